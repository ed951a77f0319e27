//! `GET /api/v1/models/{name}/load`: an autoscaled model's load and
//! replicas over the last hour, as the peer that answers sampled them, and
//! the scaling decisions taken meanwhile. The console draws it.

use serde::{Deserialize, Serialize};

/// One model's recent load, oldest sample first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelLoad {
    pub model: String,
    /// The peer that sampled it: each peer samples on its own, so the
    /// history survives a failover, and a peer started recently has less.
    pub peer_id: u64,
    /// Only autoscaled models are sampled; for the others `samples` is
    /// empty.
    pub autoscaled: bool,
    /// The targets the autoscaler holds the model to, as the catalog sets
    /// them now.
    pub targets: LoadTargets,
    /// One a second while this peer sampled, at most an hour of them.
    pub samples: Vec<LoadSampleView>,
    /// The autoscaler's changes of the replica count this peer saw
    /// committed, oldest first.
    pub decisions: Vec<ScaleMark>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadTargets {
    pub target_requests_per_replica: u32,
    pub ttft_p90_ms: Option<u32>,
    pub queue_p90_ms: Option<u32>,
    pub kv_cache_usage_percent: Option<u32>,
}

/// The model at one moment: its engines' load, and its replicas as the
/// replicated state had them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadSampleView {
    pub at_ms: u64,
    /// Requests that got their first token since the sample before, a
    /// second (none when an engine could not be read).
    pub requests_per_s: Option<f64>,
    /// Requests running or waiting on the ready engines.
    pub outstanding: Option<u32>,
    pub ttft_p90_ms: Option<u32>,
    pub queue_p90_ms: Option<u32>,
    pub kv_cache_usage_percent: Option<u32>,
    /// The replica count the model should have.
    pub desired: u32,
    pub ready: u32,
    /// Placed, starting or loading.
    pub starting: u32,
    /// Draining or stopping.
    pub draining: u32,
    /// Asleep (vLLM sleep mode): holding GPUs, woken by a request.
    #[serde(default)]
    pub sleeping: u32,
}

/// A committed change of the replica count, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleMark {
    pub at_ms: u64,
    pub from: u32,
    pub to: u32,
    pub reason: String,
}
