//! server.yaml's `liveness.agent_heartbeat_interval` reaches every agent:
//! the leader names it in `Registered`, which the agent obeys over its own
//! agent.yaml. The agent here is a raw stream, so the test reads exactly
//! what the leader sends.

use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_client::AgentServiceClient;
use llmgw_proto::agent::control_message::Body as Down;
use llmgw_proto::agent::{AgentMessage, Inventory, Register};
use llmgw_test_kit::Cluster;
use tokio::sync::mpsc;

/// The `heartbeat_interval_ms` the leader of a cluster started with
/// `liveness` settings `extra` puts in its `Registered`.
async fn registered_interval_ms(extra: &str) -> u64 {
    let cluster = Cluster::start(extra);
    let leader = cluster.wait_leader().await;
    let endpoint = llmgw_tls::endpoint(&cluster.grpc(leader)).unwrap();
    let channel = llmgw_tls::connect(&endpoint, None).await.unwrap();
    let (tx, rx) = mpsc::channel(8);
    tx.send(AgentMessage {
        body: Some(Up::Register(Register {
            node_id: "beat-1".into(),
            mgmt_addr: "127.0.0.1".into(),
            inventory: Some(Inventory {
                hostname: "beat-1".into(),
                gpu_source: "none".into(),
                ..Inventory::default()
            }),
            ..Register::default()
        })),
    })
    .await
    .unwrap();
    let mut answers = AgentServiceClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("the leader accepts the registration")
        .into_inner();
    loop {
        let message = answers
            .message()
            .await
            .expect("the stream stays up")
            .expect("a Registered before the stream ends");
        if let Some(Down::Registered(registered)) = message.body {
            return registered.heartbeat_interval_ms;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_tells_agents_the_configured_heartbeat_interval() {
    let configured = "liveness:\n  node_ttl: 6s\n  agent_heartbeat_interval: 700ms\n";
    assert_eq!(registered_interval_ms(configured).await, 700);
    // Without the setting, each agent keeps its own agent.yaml interval.
    assert_eq!(registered_interval_ms("").await, 0);
}
