//! A shard as the leader asked for it: the wire `ShardSpec` read into a
//! checked, serialisable form that the state file keeps and the spec hash
//! covers.

use std::collections::BTreeMap;

use llmgw_catalog::{Engine, LaunchMode, Profile};
use llmgw_engines::{FabricAssignment, KvEventSockets, ShardAssignment};
use llmgw_proto::agent::ShardSpec;
use serde::{Deserialize, Serialize};

/// Why a `ShardSpec` from the wire cannot be used at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "shard id {0:?} is not usable: use 1-128 characters from letters, digits, `.`, `_` and `-`"
    )]
    BadShardId(String),
    #[error("shard {shard}: {source}")]
    UnknownEngine {
        shard: String,
        source: llmgw_catalog::UnknownEngine,
    },
    #[error("shard {shard}: {why} (or empty)")]
    UnknownLaunchMode { shard: String, why: String },
    #[error("shard {shard}: {field} {value} is not a TCP port")]
    BadPort {
        shard: String,
        field: &'static str,
        value: u32,
    },
    #[error("shard {shard}: {field} must be at least 1")]
    Zero { shard: String, field: &'static str },
}

/// One shard to run on this node, as commanded. Every field but the
/// shard's identity reads as its default when absent: a state file written
/// by an older agent, before a field existed, still loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub shard_id: String,
    pub replica_id: String,
    pub model: String,
    #[serde(default)]
    pub source: String,
    /// Catalog aliases, served after `model`.
    #[serde(default)]
    pub aliases: Vec<String>,
    pub engine: Engine,
    #[serde(default)]
    pub profile: String,
    #[serde(default)]
    pub nodes: u32,
    #[serde(default)]
    pub rank: u32,
    #[serde(default)]
    pub gpus: Vec<u32>,
    #[serde(default)]
    pub gpus_per_node: u32,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub tensor_parallel: u32,
    #[serde(default)]
    pub pipeline_parallel: u32,
    /// Data-parallel ranks; left out of the state file (and so of the spec
    /// hash) when 1, so a shard launched before the field existed is still
    /// recognised as the same spec.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub data_parallel: u32,
    #[serde(default)]
    pub master_addr: String,
    #[serde(default)]
    pub master_port: u16,
    #[serde(default)]
    pub fabric: Option<String>,
    #[serde(default)]
    pub launch_mode: Option<LaunchMode>,
    #[serde(default)]
    pub min_gpu_memory_gb: u32,
    #[serde(default)]
    pub gpu_models: Vec<String>,
    #[serde(default)]
    pub engine_args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The head's KV event publisher ports; 0 when not asked to publish.
    #[serde(default)]
    pub kv_events_port: u16,
    #[serde(default)]
    pub kv_replay_port: u16,
    /// Launched able to sleep (vLLM sleep mode). False is left out of the
    /// hash, so shards launched before the field existed keep theirs.
    #[serde(default)]
    pub sleep_mode: bool,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Shard ids become file names in `work_dir`, so they are kept to a safe set.
pub fn check_shard_id(id: &str) -> Result<(), SpecError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(SpecError::BadShardId(id.to_string()))
    }
}

fn port(shard: &str, field: &'static str, value: u32) -> Result<u16, SpecError> {
    u16::try_from(value).map_err(|_| SpecError::BadPort {
        shard: shard.to_string(),
        field,
        value,
    })
}

