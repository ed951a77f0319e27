//! One run against a real cluster, phase by phase: registration, steady
//! state, placement, failover, catch-up by snapshot, whole-cluster restart.
//! Each phase prints its line and hands its figures to the summary.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use llmgw_api::{ReplicaState, paths};
use llmgw_fleet_sim::{Fleet, metric};
use llmgw_procfs::{cpu_seconds, rss_kib, to_pid};
use llmgw_tls::Tls;

use crate::Args;
use crate::cluster::{
    Cluster, POLL, at_least, fleet_back, required_metric, wait_for, watch_unhealthy,
};
use crate::summary::RunFigures;

/// Every measurement of one run, in order.
pub async fn bench_cluster(
    cluster: &mut Cluster,
    args: &Args,
    fleet_runtime: &tokio::runtime::Handle,
    certificates: Option<Vec<Tls>>,
) -> Result<RunFigures> {
    let mut figures = RunFigures::default();
    let converge = Duration::from_secs(args.converge_s);
    let first = wait_for("a leader", Duration::from_secs(60), POLL, || {
        cluster.leader()
    })
    .await?;
    println!("cluster: leader {first}");

    let started = Instant::now();
    let entered = fleet_runtime.enter();
    let fleet = Fleet::spawn(
        "sim",
        args.nodes,
        &cluster.grpc_addrs(),
        Duration::from_millis(args.heartbeat_ms),
        certificates,
    );
    drop(entered);
    let first = fleet_back(cluster, args.nodes, converge, "the whole fleet registered").await?;
    figures.register_s = started.elapsed().as_secs_f64();
    let admin = cluster.admin(first);
    let changes = metric(&cluster.http, &admin, "llmgw_raft_leader_changes_total").await;
    println!(
        "register: {} nodes ready with open streams in {:.2} s (leader {first}, leader changes seen: {})",
        args.nodes,
        figures.register_s,
        changes.map_or("?".to_owned(), |c| c.to_string())
    );

    (figures.leader_cpu_percent, figures.leader_rss_mib) =
        measure_steady_state(cluster, first, args).await?;
    figures.placements_per_s = measure_placement(&cluster.http, &admin, args.replicas).await?;
    let next;
    (
        next,
        figures.new_leader_s,
        figures.rehomed_s,
        figures.failover_not_ready,
    ) = measure_failover(cluster, first, args.nodes, converge).await?;
    figures.catch_up_s = measure_catch_up(cluster, first, next, args).await?;
    (
        figures.restart_s,
        figures.restart_lost,
        figures.restart_not_ready,
    ) = measure_whole_restart(cluster, args.nodes, converge).await?;
    let stats = fleet.stats();
    figures.reconnects = stats.reconnects;
    println!(
        "fleet: {} registered, {} reconnects, {} commands, {} refused",
        stats.registered, stats.reconnects, stats.commands, stats.refused
    );
    fleet.stop();
    Ok(figures)
}

/// The leader's CPU (% of one core) and memory (MiB) with the whole fleet
/// heartbeating.
async fn measure_steady_state(cluster: &Cluster, leader: u64, args: &Args) -> Result<(f64, f64)> {
    let pid = cluster
        .peer(leader)
        .child
        .as_ref()
        .map(|child| to_pid(child.id()))
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu0 = cpu_seconds(pid).context("leader /proc")?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.steady_s)).await;
    let cpu1 = cpu_seconds(pid).context("leader /proc")?;
    let rss = rss_kib(pid).context("leader /proc")? as f64 / 1024.0;
    let cpu = 100.0 * (cpu1 - cpu0) / t0.elapsed().as_secs_f64();
    println!(
        "steady state: leader CPU {cpu:.1}% of one core, RSS {rss:.0} MiB ({} heartbeats/s)",
        (args.nodes as f64 * 1000.0 / args.heartbeat_ms as f64) as u64
    );
    Ok((cpu, rss))
}

/// SIGKILLs the leader with the whole fleet connected. Answers the new
/// leader once every stream is back on it, the seconds to elect it and to
/// re-home every stream, and the most nodes marked not ready after.
async fn measure_failover(
    cluster: &mut Cluster,
    killed: u64,
    nodes: usize,
    converge: Duration,
) -> Result<(u64, f64, f64, usize)> {
    let killed_at = Instant::now();
    cluster.kill(killed)?;
    let next = wait_for("a new leader", Duration::from_secs(60), POLL, || {
        cluster.leader()
    })
    .await?;
    let elected = killed_at.elapsed().as_secs_f64();
    let admin = cluster.admin(next);
    let http = &cluster.http;
    wait_for("the fleet re-homed", converge, POLL, || async {
        let streams = required_metric(http, &admin, "llmgw_agent_streams").await?;
        at_least(streams, nodes as f64, "streams on the new leader")
    })
    .await?;
    let rehomed = killed_at.elapsed().as_secs_f64();
    let worst = watch_unhealthy(http, &admin, Duration::from_secs(35)).await;
    println!(
        "failover: new leader {next} after {elected:.2} s, all {nodes} streams re-homed after {rehomed:.2} s, \
         nodes marked not ready during the next 35 s: {worst}"
    );
    Ok((next, elected, rehomed, worst))
}

