//! The control plane's API keys as a router checks them: looked up by the
//! SHA-256 of the presented secret, so the router never holds a secret it
//! did not read from its own config.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use llmgw_api::keys::{ApiKeyRecord, KeyLimits, KeyView, digest_from_hex, secret_digest_bytes};
use llmgw_api::usage::KeySpend;

use crate::settings::KeyGrant;

/// Who a request's key says the caller is, and what it may do.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub name: String,
    pub team: String,
    /// Models (names or aliases) it may use; empty: every model.
    pub models: Vec<String>,
    pub limits: KeyLimits,
    pub expires_at_ms: Option<u64>,
    pub revoked: bool,
    /// What the key spent today and this month over every router, as the
    /// control plane last said.
    pub spent: KeySpend,
    /// Each router's share of the key's per-minute limits, by reporter
    /// name; empty until a router reported demand for the key.
    pub shares: BTreeMap<String, f64>,
}

impl Grant {
    fn from_record(key: &ApiKeyRecord, spent: KeySpend, shares: BTreeMap<String, f64>) -> Self {
        Grant {
            spent,
            shares,
            name: key.name.clone(),
            team: key.settings.team.clone(),
            models: key.settings.models.clone(),
            limits: key.settings.limits,
            expires_at_ms: key.settings.expires_at_ms,
            revoked: key.is_revoked(),
        }
    }

    /// A key from router.yaml: no team, no limits, no expiry.
    pub(crate) fn from_config(key: &KeyGrant) -> Self {
        Grant {
            name: key.name.clone(),
            team: String::new(),
            models: key.models.clone(),
            limits: KeyLimits::default(),
            expires_at_ms: None,
            revoked: false,
            spent: KeySpend::default(),
            shares: BTreeMap::new(),
        }
    }
}

/// Every key the control plane holds, by the digest of its secret.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyRing {
    by_digest: HashMap<[u8; 32], Arc<Grant>>,
    /// The control plane has keys (revoked ones count): from the first one
    /// created, every request needs a key. Revoking the last key does not
    /// open the router again.
    enforced: bool,
}

impl KeyRing {
    /// Keys with nothing spent and no shares (for tests and tools).
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a ApiKeyRecord>) -> Self {
        Self::build(
            records
                .into_iter()
                .map(|k| (k, KeySpend::default(), BTreeMap::new())),
        )
    }

    /// Keys as the admin API lists them, with what each spent and each
    /// router's share of its per-minute limits.
    pub fn from_views(views: &[KeyView]) -> Self {
        Self::build(views.iter().map(|v| (&v.key, v.spent, v.shares.clone())))
    }

    pub fn build<'a>(
        keys: impl IntoIterator<Item = (&'a ApiKeyRecord, KeySpend, BTreeMap<String, f64>)>,
    ) -> Self {
        let mut ring = KeyRing::default();
        for (key, spent, shares) in keys {
            ring.enforced = true;
            // The control plane refuses a digest that is not 64 hex
            // digits; one that still is not (a newer server's) matches
            // no secret.
            if let Some(digest) = digest_from_hex(&key.secret_sha256) {
                ring.by_digest
                    .insert(digest, Arc::new(Grant::from_record(key, spent, shares)));
            }
        }
        ring
    }

    pub fn enforced(&self) -> bool {
        self.enforced
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Names of the keys with per-minute limits: a router reports its
    /// demand for each (0 when idle), so its share stays counted.
    pub(crate) fn per_minute_limited(&self) -> impl Iterator<Item = &str> {
        self.by_digest
            .values()
            .filter(|g| !g.revoked && g.limits.has_per_minute())
            .map(|g| g.name.as_str())
    }

    pub(crate) fn find(&self, secret: &str) -> Option<&Arc<Grant>> {
        if self.by_digest.is_empty() {
            return None;
        }
        self.by_digest.get(&secret_digest_bytes(secret))
    }
}
