//! The catalog's data types. They are plain values: decoding and validation
//! live in `decode.rs`, so a `Model` that exists has passed every rule.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Catalog {
    pub models: Vec<Model>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    #[serde(flatten)]
    pub serving: Serving,
    /// What its tokens cost: usage is counted in money from it, and keys
    /// with money budgets are held to them. None: its tokens cost nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<crate::Price>,
}

/// How a model is served: by engines llmgw runs, or by endpoints it only
/// routes to. A model is exactly one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Serving {
    Managed(Managed),
    Endpoints { endpoints: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Managed {
    /// What the engine loads, e.g. a Hugging Face repository.
    pub source: String,
    pub replicas: u32,
    /// Tried in order; the first that fits the fleet is used.
    pub profiles: Vec<Profile>,
    /// How a change to this entry replaces running replicas. Left out of
    /// the stored entry when it is the default, so entries written before
    /// it existed keep their bytes.
    #[serde(default, skip_serializing_if = "RolloutPolicy::is_default")]
    pub rollout: RolloutPolicy,
    /// Replicas that follow the load between two bounds; none: always
    /// `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<Autoscale>,
    /// Which model yields GPUs when the pool is full: a model that cannot
    /// place a replica it wants takes them from an autoscaled model of
    /// lower priority running above its `min_replicas`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// How many replicas a model runs as its load changes. The signal is the
/// requests its engines hold (running and waiting, as they report them on
/// `/metrics`) per ready replica; a change must be wanted for a whole
/// window before it is made, so a burst or a lull does not move GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autoscale {
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Requests per replica (running plus waiting) the model is sized for.
    pub target_requests_per_replica: u32,
    /// How long more replicas must be wanted before one is added.
    #[serde(with = "duration_text")]
    pub scale_up_window: Duration,
    /// How long fewer replicas must be enough before one is drained.
    #[serde(with = "duration_text")]
    pub scale_down_window: Duration,
    /// The time to first token the model should keep its 90th percentile
    /// under. Above it for a whole `scale_up_window`, the model grows by
    /// a replica though its request count does not ask for one; above it,
    /// it never shrinks.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_duration_text"
    )]
    pub ttft_p90_slo: Option<Duration>,
    /// The same for the time a request waits in the engine's queue before
    /// it is scheduled.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_duration_text"
    )]
    pub queue_p90_slo: Option<Duration>,
    /// The KV cache usage, in percent, the fullest engine should stay
    /// under: engines that hold many long contexts preempt requests before
    /// their request count reaches the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage_percent: Option<u32>,
    /// With vLLM: after this long with no request, the model's replicas
    /// sleep (vLLM sleep mode level 1: weights in CPU memory, the KV cache
    /// dropped) and keep their GPUs; the first request wakes them, in
    /// seconds rather than a cold start's minutes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_duration_text"
    )]
    pub sleep_after: Option<Duration>,
    /// Requests each router sends one ready replica at a time; more wait
    /// at the router, in arrival order, for a replica with room. Without
    /// it, every request goes to an engine at once and queues there, and
    /// the queue stays on that engine when a new replica comes up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_replica: Option<u32>,
}

impl Autoscale {
    pub const DEFAULT_TARGET_REQUESTS: u32 = 8;
    pub const DEFAULT_SCALE_UP_WINDOW: Duration = Duration::from_secs(30);
    pub const DEFAULT_SCALE_DOWN_WINDOW: Duration = Duration::from_secs(300);

    /// The policy as an operator reads it.
    pub fn describe(&self) -> String {
        let targets: Vec<String> = [
            ("time to first token", self.ttft_p90_slo),
            ("queue wait", self.queue_p90_slo),
        ]
        .into_iter()
        .filter_map(|(what, slo)| {
            Some(format!(
                "the {what} (p90) under {}",
                llmgw_yaml::format_duration(slo?)
            ))
        })
        .chain(
            self.kv_cache_usage_percent
                .map(|p| format!("the KV cache usage of the fullest engine under {p}%")),
        )
        .collect();
        let slo = if targets.is_empty() {
            String::new()
        } else {
            format!(", and to keep {}", targets.join(" and "))
        };
        let queue = self.max_requests_per_replica.map_or(String::new(), |most| {
            format!("; at most {most} requests a replica from each router, the rest wait there")
        });
        let sleep = self.sleep_after.map_or(String::new(), |idle| {
            format!(
                "; asleep (vLLM sleep mode) after {} without a request",
                llmgw_yaml::format_duration(idle)
            )
        });
        format!(
            "autoscaled between {} and {} replicas, sized for {} requests (running and waiting) a replica{slo}; \
             a change must be wanted for {} to grow, {} to shrink{queue}{sleep}",
            self.min_replicas,
            self.max_replicas,
            self.target_requests_per_replica,
            llmgw_yaml::format_duration(self.scale_up_window),
            llmgw_yaml::format_duration(self.scale_down_window),
        )
    }

