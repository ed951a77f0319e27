//! `GET /readyz` and the console's `/api/v1/events` stream.

use serde::{Deserialize, Serialize};

/// `GET /readyz`: 200 with the leader once one is known, 503 with the
/// reason before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One `state` event of `GET /api/v1/events`: who leads, and a cue to read
/// the views again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateEvent {
    pub leader_id: Option<u64>,
    pub term: u64,
    pub applied_index: Option<u64>,
}
