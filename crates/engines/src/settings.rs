//! The engines a node has installed: the `engines:` section of agent.yaml.
//! `llmgw-config` decodes and validates it; adapters only read it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use llmgw_catalog::LaunchMode;
use llmgw_engine_options::Version;
use serde::Serialize;

/// The first vLLM release with `--nnodes`, which multi-node `mp` needs.
pub const VLLM_MP_MIN_VERSION: Version = Version::new(0, 11, 1);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct EnginesConfig {
    pub vllm: Option<VllmConfig>,
    pub sglang: Option<SglangConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VllmConfig {
    pub bin: PathBuf,
    pub launch_mode: LaunchMode,
    pub ray_bin: Option<PathBuf>,
    /// Decides which flags the adapter may use (`--nnodes` from
    /// [`VLLM_MP_MIN_VERSION`]).
    pub version: Version,
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SglangConfig {
    pub python: PathBuf,
    pub version: Version,
    pub env: BTreeMap<String, String>,
}
