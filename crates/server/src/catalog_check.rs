//! The catalog's validation rules, applied to one entry.

use crate::api::ApiError;

pub fn check(name: &str, spec: &serde_json::Value) -> Result<(), ApiError> {
    let model: llmgw_catalog::Model = serde_json::from_value(spec.clone())
        .map_err(|e| ApiError::bad_request(format!("model {name}: {e}")))?;
    model
        .validate()
        .map_err(|e| ApiError::bad_request(format!("model {name}: {e}")))?;
    Ok(())
}
