//! The fleet benchmark: a 3-peer control plane of real `llmgw server`
//! processes on this machine and thousands of simulated agents, with the
//! production transport (mTLS between peers and from every agent, each
//! with a certificate of its own; HTTPS and tokens on the admin API)
//! unless `--insecure`. Prints, per run: time to register the fleet, the
//! leader's CPU and memory at steady state, placement (replicas committed
//! per second), the time to a new leader and for the whole fleet to
//! re-home after the leader is SIGKILLed (and how many nodes were marked
//! unreachable meanwhile), a follower catching up by snapshot, and the
//! whole cluster killed and restarted. Before the runs, the placement
//! decision rate and the snapshot at this size, in process; after them,
//! every figure as min / median / max over the runs.
//!
//!     cargo build --release -p llmgw-cli -p llmgw-fleet-sim
//!     target/release/fleet-bench --nodes 10000 --replicas 2000 --runs 10

mod cluster;
mod phases;
mod summary;

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;
use llmgw_api::Model;

use crate::cluster::{Cluster, Transport};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    #[arg(long, default_value_t = 5000)]
    heartbeat_ms: u64,
    #[arg(long, default_value_t = 2000)]
    replicas: u32,
    /// Runs, each against a fresh cluster with the same fleet.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Seconds of steady state over which the leader's CPU is measured.
    #[arg(long, default_value_t = 20)]
    steady_s: u64,
    /// A run whose fleet has not registered (or re-homed, or come back
    /// after a restart) within this many seconds did not converge: it is
    /// reported as failed and the next run starts.
    #[arg(long, default_value_t = 120)]
    converge_s: u64,
    /// The peers' `raft.snapshot_after_logs`; the catch-up phase writes
    /// more entries than this (plus the kept ones) while a follower is
    /// down, so that it catches up by snapshot.
    #[arg(long, default_value_t = 200)]
    snapshot_after_logs: u64,
    /// The peers' `raft.keep_logs_after_snapshot`.
    #[arg(long, default_value_t = 50)]
    keep_logs_after_snapshot: u64,
    /// Plaintext peers, agents and admin API (`insecure: true`), as the
    /// figures before 2026-12-07 were taken.
    #[arg(long)]
    insecure: bool,
    /// Keep the peers' directory (configs, data, logs) after the run. A
    /// run that fails keeps it anyway.
    #[arg(long)]
    keep: bool,
}

/// The catalog allows 1,000 replicas per model: larger counts are split
/// across models `bench-0`, `bench-1`, ...
fn bench_models(replicas: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut left = replicas;
    while left > 0 {
        let count = left.min(1000);
        out.push((format!("bench-{}", out.len()), count));
        left -= count;
    }
    out
}

fn bench_model(name: &str, replicas: u32) -> Model {
    let entry = serde_json::json!({
        "name": name,
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": replicas,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16}]
    });
    serde_json::from_value(entry).expect("the bench's catalog entry is well formed")
}

/// The leader's pure placement round on an in-memory fleet: how fast
/// decisions are made, before any Raft write.
fn decide_in_process(nodes: usize, replicas: u32) -> Result<llmgw_state::FleetState> {
    use llmgw_state::{Command, FleetState, Gpu, ModelSpec, NodeInventory};
    let mut fleet = FleetState::default();
    for i in 0..nodes {
        fleet.apply(&Command::RegisterNode {
            id: format!("sim-{i:05}"),
            mgmt_addr: format!("10.{}.{}.{}", 100 + i / 65_536, (i / 256) % 256, i % 256),
            inventory: NodeInventory {
                hostname: format!("sim-{i:05}"),
                gpus: (0..8)
                    .map(|index| Gpu {
                        index,
                        model: "NVIDIA H100 80GB HBM3".into(),
                        memory_mb: 81_559,
                        nvlink_peers: (0..8).filter(|p| *p != index).collect(),
                        ..Gpu::default()
                    })
                    .collect(),
                engines: vec!["vllm".into()],
                ..NodeInventory::default()
            },
            fabrics: vec![format!("ib-{}", i % 4)],
            labels: [("rack".to_owned(), format!("r{}", i % 50))].into(),
            at_ms: 1,
        });
    }
    for (name, count) in bench_models(replicas) {
        fleet.apply(&Command::PutModel {
            name: name.clone(),
            spec: ModelSpec::new(bench_model(&name, count)),
            replicas: count,
            at_ms: 1,
        });
    }
    let mut memory = llmgw_reconcile::Memory::default();
    let settings = llmgw_reconcile::PlanSettings::default();
    let started = Instant::now();
    let commands = llmgw_reconcile::decide(&fleet, &mut memory, &settings, 2);
    let took = started.elapsed().as_secs_f64();
    if commands.len() != replicas as usize {
        bail!("decide placed {} of {replicas}", commands.len());
    }
    println!(
        "decide (in process): {replicas} placements on {nodes} nodes in {:.1} ms ({:.0} decisions/s)",
        took * 1000.0,
        f64::from(replicas) / took
    );
    // In batches of 256, as the leader proposes them.
    let batches: Vec<Command> = commands
        .chunks(256)
        .map(|chunk| Command::Batch {
            commands: chunk.to_vec(),
            at_ms: 2,
        })
        .collect();
    let started = Instant::now();
    for batch in &batches {
        fleet.apply(batch);
    }
    let took = started.elapsed().as_secs_f64();
    if fleet.replicas.len() != replicas as usize {
        bail!("apply placed {} of {replicas}", fleet.replicas.len());
    }
    println!(
        "apply (in process): {replicas} placements in batches of 256 in {:.1} ms ({:.0} placements/s)",
        took * 1000.0,
        f64::from(replicas) / took
    );
    Ok(fleet)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let fleet_state = decide_in_process(args.nodes, args.replicas)?;
    snapshot_in_process(&fleet_state)?;
    drop(fleet_state);
    // The simulated fleet gets a runtime of its own: on a real fleet the
    // agents' side of every handshake runs on other machines, and the
    // bench's polls must not queue behind ten thousand of them.
    let fleet_runtime = llmgw_runtime::multi_thread_runtime()?;
    llmgw_runtime::multi_thread_runtime_with_workers(1)?
        .block_on(bench_runs(&args, fleet_runtime.handle()))
}

