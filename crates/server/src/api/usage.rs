//! API keys' usage: routers report it, operators read it per day.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use bytes::Bytes;
use llmgw_api::usage::{UsageDay, UsageQuery, UsageReport, UsageTotals, utc_date};

use super::{ApiError, ApiState};

/// A router's report (the read token routers hold may send it).
pub async fn report(State(state): State<ApiState>, body: Bytes) -> Result<StatusCode, ApiError> {
    let report: UsageReport = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("POST /api/v1/usage: {e}")))?;
    state
        .control
        .write(crate::usage::record(report, state.usage_retention))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Usage per UTC day, key and model over the last `days` days.
pub async fn per_day(
    State(state): State<ApiState>,
    Query(query): Query<UsageQuery>,
) -> Result<Json<Vec<UsageDay>>, ApiError> {
    let today = llmgw_raft::now_ms() / 86_400_000;
    let first_day = today.saturating_sub(query.days.saturating_sub(1));
    Ok(Json(state.control.read(|fleet| {
        let mut days: BTreeMap<(u64, &str, &str), UsageTotals> = BTreeMap::new();
        for (key, models) in &fleet.usage.minutes {
            for (model, minutes) in models {
                for (minute, totals) in minutes.range(first_day * 1_440..) {
                    days.entry((minute / 1_440, key, model))
                        .or_default()
                        .add(totals);
                }
            }
        }
        days.into_iter()
            .map(|((day, key, model), totals)| UsageDay {
                day: utc_date(day),
                key: key.to_owned(),
                team: fleet
                    .api_keys
                    .get(key)
                    .map(|k| k.settings.team.clone())
                    .unwrap_or_default(),
                model: model.to_owned(),
                totals,
            })
            .collect()
    })))
}
