//! `GET /api/v1/snapshot`: a consistent backup of the replicated state,
//! for `llmgw ctl snapshot save` (restore with `llmgw server restore`).

use axum::Json;
use axum::extract::State;
use llmgw_store::Backup;

use super::{ApiError, ApiState};

pub async fn snapshot(State(state): State<ApiState>) -> Result<Json<Backup>, ApiError> {
    let backup = state.control.backup().await?;
    tracing::info!(
        index = backup.index(),
        term = backup.term(),
        state_hash = %backup.state_hash,
        "backup taken"
    );
    Ok(Json(backup))
}
