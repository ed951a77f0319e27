//! vLLM and SGLang command lines, exactly as the engines document them.

use std::collections::BTreeMap;

use llmgw_catalog::{Engine, LaunchMode, MANAGED_ENV, managed_flag};
use llmgw_engine_options::Version;

use crate::plan::{LaunchPlan, NodeContext, ProcessRole, ProcessSpec, Readiness, ShardAssignment};
use crate::settings::{SglangConfig, VLLM_MP_MIN_VERSION, VllmConfig};

/// Why a shard cannot be launched as assigned. Each names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("this node has no `engines.{0}` section in agent.yaml, so it cannot run a {0} profile")]
    EngineNotConfigured(Engine),
    #[error(
        "profile `{profile}` needs {expected} GPU(s) on this node, but the shard was assigned {assigned}"
    )]
    GpuCount {
        profile: String,
        expected: u32,
        assigned: usize,
    },
    #[error("rank {rank} is outside the replica's {nodes} node(s)")]
    RankOutOfRange { rank: u32, nodes: u32 },
    #[error(
        "multi-node vLLM in `mp` mode needs vLLM {VLLM_MP_MIN_VERSION} or newer (--nnodes); this node has {0}"
    )]
    MpNeedsNewerVllm(Version),
    #[error("launch mode `ray` needs `engines.vllm.ray_bin` in agent.yaml")]
    RayBinMissing,
    #[error("a multi-node shard needs a fabric, and none was assigned")]
    NoFabric,
    #[error("engine argument {arg:?} sets {flag}, which llmgw manages")]
    ManagedFlag { arg: String, flag: &'static str },
    #[error("environment variable {0} is set by llmgw; remove it from the profile")]
    ManagedEnv(String),
    #[error(
        "sleep mode is for single-node vLLM replicas; this shard is {engine} on {nodes} node(s)"
    )]
    SleepModeUnsupported { engine: Engine, nodes: u32 },
}

/// Builds the launch plan for one shard on this node.
pub fn plan_shard(shard: &ShardAssignment, node: &NodeContext) -> Result<LaunchPlan, PlanError> {
    let profile = &shard.profile;
    if shard.rank >= profile.nodes {
        return Err(PlanError::RankOutOfRange {
            rank: shard.rank,
            nodes: profile.nodes,
        });
    }
    if shard.gpus.len() != profile.gpus_per_node as usize {
        return Err(PlanError::GpuCount {
            profile: profile.name.clone(),
            expected: profile.gpus_per_node,
            assigned: shard.gpus.len(),
        });
    }
    if profile.is_multi_node() && shard.fabric.is_none() {
        return Err(PlanError::NoFabric);
    }
    if shard.sleep_mode && (profile.engine != Engine::Vllm || profile.is_multi_node()) {
        return Err(PlanError::SleepModeUnsupported {
            engine: profile.engine,
            nodes: profile.nodes,
        });
    }
    // The catalog refuses these too; checked again because an agent may be
    // newer than the catalog entry it is handed.
    for arg in &profile.engine_args {
        if let Some(flag) = managed_flag(profile.engine, arg) {
            return Err(PlanError::ManagedFlag {
                arg: arg.clone(),
                flag,
            });
        }
    }
    if let Some(key) = profile
        .env
        .keys()
        .find(|k| MANAGED_ENV.contains(&k.as_str()))
    {
        return Err(PlanError::ManagedEnv(key.clone()));
    }
    match profile.engine {
        Engine::Vllm => {
            let vllm = node
                .engines
                .vllm
                .as_ref()
                .ok_or(PlanError::EngineNotConfigured(Engine::Vllm))?;
            plan_vllm(shard, node, vllm)
        }
        Engine::Sglang => {
            let sglang = node
                .engines
                .sglang
                .as_ref()
                .ok_or(PlanError::EngineNotConfigured(Engine::Sglang))?;
            Ok(plan_sglang(shard, node, sglang))
        }
    }
}

