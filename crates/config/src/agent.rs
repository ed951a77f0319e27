//! `agent.yaml`: one per GPU node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

use llmgw_catalog::LaunchMode;
use llmgw_engine_options::{DEFAULT_SGLANG_VERSION, DEFAULT_VLLM_VERSION, Version};
use llmgw_engines::{EnginesConfig, SglangConfig, VLLM_MP_MIN_VERSION, VllmConfig};
use llmgw_yaml::{Cx, Decode, Fields, Node, Path};
use serde::Serialize;

use crate::common::{
    ConfigError, TlsConfig, decode_transport, grpc_authority, read_file, relative_to,
};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentConfig {
    pub node_id: String,
    /// Control-plane peers' gRPC addresses (`host:port`); the agent may dial
    /// any and is redirected to the leader.
    pub servers: Vec<String>,
    /// The address engines are reachable on and NCCL bootstraps over.
    pub mgmt_addr: String,
    pub mgmt_interface: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub heartbeat_interval: Duration,
    /// Hearing nothing from the peer it is attached to for this long, the
    /// agent drops the stream and finds the leader again. `None`: twice the
    /// heartbeat interval in force, and at least 2 s.
    pub leader_timeout: Option<Duration>,
    pub reconnect_base: Duration,
    pub reconnect_max: Duration,
    pub fabrics: Vec<FabricConfig>,
    pub discovery: DiscoveryConfig,
    pub engines: EnginesConfig,
    pub supervisor: SupervisorConfig,
    pub tls: Option<TlsConfig>,
    pub insecure: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FabricConfig {
    pub name: String,
    pub hcas: Vec<String>,
    pub rate_gbps: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscoveryConfig {
    /// Explicit `nvidia-smi` path; `None` searches `PATH`.
    pub nvidia_smi: Option<PathBuf>,
    pub ib_root: PathBuf,
    pub prefer_nvml: bool,
    pub skip_gpus: bool,
    /// A file describing simulated hardware (tests and `llmgw dev` only).
    pub fixture: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SupervisorConfig {
    pub work_dir: PathBuf,
    pub log_lines: usize,
    /// Each engine's log file is cut to half when it passes this size.
    pub log_max_bytes: u64,
    pub stop_timeout: Duration,
    pub health_interval: Duration,
    /// How long an engine may load before it is declared hung and stopped.
    pub startup_timeout: Duration,
}

impl AgentConfig {
    pub fn load(path: &FsPath) -> Result<Self, ConfigError> {
        let (name, text) = read_file(path)?;
        let config = Self::parse(&name, &text)?;
        Ok(config.resolve_paths(path))
    }

    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        Self::parse_with(file, text, &[])
    }

    /// Loads the file with top-level `overrides` (`node_id`, `mgmt_addr`
    /// from the command line or environment) in place of the file's own
    /// values: a DaemonSet shares one file across nodes. Overridden values
    /// are checked exactly as if the file said them.
    pub fn load_with(path: &FsPath, overrides: &[(&str, String)]) -> Result<Self, ConfigError> {
        let (name, text) = read_file(path)?;
        let config = Self::parse_with(&name, &text, overrides)?;
        Ok(config.resolve_paths(path))
    }

    pub fn parse_with(
        file: &str,
        text: &str,
        overrides: &[(&str, String)],
    ) -> Result<Self, ConfigError> {
        Ok(llmgw_yaml::load(file, text, |node, cx| {
            if overrides.is_empty() {
                return Self::decode(node, &Path::root(), cx);
            }
            let mut node = node.clone();
            if let llmgw_yaml::Value::Map(entries) = &mut node.value {
                for (key, value) in overrides {
                    entries.retain(|e| e.key != *key);
                    entries.push(llmgw_yaml::Entry {
                        key: (*key).to_owned(),
                        key_pos: node.pos,
                        value: llmgw_yaml::Node {
                            pos: node.pos,
                            value: llmgw_yaml::Value::Scalar {
                                text: value.clone(),
                                quoted: true,
                            },
                        },
                    });
                }
            }
            Self::decode(&node, &Path::root(), cx)
        })?)
    }

    fn resolve_paths(mut self, file: &FsPath) -> Self {
        self.discovery.fixture = self.discovery.fixture.map(|p| relative_to(file, p));
        self.tls = self.tls.map(|t| t.resolve(file));
        self
    }

    /// Things that are allowed but worth saying out loud.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.tls.is_none() && !self.insecure {
            out.push(
                "no `tls` section and no `insecure: true`: `llmgw agent` refuses to start; add \
                 `tls` (ca, cert, key) or set `insecure: true` to say plaintext is intended"
                    .to_string(),
            );
        }
        if self.insecure {
            out.push(
                "insecure: true — the agent stream is plaintext; use only on a trusted network"
                    .to_string(),
            );
        }
        out
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

const AGENT_KEYS: &[&str] = &[
    "node_id",
    "server",
    "servers",
    "mgmt_addr",
    "mgmt_interface",
    "labels",
    "heartbeat_interval",
    "leader_timeout",
    "reconnect_base",
    "reconnect_max",
    "fabrics",
    "discovery",
    "engines",
    "supervisor",
    "tls",
    "insecure",
];

impl Decode for AgentConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, AGENT_KEYS)?;
        let node_id: String = f.or(cx, "node_id", hostname());
        if let Err(why) = llmgw_node_id::check_node_id(&node_id) {
            f.report(cx, "node_id", why);
        }
        let servers = decode_servers(&f, cx);
        let mgmt_addr: Option<String> = f.required(cx, "mgmt_addr");
        let labels: BTreeMap<String, String> = f.or(cx, "labels", BTreeMap::new());
        let heartbeat_interval: Duration = f.or(cx, "heartbeat_interval", Duration::from_secs(5));
        let leader_timeout: Option<Duration> = f.optional(cx, "leader_timeout");
        if leader_timeout.is_some_and(|t| t <= heartbeat_interval) {
            f.report(
                cx,
                "leader_timeout",
                "must be longer than heartbeat_interval: the leader answers each heartbeat",
            );
        }
        let reconnect_base: Duration = f.or(cx, "reconnect_base", Duration::from_secs(1));
        let reconnect_max: Duration = f.or(cx, "reconnect_max", Duration::from_secs(30));
        if heartbeat_interval < Duration::from_millis(100)
            || heartbeat_interval > Duration::from_secs(60)
        {
            f.report(cx, "heartbeat_interval", "must be between 100ms and 1m");
        }
        if reconnect_base.is_zero() {
            f.report(
                cx,
                "reconnect_base",
                "must be more than 0s, or a fleet reconnects in lockstep",
            );
        }
        if reconnect_max < reconnect_base {
            f.report(cx, "reconnect_max", "must be at least reconnect_base");
        }
        let fabrics: Vec<FabricConfig> = f.or(cx, "fabrics", Vec::new());
        check_fabrics(&f, cx, &fabrics);
        let discovery: DiscoveryConfig = f
            .optional(cx, "discovery")
            .unwrap_or_else(DiscoveryConfig::defaults);
        let engines = optional_with(&f, cx, "engines", decode_engines).unwrap_or_default();
        if engines.vllm.is_none() && engines.sglang.is_none() && f.has("engines") {
            f.report(
                cx,
                "engines",
                "configure at least one engine (`vllm` or `sglang`)",
            );
        }
        let supervisor: SupervisorConfig = f
            .optional(cx, "supervisor")
            .unwrap_or_else(SupervisorConfig::defaults);
        let (tls, insecure) = decode_transport(&f, cx);
        Some(AgentConfig {
            node_id,
            servers: servers?,
            mgmt_addr: mgmt_addr?,
            mgmt_interface: f.optional(cx, "mgmt_interface"),
            labels,
            heartbeat_interval,
            leader_timeout,
            reconnect_base,
            reconnect_max,
            fabrics,
            discovery,
            engines,
            supervisor,
            tls,
            insecure,
        })
    }
}

