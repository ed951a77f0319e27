//! API keys clients present to routers. The control plane keeps a digest of
//! each secret, never the secret: the one copy is the answer to the request
//! that created or rotated the key.

use serde::{Deserialize, Serialize};

/// One key as replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    pub name: String,
    #[serde(flatten)]
    pub settings: KeySettings,
    /// SHA-256 of the secret, 64 lowercase hex digits.
    pub secret_sha256: String,
    /// The secret's first characters, to tell keys apart in listings and
    /// logs without revealing them.
    pub secret_prefix: String,
    pub created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<u64>,
}

/// What an operator may change on a key without rotating its secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySettings {
    /// The team (or owner) the key belongs to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub team: String,
    /// Models (by name or alias) the key may use; empty: every model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Wall-clock time (ms since the epoch) after which routers refuse it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "KeyLimits::is_unlimited")]
    pub limits: KeyLimits,
}

/// Limits each router holds a key to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<u32>,
    /// Prompt and completion tokens per minute, charged when each answer
    /// is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// Prompt and completion tokens per UTC day, over every router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// Prompt and completion tokens per UTC calendar month, over every
    /// router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_month: Option<u64>,
    /// Money per UTC day, over every router, by the models' prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_day: Option<llmgw_catalog::Usd>,
    /// Money per UTC calendar month, over every router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_month: Option<llmgw_catalog::Usd>,
    /// Report what the limits would refuse (metric and log) without
    /// refusing: for trying a new limit on live traffic.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
}

impl KeyLimits {
    /// Whether it has a requests- or tokens-per-minute limit: the limits a
    /// key's routers share.
    pub fn has_per_minute(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }

    pub fn is_unlimited(&self) -> bool {
        self.requests_per_minute.is_none()
            && self.max_concurrent_requests.is_none()
            && self.tokens_per_minute.is_none()
            && self.tokens_per_day.is_none()
            && self.tokens_per_month.is_none()
            && self.usd_per_day.is_none()
            && self.usd_per_month.is_none()
    }
}

impl ApiKeyRecord {
    pub fn is_revoked(&self) -> bool {
        self.revoked_at_ms.is_some()
    }

    /// Whether the key had expired at `now_ms`.
    pub fn expired_at(&self, now_ms: u64) -> bool {
        self.settings.expires_at_ms.is_some_and(|at| at <= now_ms)
    }
}

/// Why a key name or digest is not acceptable; `None` when it is.
pub fn check_key_name(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 64 {
        return Some(format!("key name `{name}` must be 1 to 64 characters long"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Some(format!(
            "key name `{name}` may hold only letters, digits, `-`, `_` and `.`"
        ));
    }
    None
}

pub(crate) fn check_digest(digest: &str) -> Option<String> {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    (digest.len() != 64 || !digest.bytes().all(hex))
        .then(|| "secret_sha256 must be 64 lowercase hex digits".to_owned())
}
