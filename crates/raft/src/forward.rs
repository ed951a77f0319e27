//! Requests a follower forwards to the leader, over the `Forward` RPC.

use llmgw_state::{Command, Outcome};
use llmgw_store::PeerNode;
use serde::{Deserialize, Serialize};

use crate::error::ControlError;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ForwardRequest {
    /// Boxed: a command is far larger than the other requests.
    Write(Box<Command>),
    AddPeer {
        id: u64,
        node: PeerNode,
    },
    RemovePeer {
        id: u64,
    },
    /// Confirm leadership with a quorum and return the index a linearizable
    /// read must wait for.
    ReadIndex,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ForwardResponse {
    Written {
        outcome: Outcome,
        log_index: u64,
    },
    PeerChanged,
    ReadIndex(u64),
    /// The receiver is not the leader (any more); try this one.
    NotLeader {
        leader: Option<(u64, PeerNode)>,
    },
    Failed(ForwardFailure),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ForwardFailure {
    NoLeader(String),
    Ambiguous(String),
    Invalid(String),
    Conflict(String),
    Fatal(String),
    /// Appended: an older peer cannot decode it and reports the forward
    /// as failed, which is still a refusal.
    DiskFull(String),
}

impl From<ControlError> for ForwardResponse {
    fn from(error: ControlError) -> Self {
        ForwardResponse::Failed(match error {
            ControlError::Rejected(rejection) => {
                return ForwardResponse::Written {
                    outcome: Outcome::Rejected(rejection),
                    log_index: 0,
                };
            }
            // Committed: the asking peer waits for the apply itself.
            ControlError::CommittedNotApplied { index, .. } => {
                return ForwardResponse::Written {
                    outcome: Outcome::Applied,
                    log_index: index,
                };
            }
            ControlError::NoLeader(m) => ForwardFailure::NoLeader(m),
            ControlError::Ambiguous(m) => ForwardFailure::Ambiguous(m),
            ControlError::Invalid(m) => ForwardFailure::Invalid(m),
            ControlError::Conflict(m) => ForwardFailure::Conflict(m),
            ControlError::Fatal(m) => ForwardFailure::Fatal(m),
            ControlError::DiskFull(m) => ForwardFailure::DiskFull(m),
        })
    }
}

impl From<ForwardFailure> for ControlError {
    fn from(failure: ForwardFailure) -> Self {
        match failure {
            ForwardFailure::NoLeader(m) => ControlError::NoLeader(m),
            ForwardFailure::Ambiguous(m) => ControlError::Ambiguous(m),
            ForwardFailure::Invalid(m) => ControlError::Invalid(m),
            ForwardFailure::Conflict(m) => ControlError::Conflict(m),
            ForwardFailure::Fatal(m) => ControlError::Fatal(m),
            ForwardFailure::DiskFull(m) => ControlError::DiskFull(m),
        }
    }
}
