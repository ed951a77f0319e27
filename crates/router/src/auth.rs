//! Bearer API keys: the control plane's (replicated, by digest) and those in
//! router.yaml, each allowed a list of models.

use std::sync::Arc;

use hyper::StatusCode;
use hyper::header::{AUTHORIZATION, HeaderMap};

use crate::keys::{Grant, KeyRing};
use crate::openai::ApiError;
use crate::settings::Settings;
use crate::table::RoutedModel;

/// The caller's key, or `None` when neither the control plane nor
/// router.yaml has keys. `now_ms`: the wall clock, for expiry.
pub fn authenticate(
    settings: &Settings,
    ring: &KeyRing,
    headers: &HeaderMap,
    now_ms: u64,
) -> Result<Option<Arc<Grant>>, ApiError> {
    if settings.api_keys.is_empty() && !ring.enforced() {
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
    if let Some(grant) = ring.find(presented) {
        if grant.revoked {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "revoked_api_key",
                format!("API key `{}` was revoked.", grant.name),
            ));
        }
        if grant.expires_at_ms.is_some_and(|at| at <= now_ms) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "expired_api_key",
                format!("API key `{}` has expired.", grant.name),
            ));
        }
        return Ok(Some(Arc::clone(grant)));
    }
    settings
        .api_keys
        .iter()
        .find(|grant| constant_time_eq(grant.key.as_bytes(), presented.as_bytes()))
        .map(|grant| Some(Arc::new(Grant::from_config(grant))))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "Incorrect API key provided.",
            )
        })
}

/// Whether the key may use the model, by its name or any alias.
pub fn may_use(grant: Option<&Grant>, model: &RoutedModel) -> bool {
    match grant {
        None => true,
        Some(grant) if grant.models.is_empty() => true,
        Some(grant) => grant
            .models
            .iter()
            .any(|allowed| *allowed == model.name || model.aliases.contains(allowed)),
    }
}

pub fn forbidden(grant: &Grant, model: &str) -> ApiError {
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
    use crate::settings::KeyGrant;
    use hyper::header::HeaderValue;
    use llmgw_api::keys::{ApiKeyRecord, KeySettings, secret_digest};

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

    fn bearer(secret: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {secret}")).unwrap(),
        );
        h
    }

    fn record(name: &str, secret: &str) -> ApiKeyRecord {
        ApiKeyRecord {
            name: name.into(),
            settings: KeySettings {
                expires_at_ms: Some(1_000),
                ..KeySettings::default()
            },
            secret_sha256: secret_digest(secret),
            secret_prefix: String::new(),
            created_at_ms: 0,
            rotated_at_ms: None,
            revoked_at_ms: None,
        }
    }

    #[test]
    fn missing_wrong_and_right_keys() {
        let s = settings();
        let ring = KeyRing::default();
        let auth = |h: &HeaderMap| authenticate(&s, &ring, h, 0);
        assert_eq!(auth(&HeaderMap::new()).unwrap_err().status, 401);
        assert_eq!(auth(&bearer("sk-b")).unwrap_err().code, "invalid_api_key");
        assert_eq!(auth(&bearer("sk-a")).unwrap().unwrap().name, "team-a");
        assert!(
            authenticate(&Settings::default(), &ring, &HeaderMap::new(), 0)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn control_plane_keys_expire_and_revoke_and_stay_enforced() {
        let open = Settings::default();
        let mut revoked = record("old", "sk-old");
        revoked.revoked_at_ms = Some(5);
        let ring = KeyRing::from_records([&record("ci", "sk-ci"), &revoked]);
        let auth = |h: &HeaderMap, now| authenticate(&open, &ring, h, now);
        assert_eq!(auth(&bearer("sk-ci"), 999).unwrap().unwrap().name, "ci");
        assert_eq!(
            auth(&bearer("sk-ci"), 1_000).unwrap_err().code,
            "expired_api_key"
        );
        let refused = auth(&bearer("sk-old"), 0).unwrap_err();
        assert_eq!(refused.code, "revoked_api_key");
        assert!(refused.message.contains("`old`"), "{}", refused.message);
        assert_eq!(
            auth(&HeaderMap::new(), 0).unwrap_err().code,
            "missing_api_key"
        );
        // Only revoked keys left: still closed.
        let only_revoked = KeyRing::from_records([&revoked]);
        assert_eq!(
            authenticate(&open, &only_revoked, &HeaderMap::new(), 0)
                .unwrap_err()
                .code,
            "missing_api_key"
        );
    }

    #[test]
    fn model_lists_accept_aliases() {
        let s = settings();
        let grant = Grant::from_config(&s.api_keys[0]);
        let model = RoutedModel {
            name: "llama".into(),
            aliases: vec!["l3".into()],
            mapped_aliases: Vec::new(),
            endpoints: vec![],
            unavailable_reason: None,
            wakes_on_request: false,
            max_requests_per_replica: None,
        };
        assert!(may_use(Some(&grant), &model));
        let other = RoutedModel {
            name: "qwen".into(),
            aliases: vec![],
            mapped_aliases: Vec::new(),
            ..model
        };
        assert!(!may_use(Some(&grant), &other));
        assert!(may_use(None, &other));
    }
}
