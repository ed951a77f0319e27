//! The bounded client load that runs through every scenario, and the
//! sampler that asks every peer who leads in which term.
//!
//! Workers each keep one request in flight against a random member: `PUT`
//! and `DELETE` on a few shared register keys, consistent `GET`s of them,
//! and `PUT`s of fresh keys that are never touched again (so an
//! acknowledged one must be on every peer at the end). Every value is
//! unique to the run.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_api::{ClusterView, Model, paths};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::{Members, get_view, snapshot};
use crate::history::{History, OpRecord, Outcome};
use crate::linearizability::{RegOp, RegRet};

/// Register keys shared by all workers.
pub const REGISTER_KEYS: usize = 6;
/// Endpoint prefix that carries a written value.
const VALUE_PREFIX: &str = "http://10.1.2.3:8000/v/";
/// Longer than the server's own write deadline (10 s), so most answers are
/// definite.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(12);

pub fn register_key(i: usize) -> String {
    format!("reg-{i}")
}

pub fn unique_key_prefix() -> &'static str {
    "once-"
}

/// The value a model entry carries, if it is one of ours.
pub fn value_of(model: &Model) -> Option<String> {
    model
        .static_endpoints()
        .iter()
        .find_map(|endpoint| endpoint.strip_prefix(VALUE_PREFIX))
        .map(str::to_owned)
}

pub fn model_body(key: &str, value: &str) -> String {
    serde_json::json!({"name": key, "endpoints": [format!("{VALUE_PREFIX}{value}")]}).to_string()
}

/// The client every worker uses (HTTPS with the run's CA and token).
pub fn client(cluster: &crate::cluster::Cluster) -> reqwest::Client {
    cluster.admin_client(CLIENT_TIMEOUT)
}

/// One request's outcome from the HTTP exchange.
fn classify_error(error: &reqwest::Error) -> Outcome {
    if error.is_connect() {
        // Refused or unroutable before any byte of the request left.
        Outcome::Failed(format!("connect: {error}"))
    } else if error.is_timeout() {
        Outcome::Unknown(format!("timed out after {CLIENT_TIMEOUT:?}"))
    } else {
        Outcome::Unknown(format!("transport: {error}"))
    }
}

/// Sends one operation to `base` and classifies the answer.
pub async fn perform(http: &reqwest::Client, base: &str, key: &str, op: &RegOp) -> Outcome {
    let path = format!("{base}{}", paths::model(key));
    let request = match op {
        RegOp::Write(value) => http
            .put(&path)
            .header("content-type", "application/json")
            .body(model_body(key, value)),
        RegOp::Delete => http.delete(&path),
        RegOp::Read => http.get(format!("{path}?consistent=true")),
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => return classify_error(&error),
    };
    let status = response.status().as_u16();
    let body = match response.text().await {
        Ok(text) => text,
        Err(error) => {
            return Outcome::Unknown(format!("HTTP {status}, body cut off: {error}"));
        }
    };
    match (op, status) {
        (RegOp::Write(_), 200) => Outcome::Ok(RegRet::Ok),
        // The server applied the write, then found the model gone when it
        // read it back for the answer: a concurrent delete came after.
        (RegOp::Write(_), 404) if body.contains("deleted concurrently") => Outcome::Ok(RegRet::Ok),
        (RegOp::Delete, 204) => Outcome::Ok(RegRet::Ok),
        // Committed (and applied by the leader), not yet applied on the
        // peer that answered: it happened.
        (RegOp::Write(_) | RegOp::Delete, 202) => Outcome::Ok(RegRet::Ok),
        (RegOp::Delete, 404) => Outcome::Ok(RegRet::NotFound),
        (RegOp::Read, 200) => match serde_json::from_str::<Model>(&body)
            .ok()
            .as_ref()
            .and_then(value_of)
        {
            Some(value) => Outcome::Ok(RegRet::Value(Some(value))),
            None => Outcome::Unknown(format!("HTTP 200 without a value of ours: {body}")),
        },
        (RegOp::Read, 404) => Outcome::Ok(RegRet::Value(None)),
        (_, 400..=499) => Outcome::Failed(format!("HTTP {status}: {body}")),
        // A peer short of disk space refuses a write before proposing it.
        (_, 507) if body.contains("\"disk_full\"") => {
            Outcome::Failed(format!("HTTP {status}: {body}"))
        }
        _ => Outcome::Unknown(format!("HTTP {status}: {body}")),
    }
}