fn health_url(node: &NodeContext, port: u16) -> String {
    format!("http://{}:{port}/health", node.mgmt_addr)
}

/// The environment every engine process of a shard gets, in increasing
/// precedence: the agent's per-engine env, the profile's env, then what llmgw
/// derives from the placement (which the catalog forbids profiles to set).
fn shard_env(
    shard: &ShardAssignment,
    node: &NodeContext,
    engine_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = engine_env.clone();
    env.extend(shard.profile.env.clone());
    let gpus: Vec<String> = shard.gpus.iter().map(u32::to_string).collect();
    env.insert("CUDA_VISIBLE_DEVICES".into(), gpus.join(","));
    if let Some(ifname) = &node.mgmt_interface {
        // NCCL and Gloo bootstrap over TCP on the management network before
        // moving to RDMA; pinning the interface avoids a wrong-NIC hang.
        env.insert("NCCL_SOCKET_IFNAME".into(), ifname.clone());
        env.insert("GLOO_SOCKET_IFNAME".into(), ifname.clone());
    }
    if let Some(fabric) = &shard.fabric {
        env.insert("NCCL_IB_HCA".into(), fabric.hcas.join(","));
    }
    if shard.kv_events.is_some() {
        // vLLM 0.11 seeds its block hashes from this, randomly per process
        // when unset; a fixed seed names one prefix alike on every engine
        // and across restarts. A profile's own seed is kept.
        env.entry("PYTHONHASHSEED".into())
            .or_insert_with(|| "0".into());
    }
    env
}

/// `--kv-events-config`, on the head only: its scheduler owns the cache.
fn push_kv_events_args(args: &mut Vec<String>, shard: &ShardAssignment) {
    if let Some(kv) = &shard.kv_events {
        args.extend(["--kv-events-config".into(), kv.config_json()]);
    }
}

fn served_names(shard: &ShardAssignment) -> Vec<String> {
    std::iter::once(shard.model.clone())
        .chain(shard.aliases.iter().cloned())
        .collect()
}

fn plan_vllm(
    shard: &ShardAssignment,
    node: &NodeContext,
    vllm: &VllmConfig,
) -> Result<LaunchPlan, PlanError> {
    let mut env = shard_env(shard, node, &vllm.env);
    env.insert("VLLM_HOST_IP".into(), node.mgmt_addr.clone());
    if !shard.profile.is_multi_node() {
        return Ok(plan_vllm_single_node(shard, node, vllm, env));
    }
    match shard.profile.launch_mode.unwrap_or(vllm.launch_mode) {
        LaunchMode::Mp => plan_vllm_mp(shard, node, vllm, env),
        LaunchMode::Ray => plan_vllm_ray(shard, node, vllm, env),
    }
}

fn plan_vllm_single_node(
    shard: &ShardAssignment,
    node: &NodeContext,
    vllm: &VllmConfig,
    env: BTreeMap<String, String>,
) -> LaunchPlan {
    let mut serve = vllm_serve_args(shard);
    push_vllm_http_args(&mut serve, shard, node);
    serve.extend(vllm_parallel_args(shard));
    let mut env = env;
    if shard.sleep_mode {
        // The sleep endpoints exist only in the server's development mode;
        // set after the profile's env, so nothing turns them off. The
        // router never forwards them.
        serve.push("--enable-sleep-mode".into());
        env.insert("VLLM_SERVER_DEV_MODE".into(), "1".into());
    }
    serve.extend(shard.profile.engine_args.iter().cloned());
    LaunchPlan {
        processes: vec![engine_process(vllm.bin.clone(), serve, env)],
        readiness: vllm_health(shard, node),
        port: Some(shard.port),
    }
}

