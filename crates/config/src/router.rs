//! `router.yaml`: a standalone OpenAI router (`llmgw router`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

use llmgw_catalog::Catalog;
use llmgw_yaml::{Cx, Decode, Node, Path};
use serde::Serialize;

use crate::common::{ConfigError, read_file, relative_to};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouterConfig {
    pub listen: SocketAddr,
    /// Threads serving client traffic, each with its own listening socket;
    /// None: one per CPU.
    pub threads: Option<usize>,
    /// Admin API URLs of control-plane peers to watch for endpoints. The
    /// router keeps its last known endpoints while none answers.
    pub control_plane: Vec<String>,
    /// CA bundle that signed the peers' certificates, for https:// peers.
    pub control_plane_ca: Option<PathBuf>,
    /// File holding an admin API read token, for peers that require one.
    pub control_plane_token_file: Option<PathBuf>,
    /// Static catalog file (models with `endpoints`).
    pub catalog: Option<PathBuf>,
    /// Static models written inline, as in models.yaml.
    pub models: Catalog,
    pub balancing: Balancing,
    pub timeouts: RouterTimeouts,
    pub max_retries: u32,
    pub ejection: Ejection,
    pub max_body_bytes: usize,
    pub api_keys: Vec<ApiKey>,
    pub resume: Resume,
    /// How often the router reports what its API keys used to the
    /// control plane.
    pub usage_report_interval: Duration,
    pub scale_from_zero: ScaleFromZero,
}

/// Requests for a model scaled to zero are held while a replica starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScaleFromZero {
    /// How long one request waits for a ready replica before its 503.
    pub hold: Duration,
    /// Requests held at once, over every such model; more get a 503.
    pub max_held: usize,
    /// While a streamed request is held, an SSE comment is sent this often
    /// so clients and proxies see the connection alive; 0s sends none.
    pub keep_alive: Duration,
}

impl ScaleFromZero {
    pub fn defaults() -> Self {
        ScaleFromZero {
            hold: Duration::from_secs(300),
            max_held: 1024,
            keep_alive: Duration::from_secs(10),
        }
    }
}

impl Decode for ScaleFromZero {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["hold", "max_held", "keep_alive"])?;
        let d = ScaleFromZero::defaults();
        let s = ScaleFromZero {
            hold: f.or(cx, "hold", d.hold),
            max_held: f.or(cx, "max_held", d.max_held),
            keep_alive: f.or(cx, "keep_alive", d.keep_alive),
        };
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&s.hold) {
            f.report(
                cx,
                "hold",
                "between 1s and 1h: a replica's cold start plus its load time",
            );
        }
        if s.max_held > 1_000_000 {
            f.report(cx, "max_held", "at most 1000000");
        }
        if !s.keep_alive.is_zero() && s.keep_alive < Duration::from_millis(100) {
            f.report(
                cx,
                "keep_alive",
                "at least 100ms, or 0s to send no keep-alive comments",
            );
        }
        Some(s)
    }
}