/// Runs `worker` until `stop`; each worker has its own seeded choices.
/// While `quiet` is set it sends nothing: a schedule idles the cluster.
#[allow(clippy::too_many_arguments)]
pub async fn worker(
    http: reqwest::Client,
    worker: usize,
    seed: u64,
    run_id: String,
    members: Members,
    history: History,
    stop: Arc<AtomicBool>,
    quiet: Arc<AtomicBool>,
    pause: Duration,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x9e37_79b9 * (worker as u64 + 1)));
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let peers: Vec<(u64, String)> = snapshot(&members);
        if peers.is_empty() || quiet.load(Ordering::Relaxed) {
            tokio::time::sleep(pause).await;
            continue;
        }
        let (peer, base) = peers[rng.random_range(0..peers.len())].clone();
        seq += 1;
        let value = format!("{run_id}-w{worker}-{seq}");
        let roll = rng.random_range(0..100);
        let (key, op) = if roll < 15 {
            (
                format!("{}{run_id}-w{worker}-{seq}", unique_key_prefix()),
                RegOp::Write(value),
            )
        } else {
            let key = register_key(rng.random_range(0..REGISTER_KEYS));
            let op = match roll {
                15..=49 => RegOp::Write(value),
                50..=64 => RegOp::Delete,
                _ => RegOp::Read,
            };
            (key, op)
        };
        let id = history.next_id();
        let invoke_us = history.now_us();
        let outcome = perform(&http, &base, &key, &op).await;
        let complete_us = history.now_us();
        history.record(OpRecord {
            id,
            worker,
            peer,
            key,
            op,
            invoke_us,
            complete_us,
            outcome,
        });
        tokio::time::sleep(pause).await;
    }
}

/// One peer's answer to "who leads?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderSample {
    /// When the question was sent.
    pub at_us: u64,
    /// When the answer came: the leadership it names existed by then.
    pub answered_us: u64,
    /// The peer that answered.
    pub peer: u64,
    /// The cluster's epoch (0 before its first began): a restore begins a
    /// new one, whose terms start again from the backup's.
    pub epoch: u64,
    pub term: u64,
    pub leader: Option<u64>,
}

#[cfg(test)]
impl LeaderSample {
    /// A sample asked `at_s` seconds into a run and answered 1 ms later,
    /// before the cluster's first epoch (tests of the checks).
    pub(crate) fn at_seconds(at_s: f64, peer: u64, term: u64, leader: Option<u64>) -> Self {
        let at_us = (at_s * 1e6) as u64;
        LeaderSample {
            at_us,
            answered_us: at_us + 1_000,
            peer,
            epoch: 0,
            term,
            leader,
        }
    }
}

/// Asks every member `GET /api/v1/cluster` every `every` until `stop`,
/// each member on its own: a peer whose answer is slow (paused, or waiting
/// on a peer it cannot reach: the view includes every peer's status) gets
/// no new request until it answers or 3 s pass, and never delays the
/// others' samples. With one shared round and a short timeout instead,
/// every peer's samples vanished for as long as any peer was cut off.
/// A sample carries the time its request was sent.
pub async fn sampler(
    http: reqwest::Client,
    members: Members,
    history: History,
    stop: Arc<AtomicBool>,
    every: Duration,
) -> Vec<LeaderSample> {
    let samples: Arc<Mutex<Vec<LeaderSample>>> = Arc::default();
    let busy: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let mut asks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        for (id, base) in snapshot(&members) {
            if !busy.lock().unwrap_or_else(|p| p.into_inner()).insert(id) {
                continue;
            }
            let (http, history) = (http.clone(), history.clone());
            let (samples, busy) = (samples.clone(), busy.clone());
            asks.push(tokio::spawn(async move {
                let at_us = history.now_us();
                if let Ok(view) = get_view::<ClusterView>(&http, &base, paths::CLUSTER).await {
                    samples
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(LeaderSample {
                            at_us,
                            answered_us: history.now_us(),
                            peer: id,
                            epoch: view.epoch.unwrap_or(0),
                            term: view.term,
                            leader: view.leader_id,
                        });
                }
                busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            }));
        }
        asks.retain(|ask| !ask.is_finished());
        tokio::time::sleep(every).await;
    }
    for ask in asks {
        let _ = ask.await;
    }
    let mut samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner()));
    samples.sort_by_key(|s| (s.at_us, s.peer));
    samples
}
