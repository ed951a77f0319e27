//! Request bodies built to hurt a parser, sent to a real `llmgw server`: each
//! is refused with a status and a message that names the limit, and the peer
//! that received it keeps serving.

use llmgw_test_kit::Cluster;
use reqwest::Method;

async fn put_model_body(cluster: &Cluster, leader: u64, body: String) -> (u16, String) {
    let (status, answer) = cluster
        .send(leader, Method::PUT, "/api/v1/models/m", Some(body))
        .await
        .expect("the peer answers instead of dying");
    (status, answer.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_and_oversized_bodies_are_refused_and_the_peer_stays_up() {
    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;

    // 60 KB of nested block sequences once overflowed the stack and aborted
    // the peer.
    let nested_yaml = "- ".repeat(30_000) + "x\n";
    let (status, message) = put_model_body(&cluster, leader, nested_yaml).await;
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("deeper than 64 levels"), "{message}");
    assert!(message.contains("PUT /api/v1/models/m"), "{message}");

    let nested_json = "{\"a\": ".repeat(20_000) + "1" + &"}".repeat(20_000);
    let (status, message) = put_model_body(&cluster, leader, nested_json).await;
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("deeper than 64 levels"), "{message}");

    let huge = format!(
        "{{\"name\": \"m\", \"endpoints\": [\"http://10.1.2.3:8000\"], \"pad\": \"{}\"}}",
        "x".repeat(3 << 20)
    );
    let (status, message) = put_model_body(&cluster, leader, huge).await;
    assert_eq!(status, 413, "{message}");
    assert!(message.contains("1048576 bytes"), "{message}");
    assert!(message.contains("payload_too_large"), "{message}");

    // The peer that took all of it still serves reads and writes.
    let (status, _) = cluster.get(leader, "/healthz").await.unwrap();
    assert_eq!(status, 200);
    let (status, answer) = cluster.put_model(leader, "after").await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(cluster.running().len(), 3, "{}", cluster.log_tails());

    // A profile the engine itself would refuse is refused here, with the
    // engine's own name for the option.
    let vllm_flag_for_sglang = r#"
name: m
source: Qwen/Qwen2.5-0.5B-Instruct
profiles:
  - name: one
    engine: sglang
    gpus_per_node: 1
    engine_args: ["--max-model-len", "8192"]
"#;
    let (status, message) = put_model_body(&cluster, leader, vllm_flag_for_sglang.into()).await;
    assert_eq!(status, 400, "{message}");
    assert!(
        message.contains("--max-model-len is not an option of sglang")
            && message.contains("did you mean --context-length"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_floods_its_stream_is_cut_off_with_the_reason() {
    use llmgw_proto::agent::agent_message::Body as Up;
    use llmgw_proto::agent::agent_service_client::AgentServiceClient;
    use llmgw_proto::agent::{AgentMessage, CommandAck, Register};

    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let register = AgentMessage {
        body: Some(Up::Register(Register {
            node_id: "flood-1".into(),
            mgmt_addr: "127.0.0.1".into(),
            ..Register::default()
        })),
    };
    // Acks are answered with nothing, so only the flood itself is measured.
    let flood = (0..20_000).map(|n| AgentMessage {
        body: Some(Up::Ack(CommandAck {
            command_id: n,
            accepted: true,
            message: String::new(),
        })),
    });
    let endpoint = llmgw_tls::endpoint(&cluster.grpc(leader)).unwrap();
    let channel = llmgw_tls::connect(&endpoint, None).await.unwrap();
    let mut answers = AgentServiceClient::new(channel)
        .connect(tokio_stream::iter(std::iter::once(register).chain(flood)))
        .await
        .expect("the leader accepts the registration")
        .into_inner();
    let cut = loop {
        match answers.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without saying why"),
            Err(status) => break status,
        }
    };
    assert_eq!(cut.code(), tonic::Code::ResourceExhausted, "{cut:?}");
    assert!(
        cut.message().contains("200 per second") && cut.message().contains("flood-1"),
        "{}",
        cut.message()
    );
    cluster
        .wait_log(leader, &["flood-1", "the leader closed its stream"])
        .await;
    let (status, _) = cluster.get(leader, "/healthz").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(cluster.running().len(), 3, "{}", cluster.log_tails());
}

/// An append or a snapshot that openraft would trust (it carries the real
/// leader's vote) but that is malformed: entries with a gap trip an
/// assertion in openraft's core, and snapshot data that does not decode
/// fails the state machine, which openraft treats as fatal. Both are
/// refused by the transport; the follower keeps replicating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_append_or_snapshot_is_refused_and_the_follower_keeps_replicating() {
    use llmgw_proto::raft::raft_service_client::RaftServiceClient;
    use llmgw_proto::raft::{RaftPayload, SnapshotChunk};
    use llmgw_store::{Entry, TypeConfig};
    use openraft::alias::{LogIdOf, SnapshotMetaOf, VoteOf};
    use openraft::entry::RaftEntry;
    use openraft::vote::RaftLeaderId;

    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let term = cluster.cluster_view(follower).await.unwrap().term;
    let vote = VoteOf::<TypeConfig>::new_committed(term, leader);
    let log_id = |index| {
        LogIdOf::<TypeConfig>::new(
            openraft::vote::leader_id_adv::LeaderId::new(term, leader).to_committed(),
            index,
        )
    };
    let endpoint = llmgw_tls::endpoint(&cluster.grpc(follower)).unwrap();
    let channel = llmgw_tls::connect(&endpoint, None).await.unwrap();
    let mut raft = RaftServiceClient::new(channel);

    // Entries that do not follow prev_log_id.
    let gap = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: None,
        entries: vec![Entry::new_blank(log_id(7))],
        leader_commit: None,
    };
    let refused = raft
        .append_entries(RaftPayload {
            data: serde_json::to_vec(&gap).unwrap(),
            error: String::new(),
        })
        .await
        .expect_err("an append with a gap was taken");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("not at index 0"), "{refused:?}");

    // A snapshot past everything committed, whose data is not a state.
    let meta = SnapshotMetaOf::<TypeConfig> {
        last_log_id: Some(log_id(1_000_000)),
        last_membership: Default::default(),
    };
    let chunk = SnapshotChunk {
        meta: serde_json::to_vec(&(vote, meta)).unwrap(),
        data: b"{\"not\": \"a fleet state\"".to_vec(),
    };
    let refused = raft
        .install_snapshot(tokio_stream::iter([chunk]))
        .await
        .expect_err("a snapshot that does not decode was taken");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("does not decode"), "{refused:?}");
    cluster
        .wait_log(follower, &["refused a Raft RPC", "does not decode"])
        .await;

    // The follower still follows: a write through it applies there.
    let (status, answer) = cluster.put_model(follower, "after-forgery").await.unwrap();
    assert_eq!(status, 200, "{answer}");
    let names = cluster.model_names(follower, false).await.unwrap();
    assert!(names.contains(&"after-forgery".to_owned()), "{names:?}");
    assert_eq!(cluster.running().len(), 3, "{}", cluster.log_tails());
}

