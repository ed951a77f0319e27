//! Placement, reconciliation and drain, end to end: three real peers, four
//! real agents with fixture inventories across two fabrics plus one node
//! without a fabric, and simulated engines launched through the real
//! adapters.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use llmgw_dev::{A100_ROCE_B, H100_IB_A, L40S_PCIE};
use reqwest::Method;
use serde_json::{Value, json};
use support::agents::Agent;
use support::{Cluster, eventually};

const LIVENESS: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 5s\n  leader_grace: 6s\n";

async fn put(cluster: &Cluster, peer: u64, model: Value) {
    let name = model["name"].as_str().unwrap().to_owned();
    let (status, body) = cluster
        .send(
            peer,
            Method::PUT,
            &format!("/api/v1/models/{name}"),
            Some(model.to_string()),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "PUT {name}: {body}");
}

/// Replicas of `model` by id, as `peer` sees them.
async fn replicas(
    cluster: &Cluster,
    peer: u64,
    model: &str,
) -> Result<BTreeMap<String, Value>, String> {
    match cluster.get(peer, "/api/v1/replicas").await? {
        (200, Value::Array(all)) => Ok(all
            .into_iter()
            .filter(|r| r["model"] == model)
            .filter_map(|r| Some((r["id"].as_str()?.to_owned(), r)))
            .collect()),
        other => Err(format!("{other:?}")),
    }
}

/// Waits for exactly one ready replica of `model`; returns it.
async fn one_ready(cluster: &Cluster, peer: u64, model: &str) -> Value {
    eventually(
        cluster,
        &format!("one ready replica of {model}"),
        || async {
            let all = replicas(cluster, peer, model).await?;
            let ready: Vec<&Value> = all.values().filter(|r| r["state"] == "ready").collect();
            if all.len() == 1 && ready.len() == 1 {
                Ok(ready[0].clone())
            } else {
                let states: Vec<String> = all
                    .values()
                    .map(|r| format!("{} {} {}", r["id"], r["state"], r["shards"]))
                    .collect();
                Err(states.join("; "))
            }
        },
    )
    .await
}

