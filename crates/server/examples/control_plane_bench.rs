//! Control-plane benchmark: failover time and admin-API write throughput
//! of three real `llmgw server` processes on 127.0.0.1. Prints figures;
//! asserts nothing about them.
//!
//! `cargo build -p llmgw-cli && cargo run -p llmgw-server --example control_plane_bench`
//! (release: add `--release` to both). `FAILOVERS=N` changes the number of
//! leader kills (default 20); `PAUSES=N` the number of leader SIGSTOPs
//! (default 5) and `PAUSE_SECONDS=S` their length (default 10);
//! `WRITE_SECONDS=S` the length of each
//! throughput run (default 5). `TLS=1` runs the peers with mTLS (the
//! default, plaintext, is `insecure: true`). `RAFT="k: v, ..."` sets
//! fields of server.yaml's `raft` section. `DISK_HOG_SECONDS=S` (default
//! 20) counts elections and lapsed leases while a neighbour saturates the
//! disk with synced writes.

use std::time::{Duration, Instant};

use llmgw_test_kit::Cluster;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let failovers = env_u64("FAILOVERS", 20);
    let write_seconds = env_u64("WRITE_SECONDS", 5);
    let mut cluster = start_cluster().await;
    bench_failovers(&mut cluster, failovers).await;
    bench_pauses(&cluster).await;
    bench_loaded_disk(&cluster).await;
    bench_writes(&cluster, write_seconds).await;
}

/// Three peers, with `TLS` and `RAFT` applied, that accepted a first write.
async fn start_cluster() -> Cluster {
    let tls = env_u64("TLS", 0) == 1;
    println!("peer transport: {}", if tls { "mTLS" } else { "plaintext" });
    // `RAFT="heartbeat_interval: 80ms, election_timeout_min: 250ms, ..."`
    // compares timings without a rebuild.
    let raft = std::env::var("RAFT")
        .map(|fields| format!("raft: {{{fields}}}\n"))
        .unwrap_or_default();
    if !raft.is_empty() {
        print!("server.yaml {raft}");
    }
    let cluster = if tls {
        Cluster::start_tls(&raft)
    } else {
        Cluster::start(&raft)
    };
    cluster.wait_leader().await;
    cluster.put_model(1, "warm-up").await.expect("first write");
    cluster
}

