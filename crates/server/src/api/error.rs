//! Errors of the admin API, as `{"error": {"message", "type"}}` with the
//! status code that says what happened.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use llmgw_api::ErrorBody;
use llmgw_raft::ControlError;
use llmgw_state::RejectionKind;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request",
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "not_found",
            message: message.into(),
        }
    }
}

impl From<ControlError> for ApiError {
    fn from(error: ControlError) -> Self {
        let message = error.to_string();
        let (status, kind) = match &error {
            ControlError::Rejected(rejection) => match rejection.kind {
                RejectionKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
                RejectionKind::Conflict => (StatusCode::CONFLICT, "conflict"),
                RejectionKind::Invalid => (StatusCode::BAD_REQUEST, "invalid_request"),
            },
            ControlError::NoLeader(_) => (StatusCode::SERVICE_UNAVAILABLE, "no_leader"),
            ControlError::Ambiguous(_) => (StatusCode::SERVICE_UNAVAILABLE, "outcome_unknown"),
            ControlError::CommittedNotApplied { .. } => (StatusCode::ACCEPTED, "committed"),
            ControlError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ControlError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ControlError::Fatal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            ControlError::DiskFull(_) => (StatusCode::INSUFFICIENT_STORAGE, "disk_full"),
        };
        Self {
            status,
            kind,
            message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(ErrorBody::new(self.kind, self.message))).into_response()
    }
}
