//! The router's running settings: `router.yaml` with key files read.

use std::time::Duration;

use llmgw_config::{BalancePolicy, RouterConfig};

use crate::error::RouterError;
use crate::kv::LocalTokenizers;
use crate::resume::ResumeSettings;

#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: BalancePolicy,
    pub prefix_bytes: usize,
    pub load_factor: f64,
    /// How often engines' `/metrics` are read; zero turns it off.
    pub metrics_interval: Duration,
    /// Cache-aware routing: one request of load weighs this many prompt
    /// tokens to prefill.
    pub load_weight_tokens: f64,
    pub kv_index_max_entries: usize,
    pub tokenize_timeout: Duration,
    /// Models the router tokenizes itself (`balancing.tokenizers`).
    pub tokenizers: LocalTokenizers,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub stall_timeout: Duration,
    /// Longest wait for the rest of a client's request once it began.
    pub client_read_timeout: Duration,
    /// A kept-alive client connection idle this long is closed.
    pub client_idle_timeout: Duration,
    pub max_retries: u32,
    pub consecutive_failures: u32,
    pub probe_interval: Duration,
    pub max_body_bytes: usize,
    /// Empty: no authentication.
    pub api_keys: Vec<KeyGrant>,
    /// Mid-stream failover.
    pub resume: ResumeSettings,
    /// How long a request for a model scaled to zero waits for a replica.
    pub hold_for_replica: Duration,
    /// Requests held for such models at once; more get a 503.
    pub max_held_requests: usize,
    /// SSE comment interval on a held stream; zero sends none.
    pub held_keep_alive: Duration,
}

/// One API key and the models it may use (empty: all).
#[derive(Clone)]
pub struct KeyGrant {
    pub name: String,
    pub key: String,
    pub models: Vec<String>,
}

impl std::fmt::Debug for KeyGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key itself never reaches a log.
        f.debug_struct("KeyGrant")
            .field("name", &self.name)
            .field("models", &self.models)
            .finish_non_exhaustive()
    }
}

impl Default for Settings {
    fn default() -> Self {
        let balancing = llmgw_config::Balancing::defaults();
        let timeouts = llmgw_config::RouterTimeouts::defaults();
        let ejection = llmgw_config::Ejection::defaults();
        let scale_from_zero = llmgw_config::ScaleFromZero::defaults();
        Settings {
            policy: balancing.policy,
            prefix_bytes: balancing.prefix_bytes,
            load_factor: balancing.load_factor,
            metrics_interval: balancing.metrics_interval,
            load_weight_tokens: balancing.load_weight_tokens,
            kv_index_max_entries: balancing.kv_index_max_entries,
            tokenize_timeout: balancing.tokenize_timeout,
            tokenizers: LocalTokenizers::default(),
            connect_timeout: timeouts.connect,
            request_timeout: timeouts.request,
            stall_timeout: timeouts.stall,
            client_read_timeout: timeouts.client_read,
            client_idle_timeout: timeouts.client_idle,
            max_retries: 2,
            consecutive_failures: ejection.consecutive_failures,
            probe_interval: ejection.probe_interval,
            max_body_bytes: 16 * 1024 * 1024,
            api_keys: Vec::new(),
            resume: ResumeSettings::default(),
            hold_for_replica: scale_from_zero.hold,
            max_held_requests: scale_from_zero.max_held,
            held_keep_alive: scale_from_zero.keep_alive,
        }
    }
}

/// Why a file holding a secret (an API key, a token) gave none.
pub(crate) enum SecretFileError {
    Unreadable(std::io::Error),
    Empty,
}

/// The secret in `file`, trimmed of surrounding whitespace (files usually
/// end with a newline).
pub(crate) fn read_secret_file(file: &std::path::Path) -> Result<String, SecretFileError> {
    let text = std::fs::read_to_string(file).map_err(SecretFileError::Unreadable)?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(SecretFileError::Empty);
    }
    Ok(secret.to_owned())
}

impl Settings {
    /// Reads the key files named in the config; the keys are trimmed of
    /// surrounding whitespace (files usually end with a newline).
    pub fn from_config(config: &RouterConfig) -> Result<Self, RouterError> {
        let mut api_keys = Vec::with_capacity(config.api_keys.len());
        for key in &config.api_keys {
            let secret = read_secret_file(&key.key_file).map_err(|e| match e {
                SecretFileError::Unreadable(source) => RouterError::KeyFile {
                    name: key.name.clone(),
                    file: key.key_file.clone(),
                    source,
                },
                SecretFileError::Empty => RouterError::EmptyKey {
                    name: key.name.clone(),
                    file: key.key_file.clone(),
                },
            })?;
            api_keys.push(KeyGrant {
                name: key.name.clone(),
                key: secret,
                models: key.models.clone(),
            });
        }
        Ok(Settings {
            policy: config.balancing.policy,
            prefix_bytes: config.balancing.prefix_bytes,
            load_factor: config.balancing.load_factor,
            metrics_interval: config.balancing.metrics_interval,
            load_weight_tokens: config.balancing.load_weight_tokens,
            kv_index_max_entries: config.balancing.kv_index_max_entries,
            tokenize_timeout: config.balancing.tokenize_timeout,
            tokenizers: LocalTokenizers::load(
                &config.balancing.tokenizers,
                config.balancing.tokenizer_check_every,
            )?,
            connect_timeout: config.timeouts.connect,
            request_timeout: config.timeouts.request,
            stall_timeout: config.timeouts.stall,
            client_read_timeout: config.timeouts.client_read,
            client_idle_timeout: config.timeouts.client_idle,
            max_retries: config.max_retries,
            consecutive_failures: config.ejection.consecutive_failures,
            probe_interval: config.ejection.probe_interval,
            max_body_bytes: config.max_body_bytes,
            api_keys,
            resume: ResumeSettings {
                enabled: config.resume.enabled,
                max_resumptions: config.resume.max_resumptions,
                max_text_bytes: config.resume.max_text_bytes,
                memory_cap_bytes: config.resume.memory_cap_bytes,
            },
            hold_for_replica: config.scale_from_zero.hold,
            max_held_requests: config.scale_from_zero.max_held,
            held_keep_alive: config.scale_from_zero.keep_alive,
        })
    }
}
