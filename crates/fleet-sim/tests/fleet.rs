//! The simulated fleet against a real three-peer control plane: every node
//! registers with the leader, and re-homes when it is SIGKILLed, with no
//! node marked unreachable.

use std::time::Duration;

use llmgw_api::NodeStatus;
use llmgw_fleet_sim::{Fleet, node_certificates};
use llmgw_test_kit::Cluster;

const NODES: usize = 60;

const LIVENESS: &str = "liveness:\n  node_ttl: 3s\n  lost_after: 10s\n  leader_grace: 5s\n";

/// Nodes the leader holds a stream for, and nodes not `ready`.
async fn fleet_view(cluster: &Cluster, leader: u64) -> Result<(usize, usize), String> {
    let nodes = cluster.nodes(leader).await?;
    let connected = nodes
        .iter()
        .filter(|n| n.stream.as_ref().is_some_and(|stream| stream.connected))
        .count();
    let down = nodes
        .iter()
        .filter(|n| n.record.status != NodeStatus::Ready)
        .count();
    Ok((connected, down))
}

async fn last_log_index(cluster: &Cluster, peer: u64) -> Result<u64, String> {
    let index = cluster
        .metric(peer, "llmgw_raft_last_log_index")
        .await
        .ok_or("no llmgw_raft_last_log_index")?;
    Ok(index as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_registers_and_rehomes_without_going_unreachable() {
    // Production transport: every node proves its id with a certificate.
    let mut cluster = Cluster::start_tls(LIVENESS);
    let servers: Vec<String> = (1..=3).map(|id| cluster.grpc(id)).collect();
    let leader = cluster.wait_leader().await;
    let log_before = cluster
        .eventually("the leader's log index", || {
            last_log_index(&cluster, leader)
        })
        .await;
    let certificates = node_certificates(cluster.dir.path(), "sim", NODES).unwrap();
    let fleet = Fleet::spawn(
        "sim",
        NODES,
        &servers,
        Duration::from_millis(500),
        Some(certificates),
    );
    let first = cluster
        .eventually("every simulated node registered", || async {
            let leader = cluster.wait_leader().await;
            match fleet_view(&cluster, leader).await? {
                (connected, 0) if connected == NODES => Ok(leader),
                other => Err(format!("(connected, down) {other:?} on leader {leader}")),
            }
        })
        .await;
    assert_eq!(fleet.stats().registered, NODES);
    // Registrations that arrive together share log entries.
    let entries = last_log_index(&cluster, first).await.unwrap() - log_before;
    assert!(
        entries < NODES as u64,
        "{NODES} registrations took {entries} log entries"
    );
    let nodes = cluster.nodes(first).await.unwrap();
    let one = &nodes[0].record;
    assert_eq!(one.inventory.gpus.len(), 8);
    assert_eq!(one.fabrics.len(), 1);

    cluster.kill(first);
    let leader = cluster
        .eventually("the fleet re-homed to a new leader", || async {
            let leader = cluster.wait_leader().await;
            match fleet_view(&cluster, leader).await? {
                (connected, _) if leader != first && connected == NODES => Ok(leader),
                other => Err(format!("(connected, down) {other:?} on leader {leader}")),
            }
        })
        .await;
    // Past the grace period and a TTL: still nobody unreachable.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(fleet_view(&cluster, leader).await.unwrap(), (NODES, 0));
    fleet.stop();
}
