//! Agents and the control plane, end to end: three real peers, real
//! `llmgw agent` processes with fixture inventories (llmgw-test-kit).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use llmgw_api::{LinkKind, NodeStatus, NodeView};
use llmgw_dev::{A100_ROCE_B, H100_IB_A, L40S_PCIE};
use llmgw_test_kit::Cluster;
use llmgw_test_kit::agents::Agent;

const LIVENESS: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 5s\n  leader_grace: 6s\n";

/// Node id -> the node, as `peer` sees it.
async fn nodes(cluster: &Cluster, peer: u64) -> Result<BTreeMap<String, NodeView>, String> {
    Ok(cluster
        .nodes(peer)
        .await?
        .into_iter()
        .map(|n| (n.record.id.clone(), n))
        .collect())
}

fn connected(node: &NodeView) -> bool {
    node.stream.as_ref().is_some_and(|stream| stream.connected)
}

/// Every named node is ready with a live stream on the leader.
async fn all_connected(cluster: &Cluster, leader: u64, ids: &[&str]) -> Result<(), String> {
    let nodes = nodes(cluster, leader).await?;
    for id in ids {
        let node = nodes.get(*id).ok_or(format!("{id} not registered"))?;
        if node.record.status != NodeStatus::Ready || !connected(node) {
            return Err(format!(
                "{id}: {} stream {:?}",
                node.record.status.as_str(),
                node.stream
            ));
        }
    }
    Ok(())
}

/// The status `node` has on `peer`.
async fn status(cluster: &Cluster, peer: u64, node: &str) -> Result<NodeStatus, String> {
    nodes(cluster, peer)
        .await?
        .get(node)
        .map(|n| n.record.status)
        .ok_or(format!("{node} not registered"))
}