/// The killed peer missed more entries than the leader keeps after a
/// snapshot: it comes back by snapshot. Answers the seconds it took.
async fn measure_catch_up(
    cluster: &mut Cluster,
    killed: u64,
    leader: u64,
    args: &Args,
) -> Result<f64> {
    let admin = cluster.admin(leader);
    let writes = args.snapshot_after_logs + args.keep_logs_after_snapshot + 50;
    write_entries(&cluster.http, &admin, writes).await?;
    let restarted = Instant::now();
    cluster.restart(killed)?;
    let http = &cluster.http;
    let target = metric(http, &admin, "llmgw_raft_commit_index")
        .await
        .context("leader commit index")?;
    let back = cluster.admin(killed);
    wait_for(
        "the restarted peer caught up",
        Duration::from_secs(300),
        POLL,
        || async {
            let applied = required_metric(http, &back, "llmgw_raft_apply_index").await?;
            at_least(applied, target, "applied index")
        },
    )
    .await?;
    let installed = metric(http, &back, "llmgw_raft_snapshots_installed_total")
        .await
        .unwrap_or(0.0);
    let caught_up = restarted.elapsed().as_secs_f64();
    let built = metric(http, &admin, "llmgw_raft_snapshot_build_seconds")
        .await
        .unwrap_or(0.0);
    let installed_in = metric(http, &back, "llmgw_raft_snapshot_install_seconds")
        .await
        .unwrap_or(0.0);
    let bytes = metric(http, &back, "llmgw_raft_snapshot_bytes")
        .await
        .unwrap_or(0.0);
    println!(
        "catch-up: peer {killed} restarted after {writes} entries it missed, applied up to the \
         leader's commit index {target} in {caught_up:.2} s, snapshots installed: {installed} \
         ({:.1} MiB; the leader built its last in {:.0} ms, the peer installed it in {:.0} ms)",
        bytes / (1024.0 * 1024.0),
        built * 1000.0,
        installed_in * 1000.0
    );
    Ok(caught_up)
}

/// Every peer SIGKILLed at once, then all restarted. Answers the seconds
/// until the whole fleet was back, nodes lost, and the most not ready after.
async fn measure_whole_restart(
    cluster: &mut Cluster,
    nodes: usize,
    converge: Duration,
) -> Result<(f64, usize, usize)> {
    let ids: Vec<u64> = cluster.peers.iter().map(|p| p.id).collect();
    for &id in &ids {
        cluster.kill(id)?;
    }
    let down_at = Instant::now();
    for &id in &ids {
        cluster.restart(id)?;
    }
    let leader_now = fleet_back(
        cluster,
        nodes,
        converge,
        "the fleet back after a whole-cluster restart",
    )
    .await?;
    let back_after = down_at.elapsed().as_secs_f64();
    let admin = cluster.admin(leader_now);
    let http = &cluster.http;
    let term = metric(http, &admin, "llmgw_raft_term").await.unwrap_or(0.0);
    let lost = metric(http, &admin, "llmgw_nodes{status=\"lost\"}")
        .await
        .unwrap_or(0.0) as usize;
    let worst = watch_unhealthy(http, &admin, Duration::from_secs(20)).await;
    println!(
        "whole-cluster restart: all {nodes} nodes ready with open streams {back_after:.2} s after all three \
         peers were killed (leader {leader_now}, term {term}), lost: {lost}, not ready during the next 20 s: {worst}"
    );
    Ok((back_after, lost, worst))
}

/// Desired replicas of one-GPU models, committed and then ready. Answers
/// committed shard placements a second.
async fn measure_placement(http: &reqwest::Client, admin: &str, replicas: u32) -> Result<f64> {
    let placed_at = Instant::now();
    let puts = crate::bench_models(replicas)
        .into_iter()
        .map(|(name, count)| async move {
            let response = http
                .put(format!("{admin}{}", paths::model(&name)))
                .json(&crate::bench_model(&name, count))
                .send()
                .await?;
            if !response.status().is_success() {
                bail!("PUT model {name}: {}", response.text().await?);
            }
            Ok(())
        });
    for put in futures::future::join_all(puts).await {
        put?;
    }
    let wanted = f64::from(replicas);
    // Asked every 20 ms: the finer the poll, the less of a short
    // measurement is the poll's own granularity.
    wait_for(
        "every replica committed",
        Duration::from_secs(600),
        Duration::from_millis(20),
        || async {
            let mut placed = 0.0;
            for state in [
                ReplicaState::Placed,
                ReplicaState::Starting,
                ReplicaState::Loading,
                ReplicaState::Ready,
            ] {
                let name = format!("llmgw_replicas{{state=\"{}\"}}", state.as_str());
                placed += metric(http, admin, &name).await.unwrap_or(0.0);
            }
            at_least(placed, wanted, "replicas placed")
        },
    )
    .await?;
    let committed = placed_at.elapsed().as_secs_f64();
    wait_for(
        "every replica ready",
        Duration::from_secs(600),
        POLL,
        || async {
            let ready = required_metric(http, admin, "llmgw_replicas{state=\"ready\"}").await?;
            at_least(ready, wanted, "replicas ready")
        },
    )
    .await?;
    println!(
        "placement: {replicas} replicas committed in {committed:.2} s ({:.0} shard placements/s), all ready after {:.2} s",
        wanted / committed,
        placed_at.elapsed().as_secs_f64()
    );
    Ok(wanted / committed)
}

/// `count` Raft entries through the admin API: a node cordoned and
/// uncordoned in turn (nothing runs on cordon alone).
async fn write_entries(http: &reqwest::Client, admin: &str, count: u64) -> Result<()> {
    for i in 0..count {
        let verb = if i % 2 == 0 { "cordon" } else { "uncordon" };
        let response = http
            .post(format!("{admin}{}", paths::node_action("sim-00000", verb)))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("{verb} sim-00000: {}", response.text().await?);
        }
    }
    if count % 2 == 1 {
        http.post(format!(
            "{admin}{}",
            paths::node_action("sim-00000", "uncordon")
        ))
        .send()
        .await?;
    }
    Ok(())
}
