//! Everything checked before a shard is launched. An engine refuses a bad
//! profile only after minutes of loading; the agent refuses it at once, with
//! a reason that names the problem, and starts nothing.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use llmgw_catalog::{Engine, options_up_to};
use llmgw_discovery::Inventory;
use llmgw_engines::{FabricAssignment, LaunchPlan, NodeContext, PlanError, plan_shard};

use crate::spec::LaunchSpec;

/// What the agent knows of its node when it validates a shard.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub node_id: String,
    pub context: NodeContext,
    pub inventory: Inventory,
}

/// GPUs and ports held by a shard that is already running here.
#[derive(Debug, Clone)]
pub struct Held {
    pub shard_id: String,
    pub gpus: Vec<u32>,
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "profile `{profile}`: tensor_parallel x pipeline_parallel x data_parallel = {world} but nodes x gpus_per_node = {gpus}"
    )]
    WorldMismatch {
        profile: String,
        world: u32,
        gpus: u32,
    },
    #[error("GPU {gpu} is assigned twice")]
    DuplicateGpu { gpu: u32 },
    #[error("GPU {gpu} is not on this node ({have})")]
    NoSuchGpu { gpu: u32, have: String },
    #[error("GPU {gpu} is in use by shard {by}")]
    GpuBusy { gpu: u32, by: String },
    #[error("GPU {gpu} ({name}) has {have_gb} GB, profile `{profile}` needs {need_gb} GB")]
    GpuMemory {
        gpu: u32,
        name: String,
        have_gb: u64,
        need_gb: u32,
        profile: String,
    },
    #[error("GPU {gpu} is a {name}, profile `{profile}` accepts only {accepted:?}")]
    GpuModel {
        gpu: u32,
        name: String,
        profile: String,
        accepted: Vec<String>,
    },
    #[error("a multi-node shard needs a fabric, and the command names none")]
    FabricMissing,
    #[error("fabric `{0}` is not configured on this node (agent.yaml `fabrics`)")]
    FabricUnknown(String),
    #[error("fabric `{name}` has no active HCA on this node: {problems}")]
    FabricDown { name: String, problems: String },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("engine_args of profile `{profile}` are refused by {engine} {version}: {problems}")]
    EngineArgs {
        profile: String,
        engine: Engine,
        version: String,
        problems: String,
    },
    #[error("{role} program {path} does not exist")]
    ProgramMissing { role: &'static str, path: PathBuf },
    #[error("{role} program {path} is not an executable file")]
    ProgramNotExecutable { role: &'static str, path: PathBuf },
    #[error("port {port} is in use by shard {by}")]
    PortHeld { port: u16, by: String },
    #[error("port {port} on {addr} is taken by another process: {why}")]
    PortTaken {
        port: u16,
        addr: String,
        why: String,
    },
}

/// Checks the shard against this node and what already runs here, and
/// returns the launch plan when nothing is wrong.
pub fn validate(spec: &LaunchSpec, node: &NodeFacts, held: &[Held]) -> Result<LaunchPlan, Refusal> {
    let world = spec.tensor_parallel * spec.pipeline_parallel * spec.data_parallel;
    let gpus = spec.nodes * spec.gpus_per_node;
    if world != gpus {
        return Err(Refusal::WorldMismatch {
            profile: spec.profile.clone(),
            world,
            gpus,
        });
    }
    check_gpus(spec, node, held)?;
    let fabric = fabric_for(spec, node)?;
    let plan = plan_shard(&spec.assignment(fabric), &node.context)?;
    // After planning, so that a flag llmgw manages is refused as such.
    check_engine_args(spec, node)?;
    for process in &plan.processes {
        let role = match process.role {
            llmgw_engines::ProcessRole::Engine => "engine",
            llmgw_engines::ProcessRole::RayHead => "ray head",
            llmgw_engines::ProcessRole::RayWorker => "ray worker",
        };
        check_program(role, &process.program)?;
    }
    for port in ports_of(spec, &plan) {
        if let Some(h) = held.iter().find(|h| h.ports.contains(&port)) {
            return Err(Refusal::PortHeld {
                port,
                by: h.shard_id.clone(),
            });
        }
        check_port_free(&node.context.mgmt_addr, port)?;
    }
    Ok(plan)
}

/// The engine's own parser, as the option data of the installed release
/// has it, must accept the profile's `engine_args`: the same check and
/// messages as `llmgw config check` and the admin API, but against the
/// release this node runs.
fn check_engine_args(spec: &LaunchSpec, node: &NodeFacts) -> Result<(), Refusal> {
    let engines = &node.context.engines;
    let installed = match spec.engine {
        Engine::Vllm => engines.vllm.as_ref().map(|c| c.version),
        Engine::Sglang => engines.sglang.as_ref().map(|c| c.version),
    };
    // No engine section: plan_shard refuses the shard with that reason.
    let Some(installed) = installed else {
        return Ok(());
    };
    let Some((data_version, data)) = options_up_to(spec.engine, installed) else {
        tracing::info!(
            shard = %spec.shard_id,
            "not checking engine_args: llmgw has no option data for {} {installed} or older",
            spec.engine
        );
        return Ok(());
    };
    let problems = llmgw_catalog::check_engine_args(data, &spec.engine_args);
    if problems.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = problems
        .iter()
        .map(|p| format!("engine_args[{}]: {}", p.index, p.message))
        .collect();
    Err(Refusal::EngineArgs {
        profile: spec.profile.clone(),
        engine: spec.engine,
        version: if data_version == installed {
            installed.to_string()
        } else {
            format!("{installed} (option data of {data_version})")
        },
        problems: listed.join("; "),
    })
}

/// The ports a shard's processes bind on this node.
pub fn ports_of(spec: &LaunchSpec, plan: &LaunchPlan) -> Vec<u16> {
    let mut ports: Vec<u16> = plan.port.into_iter().collect();
    if spec.nodes > 1 && spec.rank == 0 && !ports.contains(&spec.master_port) {
        // The head also binds the rendezvous (vLLM's master port, SGLang's
        // dist-init address, the Ray GCS).
        ports.push(spec.master_port);
    }
    // Each data-parallel rank's KV event publisher binds its two sockets,
    // on the configured ports plus its rank, on every interface.
    for first in [spec.kv_events_port, spec.kv_replay_port] {
        if first == 0 {
            continue;
        }
        for rank in 0..spec.data_parallel {
            let port = u16::try_from(rank)
                .ok()
                .and_then(|rank| first.checked_add(rank));
            if let Some(port) = port
                && !ports.contains(&port)
            {
                ports.push(port);
            }
        }
    }
    ports
}

fn check_gpus(spec: &LaunchSpec, node: &NodeFacts, held: &[Held]) -> Result<(), Refusal> {
    let have = describe_gpus(&node.inventory);
    for (i, gpu) in spec.gpus.iter().enumerate() {
        if spec.gpus[..i].contains(gpu) {
            return Err(Refusal::DuplicateGpu { gpu: *gpu });
        }
        let Some(found) = node.inventory.gpus.iter().find(|g| g.index == *gpu) else {
            return Err(Refusal::NoSuchGpu {
                gpu: *gpu,
                have: have.clone(),
            });
        };
        if let Some(h) = held.iter().find(|h| h.gpus.contains(gpu)) {
            return Err(Refusal::GpuBusy {
                gpu: *gpu,
                by: h.shard_id.clone(),
            });
        }
        // Profiles give memory in decimal GB; NVML reports MiB.
        let have_gb = found.memory_total_mib * 1024 * 1024 / 1_000_000_000;
        if spec.min_gpu_memory_gb > 0 && have_gb < u64::from(spec.min_gpu_memory_gb) {
            return Err(Refusal::GpuMemory {
                gpu: *gpu,
                name: found.name.clone(),
                have_gb,
                need_gb: spec.min_gpu_memory_gb,
                profile: spec.profile.clone(),
            });
        }
        if !spec.profile().accepts_gpu_model(&found.name) {
            return Err(Refusal::GpuModel {
                gpu: *gpu,
                name: found.name.clone(),
                profile: spec.profile.clone(),
                accepted: spec.gpu_models.clone(),
            });
        }
    }
    Ok(())
}

fn describe_gpus(inventory: &Inventory) -> String {
    if inventory.gpus.is_empty() {
        return format!(
            "discovery found no GPUs, source {}",
            inventory.gpu_source.as_str()
        );
    }
    let indices: Vec<String> = inventory.gpus.iter().map(|g| g.index.to_string()).collect();
    format!("it has GPUs {}", indices.join(", "))
}

fn fabric_for(spec: &LaunchSpec, node: &NodeFacts) -> Result<Option<FabricAssignment>, Refusal> {
    let Some(name) = &spec.fabric else {
        return if spec.nodes > 1 {
            Err(Refusal::FabricMissing)
        } else {
            Ok(None)
        };
    };
    let status = node
        .inventory
        .fabrics
        .iter()
        .find(|f| &f.name == name)
        .ok_or_else(|| Refusal::FabricUnknown(name.clone()))?;
    if !status.is_usable() {
        return Err(Refusal::FabricDown {
            name: name.clone(),
            problems: status.problems.join("; "),
        });
    }
    Ok(Some(FabricAssignment {
        name: name.clone(),
        hcas: status.active_hcas.clone(),
    }))
}

/// Resolves a bare program name through `PATH`, as exec would.
pub fn resolve_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 || program.is_absolute() {
        return Some(program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn check_program(role: &'static str, program: &Path) -> Result<(), Refusal> {
    let missing = || Refusal::ProgramMissing {
        role,
        path: program.to_path_buf(),
    };
    let resolved = resolve_program(program).ok_or_else(missing)?;
    let meta = std::fs::metadata(&resolved).map_err(|_| missing())?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(Refusal::ProgramNotExecutable {
            role,
            path: resolved,
        });
    }
    Ok(())
}

fn check_port_free(mgmt_addr: &str, port: u16) -> Result<(), Refusal> {
    let ip: std::net::IpAddr = mgmt_addr
        .parse()
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
    let try_bind = |ip: std::net::IpAddr| TcpListener::bind(SocketAddr::new(ip, port)).map(drop);
    match try_bind(ip) {
        Ok(()) => Ok(()),
        // The management address may not be local in odd setups (NAT);
        // then the wildcard is what an engine would collide on.
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
            try_bind(std::net::Ipv4Addr::UNSPECIFIED.into()).map_err(|e| Refusal::PortTaken {
                port,
                addr: "0.0.0.0".into(),
                why: e.to_string(),
            })
        }
        Err(e) => Err(Refusal::PortTaken {
            port,
            addr: ip.to_string(),
            why: e.to_string(),
        }),
    }
}