/// SIGKILLs the leader `failovers` times: how long until a survivor
/// accepts a write again.
async fn bench_failovers(cluster: &mut Cluster, failovers: u64) {
    let mut downtimes = Vec::new();
    for round in 0..failovers {
        let leader = cluster.wait_leader().await;
        cluster.wait_converged().await;
        let survivor = (1..=3).find(|id| *id != leader).unwrap();
        cluster.kill(leader);
        let killed_at = Instant::now();
        let name = format!("failover-{round}");
        loop {
            if let Ok((200, _)) = cluster.put_model(survivor, &name).await {
                break;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(60),
                "no write accepted 60 s after the kill"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let downtime = killed_at.elapsed();
        println!(
            "failover {round:>2}: killed leader {leader}, write accepted after {:.3} s",
            downtime.as_secs_f64()
        );
        downtimes.push(downtime);
        cluster.spawn(leader);
    }
    downtimes.sort();
    if !downtimes.is_empty() {
        println!(
            "failover: {} leader SIGKILLs, time until a write is accepted again: median {:.3} s, max {:.3} s",
            downtimes.len(),
            percentile(&downtimes, 0.5).as_secs_f64(),
            downtimes.last().unwrap().as_secs_f64()
        );
    }
}

/// SIGSTOPs the leader `PAUSES` times for `PAUSE_SECONDS`: how long until
/// a survivor accepts a write while the old leader stands still.
async fn bench_pauses(cluster: &Cluster) {
    let pauses = env_u64("PAUSES", 5);
    let pause_for = Duration::from_secs(env_u64("PAUSE_SECONDS", 10));
    let mut stalls = Vec::new();
    for round in 0..pauses {
        let leader = cluster.wait_leader().await;
        cluster.wait_converged().await;
        let survivor = (1..=3).find(|id| *id != leader).unwrap();
        cluster.pause(leader);
        let paused_at = Instant::now();
        let name = format!("pause-{round}");
        loop {
            if let Ok((200, _)) = cluster.put_model(survivor, &name).await {
                break;
            }
            assert!(
                paused_at.elapsed() < pause_for,
                "no write accepted during a {pause_for:?} pause of the leader"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stall = paused_at.elapsed();
        println!(
            "pause {round:>2}: SIGSTOP leader {leader}, write accepted after {:.3} s",
            stall.as_secs_f64()
        );
        stalls.push(stall);
        tokio::time::sleep(pause_for.saturating_sub(paused_at.elapsed())).await;
        cluster.resume(leader);
    }
    stalls.sort();
    if !stalls.is_empty() {
        println!(
            "pause: {} leader SIGSTOPs of {:?}, time until a write is accepted again: median {:.3} s, max {:.3} s",
            stalls.len(),
            pause_for,
            percentile(&stalls, 0.5).as_secs_f64(),
            stalls.last().unwrap().as_secs_f64()
        );
    }
}

/// What short timeouts cost: elections and lapsed leases while a
/// neighbour saturates the disk with synced writes, and no fault.
async fn bench_loaded_disk(cluster: &Cluster) {
    let hog_seconds = env_u64("DISK_HOG_SECONDS", 20);
    if hog_seconds == 0 {
        return;
    }
    cluster.wait_leader().await;
    cluster.wait_converged().await;
    let (changes_before, lapses_before) = disturbances(cluster).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hog = {
        let stop = stop.clone();
        let path = cluster.dir.path().join("disk-hog");
        std::thread::spawn(move || disk_hog(&path, &stop))
    };
    let until = Instant::now() + Duration::from_secs(hog_seconds);
    let mut writes = 0u64;
    while Instant::now() < until {
        if let Ok((200, _)) = cluster
            .put_model(1 + writes % 3, &format!("hog-{writes}"))
            .await
        {
            writes += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let hogged = hog.join().unwrap_or(0);
    let (changes_after, lapses_after) = disturbances(cluster).await;
    println!(
        "loaded disk: {hog_seconds} s of 1-client writes ({writes} ok) beside {} MiB of synced 1 MiB writes: {} leader changes, {} lapsed leader leases",
        hogged >> 20,
        changes_after - changes_before,
        lapses_after - lapses_before
    );
}

/// Admin-API write throughput and latency with 1 and then 64 clients,
/// each for `write_seconds`.
async fn bench_writes(cluster: &Cluster, write_seconds: u64) {
    cluster.wait_leader().await;
    cluster.wait_converged().await;
    for clients in [1u64, 64] {
        let until = Instant::now() + Duration::from_secs(write_seconds);
        let runs = (0..clients).map(|client| write_client(cluster, clients, client, until));
        let started = Instant::now();
        let results = futures::future::join_all(runs).await;
        let elapsed = started.elapsed().as_secs_f64();
        let mut latencies: Vec<Duration> = results
            .iter()
            .flat_map(|(l, _)| l.iter().copied())
            .collect();
        let errors: u64 = results.iter().map(|(_, e)| e).sum();
        latencies.sort();
        println!(
            "writes, {clients:>2} concurrent clients (PUT /api/v1/models through all peers): {:.0} writes/s, p50 {:.1} ms, p99 {:.1} ms, {} errors",
            latencies.len() as f64 / elapsed,
            percentile(&latencies, 0.5).as_secs_f64() * 1e3,
            percentile(&latencies, 0.99).as_secs_f64() * 1e3,
            errors
        );
    }
    print_sync_cost(cluster).await;
}

/// What the leader's synced log writes cost over the whole run, and the
/// acknowledged record's part of them (the block written and synced after
/// the WAL so that a torn tail can be told from damage).
async fn print_sync_cost(cluster: &Cluster) {
    let leader = cluster.wait_leader().await;
    let read =
        |name: &'static str| async move { cluster.metric(leader, name).await.unwrap_or(0.0) };
    let count = read("llmgw_raft_log_sync_seconds_count").await;
    let total = read("llmgw_raft_log_sync_seconds_sum").await;
    let record = read("llmgw_raft_acknowledged_record_sync_seconds_sum").await;
    let record_max = read("llmgw_raft_acknowledged_record_sync_seconds_max").await;
    if count == 0.0 || total == 0.0 {
        println!("log sync on leader {leader}: no synced writes counted");
        return;
    }
    println!(
        "log sync on leader {leader}: {count:.0} synced writes, mean {:.2} ms, of which the acknowledged record {:.2} ms ({:.0} %, max {:.2} ms)",
        total / count * 1e3,
        record / count * 1e3,
        100.0 * record / total,
        record_max * 1e3
    );
}

/// One client of `clients` writing models until `until`, through each
/// peer in turn: the latencies of accepted writes and the count of the rest.
async fn write_client(
    cluster: &Cluster,
    clients: u64,
    client: u64,
    until: Instant,
) -> (Vec<Duration>, u64) {
    let mut latencies = Vec::new();
    let mut errors = 0u64;
    let mut i = 0u64;
    while Instant::now() < until {
        let via = 1 + (client + i) % 3;
        let name = format!("tp{clients}-{client}-{i}");
        let started = Instant::now();
        match cluster.put_model(via, &name).await {
            Ok((200, _)) => latencies.push(started.elapsed()),
            _ => errors += 1,
        }
        i += 1;
    }
    (latencies, errors)
}

/// Leader changes seen by any peer (the highest counter), and leases that
/// lapsed on any peer (its log says so), so far.
async fn disturbances(cluster: &Cluster) -> (u64, usize) {
    let mut changes = 0u64;
    for id in cluster.running() {
        if let Some(value) = cluster.metric(id, "llmgw_raft_leader_changes_total").await {
            changes = changes.max(value as u64);
        }
    }
    let lapses = cluster
        .running()
        .iter()
        .map(|&id| {
            cluster
                .log_text(id)
                .matches(llmgw_runtime::log_events::AGENT_STREAMS_RELEASED)
                .count()
        })
        .sum();
    (changes, lapses)
}

/// Writes and syncs 1 MiB at a time beside the peers' data until `stop`;
/// returns the bytes written.
fn disk_hog(path: &std::path::Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::io::Write;
    let Ok(mut file) = std::fs::File::create(path) else {
        return 0;
    };
    let chunk = vec![7u8; 1 << 20];
    let mut total = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if file
            .write_all(&chunk)
            .and_then(|()| file.sync_data())
            .is_err()
        {
            break;
        }
        total += chunk.len() as u64;
        if total.is_multiple_of(256 << 20) {
            // Stay within a small file: start over.
            let _ = file.set_len(0);
            let _ = std::io::Seek::rewind(&mut file);
        }
    }
    let _ = std::fs::remove_file(path);
    total
}