/// vLLM's own multi-node launcher: every rank runs `vllm serve`, and only
/// the head (rank 0) serves HTTP.
fn plan_vllm_mp(
    shard: &ShardAssignment,
    node: &NodeContext,
    vllm: &VllmConfig,
    env: BTreeMap<String, String>,
) -> Result<LaunchPlan, PlanError> {
    if vllm.version < VLLM_MP_MIN_VERSION {
        return Err(PlanError::MpNeedsNewerVllm(vllm.version));
    }
    let profile = &shard.profile;
    let head = shard.rank == 0;
    let mut serve = vllm_serve_args(shard);
    if head {
        push_vllm_http_args(&mut serve, shard, node);
    }
    serve.extend(vllm_parallel_args(shard));
    serve.extend([
        "--nnodes".into(),
        profile.nodes.to_string(),
        "--node-rank".into(),
        shard.rank.to_string(),
        "--master-addr".into(),
        shard.head_addr.clone(),
        "--master-port".into(),
        shard.rendezvous_port.to_string(),
    ]);
    if !head {
        serve.push("--headless".into());
    }
    serve.extend(profile.engine_args.iter().cloned());
    Ok(LaunchPlan {
        processes: vec![engine_process(vllm.bin.clone(), serve, env)],
        readiness: if head {
            vllm_health(shard, node)
        } else {
            Readiness::ProcessAlive
        },
        port: head.then_some(shard.port),
    })
}

/// Multi-node vLLM over Ray: the head runs a Ray head beside `vllm serve`,
/// the other ranks only join the Ray cluster.
fn plan_vllm_ray(
    shard: &ShardAssignment,
    node: &NodeContext,
    vllm: &VllmConfig,
    env: BTreeMap<String, String>,
) -> Result<LaunchPlan, PlanError> {
    let ray_bin = vllm.ray_bin.clone().ok_or(PlanError::RayBinMissing)?;
    let node_ip = format!("--node-ip-address={}", node.mgmt_addr);
    if shard.rank != 0 {
        return Ok(plan_ray_worker(shard, ray_bin, node_ip, env));
    }
    let ray_head = ProcessSpec {
        role: ProcessRole::RayHead,
        program: ray_bin,
        args: vec![
            "start".into(),
            "--head".into(),
            format!("--port={}", shard.rendezvous_port),
            node_ip,
            "--block".into(),
        ],
        env: env.clone(),
    };
    let mut serve = vllm_serve_args(shard);
    push_vllm_http_args(&mut serve, shard, node);
    serve.extend(vllm_parallel_args(shard));
    serve.extend(["--distributed-executor-backend".into(), "ray".into()]);
    serve.extend(shard.profile.engine_args.iter().cloned());
    Ok(LaunchPlan {
        processes: vec![ray_head, engine_process(vllm.bin.clone(), serve, env)],
        readiness: vllm_health(shard, node),
        port: Some(shard.port),
    })
}

fn plan_ray_worker(
    shard: &ShardAssignment,
    ray_bin: std::path::PathBuf,
    node_ip: String,
    env: BTreeMap<String, String>,
) -> LaunchPlan {
    let args = vec![
        "start".into(),
        format!("--address={}:{}", shard.head_addr, shard.rendezvous_port),
        node_ip,
        "--block".into(),
    ];
    LaunchPlan {
        processes: vec![ProcessSpec {
            role: ProcessRole::RayWorker,
            program: ray_bin,
            args,
            env,
        }],
        readiness: Readiness::ProcessAlive,
        port: None,
    }
}

fn vllm_serve_args(shard: &ShardAssignment) -> Vec<String> {
    vec!["serve".to_string(), shard.source.clone()]
}

/// The flags of the one process that serves the replica's HTTP API.
fn push_vllm_http_args(serve: &mut Vec<String>, shard: &ShardAssignment, node: &NodeContext) {
    serve.extend([
        "--host".into(),
        node.mgmt_addr.clone(),
        "--port".into(),
        shard.port.to_string(),
    ]);
    serve.push("--served-model-name".into());
    serve.extend(served_names(shard));
    push_kv_events_args(serve, shard);
    push_vllm_hash_algo(serve, shard);
}

