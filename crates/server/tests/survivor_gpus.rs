//! GPUs held by engine processes that outlived SIGKILL: an agent says so
//! in its heartbeats, and the leader places nothing on them until they are
//! gone (the agent would refuse the start). The agent here is a raw stream,
//! so the heartbeat is exactly what the test sends.

use std::time::Duration;

use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_client::AgentServiceClient;
use llmgw_proto::agent::{AgentMessage, EngineAvailable, Gpu, Heartbeat, Inventory, Register};
use llmgw_test_kit::Cluster;
use serde_json::json;
use tokio::sync::mpsc;

const NODE: &str = "stuck-1";

fn register() -> AgentMessage {
    let gpus = (0..2)
        .map(|index| Gpu {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_mib: 81_559,
            ..Gpu::default()
        })
        .collect();
    AgentMessage {
        body: Some(Up::Register(Register {
            node_id: NODE.into(),
            mgmt_addr: "127.0.0.1".into(),
            inventory: Some(Inventory {
                gpu_source: "fixture".into(),
                gpus,
                hostname: NODE.into(),
                ..Inventory::default()
            }),
            engines: vec![EngineAvailable {
                engine: "vllm".into(),
                version: "0.11.0".into(),
                launch_mode: "process".into(),
            }],
            ..Register::default()
        })),
    }
}

/// The GPUs of `model`'s replicas, as the leader placed them.
async fn placed_gpus(cluster: &Cluster, leader: u64, model: &str) -> Vec<Vec<u32>> {
    let mut gpus: Vec<Vec<u32>> = cluster
        .replicas(leader)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.replica.model == model)
        .map(|r| r.replica.shards[0].gpus.clone())
        .collect();
    gpus.sort();
    gpus
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_held_by_processes_that_outlived_sigkill_get_nothing_new() {
    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let endpoint = llmgw_tls::endpoint(&cluster.grpc(leader)).unwrap();
    let channel = llmgw_tls::connect(&endpoint, None).await.unwrap();
    let (tx, rx) = mpsc::channel(64);
    tx.send(register()).await.unwrap();
    let mut answers = AgentServiceClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("the leader accepts the registration")
        .into_inner();
    // Commands are read and dropped: nothing here starts engines.
    tokio::spawn(async move { while let Ok(Some(_)) = answers.message().await {} });
    let (survivors_tx, survivors) = tokio::sync::watch::channel(vec![0u32]);
    let beats = tx.clone();
    tokio::spawn(async move {
        let mut seq = 0;
        loop {
            seq += 1;
            let beat = AgentMessage {
                body: Some(Up::Heartbeat(Heartbeat {
                    seq,
                    sent_unix_ms: 0,
                    survivor_gpus: survivors.borrow().clone(),
                })),
            };
            if beats.send(beat).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    cluster
        .eventually("the node is registered", || async {
            match cluster.get(leader, &format!("/api/v1/nodes/{NODE}")).await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;

    let model = json!({
        "name": "m",
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": 2,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16}]
    });
    cluster.put_model_spec(leader, &model).await;

    // One replica fits, on GPU 1; the other waits for a free GPU.
    cluster
        .eventually("one replica, on GPU 1", || async {
            match placed_gpus(&cluster, leader, "m").await {
                gpus if gpus == [vec![1]] => Ok(()),
                gpus => Err(format!("placed on {gpus:?}")),
            }
        })
        .await;
    // The node's record says why GPU 0 takes nothing.
    let (_, node) = cluster
        .get(leader, &format!("/api/v1/nodes/{NODE}"))
        .await
        .unwrap();
    assert_eq!(node["stream"]["survivor_gpus"], json!([0]), "{node}");
    // So does the leader's explanation of the pending replica.
    let (_, explained) = cluster
        .get(leader, "/api/v1/models/m/explain")
        .await
        .unwrap();
    assert_eq!(explained["pending"], 1, "{explained}");
    let why = explained["explanation"].as_str().unwrap_or_default();
    assert!(why.contains("GPU"), "{explained}");
    // Rounds keep running (heartbeats, retries): still nothing on GPU 0.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(placed_gpus(&cluster, leader, "m").await, [vec![1]]);

    // The processes are gone: the second replica goes on GPU 0.
    survivors_tx.send(Vec::new()).unwrap();
    cluster
        .eventually("both replicas placed", || async {
            match placed_gpus(&cluster, leader, "m").await {
                gpus if gpus == [vec![0], vec![1]] => Ok(()),
                gpus => Err(format!("placed on {gpus:?}")),
            }
        })
        .await;
    drop(tx);
}