/// Mid-stream failover: a stream whose engine fails after the first byte
/// is continued by another ready replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resume {
    pub enabled: bool,
    /// Resumptions one stream may use.
    pub max_resumptions: u32,
    /// Answer text one stream keeps for resuming.
    pub max_text_bytes: usize,
    /// Request bodies and answer text kept by all streams together.
    pub memory_cap_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BalancePolicy {
    /// Power of two choices on outstanding requests.
    LeastOutstanding,
    /// Bounded-load consistent hashing on the prompt prefix.
    PrefixAffinity,
    /// The engine with the lowest cost: the prompt tokens it lacks in its
    /// KV cache (from the engines' KV events) plus its load in tokens.
    /// Falls back to prefix affinity where no engine publishes events or
    /// the request's tokens are unknown.
    CacheAware,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Balancing {
    pub policy: BalancePolicy,
    /// Bytes of the prompt that pick the endpoint under prefix affinity.
    pub prefix_bytes: usize,
    /// An endpoint takes at most this factor over the mean load before the
    /// prefix's next endpoint is tried.
    pub load_factor: f64,
    /// How often engines' `/metrics` are read for load; 0s turns it off.
    pub metrics_interval: Duration,
    /// Cache-aware cost of one request of load (outstanding or queued), in
    /// prompt tokens to prefill: how many cached tokens are worth queueing
    /// behind one more request.
    pub load_weight_tokens: f64,
    /// (block, engine) pairs the prefix index holds at most.
    pub kv_index_max_entries: usize,
    /// How long the router waits for an engine's `/tokenize` before routing
    /// the request by prompt prefix instead.
    pub tokenize_timeout: Duration,
    /// Model (catalog name) to a directory on the router's host holding
    /// its tokenizer (`tokenizer.json`, `tokenizer_config.json`): the
    /// router tokenizes those models' requests itself instead of asking an
    /// engine's `/tokenize`.
    pub tokenizers: BTreeMap<String, PathBuf>,
    /// The router's own tokens are compared with an engine's `/tokenize`
    /// for a model's first requests and then one request in this many; a
    /// difference stops the router tokenizing that model.
    pub tokenizer_check_every: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouterTimeouts {
    pub connect: Duration,
    /// Whole-request deadline.
    pub request: Duration,
    /// Longest gap between two chunks of a stream.
    pub stall: Duration,
    /// Longest wait for the rest of a client's request once its first
    /// byte came: the whole head, and each pause in its body.
    pub client_read: Duration,
    /// A kept-alive client connection with no request for this long is
    /// closed.
    pub client_idle: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ejection {
    pub consecutive_failures: u32,
    pub probe_interval: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiKey {
    pub name: String,
    /// File holding the key, so the key itself never sits in config.
    pub key_file: PathBuf,
    /// Models the key may use; empty means all.
    pub models: Vec<String>,
}

impl RouterConfig {
    pub fn load(path: &FsPath) -> Result<Self, ConfigError> {
        let (name, text) = read_file(path)?;
        let mut config = Self::parse(&name, &text)?;
        config.catalog = config.catalog.map(|c| relative_to(path, c));
        for dir in config.balancing.tokenizers.values_mut() {
            *dir = relative_to(path, std::mem::take(dir));
        }
        config.control_plane_ca = config.control_plane_ca.map(|c| relative_to(path, c));
        config.control_plane_token_file = config
            .control_plane_token_file
            .map(|c| relative_to(path, c));
        for key in &mut config.api_keys {
            key.key_file = relative_to(path, std::mem::take(&mut key.key_file));
        }
        Ok(config)
    }

    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        Ok(llmgw_yaml::load(file, text, |node, cx| {
            Self::decode(node, &Path::root(), cx)
        })?)
    }
}

const ROUTER_KEYS: &[&str] = &[
    "listen",
    "threads",
    "control_plane",
    "control_plane_ca",
    "control_plane_token_file",
    "catalog",
    "models",
    "balancing",
    "timeouts",
    "max_retries",
    "ejection",
    "max_body_bytes",
    "api_keys",
    "resume",
    "usage_report_interval",
    "scale_from_zero",
];

impl Decode for RouterConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, ROUTER_KEYS)?;
        let control_plane: Vec<String> = f.or(cx, "control_plane", Vec::new());
        for (i, url) in control_plane.iter().enumerate() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                cx.report(
                    f.item_pos("control_plane", i),
                    &f.path().field("control_plane").index(i),
                    format!("{url:?} is not an admin API URL; write e.g. https://10.0.0.1:7480"),
                );
            }
        }
        let control_plane_ca: Option<PathBuf> = f.optional(cx, "control_plane_ca");
        if control_plane_ca.is_none()
            && let Some(i) = control_plane.iter().position(|u| u.starts_with("https://"))
        {
            cx.report(
                f.item_pos("control_plane", i),
                &f.path().field("control_plane").index(i),
                "an https:// peer needs `control_plane_ca`: the CA bundle that signed the peers' \
                 certificates (the `ca` of their server.yaml)",
            );
        }
        let control_plane_token_file: Option<PathBuf> = f.optional(cx, "control_plane_token_file");
        let models = match f.node("models") {
            Some(models_node) => {
                // Inline models read exactly like models.yaml's list.
                let wrapper = Node {
                    pos: f.pos(),
                    value: llmgw_yaml::Value::Map(vec![llmgw_yaml::Entry {
                        key: "models".to_string(),
                        key_pos: models_node.pos,
                        value: models_node.clone(),
                    }]),
                };
                llmgw_catalog::decode_catalog(&wrapper, cx).unwrap_or_default()
            }
            None => Catalog::default(),
        };
        let catalog: Option<PathBuf> = f.optional(cx, "catalog");
        if control_plane.is_empty() && catalog.is_none() && !f.has("models") {
            cx.report(
                f.pos(),
                path,
                "the router has nothing to route: give `control_plane` (peers to watch), `catalog` or `models`",
            );
        }
        let max_retries: u32 = f.or(cx, "max_retries", 2);
        if max_retries > 10 {
            f.report(
                cx,
                "max_retries",
                "at most 10; each retry is another replica's time",
            );
        }
        let threads: Option<usize> = f.optional(cx, "threads");
        if threads.is_some_and(|n| !(1..=1024).contains(&n)) {
            f.report(
                cx,
                "threads",
                "between 1 and 1024; leave it out for one per CPU",
            );
        }
        let max_body_bytes: usize = f.or(cx, "max_body_bytes", 16 * 1024 * 1024);
        if max_body_bytes < 1024 {
            f.report(cx, "max_body_bytes", "must be at least 1024");
        }
        let api_keys: Vec<ApiKey> = f.or(cx, "api_keys", Vec::new());
        let mut names = BTreeSet::new();
        for (i, key) in api_keys.iter().enumerate() {
            if !names.insert(key.name.as_str()) {
                cx.report(
                    f.item_pos("api_keys", i),
                    &f.path().field("api_keys").index(i).field("name"),
                    "key name is listed twice",
                );
            }
        }
        let usage_report_interval: Duration =
            f.or(cx, "usage_report_interval", Duration::from_secs(5));
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&usage_report_interval)
        {
            f.report(
                cx,
                "usage_report_interval",
                "between 100ms and 1m: each report is one write to the control plane",
            );
        }
        Some(RouterConfig {
            usage_report_interval,
            listen: f.or(cx, "listen", SocketAddr::from(([0, 0, 0, 0], 8080))),
            threads,
            control_plane,
            control_plane_ca,
            control_plane_token_file,
            catalog,
            models,
            balancing: f
                .optional(cx, "balancing")
                .unwrap_or_else(Balancing::defaults),
            timeouts: f
                .optional(cx, "timeouts")
                .unwrap_or_else(RouterTimeouts::defaults),
            max_retries,
            ejection: f
                .optional(cx, "ejection")
                .unwrap_or_else(Ejection::defaults),
            max_body_bytes,
            api_keys,
            resume: f.optional(cx, "resume").unwrap_or_else(Resume::defaults),
            scale_from_zero: f
                .optional(cx, "scale_from_zero")
                .unwrap_or_else(ScaleFromZero::defaults),
        })
    }
}