/// Two machines configured with the same node id: the second is refused
/// while the first is connected, with both instances named, and the
/// node's facts stay the first machine's. The first machine reconnecting
/// (same instance id) still takes over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_machine_with_a_connected_node_id_is_refused_and_changes_nothing() {
    use llmgw_proto::agent::agent_message::Body as Up;
    use llmgw_proto::agent::agent_service_client::AgentServiceClient;
    use llmgw_proto::agent::{AgentMessage, Register};

    const FIRST: &str = "0123456789abcdef0123456789abcdef";
    const CLONE: &str = "fedcba9876543210fedcba9876543210";
    let register = |instance: &str, mgmt_addr: &str| AgentMessage {
        body: Some(Up::Register(Register {
            node_id: "twin-1".into(),
            mgmt_addr: mgmt_addr.into(),
            instance_id: instance.into(),
            ..Register::default()
        })),
    };
    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let endpoint = llmgw_tls::endpoint(&cluster.grpc(leader)).unwrap();
    let channel = llmgw_tls::connect(&endpoint, None).await.unwrap();
    let mut client = AgentServiceClient::new(channel);
    // The first machine's stream stays open while its sender lives.
    let (first_tx, first_rx) = tokio::sync::mpsc::channel(4);
    first_tx.send(register(FIRST, "127.0.0.1")).await.unwrap();
    let mut first = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(first_rx))
        .await
        .expect("the first machine registers")
        .into_inner();
    first
        .message()
        .await
        .expect("Registered")
        .expect("Registered");

    let refused = client
        .connect(tokio_stream::iter([register(CLONE, "127.0.0.2")]))
        .await
        .expect_err("the second machine is refused");
    assert_eq!(refused.code(), tonic::Code::AlreadyExists, "{refused:?}");
    for named in ["twin-1", FIRST, CLONE] {
        assert!(refused.message().contains(named), "{}", refused.message());
    }
    let (status, node) = cluster.get(leader, "/api/v1/nodes/twin-1").await.unwrap();
    assert_eq!(status, 200, "{node}");
    assert_eq!(node["mgmt_addr"], "127.0.0.1", "{node}");

    // The first machine again (its agent restarted): taken over at once.
    let (again_tx, again_rx) = tokio::sync::mpsc::channel(4);
    again_tx.send(register(FIRST, "127.0.0.1")).await.unwrap();
    let mut again = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(again_rx))
        .await
        .expect("the same instance takes over")
        .into_inner();
    again
        .message()
        .await
        .expect("Registered")
        .expect("Registered");
    drop(first_tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_usage_reports_are_refused_by_name_and_change_nothing() {
    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let send = |method: Method, path: &'static str, body: &str| {
        let body = body.to_owned();
        let cluster = &cluster;
        async move {
            let (status, answer) = cluster
                .send(leader, method, path, Some(body))
                .await
                .expect("the peer answers instead of dying");
            (status, answer.to_string())
        }
    };

    let (status, message) = send(Method::POST, "/api/v1/keys", r#"{"name": "has space"}"#).await;
    assert_eq!(status, 400, "{message}");
    assert!(
        message.contains("POST /api/v1/keys: name: key name `has space`"),
        "{message}"
    );

    let (status, message) = send(Method::POST, "/api/v1/keys", r#"{"name": "ci", "rpm": 5}"#).await;
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("unknown field `rpm`"), "{message}");
    // A misspelt limit would leave the key without it.
    let (status, message) = send(
        Method::POST,
        "/api/v1/keys",
        r#"{"name": "ci", "limits": {"tokens_per_dya": 5}}"#,
    )
    .await;
    assert_eq!(status, 400, "{message}");
    assert!(
        message.contains("POST /api/v1/keys: limits: unknown field `tokens_per_dya`"),
        "{message}"
    );

    let (status, message) = send(Method::POST, "/api/v1/usage", "not json").await;
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("POST /api/v1/usage"), "{message}");

    // A minute far ahead of the leader's clock would outlive every
    // retention.
    let future = r#"{"reporter": "r", "seq": 1, "rows": [{"key": "ci", "model": "m",
        "minute": 99999999999, "totals": {"completed": 1}}]}"#;
    let (status, message) = send(Method::POST, "/api/v1/usage", future).await;
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("ahead of the leader's clock"), "{message}");

    let (status, keys) = cluster
        .send(leader, Method::GET, "/api/v1/keys", None)
        .await
        .unwrap();
    assert_eq!((status, keys.to_string()), (200, "[]".to_owned()));
    let (status, usage) = cluster
        .send(leader, Method::GET, "/api/v1/usage", None)
        .await
        .unwrap();
    assert_eq!((status, usage.to_string()), (200, "[]".to_owned()));
}

