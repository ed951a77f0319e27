//! API keys: created, changed, rotated and revoked by operators.

use crate::command::{Outcome, Rejection};
use crate::keys::{ApiKeyRecord, KeySettings, check_digest, check_key_name};
use crate::types::FleetState;

impl FleetState {
    pub(super) fn create_api_key(&mut self, key: &ApiKeyRecord) -> Outcome {
        if let Some(why) = check_key_name(&key.name).or_else(|| check_digest(&key.secret_sha256)) {
            return Rejection::invalid(why);
        }
        if self
            .api_keys
            .get(&key.name)
            .is_some_and(|k| !k.is_revoked())
        {
            return Rejection::conflict(format!(
                "API key {} exists; rotate it, update it, or revoke it first",
                key.name
            ));
        }
        if let Some(owner) = self.live_key_with_digest(&key.secret_sha256) {
            return Rejection::conflict(format!("that secret is already API key {owner}'s"));
        }
        let mut key = key.clone();
        key.revoked_at_ms = None;
        key.rotated_at_ms = None;
        self.api_keys.insert(key.name.clone(), key);
        Outcome::Applied
    }

    pub(super) fn update_api_key(&mut self, name: &str, settings: &KeySettings) -> Outcome {
        match self.live_key(name) {
            Ok(key) => {
                key.settings = settings.clone();
                Outcome::Applied
            }
            Err(refusal) => refusal,
        }
    }

    pub(super) fn rotate_api_key(
        &mut self,
        name: &str,
        digest: &str,
        prefix: &str,
        at_ms: u64,
    ) -> Outcome {
        if let Some(why) = check_digest(digest) {
            return Rejection::invalid(why);
        }
        if let Some(owner) = self.live_key_with_digest(digest) {
            return Rejection::conflict(format!("that secret is already API key {owner}'s"));
        }
        match self.live_key(name) {
            Ok(key) => {
                key.secret_sha256 = digest.to_owned();
                key.secret_prefix = prefix.to_owned();
                key.rotated_at_ms = Some(at_ms);
                Outcome::Applied
            }
            Err(refusal) => refusal,
        }
    }

    pub(super) fn revoke_api_key(&mut self, name: &str, at_ms: u64) -> Outcome {
        let Some(key) = self.api_keys.get_mut(name) else {
            return Rejection::not_found(format!("there is no API key {name}"));
        };
        key.revoked_at_ms.get_or_insert(at_ms);
        Outcome::Applied
    }

    fn live_key(&mut self, name: &str) -> Result<&mut ApiKeyRecord, Outcome> {
        match self.api_keys.get_mut(name) {
            None => Err(Rejection::not_found(format!("there is no API key {name}"))),
            Some(key) if key.is_revoked() => Err(Rejection::conflict(format!(
                "API key {name} was revoked; create it again for a new secret"
            ))),
            Some(key) => Ok(key),
        }
    }

    fn live_key_with_digest(&self, digest: &str) -> Option<&str> {
        self.api_keys
            .values()
            .find(|k| !k.is_revoked() && k.secret_sha256 == digest)
            .map(|k| k.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Outcome, RejectionKind};
    use crate::keys::{ApiKeyRecord, KeyLimits, KeySettings};
    use crate::types::FleetState;

    fn digest(fill: char) -> String {
        std::iter::repeat_n(fill, 64).collect()
    }

    fn key(name: &str, fill: char) -> ApiKeyRecord {
        ApiKeyRecord {
            name: name.into(),
            settings: KeySettings {
                team: "search".into(),
                models: vec!["llama".into()],
                expires_at_ms: None,
                limits: KeyLimits {
                    requests_per_minute: Some(60),
                    ..KeyLimits::default()
                },
            },
            secret_sha256: digest(fill),
            secret_prefix: "sk-llmgw-ab".into(),
            created_at_ms: 1,
            rotated_at_ms: None,
            revoked_at_ms: None,
        }
    }

    fn rejected(outcome: Outcome) -> RejectionKind {
        match outcome {
            Outcome::Rejected(r) => r.kind,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_key_lives_is_rotated_and_revoked() {
        let mut state = FleetState::default();
        let create = |k| Command::CreateApiKey { key: k, at_ms: 1 };
        assert_eq!(state.apply(&create(key("ci", 'a'))), Outcome::Applied);
        assert_eq!(
            rejected(state.apply(&create(key("ci", 'b')))),
            RejectionKind::Conflict,
            "a live name is not created twice"
        );
        assert_eq!(
            rejected(state.apply(&create(key("other", 'a')))),
            RejectionKind::Conflict,
            "one secret belongs to one key"
        );
        let rotate = Command::RotateApiKey {
            name: "ci".into(),
            secret_sha256: digest('c'),
            secret_prefix: "sk-llmgw-cc".into(),
            at_ms: 5,
        };
        assert_eq!(state.apply(&rotate), Outcome::Applied);
        assert_eq!(state.api_keys["ci"].secret_sha256, digest('c'));
        assert_eq!(state.api_keys["ci"].rotated_at_ms, Some(5));
        let revoke = Command::RevokeApiKey {
            name: "ci".into(),
            at_ms: 9,
        };
        assert_eq!(state.apply(&revoke), Outcome::Applied);
        assert_eq!(state.apply(&revoke), Outcome::Applied);
        assert_eq!(
            state.api_keys["ci"].revoked_at_ms,
            Some(9),
            "first revocation kept"
        );
        assert_eq!(rejected(state.apply(&rotate)), RejectionKind::Conflict);
        let update = Command::UpdateApiKey {
            name: "ci".into(),
            settings: KeySettings::default(),
            at_ms: 10,
        };
        assert_eq!(rejected(state.apply(&update)), RejectionKind::Conflict);
        // The name is free again, with a fresh record.
        assert_eq!(state.apply(&create(key("ci", 'd'))), Outcome::Applied);
        assert!(!state.api_keys["ci"].is_revoked());
    }

    #[test]
    fn malformed_keys_are_invalid() {
        let mut state = FleetState::default();
        let mut bad_name = key("has space", 'a');
        assert_eq!(
            rejected(state.apply(&Command::CreateApiKey {
                key: bad_name.clone(),
                at_ms: 1
            })),
            RejectionKind::Invalid
        );
        bad_name.name = "fine".into();
        bad_name.secret_sha256 = "ABC".into();
        assert_eq!(
            rejected(state.apply(&Command::CreateApiKey {
                key: bad_name,
                at_ms: 1
            })),
            RejectionKind::Invalid
        );
        assert!(state.api_keys.is_empty());
    }

    #[test]
    fn keys_survive_the_encoding_and_an_empty_set_leaves_no_trace() {
        let mut state = FleetState::default();
        let before = serde_json::to_string(&state).unwrap();
        assert!(!before.contains("api_keys"), "{before}");
        state.apply(&Command::CreateApiKey {
            key: key("ci", 'a'),
            at_ms: 1,
        });
        let text = serde_json::to_string(&state).unwrap();
        assert!(!text.contains("sk-llmgw-ab0"), "no secret is stored");
        let back: FleetState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state);
    }
}
