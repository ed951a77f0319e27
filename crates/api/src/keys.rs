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
    /// Reads a request body, refusing a field it does not know, in
    /// `limits` as well: the stored `KeyLimits` reads past unknown fields
    /// (so a newer peer's state stays readable), and a misspelt limit
    /// would otherwise leave the key without it.
    pub fn from_json(body: &[u8]) -> Result<KeyRequest, String> {
        let request: KeyRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let written: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        if let Some(limits) = written.get("limits").and_then(|l| l.as_object()) {
            let known = limit_names();
            if let Some(unknown) = limits.keys().find(|k| !known.contains(k)) {
                return Err(format!(
                    "limits: unknown field `{unknown}`, expected one of {}",
                    known.join(", ")
                ));
            }
        }
        Ok(request)
    }

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

/// The names `KeyLimits` is written with. Every field is set (no `..`), so
/// a limit added to `KeyLimits` must be added here to compile.
fn limit_names() -> Vec<String> {
    let every = KeyLimits {
        requests_per_minute: Some(1),
        max_concurrent_requests: Some(1),
        tokens_per_minute: Some(1),
        tokens_per_day: Some(1),
        tokens_per_month: Some(1),
        usd_per_day: Some(Usd::from_micros(1)),
        usd_per_month: Some(Usd::from_micros(1)),
        shadow: true,
    };
    match serde_json::to_value(every) {
        Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
        _ => Vec::new(),
    }
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
        let error = KeyRequest::from_json(br#"{"name":"ci","rpm":5}"#).unwrap_err();
        assert!(error.contains("rpm"), "{error}");
        let error =
            KeyRequest::from_json(br#"{"name":"ci","limits":{"tokens_per_dya":5}}"#).unwrap_err();
        assert!(
            error.contains("limits: unknown field `tokens_per_dya`")
                && error.contains("tokens_per_day"),
            "{error}"
        );
        let every = br#"{"name":"ci","limits":{"requests_per_minute":1,"max_concurrent_requests":1,
            "tokens_per_minute":1,"tokens_per_day":1,"tokens_per_month":1,"usd_per_day":1.5,
            "usd_per_month":20,"shadow":true}}"#;
        let request = KeyRequest::from_json(every).expect("every limit is known");
        assert_eq!(request.limits.usd_per_day, Usd::from_dollars(1.5));
    }
}