/// `node status changed` lines that took a node to `to`, in every peer log.
fn status_changes(cluster: &Cluster, to: &str) -> Vec<String> {
    let needle = format!("to=\"{to}\"");
    let needle_plain = format!("to={to}");
    cluster
        .all_log_lines()
        .into_iter()
        .filter(|l| l.contains(llmgw_runtime::log_events::NODE_STATUS_CHANGED))
        .filter(|l| l.contains(&needle) || l.contains(&needle_plain))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_register_with_the_leader_and_rehome_when_it_dies() {
    let mut cluster = Cluster::start(LIVENESS);
    let leader = cluster.wait_leader().await;
    // Each agent dials a different peer first: two of them hit followers.
    let ids = ["h100-1", "a100-1", "l40s-1"];
    let _agents = [
        Agent::start(&cluster, ids[0], H100_IB_A, 1),
        Agent::start(&cluster, ids[1], A100_ROCE_B, 2),
        Agent::start(&cluster, ids[2], L40S_PCIE, 3),
    ];
    cluster
        .eventually("every agent registered with the leader", || {
            all_connected(&cluster, leader, &ids)
        })
        .await;

    // The whole inventory is replicated: every peer answers the same.
    for peer in 1..=3 {
        let nodes = cluster
            .eventually("inventory on every peer", || async {
                let n = nodes(&cluster, peer).await?;
                if n.len() == 3 {
                    Ok(n)
                } else {
                    Err(format!("{} nodes", n.len()))
                }
            })
            .await;
        let h100 = &nodes["h100-1"].record;
        assert_eq!(h100.inventory.gpus.len(), 8);
        assert_eq!(h100.inventory.gpu_source, "fixture");
        assert_eq!(h100.fabrics, ["ib-a"]);
        assert_eq!(h100.labels["rack"], "r1");
        let nvlink = h100
            .inventory
            .links
            .iter()
            .filter(|l| l.kind == LinkKind::Nvlink)
            .count();
        assert_eq!(nvlink, 28, "every pair of 8 NVSwitch GPUs is NVLink");
        assert_eq!(nodes["a100-1"].record.fabrics, ["roce-b"]);
        assert!(nodes["l40s-1"].record.fabrics.is_empty());
    }

    cluster.kill(leader);
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    cluster
        .eventually("every agent re-homed to the new leader", || {
            all_connected(&cluster, new_leader, &ids)
        })
        .await;
    // Heartbeats keep flowing to the new leader well past the grace period
    // and the TTL: nobody was, or becomes, unreachable.
    tokio::time::sleep(Duration::from_secs(8)).await;
    all_connected(&cluster, new_leader, &ids).await.unwrap();
    let unreachable = status_changes(&cluster, "unreachable");
    assert!(
        unreachable.is_empty(),
        "a node was marked unreachable during failover:\n{}",
        unreachable.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_is_unreachable_then_lost_and_returns_with_fresh_inventory() {
    let cluster = Cluster::start(LIVENESS);
    let leader = cluster.wait_leader().await;
    let mut agent = Agent::start(&cluster, "node-k", L40S_PCIE, 1);
    cluster
        .eventually("registered", || {
            all_connected(&cluster, leader, &["node-k"])
        })
        .await;

    agent.kill();
    cluster
        .eventually("unreachable after the TTL", || async {
            match status(&cluster, leader, "node-k").await? {
                NodeStatus::Unreachable => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    cluster
        .eventually("lost after lost_after", || async {
            match status(&cluster, leader, "node-k").await? {
                NodeStatus::Lost => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;

    // Back with a new rack label: registration refreshes the record.
    agent.write_config(&cluster, 2, "r7");
    agent.spawn();
    cluster
        .eventually("ready again with the new label", || async {
            let n = nodes(&cluster, leader).await?;
            let node = &n.get("node-k").ok_or("node-k not registered")?.record;
            let rack = node.labels.get("rack").map(String::as_str);
            if node.status == NodeStatus::Ready && rack == Some("r7") {
                Ok(())
            } else {
                Err(format!("{} {:?}", node.status.as_str(), node.labels))
            }
        })
        .await;
}

/// An agent restarted within the TTL (its stream cut, then opened again)
/// leaves its node ready: liveness counts from the last heartbeat, not
/// from the moment the stream ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_within_the_ttl_leaves_its_node_ready() {
    // A TTL far above what a restart takes, even on a loaded machine.
    let cluster =
        Cluster::start("liveness:\n  node_ttl: 20s\n  lost_after: 60s\n  leader_grace: 1s\n");
    let leader = cluster.wait_leader().await;
    let mut agent = Agent::start(&cluster, "node-r", L40S_PCIE, 1);
    cluster
        .eventually("registered", || {
            all_connected(&cluster, leader, &["node-r"])
        })
        .await;
    // The scenario: past the leader's grace period, the agent is down for
    // a few liveness rounds (one a second), well within the TTL.
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.kill();
    cluster
        .eventually("the leader saw the stream end", || async {
            let node = nodes(&cluster, leader).await?;
            match node.get("node-r") {
                Some(n) if !connected(n) => Ok(()),
                other => Err(format!("{:?}", other.map(|n| &n.stream))),
            }
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    agent.spawn();
    cluster
        .eventually("back on its stream", || {
            all_connected(&cluster, leader, &["node-r"])
        })
        .await;
    let unreachable = status_changes(&cluster, "unreachable");
    assert!(
        unreachable.is_empty(),
        "a node was marked unreachable while its agent restarted within the TTL:\n{}\n{}",
        unreachable.join("\n"),
        cluster.log_tails()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_from_an_older_term_are_refused_and_the_refusal_is_visible() {
    let cluster = Cluster::start(LIVENESS);
    let leader = cluster.wait_leader().await;
    // This agent has already obeyed a leader of term 1000 in an epoch far
    // ahead (its fencing file says so), so everything this cluster's
    // leader sends is stale.
    let layout = llmgw_dev::AgentLayout::new(cluster.dir.path(), "fenced", L40S_PCIE, "r1");
    std::fs::create_dir_all(&layout.work_dir).unwrap();
    std::fs::write(
        layout.work_dir.join("leader-term"),
        "1000 0 99999999999999 -",
    )
    .unwrap();
    let agent = Agent::start(&cluster, "fenced", L40S_PCIE, 1);
    let refusal = cluster
        .eventually("the leader shows the refusal", || async {
            let node = cluster.node(leader, "fenced").await?;
            node.stream
                .as_ref()
                .and_then(|stream| stream.refusals.first())
                .map(|refusal| refusal.message.clone())
                .ok_or(format!("no refusal yet: {:?}", node.stream))
        })
        .await;
    assert!(
        refusal.contains("term") && refusal.contains("1000"),
        "{refusal}"
    );
    assert!(
        agent.log_text().contains("refused"),
        "the agent logs the refusal too"
    );
    let refusals = cluster
        .metric(leader, "llmgw_agent_command_refusals_total")
        .await
        .unwrap_or(0.0);
    assert!(refusals >= 1.0, "refusals counted: {refusals}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_truncated_streams_leave_every_other_agent_connected() {
    let cluster = Cluster::start(LIVENESS);
    let leader = cluster.wait_leader().await;
    let _agent = Agent::start(&cluster, "steady", L40S_PCIE, 1);
    cluster
        .eventually("registered", || {
            all_connected(&cluster, leader, &["steady"])
        })
        .await;
    let grpc = cluster.peers[(leader - 1) as usize].layout.grpc;

    // Bytes that are not HTTP/2 at all.
    let mut raw = std::net::TcpStream::connect(grpc).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n\x00\xff\xfe garbage \x01\x02")
        .unwrap();
    drop(raw);

    // A gRPC stream whose first message promises 100 bytes, sends 10, and
    // ends; then one whose message is not protobuf.
    for body in [
        [&[0u8, 0, 0, 0, 100][..], &[1u8; 10][..]].concat(),
        [&[0u8, 0, 0, 0, 6][..], &[0xffu8; 6][..]].concat(),
    ] {
        let stream = tokio::net::TcpStream::connect(grpc).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        let request =
            hyper::Request::post(format!("http://{grpc}/llmgw.agent.v1.AgentService/Connect"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap();
        let response = sender.send_request(request).await;
        // Whatever the answer, it is an answer: the peer did not fall over.
        assert!(response.is_ok(), "{response:?}");
    }

    let leader_log = cluster.log_path(leader);
    cluster
        .eventually("the peer logged the broken streams", || async {
            let text = std::fs::read_to_string(&leader_log).unwrap_or_default();
            let broken = text
                .lines()
                .filter(|l| l.contains("agent stream broke before registering"))
                .count();
            if broken >= 2 {
                Ok(())
            } else {
                Err(format!("{broken} logged"))
            }
        })
        .await;
    // The real agent never noticed, and the leader still serves.
    all_connected(&cluster, leader, &["steady"]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    all_connected(&cluster, leader, &["steady"]).await.unwrap();
    let (status, _) = cluster.get(leader, "/healthz").await.unwrap();
    assert_eq!(status, 200);
}
