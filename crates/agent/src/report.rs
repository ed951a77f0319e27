//! Shard status messages: every transition of a shard goes up the stream as
//! a `ShardStatus`, and the latest one per shard is kept for registration.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use llmgw_proto::agent::{ShardState, ShardStatus};
use tokio::sync::mpsc;

use crate::process::ExitInfo;

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The number of the report after `previous`: the clock in microseconds
/// keeps it increasing across agent restarts, `previous + 1` within one run
/// even if the clock steps back.
pub(crate) fn next_seq(previous: u64) -> u64 {
    unix_micros().max(previous + 1)
}

/// Sends one shard's statuses and remembers the last.
#[derive(Clone)]
pub struct Reporter {
    pub shard_id: String,
    pub replica_id: String,
    pub port: u32,
    pid: Arc<Mutex<u32>>,
    last: Arc<Mutex<ShardStatus>>,
    events: mpsc::UnboundedSender<ShardStatus>,
}

impl Reporter {
    pub fn new(
        shard_id: &str,
        replica_id: &str,
        port: u32,
        events: mpsc::UnboundedSender<ShardStatus>,
    ) -> Self {
        Reporter {
            shard_id: shard_id.to_string(),
            replica_id: replica_id.to_string(),
            port,
            pid: Arc::new(Mutex::new(0)),
            last: Arc::new(Mutex::new(ShardStatus {
                shard_id: shard_id.to_string(),
                replica_id: replica_id.to_string(),
                state: ShardState::Unspecified as i32,
                ..Default::default()
            })),
            events,
        }
    }

    pub fn set_pid(&self, pid: u32) {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
    }

    pub fn last(&self) -> ShardStatus {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn state(&self) -> ShardState {
        ShardState::try_from(self.last().state).unwrap_or(ShardState::Unspecified)
    }

    pub fn send(&self, state: ShardState, message: impl Into<String>) {
        self.send_full(state, message, Vec::new(), None);
    }

    pub fn send_full(
        &self,
        state: ShardState,
        message: impl Into<String>,
        output_tail: Vec<String>,
        exit: Option<ExitInfo>,
    ) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let status = ShardStatus {
            shard_id: self.shard_id.clone(),
            replica_id: self.replica_id.clone(),
            state: state as i32,
            pid: *self.pid.lock().unwrap_or_else(|e| e.into_inner()),
            port: self.port,
            message: message.into(),
            output_tail,
            exit_code: exit.and_then(|e| e.code),
            signal: exit.and_then(|e| e.signal),
            at_unix_ms: unix_ms(),
            seq: next_seq(last.seq),
        };
        tracing::info!(
            shard = %self.shard_id,
            state = state.as_str_name(),
            pid = status.pid,
            message = %status.message,
            "shard status"
        );
        *last = status.clone();
        // Sent under the lock, so two transitions reach the stream in the
        // order of their numbers.
        let _ = self.events.send(status);
    }

    /// The control plane has applied report `applied` of this shard. When
    /// that is above the last report sent from here (numbered by a clock
    /// that stepped back across an agent restart), what was sent since was
    /// dropped as stale: the last status goes again, numbered above it.
    pub fn raise_floor(&self, applied: u64) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.seq >= applied {
            return;
        }
        last.seq = applied;
        if last.state == ShardState::Unspecified as i32 {
            // Nothing reported yet: the next status is numbered above it.
            return;
        }
        last.at_unix_ms = unix_ms();
        last.seq = next_seq(applied);
        tracing::info!(
            shard = %self.shard_id,
            applied,
            seq = last.seq,
            "the control plane applied a later report than this agent sent; sending the status again"
        );
        let _ = self.events.send(last.clone());
    }

    /// Sends the last status again (an idempotent command repeated), as a
    /// new report: it is what the agent sees now.
    pub fn resend(&self) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.at_unix_ms = unix_ms();
        last.seq = next_seq(last.seq);
        let _ = self.events.send(last.clone());
    }
}

pub fn is_terminal(state: ShardState) -> bool {
    matches!(state, ShardState::Stopped | ShardState::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_the_control_plane_outnumbered_goes_again_numbered_above_it() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reporter = Reporter::new("s-r0", "s", 8000, tx);
        reporter.send(ShardState::Ready, "ready");
        let sent = rx.try_recv().unwrap();

        // The control plane knows this number: nothing to do.
        reporter.raise_floor(sent.seq);
        assert!(rx.try_recv().is_err());

        // It applied a later one (an earlier run of the agent, its clock an
        // hour ahead): the status goes again above it.
        let applied = sent.seq + 3_600_000_000;
        reporter.raise_floor(applied);
        let again = rx.try_recv().unwrap();
        assert_eq!(again.state, ShardState::Ready as i32);
        assert_eq!(again.message, "ready");
        assert!(again.seq > applied, "{} <= {applied}", again.seq);
        reporter.send(ShardState::Draining, "draining");
        assert!(rx.try_recv().unwrap().seq > again.seq);
    }

    #[test]
    fn a_shard_that_reported_nothing_yet_numbers_its_first_report_above_the_floor() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reporter = Reporter::new("s-r0", "s", 8000, tx);
        let applied = unix_micros() + 3_600_000_000;
        reporter.raise_floor(applied);
        assert!(rx.try_recv().is_err(), "nothing to send again");
        reporter.send(ShardState::Loading, "adopted");
        assert!(rx.try_recv().unwrap().seq > applied);
    }
}