/// `servers:` is the normal form; the original single `server:` still loads
/// as a one-peer list.
fn decode_servers(f: &Fields<'_>, cx: &mut Cx) -> Option<Vec<String>> {
    let (key, raw): (&str, Vec<String>) = match (f.has("server"), f.has("servers")) {
        (true, true) => {
            f.report(
                cx,
                "server",
                "give either `server` (one peer) or `servers` (a list), not both",
            );
            return None;
        }
        (true, false) => ("server", vec![f.required(cx, "server")?]),
        (false, true) => ("servers", f.required(cx, "servers")?),
        (false, false) => {
            cx.report(
                f.pos(),
                &f.path().field("servers"),
                "required field is missing: list the control-plane peers' gRPC addresses",
            );
            return None;
        }
    };
    if raw.is_empty() {
        f.report(cx, key, "list at least one control-plane peer");
    }
    let mut out = Vec::new();
    for (i, text) in raw.iter().enumerate() {
        match grpc_authority(text) {
            Ok(addr) => out.push(addr),
            Err(why) => {
                let (at, path) = if key == "servers" {
                    (f.item_pos(key, i), f.path().field(key).index(i))
                } else {
                    (f.node(key).map_or(f.pos(), |n| n.pos), f.path().field(key))
                };
                cx.report(at, &path, why);
            }
        }
    }
    (out.len() == raw.len()).then_some(out)
}