impl Resume {
    pub fn defaults() -> Self {
        Resume {
            enabled: true,
            max_resumptions: 2,
            max_text_bytes: 256 * 1024,
            memory_cap_bytes: 256 * 1024 * 1024,
        }
    }
}

impl Decode for Resume {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "enabled",
                "max_resumptions",
                "max_text_bytes",
                "memory_cap_bytes",
            ],
        )?;
        let d = Resume::defaults();
        let r = Resume {
            enabled: f.or(cx, "enabled", d.enabled),
            max_resumptions: f.or(cx, "max_resumptions", d.max_resumptions),
            max_text_bytes: f.or(cx, "max_text_bytes", d.max_text_bytes),
            memory_cap_bytes: f.or(cx, "memory_cap_bytes", d.memory_cap_bytes),
        };
        if r.max_resumptions > 10 {
            f.report(
                cx,
                "max_resumptions",
                "at most 10; each resumption is another replica's time",
            );
        }
        if r.memory_cap_bytes < r.max_text_bytes {
            f.report(
                cx,
                "memory_cap_bytes",
                "must be at least max_text_bytes, or no stream could keep its text",
            );
        }
        Some(r)
    }
}

impl Balancing {
    pub fn defaults() -> Self {
        Balancing {
            policy: BalancePolicy::LeastOutstanding,
            prefix_bytes: 256,
            load_factor: 1.25,
            metrics_interval: Duration::from_secs(2),
            load_weight_tokens: 250.0,
            kv_index_max_entries: 1_000_000,
            tokenize_timeout: Duration::from_millis(200),
            tokenizers: BTreeMap::new(),
            tokenizer_check_every: 100,
        }
    }
}

