//! `GET /api/v1/models/{name}/load`: the last hour of an autoscaled
//! model's load and replicas, as this peer sampled them, with the scaling
//! decisions committed meanwhile. Any peer answers from its own history.

use axum::Json;
use axum::extract::{Path, State};
use llmgw_api::{LoadTargets, ModelLoad};
use llmgw_catalog::Autoscale;

use super::{ApiError, ApiState};

pub async fn model_load(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<ModelLoad>, ApiError> {
    let policy = state
        .control
        .read(|fleet| {
            let record = fleet.models.get(&name)?;
            Some(
                record
                    .spec
                    .model()
                    .ok()
                    .and_then(|m| m.managed()?.autoscale),
            )
        })
        .ok_or_else(|| ApiError::not_found(format!("model {name} is not in the catalog")))?;
    let (samples, decisions) = match policy {
        Some(_) => state.load_history.read(&name),
        None => Default::default(),
    };
    Ok(Json(ModelLoad {
        model: name,
        peer_id: state.control.id(),
        autoscaled: policy.is_some(),
        targets: policy.as_ref().map(targets).unwrap_or_default(),
        samples,
        decisions,
    }))
}

fn targets(policy: &Autoscale) -> LoadTargets {
    let ms = |slo: Option<std::time::Duration>| {
        slo.map(|d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX))
    };
    LoadTargets {
        target_requests_per_replica: policy.target_requests_per_replica,
        ttft_p90_ms: ms(policy.ttft_p90_slo),
        queue_p90_ms: ms(policy.queue_p90_slo),
        kv_cache_usage_percent: policy.kv_cache_usage_percent,
    }
}