fn check_fabrics(f: &Fields<'_>, cx: &mut Cx, fabrics: &[FabricConfig]) {
    let mut names = BTreeSet::new();
    let mut hca_owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (i, fabric) in fabrics.iter().enumerate() {
        let at = f.item_pos("fabrics", i);
        let path = f.path().field("fabrics").index(i);
        if !names.insert(fabric.name.as_str()) {
            cx.report(
                at,
                &path.field("name"),
                format!("fabric `{}` is listed twice", fabric.name),
            );
        }
        for hca in &fabric.hcas {
            if let Some(other) = hca_owner.insert(hca, &fabric.name) {
                cx.report(
                    at,
                    &path.field("hcas"),
                    format!(
                        "HCA `{hca}` is already in fabric `{other}`; an HCA is on one fabric only"
                    ),
                );
            }
        }
    }
}

impl Decode for FabricConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["name", "hcas", "rate_gbps"])?;
        let name: Option<String> = f.required(cx, "name");
        let hcas: Option<Vec<String>> = f.required(cx, "hcas");
        if hcas.as_ref().is_some_and(Vec::is_empty) {
            f.report(
                cx,
                "hcas",
                "list the HCAs (e.g. mlx5_0) that connect this node to the fabric",
            );
        }
        let rate_gbps: Option<u32> = f.optional(cx, "rate_gbps");
        if rate_gbps == Some(0) {
            f.report(cx, "rate_gbps", "must be more than 0");
        }
        Some(FabricConfig {
            name: name?,
            hcas: hcas?,
            rate_gbps,
        })
    }
}

impl DiscoveryConfig {
    fn defaults() -> Self {
        DiscoveryConfig {
            nvidia_smi: None,
            ib_root: PathBuf::from("/sys/class/infiniband"),
            prefer_nvml: true,
            skip_gpus: false,
            fixture: None,
        }
    }
}

impl Decode for DiscoveryConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "nvidia_smi",
                "ib_root",
                "prefer_nvml",
                "skip_gpus",
                "fixture",
            ],
        )?;
        let defaults = DiscoveryConfig::defaults();
        // The original example writes `nvidia_smi: ""` for "search PATH".
        let nvidia_smi: Option<String> = f.optional(cx, "nvidia_smi");
        Some(DiscoveryConfig {
            nvidia_smi: nvidia_smi.filter(|s| !s.is_empty()).map(PathBuf::from),
            ib_root: f.or(cx, "ib_root", defaults.ib_root),
            prefer_nvml: f.or(cx, "prefer_nvml", defaults.prefer_nvml),
            skip_gpus: f.or(cx, "skip_gpus", defaults.skip_gpus),
            fixture: f.optional(cx, "fixture"),
        })
    }
}

/// A field decoded by a function: the engine settings are `llmgw-engines`
/// types, which cannot implement this crate's foreign `Decode` trait.
fn optional_with<T>(
    f: &Fields<'_>,
    cx: &mut Cx,
    key: &str,
    decode: fn(&Node, &Path, &mut Cx) -> Option<T>,
) -> Option<T> {
    let node = f.node(key)?;
    decode(node, &f.path().field(key), cx)
}