impl LaunchSpec {
    pub fn from_proto(spec: &ShardSpec) -> Result<Self, SpecError> {
        let shard = spec.shard_id.clone();
        check_shard_id(&shard)?;
        let engine: Engine = spec
            .engine
            .parse()
            .map_err(|source| SpecError::UnknownEngine {
                shard: shard.clone(),
                source,
            })?;
        let launch_mode =
            match spec.launch_mode.as_str() {
                "" => None,
                mode => Some(mode.parse::<LaunchMode>().map_err(|why| {
                    SpecError::UnknownLaunchMode {
                        shard: shard.clone(),
                        why,
                    }
                })?),
            };
        for (field, value) in [
            ("nodes", spec.nodes),
            ("tensor_parallel", spec.tensor_parallel),
            ("pipeline_parallel", spec.pipeline_parallel),
        ] {
            if value == 0 {
                return Err(SpecError::Zero { shard, field });
            }
        }
        // `master_addr` may carry the port (`host:port`) as its comment says.
        let (master_addr, embedded_port) = match spec.master_addr.rsplit_once(':') {
            Some((host, p)) if p.parse::<u16>().is_ok() && !host.is_empty() => {
                (host.to_string(), p.parse::<u16>().ok())
            }
            _ => (spec.master_addr.clone(), None),
        };
        let master_port = match (spec.master_port, embedded_port) {
            (0, Some(p)) => p,
            (p, _) => port(&shard, "master_port", p)?,
        };
        let gpus_per_node = if spec.gpus_per_node == 0 {
            (spec.tensor_parallel * spec.pipeline_parallel * spec.data_parallel.max(1)) / spec.nodes
        } else {
            spec.gpus_per_node
        };
        let aliases = spec
            .served_names
            .iter()
            .filter(|n| **n != spec.model)
            .cloned()
            .collect();
        Ok(LaunchSpec {
            replica_id: spec.replica_id.clone(),
            model: spec.model.clone(),
            source: spec.source.clone(),
            aliases,
            engine,
            profile: spec.profile.clone(),
            nodes: spec.nodes,
            rank: spec.rank,
            gpus: spec.gpus.clone(),
            gpus_per_node,
            port: port(&shard, "port", spec.port)?,
            tensor_parallel: spec.tensor_parallel,
            pipeline_parallel: spec.pipeline_parallel,
            data_parallel: spec.data_parallel.max(1),
            master_addr,
            master_port,
            fabric: (!spec.fabric.is_empty()).then(|| spec.fabric.clone()),
            launch_mode,
            min_gpu_memory_gb: spec.min_gpu_memory_gb,
            gpu_models: spec.gpu_models.clone(),
            engine_args: spec.engine_args.clone(),
            env: spec.env.clone().into_iter().collect(),
            kv_events_port: port(&shard, "kv_events_port", spec.kv_events_port)?,
            kv_replay_port: port(&shard, "kv_replay_port", spec.kv_replay_port)?,
            sleep_mode: spec.sleep_mode,
            shard_id: shard,
        })
    }

    /// The wire form, for tests and for the fake control plane.
    pub fn to_proto(&self) -> ShardSpec {
        ShardSpec {
            shard_id: self.shard_id.clone(),
            replica_id: self.replica_id.clone(),
            model: self.model.clone(),
            source: self.source.clone(),
            served_names: std::iter::once(self.model.clone())
                .chain(self.aliases.iter().cloned())
                .collect(),
            engine: self.engine.as_str().to_string(),
            profile: self.profile.clone(),
            nodes: self.nodes,
            rank: self.rank,
            gpus: self.gpus.clone(),
            port: u32::from(self.port),
            tensor_parallel: self.tensor_parallel,
            pipeline_parallel: self.pipeline_parallel,
            data_parallel: self.data_parallel,
            master_addr: self.master_addr.clone(),
            master_port: u32::from(self.master_port),
            fabric: self.fabric.clone().unwrap_or_default(),
            engine_args: self.engine_args.clone(),
            env: self.env.clone().into_iter().collect(),
            gpus_per_node: self.gpus_per_node,
            launch_mode: self
                .launch_mode
                .map(|m| m.as_str().to_string())
                .unwrap_or_default(),
            min_gpu_memory_gb: self.min_gpu_memory_gb,
            gpu_models: self.gpu_models.clone(),
            kv_events_port: u32::from(self.kv_events_port),
            kv_replay_port: u32::from(self.kv_replay_port),
            sleep_mode: self.sleep_mode,
            asleep: false,
        }
    }

    pub fn profile(&self) -> Profile {
        Profile {
            name: self.profile.clone(),
            engine: self.engine,
            engine_version: None,
            nodes: self.nodes,
            gpus_per_node: self.gpus_per_node,
            tensor_parallel: self.tensor_parallel,
            pipeline_parallel: self.pipeline_parallel,
            data_parallel: self.data_parallel,
            min_gpu_memory_gb: self.min_gpu_memory_gb,
            gpu_models: self.gpu_models.clone(),
            launch_mode: self.launch_mode,
            engine_args: self.engine_args.clone(),
            env: self.env.clone(),
        }
    }

    /// What the engine adapters take, with this node's HCAs on the fabric.
    pub fn assignment(&self, fabric: Option<FabricAssignment>) -> ShardAssignment {
        ShardAssignment {
            shard_id: self.shard_id.clone(),
            replica_id: self.replica_id.clone(),
            model: self.model.clone(),
            aliases: self.aliases.clone(),
            source: self.source.clone(),
            profile: self.profile(),
            rank: self.rank,
            gpus: self.gpus.clone(),
            port: self.port,
            head_addr: self.master_addr.clone(),
            rendezvous_port: self.master_port,
            fabric,
            kv_events: (self.kv_events_port != 0 && self.kv_replay_port != 0).then_some(
                KvEventSockets {
                    stream: self.kv_events_port,
                    replay: self.kv_replay_port,
                },
            ),
            sleep_mode: self.sleep_mode,
        }
    }