/// Every run against a fresh cluster; the fleet's certificates are issued
/// once, by one CA that signs every run's peers too.
async fn bench_runs(args: &Args, fleet_runtime: &tokio::runtime::Handle) -> Result<()> {
    let mut dir = tempfile::tempdir()?;
    if args.keep {
        dir.disable_cleanup(true);
        println!("peer configs, data and logs: {}", dir.path().display());
    }
    let transport = if args.insecure {
        Transport::plaintext(dir.path())
    } else {
        Transport::production(dir.path())?
    };
    let certificates = if args.insecure {
        None
    } else {
        let started = Instant::now();
        let issued = llmgw_fleet_sim::node_certificates(dir.path(), "sim", args.nodes)?;
        println!(
            "certificates: {} node certificates issued and loaded in {:.2} s",
            args.nodes,
            started.elapsed().as_secs_f64()
        );
        Some(issued)
    };
    println!(
        "fleet-bench: {} nodes, heartbeat {} ms, 3 peers, {}, {} run(s)",
        args.nodes,
        args.heartbeat_ms,
        transport.describe(),
        args.runs
    );
    let raft = format!(
        "raft:\n  snapshot_after_logs: {}\n  keep_logs_after_snapshot: {}\n",
        args.snapshot_after_logs, args.keep_logs_after_snapshot
    );
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        println!("\n== run {run} of {}", args.runs);
        let run_dir = dir.path().join(format!("run-{run}"));
        std::fs::create_dir_all(&run_dir)?;
        let mut cluster = Cluster::start(&transport, &run_dir, &raft)?;
        let outcome =
            phases::bench_cluster(&mut cluster, args, fleet_runtime, certificates.clone()).await;
        drop(cluster);
        match &outcome {
            Err(error) => {
                println!("run {run} FAILED: {error:#}");
                println!("its peers' logs stay in {}", run_dir.display());
                dir.disable_cleanup(true);
            }
            // A run's data is hundreds of megabytes at this scale.
            Ok(_) if !args.keep => std::fs::remove_dir_all(&run_dir)?,
            Ok(_) => {}
        }
        runs.push(outcome.map_err(|e| format!("{e:#}")));
    }
    summary::print(&runs);
    Ok(())
}

/// The snapshot at this fleet's size, as a peer builds (encodes), installs
/// (decodes) and hashes it.
fn snapshot_in_process(fleet: &llmgw_state::FleetState) -> Result<()> {
    let started = Instant::now();
    let bytes = serde_json::to_vec(fleet)?;
    let encoded = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let decoded: llmgw_state::FleetState = serde_json::from_slice(&bytes)?;
    let decode = started.elapsed().as_secs_f64();
    if decoded != *fleet {
        bail!("the snapshot did not decode to the state it was built from");
    }
    let started = Instant::now();
    let hash = fleet.hash();
    let hashed = started.elapsed().as_secs_f64();
    println!(
        "snapshot (in process): {} nodes, {} replicas: {:.1} MiB, encode {:.0} ms, decode {:.0} ms, hash {:.0} ms ({hash})",
        fleet.nodes.len(),
        fleet.replicas.len(),
        bytes.len() as f64 / (1024.0 * 1024.0),
        encoded * 1000.0,
        decode * 1000.0,
        hashed * 1000.0
    );
    Ok(())
}
