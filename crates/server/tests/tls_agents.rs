//! mTLS between real `llmgw agent` and `llmgw server` processes: a node's
//! certificate registers only that node, and an agent's rotated
//! certificate is what it presents when it reconnects.

use std::time::{Duration, Instant, SystemTime};

use llmgw_api::NodeStatus;
use llmgw_dev::L40S_PCIE;
use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_client::AgentServiceClient;
use llmgw_proto::agent::{AgentMessage, Register};
use llmgw_test_kit::Cluster;
use llmgw_test_kit::agents::{Agent, node_tls_files};
use llmgw_tls::certs::{self, IssueRequest};
use llmgw_tls::{Identity, Tls};

const LIVENESS: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 30s\n  leader_grace: 4s\n";

/// `node`'s status and whether its stream is connected, on `peer`.
async fn node_state(
    cluster: &Cluster,
    peer: u64,
    node: &str,
) -> Result<(NodeStatus, bool), String> {
    cluster
        .nodes(peer)
        .await?
        .into_iter()
        .find(|n| n.record.id == node)
        .map(|n| {
            let connected = n.stream.is_some_and(|stream| stream.connected);
            (n.record.status, connected)
        })
        .ok_or_else(|| format!("{node} is not registered"))
}

async fn wait_connected(cluster: &Cluster, leader: u64, node: &str) {
    cluster
        .eventually(&format!("{node} connected to leader {leader}"), || async {
            match node_state(cluster, leader, node).await? {
                (NodeStatus::Ready, true) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_registers_only_its_own_node() {
    let cluster = Cluster::start_tls(LIVENESS);
    let leader = cluster.wait_leader().await;
    let _agent = Agent::start(&cluster, "node-a", L40S_PCIE, 1);
    wait_connected(&cluster, leader, "node-a").await;

    // node-a's own certificate, claiming to be node-b.
    let tls = Tls::load(
        node_tls_files(&cluster, "node-a"),
        Identity::Node("node-a".into()),
    )
    .unwrap();
    for peer in 1..=3 {
        let endpoint = llmgw_tls::endpoint(&cluster.grpc(peer))
            .unwrap()
            .connect_timeout(Duration::from_secs(5));
        let channel = llmgw_tls::connect(&endpoint, Some(&tls)).await.unwrap();
        let register = AgentMessage {
            body: Some(Up::Register(Register {
                node_id: "node-b".into(),
                mgmt_addr: "127.0.0.1".into(),
                ..Register::default()
            })),
        };
        let refused = AgentServiceClient::new(channel)
            .connect(tokio_stream::iter([register]))
            .await
            .expect_err("node-a's certificate registered node-b");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert!(
            refused.message().contains("node node-a") && refused.message().contains("node-b"),
            "{}",
            refused.message()
        );
        cluster
            .wait_log(peer, &["refused a node registration", "node-b"])
            .await;
    }
    assert!(
        node_state(&cluster, leader, "node-b").await.is_err(),
        "node-b was registered"
    );
    // The real node-a was not disturbed.
    wait_connected(&cluster, leader, "node-a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_agent_certificate_keeps_the_stream_and_is_used_to_reconnect() {
    let mut cluster = Cluster::start_tls(LIVENESS);
    let leader = cluster.wait_leader().await;
    // The agent starts with a certificate that expires soon.
    let files = node_tls_files(&cluster, "node-a");
    let short_until = SystemTime::now() + Duration::from_secs(20);
    let mut short = IssueRequest::new(Identity::Node("node-a".into()), vec![]);
    short.not_after = short_until;
    certs::issue(&cluster.tls_dir(), &cluster.tls_dir(), &short).unwrap();
    let agent = Agent::start(&cluster, "node-a", L40S_PCIE, leader);
    wait_connected(&cluster, leader, "node-a").await;

    // Rotate: a long-lived certificate over the same files.
    certs::issue(
        &cluster.tls_dir(),
        &cluster.tls_dir(),
        &IssueRequest::new(Identity::Node("node-a".into()), vec![]),
    )
    .unwrap();
    cluster
        .eventually("the agent reloads its certificate", || async {
            if agent.log_text().contains("mTLS material reloaded") {
                Ok(())
            } else {
                Err("no reload logged yet".to_owned())
            }
        })
        .await;

    // The open stream outlives the old certificate.
    while SystemTime::now() < short_until + Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, connected) = node_state(&cluster, leader, "node-a").await.unwrap();
    assert!(
        status == NodeStatus::Ready && connected,
        "{status:?} {connected}"
    );
    assert!(files.cert.exists());

    // A new leader: the agent dials again, and only the new certificate
    // can get it through.
    cluster.kill(leader);
    let killed = Instant::now();
    let new_leader = cluster.wait_leader().await;
    wait_connected(&cluster, new_leader, "node-a").await;
    eprintln!(
        "node-a re-homed to leader {new_leader} {:?} after the kill",
        killed.elapsed()
    );
    for peer in cluster.running() {
        let refusals: Vec<String> = cluster
            .log_text(peer)
            .lines()
            .filter(|l| l.contains("mTLS handshake failed"))
            .map(str::to_owned)
            .collect();
        assert!(
            refusals.is_empty(),
            "peer {peer} refused a handshake: {refusals:?}"
        );
    }
}
