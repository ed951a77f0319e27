//! Every error of the admin API: `{"error": {"message", "type"}}` with the
//! status code that says what happened.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request`, `not_found`, `conflict`, `no_leader`,
    /// `outcome_unknown`, `committed`, `disk_full`, `payload_too_large`,
    /// `unauthorized` or `internal`.
    #[serde(rename = "type")]
    pub kind: String,
}

impl ErrorBody {
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                message: message.into(),
                kind: kind.into(),
            },
        }
    }
}