fn decode_engines(node: &Node, path: &Path, cx: &mut Cx) -> Option<EnginesConfig> {
    let f = cx.map(node, path, &["vllm", "sglang"])?;
    Some(EnginesConfig {
        vllm: optional_with(&f, cx, "vllm", decode_vllm),
        sglang: optional_with(&f, cx, "sglang", decode_sglang),
    })
}

fn decode_version(f: &Fields<'_>, cx: &mut Cx, default: Version) -> Version {
    let Some(text) = f.optional::<String>(cx, "version") else {
        return default;
    };
    Version::parse(&text).unwrap_or_else(|| {
        f.report(
            cx,
            "version",
            format!("invalid version {text:?}; write it as e.g. `0.11.1`"),
        );
        default
    })
}

fn decode_vllm(node: &Node, path: &Path, cx: &mut Cx) -> Option<VllmConfig> {
    let f = cx.map(
        node,
        path,
        &["bin", "launch_mode", "ray_bin", "version", "env"],
    )?;
    let bin: Option<PathBuf> = f.required(cx, "bin");
    let launch_mode: LaunchMode = f.or(cx, "launch_mode", LaunchMode::Mp);
    let ray_bin: Option<PathBuf> = f.optional(cx, "ray_bin");
    let version = decode_version(&f, cx, DEFAULT_VLLM_VERSION);
    if launch_mode == LaunchMode::Ray && ray_bin.is_none() {
        f.report(
            cx,
            "ray_bin",
            "launch_mode `ray` needs `ray_bin`, the `ray` executable of the vLLM environment",
        );
    }
    if launch_mode == LaunchMode::Mp && version < VLLM_MP_MIN_VERSION {
        f.report(
            cx,
            "launch_mode",
            format!("launch_mode `mp` needs vLLM {VLLM_MP_MIN_VERSION} or newer (--nnodes); version {version} only supports `ray`"),
        );
    }
    Some(VllmConfig {
        bin: bin?,
        launch_mode,
        ray_bin,
        version,
        env: f.or(cx, "env", BTreeMap::new()),
    })
}

fn decode_sglang(node: &Node, path: &Path, cx: &mut Cx) -> Option<SglangConfig> {
    let f = cx.map(node, path, &["python", "version", "env"])?;
    let python: Option<PathBuf> = f.required(cx, "python");
    Some(SglangConfig {
        python: python?,
        version: decode_version(&f, cx, DEFAULT_SGLANG_VERSION),
        env: f.or(cx, "env", BTreeMap::new()),
    })
}

impl SupervisorConfig {
    fn defaults() -> Self {
        SupervisorConfig {
            work_dir: PathBuf::from("/var/lib/llmgw-agent"),
            log_lines: 512,
            log_max_bytes: 64 * 1024 * 1024,
            stop_timeout: Duration::from_secs(60),
            health_interval: Duration::from_secs(2),
            startup_timeout: Duration::from_secs(30 * 60),
        }
    }
}

impl Decode for SupervisorConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "work_dir",
                "log_lines",
                "log_max_bytes",
                "stop_timeout",
                "health_interval",
                "startup_timeout",
            ],
        )?;
        let d = SupervisorConfig::defaults();
        let out = SupervisorConfig {
            work_dir: f.or(cx, "work_dir", d.work_dir),
            log_lines: f.or(cx, "log_lines", d.log_lines),
            log_max_bytes: f.or(cx, "log_max_bytes", d.log_max_bytes),
            stop_timeout: f.or(cx, "stop_timeout", d.stop_timeout),
            health_interval: f.or(cx, "health_interval", d.health_interval),
            startup_timeout: f.or(cx, "startup_timeout", d.startup_timeout),
        };
        if out.log_lines == 0 || out.log_lines > 100_000 {
            f.report(cx, "log_lines", "must be between 1 and 100000");
        }
        if out.log_max_bytes < 64 * 1024 {
            f.report(
                cx,
                "log_max_bytes",
                "must be at least 65536 so a failure's tail fits",
            );
        }
        if out.health_interval < Duration::from_millis(50) {
            f.report(cx, "health_interval", "must be at least 50ms");
        }
        if out.startup_timeout <= out.health_interval {
            f.report(cx, "startup_timeout", "must be longer than health_interval");
        }
        Some(out)
    }
}