async fn chat(http: &reqwest::Client, endpoint: &str, model: &str) -> Result<String, String> {
    let response = http
        .post(format!("{endpoint}/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 8
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body: Value = response.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    body["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_owned)
        .ok_or(format!("no content: {body}"))
}

fn head_node(replica: &Value) -> String {
    replica["shards"][0]["node"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_place_serve_move_off_lost_and_drained_nodes_and_explain_the_rest() {
    let mut cluster = Cluster::start(LIVENESS);
    let leader = cluster.wait_leader().await;
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
        agents.insert(id, Agent::start(&cluster, id, kind, 1 + i as u64 % 3));
    }
    eventually(&cluster, "four nodes ready", || async {
        let (_, nodes) = cluster.get(leader, "/api/v1/nodes").await?;
        let ready = nodes
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["status"] == "ready" && n["stream"]["connected"] == true)
            .count();
        if ready == 4 {
            Ok(())
        } else {
            Err(format!("{ready} ready"))
        }
    })
    .await;

    // A two-node tensor-parallel model: only the two H100s share a fabric
    // with 8 free GPUs each.
    put(
        &cluster,
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
    let llama = one_ready(&cluster, leader, "llama-70b").await;
    let llama_nodes: BTreeSet<&str> = llama["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap())
        .collect();
    assert_eq!(llama_nodes, BTreeSet::from(["h100-1", "h100-2"]));
    assert_eq!(llama["fabric"], "ib-a");

    // A single-node model, and one that fits nowhere.
    put(
        &cluster,
        leader,
        json!({
            "name": "qwen",
            "aliases": ["qwen-small"],
            "source": "Qwen/Qwen2.5-0.5B-Instruct",
            "replicas": 1,
            "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                          "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16}]
        }),
    )
    .await;
    put(
        &cluster,
        leader,
        json!({
            "name": "needs-b200",
            "source": "Qwen/Qwen2.5-7B-Instruct",
            "replicas": 1,
            "profiles": [{"name": "b200", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                          "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16,
                          "gpu_models": ["B200"]}]
        }),
    )
    .await;
    let qwen = one_ready(&cluster, leader, "qwen").await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    for (replica, model) in [(&llama, "llama-70b"), (&qwen, "qwen-small")] {
        let endpoint = replica["endpoint"].as_str().expect("endpoint");
        let answer = chat(&http, endpoint, model).await.unwrap();
        assert!(!answer.is_empty());
    }
    let (_, why) = cluster
        .get(leader, "/api/v1/models/needs-b200/explain")
        .await
        .unwrap();
    assert_eq!(why["pending"], 1, "{why}");
    let text = why["explanation"].as_str().unwrap();
    assert!(
        text.contains("0/4 nodes fit needs-b200 profile b200")
            && text.contains("4 have no allowed GPU model"),
        "{text}"
    );

    // Drain qwen's node, and kill the leader in the middle of it: the new
    // leader finishes the drain from the replicated state.
    let drained = head_node(&qwen);
    let first_qwen = qwen["id"].as_str().unwrap().to_owned();
    let (status, body) = cluster
        .send(
            leader,
            Method::POST,
            &format!("/api/v1/nodes/{drained}/drain?deadline_s=60"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    eventually(&cluster, "a replacement is placed", || async {
        let all = replicas(&cluster, leader, "qwen").await?;
        if all.len() == 2 {
            Ok(())
        } else {
            Err(format!("{} replicas", all.len()))
        }
    })
    .await;
    cluster.kill(leader);
    let leader = cluster.wait_leader().await;
    let seen = std::sync::Mutex::new(BTreeSet::new());
    let moved = eventually(
        &cluster,
        "the drain finishes under the new leader",
        || async {
            let all = replicas(&cluster, leader, "qwen").await?;
            seen.lock().unwrap().extend(all.keys().cloned());
            let (_, node) = cluster
                .get(leader, &format!("/api/v1/nodes/{drained}"))
                .await?;
            let ready: Vec<&Value> = all.values().filter(|r| r["state"] == "ready").collect();
            if all.len() == 1 && ready.len() == 1 && node["draining"] == false {
                Ok(ready[0].clone())
            } else {
                Err(format!(
                    "{} replicas, draining {}",
                    all.len(),
                    node["draining"]
                ))
            }
        },
    )
    .await;
    assert_ne!(head_node(&moved), drained);
    let seen = seen.into_inner().unwrap();
    assert!(seen.len() <= 2, "one replacement, never a second: {seen:?}");
    assert_ne!(moved["id"], first_qwen.as_str());
    let (_, node) = cluster
        .get(leader, &format!("/api/v1/nodes/{drained}"))
        .await
        .unwrap();
    assert_eq!(node["cordoned"], true, "a drained node stays cordoned");
    let endpoint = moved["endpoint"].as_str().unwrap();
    chat(&http, endpoint, "qwen").await.unwrap();

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
    let back = eventually(&cluster, "qwen ready on another node", || async {
        let all = replicas(&cluster, leader, "qwen").await?;
        let ready: Vec<&Value> = all
            .values()
            .filter(|r| r["state"] == "ready" && head_node(r) != doomed)
            .collect();
        if all.len() == 1 && ready.len() == 1 {
            Ok(ready[0].clone())
        } else {
            Err(format!("{all:?}"))
        }
    })
    .await;
    let (_, lost) = cluster
        .get(leader, &format!("/api/v1/nodes/{doomed}"))
        .await
        .unwrap();
    assert_eq!(lost["status"], "lost");
    chat(&http, back["endpoint"].as_str().unwrap(), "qwen")
        .await
        .unwrap();
    let (_, why) = cluster
        .get(leader, "/api/v1/models/qwen/explain")
        .await
        .unwrap();
    assert!(
        why["last_failure"]["failure"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("lost")),
        "{why}"
    );
}
