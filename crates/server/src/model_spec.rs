//! Turning a `PUT /api/v1/models/{name}` body into a catalog entry: JSON or
//! YAML, one model entry as in models.yaml, validated by llmgw-catalog.

use llmgw_state::ModelRecord;

use crate::api::ApiError;

pub struct ParsedModel {
    pub spec: serde_json::Value,
    pub replicas: u32,
}

/// The model entry as the API shows it: the spec as written.
pub fn view(record: &ModelRecord) -> serde_json::Value {
    record.spec.clone()
}

fn is_yaml(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    matches!(
        essence,
        "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml"
    )
}

pub fn parse(name: &str, content_type: &str, body: &[u8]) -> Result<ParsedModel, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request(format!("model {name}: the body is not UTF-8")))?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request(format!(
            "model {name}: the body is empty; send one model entry as in models.yaml (JSON or YAML)"
        )));
    }
    let spec: serde_json::Value = if is_yaml(content_type) {
        serde_saphyr::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("model {name}: YAML body: {e}")))?
    } else {
        match serde_json::from_str(text) {
            Ok(value) => value,
            // Without a YAML content type, accept YAML when it is not JSON.
            Err(json_error) => serde_saphyr::from_str(text).map_err(|_| {
                ApiError::bad_request(format!("model {name}: body is neither JSON nor YAML: {json_error}"))
            })?,
        }
    };
    let spec = validate(name, spec)?;
    let replicas = spec
        .get("replicas")
        .and_then(serde_json::Value::as_u64)
        .map_or(Ok(0), u32::try_from)
        .map_err(|_| ApiError::bad_request(format!("model {name}: `replicas` is too large")))?;
    Ok(ParsedModel { spec, replicas })
}

/// Checks the entry with the catalog's rules and returns it in canonical
/// form.
fn validate(name: &str, spec: serde_json::Value) -> Result<serde_json::Value, ApiError> {
    let serde_json::Value::Object(mut fields) = spec else {
        return Err(ApiError::bad_request(format!(
            "model {name}: expected one model entry (a mapping with `name`, `source`, `profiles`...)"
        )));
    };
    match fields.get("name") {
        None => {
            fields.insert("name".to_owned(), serde_json::Value::String(name.to_owned()));
        }
        Some(serde_json::Value::String(given)) if given == name => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "model {name}: the body names model {other}, but the URL names {name}"
            )));
        }
    }
    let spec = serde_json::Value::Object(fields);
    crate::catalog_check::check(name, &spec)?;
    Ok(spec)
}
