//! Placement, reconciliation and drain, end to end: three real peers, four
//! real agents with fixture inventories across two fabrics plus one node
//! without a fabric, and simulated engines launched through the real
//! adapters.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use llmgw_api::{NodeStatus, NodeView, ReplicaState, ReplicaView};
use llmgw_dev::{A100_ROCE_B, H100_IB_A, L40S_PCIE};
use llmgw_test_kit::agents::Agent;
use llmgw_test_kit::{Cluster, chat};
use reqwest::Method;
use serde_json::{Value, json};

const LIVENESS: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 5s\n  leader_grace: 6s\n";

async fn put(cluster: &Cluster, peer: u64, model: Value) {
    cluster.put_model_spec(peer, &model).await;
}

/// Replicas of `model` by id, as `peer` sees them.
async fn replicas(
    cluster: &Cluster,
    peer: u64,
    model: &str,
) -> Result<BTreeMap<String, ReplicaView>, String> {
    Ok(cluster
        .replicas(peer)
        .await?
        .into_iter()
        .filter(|r| r.replica.model == model)
        .map(|r| (r.replica.id.clone(), r))
        .collect())
}

fn is_ready(replica: &ReplicaView) -> bool {
    replica.state == ReplicaState::Ready
}

/// Waits for exactly one ready replica of `model`; returns it.
async fn one_ready(cluster: &Cluster, peer: u64, model: &str) -> ReplicaView {
    cluster
        .eventually(&format!("one ready replica of {model}"), || async {
            let all = replicas(cluster, peer, model).await?;
            let ready: Vec<&ReplicaView> = all.values().filter(|r| is_ready(r)).collect();
            if all.len() == 1 && ready.len() == 1 {
                Ok(ready[0].clone())
            } else {
                let states: Vec<String> = all
                    .values()
                    .map(|r| {
                        format!(
                            "{} {} {:?}",
                            r.replica.id,
                            r.state.as_str(),
                            r.replica.shards
                        )
                    })
                    .collect();
                Err(states.join("; "))
            }
        })
        .await
}

fn head_node(replica: &ReplicaView) -> String {
    replica.replica.shards[0].node.clone()
}

fn endpoint(replica: &ReplicaView) -> &str {
    replica
        .endpoint
        .as_deref()
        .expect("a ready replica has an endpoint")
}

