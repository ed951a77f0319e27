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
//! default, plaintext, is `insecure: true`).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::Cluster;

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
    let tls = env_u64("TLS", 0) == 1;
    println!("peer transport: {}", if tls { "mTLS" } else { "plaintext" });
    let mut cluster = if tls {
        Cluster::start_tls("")
    } else {
        Cluster::start("")
    };
    cluster.wait_leader().await;
    cluster.put_model(1, "warm-up").await.expect("first write");

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

    cluster.wait_leader().await;
    cluster.wait_converged().await;
    for clients in [1u64, 64] {
        let until = Instant::now() + Duration::from_secs(write_seconds);
        let cluster_ref = &cluster;
        let runs = (0..clients).map(|client| async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < until {
                let via = 1 + (client + i) % 3;
                let name = format!("tp{clients}-{client}-{i}");
                let started = Instant::now();
                match cluster_ref.put_model(via, &name).await {
                    Ok((200, _)) => latencies.push(started.elapsed()),
                    _ => errors += 1,
                }
                i += 1;
            }
            (latencies, errors)
        });
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
}