    /// Whether a request for the model with no replica serving is held
    /// while one starts or wakes: scaled to zero, or asleep.
    pub fn wakes_on_request(&self) -> bool {
        self.min_replicas == 0 || self.sleep_after.is_some()
    }

    /// `replicas` held within the bounds (at most `max_replicas`, should
    /// the bounds be reversed: never a panic on an entry being checked).
    pub fn clamp(&self, replicas: u32) -> u32 {
        replicas.max(self.min_replicas).min(self.max_replicas)
    }
}

/// An optional duration stored as the text an operator writes.
mod optional_duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_text::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| llmgw_yaml::parse_duration(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Durations stored as the text an operator writes (`30s`, `5m`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&llmgw_yaml::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        llmgw_yaml::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// How a changed model replaces its replicas: make-before-break, a few at
/// a time, and back to the previous entry when the new one keeps failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RolloutPolicy {
    /// New replicas started beside the old ones at once (each old replica
    /// drains once its replacement is ready).
    pub max_surge: u32,
    /// Old replicas that may be taken down before a replacement is ready,
    /// when no GPUs are free for a surge.
    pub max_unavailable: u32,
    /// Failed new replicas after which the previous entry is restored;
    /// 0: never roll back on its own.
    pub rollback_after_failures: u32,
}

impl RolloutPolicy {
    pub const DEFAULT: RolloutPolicy = RolloutPolicy {
        max_surge: 1,
        max_unavailable: 0,
        rollback_after_failures: 3,
    };

    pub fn is_default(&self) -> bool {
        *self == Self::DEFAULT
    }
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The engine family, one type from the catalog to the simulator.
pub use llmgw_engine_options::Engine;

/// How the shards of a multi-node vLLM replica find each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchMode {
    /// One `vllm serve` per node with `--nnodes/--node-rank` (vLLM >= 0.11.1).
    Mp,
    /// `ray start` on every node, `vllm serve` on the head only.
    Ray,
}

impl LaunchMode {
    pub const ALL: [LaunchMode; 2] = [LaunchMode::Mp, LaunchMode::Ray];

    pub fn as_str(self) -> &'static str {
        match self {
            LaunchMode::Mp => "mp",
            LaunchMode::Ray => "ray",
        }
    }
}

impl std::str::FromStr for LaunchMode {
    type Err = String;

    /// `mp` or `ray`; anything else is refused with the modes there are.
    fn from_str(name: &str) -> Result<Self, String> {
        LaunchMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == name)
            .ok_or_else(|| format!("unknown launch mode {name:?}; expected `mp` or `ray`"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    pub engine: Engine,
    /// The engine release whose options `engine_args` is checked against
    /// (one with option data); unset: the engine's default release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub tensor_parallel: u32,
    pub pipeline_parallel: u32,
    /// Engine ranks behind the replica's one server, each with
    /// `tensor_parallel x pipeline_parallel` GPUs of its own and its own
    /// KV cache (vLLM `--data-parallel-size`, SGLang `--dp-size`). Left
    /// out when 1, so entries and fingerprints from before it read alike.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub data_parallel: u32,
    /// Memory each GPU must have, in GB; 0 means any.
    pub min_gpu_memory_gb: u32,
    /// GPU model names that qualify (matched as substrings of the device
    /// name, so `H100` matches `NVIDIA H100 80GB HBM3`); empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// Overrides the agent's vLLM launch mode for multi-node replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_mode: Option<LaunchMode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Profile {
    pub fn total_gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }

    pub fn is_multi_node(&self) -> bool {
        self.nodes > 1
    }

    /// Whether a GPU with this device name qualifies.
    pub fn accepts_gpu_model(&self, device_name: &str) -> bool {
        self.gpu_models.is_empty()
            || self.gpu_models.iter().any(|m| {
                device_name
                    .to_ascii_lowercase()
                    .contains(&m.to_ascii_lowercase())
            })
    }
}

impl Model {
    pub fn managed(&self) -> Option<&Managed> {
        match &self.serving {
            Serving::Managed(m) => Some(m),
            Serving::Endpoints { .. } => None,
        }
    }

    pub fn static_endpoints(&self) -> &[String] {
        match &self.serving {
            Serving::Endpoints { endpoints } => endpoints,
            Serving::Managed(_) => &[],
        }
    }

    /// The model's name followed by its aliases: every name a client may use.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(self.aliases.iter().map(String::as_str))
    }

    pub fn desired_replicas(&self) -> u32 {
        self.managed().map_or(0, |m| m.replicas)
    }
}

impl Catalog {
    /// The model a client's `model` field names, by name or alias.
    pub fn resolve(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.names().any(|n| n == name))
    }

    pub fn get(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }
}