fn connected(node: &NodeView) -> bool {
    node.stream.as_ref().is_some_and(|stream| stream.connected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_place_serve_move_off_lost_and_drained_nodes_and_explain_the_rest() {
    let mut cluster = Cluster::start(LIVENESS);
    let leader = cluster.wait_leader().await;
    let mut agents = four_ready_nodes(&cluster, leader).await;

    let llama = a_two_node_model_lands_on_the_fabric_pair(&cluster, leader).await;
    // A single-node model, and one that fits nowhere.
    put(&cluster, leader, qwen_tp1()).await;
    put(&cluster, leader, needs_b200()).await;
    let qwen = one_ready(&cluster, leader, "qwen").await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    for (replica, model) in [(&llama, "llama-70b"), (&qwen, "qwen-small")] {
        let answer = chat(&http, endpoint(replica), model).await.unwrap();
        assert!(!answer.is_empty());
    }
    the_model_that_fits_nowhere_is_explained(&cluster, leader).await;

    // Drain qwen's node, and kill the leader in the middle of it: the new
    // leader finishes the drain from the replicated state.
    let drained = head_node(&qwen);
    drain_until_a_replacement_is_placed(&cluster, leader, &drained).await;
    cluster.kill(leader);
    let leader = cluster.wait_leader().await;
    let moved = the_drain_finishes_with_one_replacement(&cluster, leader, &drained, &qwen).await;
    chat(&http, endpoint(&moved), "qwen").await.unwrap();

    // Lose the node qwen runs on now: it moves back to the uncordoned node.
    let (status, _) = cluster
        .send(
            leader,
            Method::POST,
            &format!("/api/v1/nodes/{drained}/uncordon"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let doomed = head_node(&moved);
    agents.get_mut(doomed.as_str()).unwrap().kill();
    let back = qwen_moves_off_the_lost_node(&cluster, leader, &doomed).await;
    chat(&http, endpoint(&back), "qwen").await.unwrap();
    let why = cluster.explain(leader, "qwen").await.unwrap();
    assert!(
        why.last_failure
            .as_ref()
            .is_some_and(|f| f.failure.message.contains("lost")),
        "{why:?}"
    );
}

/// Two H100s on fabric `ib-a`, an A100 on `roce-b` and an L40S without a
/// fabric, each agent on its own peer; returns once all four are ready
/// and connected.
async fn four_ready_nodes(cluster: &Cluster, leader: u64) -> BTreeMap<&'static str, Agent> {
    let mut agents = BTreeMap::new();
    for (i, (id, kind)) in [
        ("h100-1", H100_IB_A),
        ("h100-2", H100_IB_A),
        ("a100-1", A100_ROCE_B),
        ("l40s-1", L40S_PCIE),
    ]
    .into_iter()
    .enumerate()
    {
        agents.insert(id, Agent::start(cluster, id, kind, 1 + i as u64 % 3));
    }
    cluster
        .eventually("four nodes ready", || async {
            let ready = cluster
                .nodes(leader)
                .await?
                .iter()
                .filter(|n| n.record.status == NodeStatus::Ready && connected(n))
                .count();
            if ready == 4 {
                Ok(())
            } else {
                Err(format!("{ready} ready"))
            }
        })
        .await;
    agents
}

/// A two-node tensor-parallel model: only the two H100s share a fabric
/// with 8 free GPUs each.
async fn a_two_node_model_lands_on_the_fabric_pair(cluster: &Cluster, leader: u64) -> ReplicaView {
    put(
        cluster,
        leader,
        json!({
            "name": "llama-70b",
            "source": "meta-llama/Llama-3.1-70B-Instruct",
            "replicas": 1,
            "profiles": [{
                "name": "tp8x2", "engine": "vllm", "nodes": 2, "gpus_per_node": 8,
                "tensor_parallel": 8, "pipeline_parallel": 2, "launch_mode": "mp",
                "min_gpu_memory_gb": 40
            }]
        }),
    )
    .await;
    let llama = one_ready(cluster, leader, "llama-70b").await;
    let llama_nodes: BTreeSet<&str> = llama
        .replica
        .shards
        .iter()
        .map(|s| s.node.as_str())
        .collect();
    assert_eq!(llama_nodes, BTreeSet::from(["h100-1", "h100-2"]));
    assert_eq!(llama.replica.fabric.as_deref(), Some("ib-a"));
    llama
}

fn qwen_tp1() -> Value {
    json!({
        "name": "qwen",
        "aliases": ["qwen-small"],
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": 1,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16}]
    })
}

/// A model only B200s may run: no node here has one.
fn needs_b200() -> Value {
    json!({
        "name": "needs-b200",
        "source": "Qwen/Qwen2.5-7B-Instruct",
        "replicas": 1,
        "profiles": [{"name": "b200", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16,
                      "gpu_models": ["B200"]}]
    })
}

async fn the_model_that_fits_nowhere_is_explained(cluster: &Cluster, leader: u64) {
    let why = cluster.explain(leader, "needs-b200").await.unwrap();
    assert_eq!(why.pending, 1, "{why:?}");
    let text = why.explanation.as_deref().unwrap();
    assert!(
        text.contains("0/4 nodes fit needs-b200 profile b200")
            && text.contains("4 have no allowed GPU model"),
        "{text}"
    );
}

/// Starts draining `node` and returns once qwen's replacement is placed,
/// while the drain is still under way.
async fn drain_until_a_replacement_is_placed(cluster: &Cluster, leader: u64, node: &str) {
    let (status, body) = cluster
        .send(
            leader,
            Method::POST,
            &format!("/api/v1/nodes/{node}/drain?deadline_s=60"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    cluster
        .eventually("a replacement is placed", || async {
            let all = replicas(cluster, leader, "qwen").await?;
            if all.len() == 2 {
                Ok(())
            } else {
                Err(format!("{} replicas", all.len()))
            }
        })
        .await;
}

/// The drain of `drained` ends with one ready qwen replica elsewhere, a
/// new one, and no second replacement ever seen; the node stays cordoned.
async fn the_drain_finishes_with_one_replacement(
    cluster: &Cluster,
    leader: u64,
    drained: &str,
    first_qwen: &ReplicaView,
) -> ReplicaView {
    let seen = std::sync::Mutex::new(BTreeSet::new());
    let moved = cluster
        .eventually("the drain finishes under the new leader", || async {
            let all = replicas(cluster, leader, "qwen").await?;
            seen.lock().unwrap().extend(all.keys().cloned());
            let node = cluster.node(leader, drained).await?;
            let ready: Vec<&ReplicaView> = all.values().filter(|r| is_ready(r)).collect();
            if all.len() == 1 && ready.len() == 1 && !node.record.draining {
                Ok(ready[0].clone())
            } else {
                Err(format!(
                    "{} replicas, draining {}",
                    all.len(),
                    node.record.draining
                ))
            }
        })
        .await;
    assert_ne!(head_node(&moved), drained);
    let seen = seen.into_inner().unwrap();
    assert!(seen.len() <= 2, "one replacement, never a second: {seen:?}");
    assert_ne!(moved.replica.id, first_qwen.replica.id);
    let node = cluster.node(leader, drained).await.unwrap();
    assert!(node.record.cordoned, "a drained node stays cordoned");
    moved
}

/// qwen comes back ready on another node once `doomed`'s agent is gone,
/// and the node is marked lost.
async fn qwen_moves_off_the_lost_node(cluster: &Cluster, leader: u64, doomed: &str) -> ReplicaView {
    let back = cluster
        .eventually("qwen ready on another node", || async {
            let all = replicas(cluster, leader, "qwen").await?;
            let ready: Vec<&ReplicaView> = all
                .values()
                .filter(|r| is_ready(r) && head_node(r) != doomed)
                .collect();
            if all.len() == 1 && ready.len() == 1 {
                Ok(ready[0].clone())
            } else {
                Err(format!("{all:?}"))
            }
        })
        .await;
    let lost = cluster.node(leader, doomed).await.unwrap();
    assert_eq!(lost.record.status, NodeStatus::Lost);
    back
}
