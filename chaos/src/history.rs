//! Every client operation of a run, with invoke/complete times and outcome.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::linearizability::{RegEvent, RegOp, RegRet};

/// How an operation ended, as far as the client can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with a definite result.
    Ok(RegRet),
    /// Definitely not applied: refused before it reached the server, or
    /// a 4xx that is decided before anything is written.
    Failed(String),
    /// Maybe applied: timed out, cut off after sending, or a 5xx. Never
    /// treated as absent.
    Unknown(String),
}

#[derive(Debug, Clone)]
pub struct OpRecord {
    pub id: u64,
    /// The load worker that issued it.
    pub worker: usize,
    /// The peer it was sent to.
    pub peer: u64,
    pub key: String,
    pub op: RegOp,
    /// Microseconds since the run started.
    pub invoke_us: u64,
    pub complete_us: u64,
    pub outcome: Outcome,
}

impl OpRecord {
    /// The checker's view; `None` for operations that definitely failed,
    /// which had no effect.
    pub fn event(&self) -> Option<RegEvent> {
        let ret = match &self.outcome {
            Outcome::Ok(ret) => ret.clone(),
            Outcome::Unknown(_) => RegRet::Unknown,
            Outcome::Failed(_) => return None,
        };
        Some(RegEvent {
            id: self.id,
            key: self.key.clone(),
            op: self.op.clone(),
            ret,
            invoke: self.invoke_us,
            complete: self.complete_us,
        })
    }
}

/// The shared, append-only record of a run.
#[derive(Clone)]
pub struct History {
    started: Instant,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    ops: Vec<OpRecord>,
}

impl History {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            inner: Arc::default(),
        }
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    pub fn next_id(&self) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.next_id += 1;
        inner.next_id
    }

    pub fn record(&self, op: OpRecord) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ops
            .push(op);
    }

    pub fn ops(&self) -> Vec<OpRecord> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ops
            .clone()
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}
