//! API keys as the admin API writes and answers them. A key's secret
//! appears once, in the answer to the request that created or rotated it;
//! the control plane and every router keep only its SHA-256.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use llmgw_catalog::Usd;
pub use llmgw_state::{ApiKeyRecord, KeyLimits, KeySettings};

/// What every secret starts with, so a leaked one is recognisable (and
/// found by secret scanners) as an llmgw key.
pub const SECRET_PREFIX: &str = "sk-llmgw-";

/// How much of a secret listings show.
const SHOWN_CHARS: usize = SECRET_PREFIX.len() + 4;

/// `POST /api/v1/keys` creates `name`; `PUT /api/v1/keys/{name}` replaces
/// the settings of a live key (`name`, when given, must match).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRequest {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub team: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    #[serde(default)]
    pub limits: KeyLimits,
}

impl KeyRequest {
    pub fn settings(&self) -> KeySettings {
        KeySettings {
            team: self.team.clone(),
            models: self.models.clone(),
            expires_at_ms: self.expires_at_ms,
            limits: self.limits,
        }
    }

    pub fn from_record(key: &ApiKeyRecord) -> Self {
        KeyRequest {
            name: key.name.clone(),
            team: key.settings.team.clone(),
            models: key.settings.models.clone(),
            expires_at_ms: key.settings.expires_at_ms,
            limits: key.settings.limits,
        }
    }
}

/// A key as `GET /api/v1/keys` answers it: the record and what the key
/// spent today and this month over every router (budgets hold against it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyView {
    #[serde(flatten)]
    pub key: ApiKeyRecord,
    #[serde(default)]
    pub spent: llmgw_state::KeySpend,
    /// Each router's share of the key's per-minute limits, by the name it
    /// reports under (an even part, the rest by its recent demand).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub shares: std::collections::BTreeMap<String, f64>,
}

/// The answer to creating or rotating a key: the only time its secret is
/// shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedKey {
    pub secret: String,
    pub key: ApiKeyRecord,
}

/// The digest the control plane stores and routers look secrets up by, in
/// lowercase hex.
pub fn secret_digest(secret: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for byte in secret_digest_bytes(secret) {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    hex
}

/// The digest as bytes: what a router computes per request.
pub fn secret_digest_bytes(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// A digest in hex back to bytes; `None` unless 64 hex digits.
pub fn digest_from_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// The start of a secret that listings show.
pub fn shown_prefix(secret: &str) -> String {
    secret.chars().take(SHOWN_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_sha256_in_hex() {
        assert_eq!(
            secret_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(shown_prefix("sk-llmgw-0123456789"), "sk-llmgw-0123");
        assert_eq!(
            digest_from_hex(&secret_digest("abc")),
            Some(secret_digest_bytes("abc"))
        );
        assert_eq!(digest_from_hex("zz"), None);
    }

    #[test]
    fn a_new_key_names_an_unknown_field() {
        let error = serde_json::from_str::<KeyRequest>(r#"{"name":"ci","rpm":5}"#).unwrap_err();
        assert!(error.to_string().contains("rpm"), "{error}");
    }
}