/// Registrations each just under the agent message cap (4 MiB), from many
/// node ids at once, while a follower is paused: catching it up takes
/// appends past the peer transport's 64 MiB, which never arrive, so it
/// never catches up (and with one more peer down, nothing commits). Each
/// is refused by its size; writes keep flowing and every peer converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_maximum_size_registrations_is_refused_and_writes_keep_flowing() {
    use llmgw_proto::agent::agent_message::Body as Up;
    use llmgw_proto::agent::agent_service_client::AgentServiceClient;
    use llmgw_proto::agent::{AgentMessage, Register};
    use tokio_stream::StreamExt;

    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let behind = if leader == 1 { 2 } else { 1 };
    cluster.pause(behind);
    let endpoint = llmgw_tls::endpoint(&cluster.grpc(leader)).unwrap();
    // Each node's first answer: registered, or why not.
    let bursts = (0..24).map(|n| {
        let endpoint = endpoint.clone();
        async move {
            let labels = (0..64)
                .map(|l| (format!("label-{l}"), "x".repeat(48 << 10)))
                .collect();
            let register = AgentMessage {
                body: Some(Up::Register(Register {
                    node_id: format!("big-{n}"),
                    mgmt_addr: "127.0.0.1".into(),
                    labels,
                    ..Register::default()
                })),
            };
            let channel = llmgw_tls::connect(&endpoint, None).await.unwrap();
            let mut answers = AgentServiceClient::new(channel)
                .max_encoding_message_size(8 << 20)
                .connect(tokio_stream::iter([register]).chain(tokio_stream::pending()))
                .await?
                .into_inner();
            answers.message().await.map(|first| format!("{first:?}"))
        }
    });
    let answers = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        futures::future::join_all(bursts),
    )
    .await;
    cluster.resume(behind);
    let write = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        cluster.put_model(leader, "after-the-burst"),
    )
    .await;
    assert!(
        matches!(write, Ok(Ok((200, _)))),
        "a write after the burst: {write:?}"
    );
    for answer in answers.expect("every registration is answered") {
        let refusal = answer.expect_err("an oversized registration is refused");
        assert_eq!(refusal.code(), tonic::Code::InvalidArgument, "{refusal:?}");
        assert!(
            refusal.message().contains("at most 256 KiB"),
            "{}",
            refusal.message()
        );
    }
    cluster.wait_converged().await;
}

/// A body under the 1 MiB limit whose command is larger in the log (YAML
/// quotes become escaped JSON) is refused by the log's own bound, naming
/// it, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_the_log_entry_bound_is_refused_and_nothing_is_written() {
    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let quotes = "\"".repeat(700 << 10);
    let yaml = format!(
        "name: m\nsource: Qwen/Qwen2.5-0.5B-Instruct\nprofiles:\n  - name: one\n    engine: vllm\n    gpus_per_node: 1\n    env:\n      NOTE: '{quotes}'\n"
    );
    let (status, message) = put_model_body(&cluster, leader, yaml).await;
    let head: String = message.chars().take(300).collect();
    assert_eq!(status, 400, "{head}");
    assert!(
        message.contains("over the bound of 1048576 bytes"),
        "{head}"
    );
    let names = cluster.model_names(leader, true).await.unwrap();
    assert!(!names.contains(&"m".to_owned()), "{names:?}");
    let (status, answer) = cluster.put_model(leader, "after").await.unwrap();
    assert_eq!(status, 200, "{answer}");
}
