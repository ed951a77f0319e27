//! The model catalog.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use bytes::Bytes;
use llmgw_raft::now_ms;
use llmgw_state::{Command, ModelSpec};

use super::{ApiError, ApiState, ReadQuery};
use crate::model_spec;

pub async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    state.before_read(&query).await?;
    Ok(Json(state.control.read(|fleet| {
        fleet.models.values().map(model_spec::view).collect()
    })))
}

pub async fn get_one(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.before_read(&query).await?;
    state
        .control
        .read(|fleet| fleet.models.get(&name).map(model_spec::view))
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("model {name} is not in the catalog")))
}

pub async fn put(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let model = model_spec::parse(&name, &body)?;
    state
        .control
        .read(|fleet| model_spec::check_names(fleet, &model))?;
    let replicas = model.desired_replicas();
    let spec = ModelSpec::new(model);
    // The answer is the entry as written: reading it back could meet a
    // concurrent delete and report a write that was applied as missing.
    let written = spec.stored().clone();
    state
        .control
        .write(Command::PutModel {
            name,
            spec,
            replicas,
            at_ms: now_ms(),
        })
        .await?;
    Ok(Json(written))
}

pub async fn delete(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state
        .control
        .write(Command::DeleteModel {
            name,
            at_ms: now_ms(),
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A router holds a request for a model scaled to zero: the model wants a
/// replica (a no-op when it has or wants one already).
pub async fn wake(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state
        .control
        .write(Command::WakeModel {
            name,
            at_ms: now_ms(),
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