impl Decode for Balancing {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "policy",
                "prefix_bytes",
                "load_factor",
                "metrics_interval",
                "load_weight_tokens",
                "kv_index_max_entries",
                "tokenize_timeout",
                "tokenizers",
                "tokenizer_check_every",
            ],
        )?;
        let d = Balancing::defaults();
        let policy = match f.optional::<String>(cx, "policy").as_deref() {
            None | Some("least_outstanding") => BalancePolicy::LeastOutstanding,
            Some("prefix_affinity") => BalancePolicy::PrefixAffinity,
            Some("cache_aware") => BalancePolicy::CacheAware,
            Some(other) => {
                f.report(
                    cx,
                    "policy",
                    format!("unknown policy {other:?}; expected `least_outstanding`, `prefix_affinity` or `cache_aware`"),
                );
                d.policy
            }
        };
        let load_factor: f64 = f.or(cx, "load_factor", d.load_factor);
        if load_factor < 1.0 {
            f.report(
                cx,
                "load_factor",
                "must be at least 1.0 (1.0 means perfectly even load)",
            );
        }
        let load_weight_tokens: f64 = f.or(cx, "load_weight_tokens", d.load_weight_tokens);
        if !(load_weight_tokens.is_finite() && load_weight_tokens >= 0.0) {
            f.report(
                cx,
                "load_weight_tokens",
                "must be a number of tokens, 0 or more",
            );
        }
        let kv_index_max_entries: usize = f.or(cx, "kv_index_max_entries", d.kv_index_max_entries);
        if kv_index_max_entries == 0 {
            f.report(cx, "kv_index_max_entries", "must be at least 1");
        }
        let tokenizer_check_every: u64 = f.or(cx, "tokenizer_check_every", d.tokenizer_check_every);
        if tokenizer_check_every == 0 {
            f.report(
                cx,
                "tokenizer_check_every",
                "must be at least 1 (1 checks every request against an engine)",
            );
        }
        let tokenizers: BTreeMap<String, PathBuf> = f.or(cx, "tokenizers", BTreeMap::new());
        Some(Balancing {
            policy,
            prefix_bytes: f.or(cx, "prefix_bytes", d.prefix_bytes),
            load_factor,
            metrics_interval: f.or(cx, "metrics_interval", d.metrics_interval),
            load_weight_tokens,
            kv_index_max_entries,
            tokenize_timeout: f.or(cx, "tokenize_timeout", d.tokenize_timeout),
            tokenizers,
            tokenizer_check_every,
        })
    }
}

impl RouterTimeouts {
    pub fn defaults() -> Self {
        RouterTimeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(600),
            stall: Duration::from_secs(60),
            client_read: Duration::from_secs(30),
            client_idle: Duration::from_secs(75),
        }
    }
}

impl Decode for RouterTimeouts {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &["connect", "request", "stall", "client_read", "client_idle"],
        )?;
        let d = RouterTimeouts::defaults();
        let t = RouterTimeouts {
            connect: f.or(cx, "connect", d.connect),
            request: f.or(cx, "request", d.request),
            stall: f.or(cx, "stall", d.stall),
            client_read: f.or(cx, "client_read", d.client_read),
            client_idle: f.or(cx, "client_idle", d.client_idle),
        };
        for (key, value) in [
            ("client_read", t.client_read),
            ("client_idle", t.client_idle),
        ] {
            if value.is_zero() {
                f.report(cx, key, "must be longer than zero");
            }
        }
        if t.stall > t.request {
            f.report(cx, "stall", "must not exceed the request deadline");
        }
        Some(t)
    }
}

impl Ejection {
    pub fn defaults() -> Self {
        Ejection {
            consecutive_failures: 3,
            probe_interval: Duration::from_secs(2),
        }
    }
}

impl Decode for Ejection {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["consecutive_failures", "probe_interval"])?;
        let d = Ejection::defaults();
        let e = Ejection {
            consecutive_failures: f.or(cx, "consecutive_failures", d.consecutive_failures),
            probe_interval: f.or(cx, "probe_interval", d.probe_interval),
        };
        if e.consecutive_failures == 0 {
            f.report(cx, "consecutive_failures", "must be at least 1");
        }
        Some(e)
    }
}

impl Decode for ApiKey {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["name", "key_file", "models"])?;
        Some(ApiKey {
            name: f.required(cx, "name")?,
            key_file: f.required(cx, "key_file")?,
            models: f.or(cx, "models", Vec::new()),
        })
    }
}