    /// A stable digest of everything that decides how the shard runs: two
    /// commands with the same hash start the same processes. Taken over a
    /// canonical form (fields sorted by name, fields at their default left
    /// out), so a field added to a later build, absent from every older
    /// command and state file, changes no hash: an agent upgraded under
    /// running engines recognises them when the leader sends them again.
    pub fn hash(&self) -> String {
        let encoded = serde_json::to_value(self).unwrap_or_default();
        let mut fields: Vec<(&String, &serde_json::Value)> = encoded
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, value)| !is_default(value))
            .collect();
        fields.sort_by(|a, b| a.0.cmp(b.0));
        let mut canonical = String::new();
        for (name, value) in fields {
            canonical.push_str(name);
            canonical.push('=');
            canonical.push_str(&value.to_string());
            canonical.push('\n');
        }
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in canonical.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

fn is_default(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null => true,
        serde_json::Value::Bool(b) => !b,
        serde_json::Value::Number(n) => n.as_u64() == Some(0),
        serde_json::Value::String(s) => s.is_empty(),
        serde_json::Value::Array(items) => items.is_empty(),
        serde_json::Value::Object(fields) => fields.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> ShardSpec {
        ShardSpec {
            shard_id: "r1-s0".into(),
            replica_id: "r1".into(),
            model: "qwen".into(),
            source: "Qwen/Qwen2.5-0.5B-Instruct".into(),
            served_names: vec!["qwen".into(), "q".into()],
            engine: "vllm".into(),
            profile: "tp1".into(),
            nodes: 1,
            gpus: vec![0],
            port: 8000,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            ..Default::default()
        }
    }

    #[test]
    fn data_parallel_one_leaves_the_spec_hash_as_it_was() {
        let spec = LaunchSpec::from_proto(&wire()).unwrap();
        assert_eq!(spec.data_parallel, 1, "0 on the wire reads as 1");
        let written = serde_json::to_string(&spec).unwrap();
        assert!(!written.contains("data_parallel"), "{written}");
        let mut two = spec.clone();
        two.data_parallel = 2;
        assert_ne!(two.hash(), spec.hash());
        let again = LaunchSpec::from_proto(&two.to_proto()).unwrap();
        assert_eq!(again.data_parallel, 2);
    }

    #[test]
    fn wire_spec_round_trips_and_derives_gpus_per_node() {
        let spec = LaunchSpec::from_proto(&wire()).unwrap();
        assert_eq!(spec.gpus_per_node, 1);
        assert_eq!(spec.aliases, vec!["q".to_string()]);
        let again = LaunchSpec::from_proto(&spec.to_proto()).unwrap();
        assert_eq!(again, spec);
        assert_eq!(again.hash(), spec.hash());
    }

    #[test]
    fn hash_changes_with_anything_that_changes_the_launch() {
        let a = LaunchSpec::from_proto(&wire()).unwrap();
        let mut b = a.clone();
        b.engine_args.push("--enforce-eager".into());
        assert_ne!(a.hash(), b.hash());
    }

    /// A state file an older agent wrote, before some fields existed:
    /// it loads, and its spec hashes as the same command does now, so the
    /// engine it records is recognised, not refused as a different spec.
    #[test]
    fn a_spec_recorded_before_a_field_existed_is_the_same_spec() {
        let now = LaunchSpec::from_proto(&wire()).unwrap();
        let mut older = serde_json::to_value(&now).unwrap();
        let fields = older.as_object_mut().unwrap();
        for added_later in ["gpu_models", "min_gpu_memory_gb", "launch_mode", "env"] {
            fields.remove(added_later);
        }
        let recorded: LaunchSpec = serde_json::from_value(older).expect("an older record loads");
        assert_eq!(recorded, now);
        assert_eq!(recorded.hash(), now.hash());
    }

    /// The hash is recorded in state files and compared across agent
    /// versions: it must not move when the code around it does.
    #[test]
    fn the_hash_of_a_fixed_spec_never_changes() {
        let spec = LaunchSpec::from_proto(&wire()).unwrap();
        assert_eq!(spec.hash(), PINNED_HASH);
    }

    const PINNED_HASH: &str = "631be9dda64158b2";

    #[test]
    fn master_addr_may_carry_the_port() {
        let mut w = wire();
        w.master_addr = "10.0.0.1:29501".into();
        let spec = LaunchSpec::from_proto(&w).unwrap();
        assert_eq!(
            (spec.master_addr.as_str(), spec.master_port),
            ("10.0.0.1", 29501)
        );
    }

    #[test]
    fn unusable_specs_are_refused_with_the_field() {
        let mut w = wire();
        w.shard_id = "../etc".into();
        assert!(matches!(
            LaunchSpec::from_proto(&w),
            Err(SpecError::BadShardId(_))
        ));
        let mut w = wire();
        w.engine = "trt".into();
        let err = LaunchSpec::from_proto(&w).unwrap_err().to_string();
        assert!(err.contains("unknown engine \"trt\""), "{err}");
        let mut w = wire();
        w.port = 70000;
        let err = LaunchSpec::from_proto(&w).unwrap_err().to_string();
        assert!(err.contains("port 70000 is not a TCP port"), "{err}");
    }
}