/// vLLM's default block hash pickles Python objects, so one prefix can hash
/// differently under another Python or vLLM build; CBOR does not. With
/// `PYTHONHASHSEED` fixed, a prefix then has one hash on every engine of
/// the fleet. A profile's own choice (xxhash, for speed) is kept.
fn push_vllm_hash_algo(serve: &mut Vec<String>, shard: &ShardAssignment) {
    let chosen = shard
        .profile
        .engine_args
        .iter()
        .any(|arg| arg.split('=').next() == Some("--prefix-caching-hash-algo"));
    if shard.kv_events.is_some() && !chosen {
        serve.extend(["--prefix-caching-hash-algo".into(), "sha256_cbor".into()]);
    }
}

fn vllm_parallel_args(shard: &ShardAssignment) -> Vec<String> {
    let profile = &shard.profile;
    let mut args = vec![
        "--tensor-parallel-size".to_string(),
        profile.tensor_parallel.to_string(),
        "--pipeline-parallel-size".to_string(),
        profile.pipeline_parallel.to_string(),
    ];
    // Left out at 1, the engine's default: command lines from before
    // data parallelism stay as they were.
    if profile.data_parallel > 1 {
        args.extend([
            "--data-parallel-size".to_string(),
            profile.data_parallel.to_string(),
        ]);
    }
    args
}

fn vllm_health(shard: &ShardAssignment, node: &NodeContext) -> Readiness {
    Readiness::VllmHealth {
        url: health_url(node, shard.port),
    }
}

fn plan_sglang(shard: &ShardAssignment, node: &NodeContext, sglang: &SglangConfig) -> LaunchPlan {
    let profile = &shard.profile;
    let env = shard_env(shard, node, &sglang.env);
    let mut args = vec![
        "-m".to_string(),
        "sglang.launch_server".into(),
        "--model-path".into(),
        shard.source.clone(),
        "--host".into(),
        node.mgmt_addr.clone(),
        "--port".into(),
        shard.port.to_string(),
        "--served-model-name".into(),
        // SGLang takes one served name; aliases are resolved by the router.
        shard.model.clone(),
        // `--tp-size` is the total across every node of the replica.
        "--tp-size".into(),
        profile.tensor_parallel.to_string(),
        "--pp-size".into(),
        profile.pipeline_parallel.to_string(),
        // The router reads running and queued requests from /metrics.
        "--enable-metrics".into(),
    ];
    if profile.data_parallel > 1 {
        // Each rank a whole `--tp-size` of its own GPUs (no DP attention).
        args.extend(["--dp-size".into(), profile.data_parallel.to_string()]);
    }
    if profile.is_multi_node() {
        args.extend([
            "--nnodes".into(),
            profile.nodes.to_string(),
            "--node-rank".into(),
            shard.rank.to_string(),
            "--dist-init-addr".into(),
            format!("{}:{}", shard.head_addr, shard.rendezvous_port),
        ]);
    }
    push_kv_events_args(&mut args, shard);
    args.extend(profile.engine_args.iter().cloned());
    let head = shard.rank == 0;
    LaunchPlan {
        processes: vec![engine_process(sglang.python.clone(), args, env)],
        readiness: if head {
            Readiness::SglangHealth {
                url: health_url(node, shard.port),
            }
        } else {
            // Non-zero ranks serve a dummy health endpoint that is always 200.
            Readiness::ProcessAlive
        },
        port: Some(shard.port),
    }
}

fn engine_process(
    program: std::path::PathBuf,
    args: Vec<String>,
    env: BTreeMap<String, String>,
) -> ProcessSpec {
    ProcessSpec {
        role: ProcessRole::Engine,
        program,
        args,
        env,
    }
}
