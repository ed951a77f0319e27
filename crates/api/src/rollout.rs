//! `GET /api/v1/models/{name}/rollout` and `POST .../rollback`: how far a
//! change to a model has rolled onto its replicas.

use llmgw_catalog::RolloutPolicy;
use llmgw_state::{ReplicaState, Rollout};
use serde::{Deserialize, Serialize};

/// Where a model's replicas stand against its current launch spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutView {
    pub model: String,
    /// The launch fingerprint of the entry in the catalog now.
    pub fingerprint: String,
    pub desired: u32,
    pub phase: RolloutPhase,
    /// Replicas running the current spec, and of them those ready.
    pub updated: u32,
    pub updated_ready: u32,
    /// Replicas still running an earlier spec.
    pub outdated: u32,
    pub policy: RolloutPolicy,
    /// The last rollout, finished or not.
    pub rollout: Option<Rollout>,
    /// Whether `rollback` has an earlier launch spec to restore.
    pub can_roll_back: bool,
    /// Why a replacement is not placed, when it is not.
    pub blocked: Option<String>,
    pub replicas: Vec<RolloutReplica>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutPhase {
    /// Every replica runs the current spec (or none ever changed).
    Complete,
    /// Replicas are being replaced.
    InProgress,
    /// New replicas failed; the rollout retries with backoff.
    Failing,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Complete => "complete",
            RolloutPhase::InProgress => "in progress",
            RolloutPhase::Failing => "failing",
        }
    }
}

/// One replica of the model, with the spec it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutReplica {
    pub id: String,
    pub state: ReplicaState,
    /// The launch fingerprint it was placed from; none on a replica from
    /// before fingerprints were recorded.
    pub fingerprint: Option<String>,
    /// Runs the current spec.
    pub current: bool,
    pub replaces: Option<String>,
    /// Why it is going away, when it is.
    pub stopping: Option<String>,
}
