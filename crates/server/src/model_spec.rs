//! Turning a `PUT /api/v1/models/{name}` body into a catalog entry: one
//! model entry as in models.yaml, JSON or YAML, validated by llmgw-catalog.

use llmgw_catalog::{Catalog, Model};
use llmgw_state::{FleetState, ModelRecord};

use crate::api::ApiError;

/// The model entry as the API shows it: the validated entry, in the shape
/// of models.yaml.
pub fn view(record: &ModelRecord) -> serde_json::Value {
    record.spec.stored().clone()
}

/// Parses and validates the body. JSON is YAML, so one parser takes both
/// whatever the content type says.
pub fn parse(name: &str, body: &[u8]) -> Result<Model, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| {
        ApiError::bad_request(format!("model {name}: the request body is not UTF-8"))
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request(format!(
            "model {name}: the request body is empty; send one model entry as in models.yaml (JSON or YAML)"
        )));
    }
    let source = format!("PUT /api/v1/models/{name}");
    let model = llmgw_catalog::parse_model(&source, text)
        .map_err(|problems| ApiError::bad_request(problems.to_string()))?;
    if model.name != name {
        return Err(ApiError::bad_request(format!(
            "{source}: the body names model `{}`, but the URL names `{name}`",
            model.name
        )));
    }
    Ok(model)
}

/// Names and aliases are one namespace across the catalog.
pub fn check_names(fleet: &FleetState, model: &Model) -> Result<(), ApiError> {
    let catalog = Catalog {
        models: fleet
            .models
            .values()
            .filter_map(|record| record.spec.model().ok().cloned())
            .collect(),
    };
    catalog.check_put(model).map_err(|message| ApiError {
        status: axum::http::StatusCode::CONFLICT,
        kind: "conflict",
        message: format!("model {}: {message}", model.name),
    })
}
