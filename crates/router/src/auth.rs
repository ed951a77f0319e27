//! Optional bearer API keys, each allowed a list of models.

use hyper::StatusCode;
use hyper::header::{AUTHORIZATION, HeaderMap};

use crate::openai::ApiError;
use crate::settings::{KeyGrant, Settings};
use crate::table::RoutedModel;

/// The caller's key, or `None` when the router has no keys configured.
pub fn authenticate<'s>(
    settings: &'s Settings,
    headers: &HeaderMap,
) -> Result<Option<&'s KeyGrant>, ApiError> {
    if settings.api_keys.is_empty() {
        return Ok(None);
    }
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(presented) = presented else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_api_key",
            "You didn't provide an API key. Send it as `Authorization: Bearer KEY`.",
        ));
    };
    settings
        .api_keys
        .iter()
        .find(|grant| constant_time_eq(grant.key.as_bytes(), presented.as_bytes()))
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "Incorrect API key provided.",
            )
        })
}

/// Whether the key may use the model, by its name or any alias.
pub fn may_use(grant: Option<&KeyGrant>, model: &RoutedModel) -> bool {
    match grant {
        None => true,
        Some(grant) if grant.models.is_empty() => true,
        Some(grant) => grant
            .models
            .iter()
            .any(|allowed| *allowed == model.name || model.aliases.contains(allowed)),
    }
}

pub fn forbidden(grant: &KeyGrant, model: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "model_not_allowed",
        format!("API key `{}` may not use model `{model}`.", grant.name),
    )
    .param("model")
}

/// Compares without an early exit, so timing does not reveal how much of a
/// guessed key was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn settings() -> Settings {
        Settings {
            api_keys: vec![KeyGrant {
                name: "team-a".into(),
                key: "sk-a".into(),
                models: vec!["l3".into()],
            }],
            ..Settings::default()
        }
    }

    #[test]
    fn missing_wrong_and_right_keys() {
        let s = settings();
        let mut h = HeaderMap::new();
        assert_eq!(authenticate(&s, &h).unwrap_err().status, 401);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer sk-b"));
        assert_eq!(authenticate(&s, &h).unwrap_err().code, "invalid_api_key");
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer sk-a"));
        assert_eq!(authenticate(&s, &h).unwrap().unwrap().name, "team-a");
        assert!(
            authenticate(&Settings::default(), &HeaderMap::new())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn model_lists_accept_aliases() {
        let s = settings();
        let grant = &s.api_keys[0];
        let model = RoutedModel {
            name: "llama".into(),
            aliases: vec!["l3".into()],
            mapped_aliases: Vec::new(),
            endpoints: vec![],
            unavailable_reason: None,
            wakes_on_request: false,
        };
        assert!(may_use(Some(grant), &model));
        let other = RoutedModel {
            name: "qwen".into(),
            aliases: vec![],
            mapped_aliases: Vec::new(),
            ..model
        };
        assert!(!may_use(Some(grant), &other));
        assert!(may_use(None, &other));
    }
}
