//! Agents and the control plane, end to end: three real peers, real
//! `llmgw agent` processes with fixture inventories (tests/support).

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use llmgw_dev::{A100_ROCE_B, H100_IB_A, L40S_PCIE};
use serde_json::Value;
use support::agents::Agent;
use support::{Cluster, eventually};

const LIVENESS: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 5s\n  leader_grace: 6s\n";

/// Node id -> the node's JSON, as `peer` sees it.
async fn nodes(cluster: &Cluster, peer: u64) -> Result<BTreeMap<String, Value>, String> {
    match cluster.get(peer, "/api/v1/nodes").await? {
        (200, Value::Array(nodes)) => Ok(nodes
            .into_iter()
            .filter_map(|n| Some((n["id"].as_str()?.to_owned(), n)))
            .collect()),
        other => Err(format!("GET /api/v1/nodes on peer {peer}: {other:?}")),
    }
}

/// Every named node is ready with a live stream on the leader.
async fn all_connected(cluster: &Cluster, leader: u64, ids: &[&str]) -> Result<(), String> {
    let nodes = nodes(cluster, leader).await?;
    for id in ids {
        let node = nodes.get(*id).ok_or(format!("{id} not registered"))?;
        if node["status"] != "ready" || node["stream"]["connected"] != true {
            return Err(format!(
                "{id}: {} stream {}",
                node["status"], node["stream"]
            ));
        }
    }
    Ok(())
}

/// `node status changed` lines that took a node to `to`, in every peer log.
fn status_changes(cluster: &Cluster, to: &str) -> Vec<String> {
    let needle = format!("to=\"{to}\"");
    let needle_plain = format!("to={to}");
    let mut found = Vec::new();
    for peer in &cluster.peers {
        for start in 1..=peer.starts {
            let path = peer.layout.log.with_extension(format!("{start}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            found.extend(
                text.lines()
                    .filter(|l| l.contains("node status changed"))
                    .filter(|l| l.contains(&needle) || l.contains(&needle_plain))
                    .map(str::to_owned),
            );
        }
    }
    found
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
    eventually(&cluster, "every agent registered with the leader", || {
        all_connected(&cluster, leader, &ids)
    })
    .await;

    // The whole inventory is replicated: every peer answers the same.
    for peer in 1..=3 {
        let nodes = eventually(&cluster, "inventory on every peer", || async {
            let n = nodes(&cluster, peer).await?;
            if n.len() == 3 {
                Ok(n)
            } else {
                Err(format!("{} nodes", n.len()))
            }
        })
        .await;
        let h100 = &nodes["h100-1"];
        assert_eq!(h100["inventory"]["gpus"].as_array().unwrap().len(), 8);
        assert_eq!(h100["inventory"]["gpu_source"], "fixture");
        assert_eq!(h100["fabrics"], serde_json::json!(["ib-a"]));
        assert_eq!(h100["labels"]["rack"], "r1");
        let nvlink = h100["inventory"]["links"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["kind"] == "nvlink")
            .count();
        assert_eq!(nvlink, 28, "every pair of 8 NVSwitch GPUs is NVLink");
        assert_eq!(nodes["a100-1"]["fabrics"], serde_json::json!(["roce-b"]));
        assert_eq!(nodes["l40s-1"]["fabrics"], serde_json::json!([]));
    }

    cluster.kill(leader);
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    eventually(&cluster, "every agent re-homed to the new leader", || {
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
    eventually(&cluster, "registered", || {
        all_connected(&cluster, leader, &["node-k"])
    })
    .await;

    agent.kill();
    eventually(&cluster, "unreachable after the TTL", || async {
        let n = nodes(&cluster, leader).await?;
        match n["node-k"]["status"].as_str() {
            Some("unreachable") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eventually(&cluster, "lost after lost_after", || async {
        let n = nodes(&cluster, leader).await?;
        match n["node-k"]["status"].as_str() {
            Some("lost") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Back with a new rack label: registration refreshes the record.
    agent.write_config(&cluster, 2, "r7");
    agent.spawn();
    eventually(&cluster, "ready again with the new label", || async {
        let n = nodes(&cluster, leader).await?;
        let node = &n["node-k"];
        if node["status"] == "ready" && node["labels"]["rack"] == "r7" {
            Ok(())
        } else {
            Err(format!("{} {}", node["status"], node["labels"]))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_from_an_older_term_are_refused_and_the_refusal_is_visible() {
    let cluster = Cluster::start(LIVENESS);
    let leader = cluster.wait_leader().await;
    // This agent has already obeyed a leader of term 1000 (its fencing file
    // says so), so everything this cluster's leader sends is stale.
    let layout = llmgw_dev::AgentLayout::new(cluster.dir.path(), "fenced", L40S_PCIE, "r1");
    std::fs::create_dir_all(&layout.work_dir).unwrap();
    std::fs::write(layout.work_dir.join("leader-term"), "1000").unwrap();
    let agent = Agent::start(&cluster, "fenced", L40S_PCIE, 1);
    let refusal = eventually(&cluster, "the leader shows the refusal", || async {
        let (status, node) = cluster.get(leader, "/api/v1/nodes/fenced").await?;
        if status != 200 {
            return Err(format!("{status}: {node}"));
        }
        node["stream"]["refusals"]
            .as_array()
            .and_then(|r| r.first())
            .and_then(|r| r["message"].as_str())
            .map(str::to_owned)
            .ok_or(format!("no refusal yet: {}", node["stream"]))
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
    eventually(&cluster, "registered", || {
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
    eventually(&cluster, "the peer logged the broken streams", || async {
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
