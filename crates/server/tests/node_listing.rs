//! `GET /api/v1/nodes` filtered by status and read in pages: the `Link`
//! header leads from one page to the next, every node once, and a filter
//! or a page size that makes no sense is refused naming the parameter.

use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_client::AgentServiceClient;
use llmgw_proto::agent::{AgentMessage, Register};
use llmgw_test_kit::Cluster;
use serde_json::Value;

/// Registers `node` and keeps its stream open while the sender lives.
async fn register(
    client: &mut AgentServiceClient<tonic::transport::Channel>,
    node: &str,
) -> tokio::sync::mpsc::Sender<AgentMessage> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(AgentMessage {
        body: Some(Up::Register(Register {
            node_id: node.into(),
            mgmt_addr: "127.0.0.1".into(),
            ..Register::default()
        })),
    })
    .await
    .unwrap();
    let mut answers = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap_or_else(|e| panic!("{node} registers: {e}"))
        .into_inner();
    answers
        .message()
        .await
        .expect("Registered")
        .expect("Registered");
    tx
}

/// `GET path`: the status, the ids of the nodes listed, and the `Link`.
async fn page(
    cluster: &Cluster,
    peer: u64,
    path: &str,
) -> (u16, Vec<String>, Option<String>, Value) {
    let response = cluster
        .http
        .get(format!("{}{path}", cluster.admin(peer)))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let link = response
        .headers()
        .get("link")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap_or(Value::Null);
    let ids = body
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .map(|n| n["id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    (status, ids, link, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_listed_by_status_in_pages_that_link_to_the_next() {
    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let endpoint = llmgw_tls::endpoint(&cluster.grpc(leader)).unwrap();
    let channel = llmgw_tls::connect(&endpoint, None).await.unwrap();
    let mut client = AgentServiceClient::new(channel);
    let names = ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"];
    let mut streams = Vec::new();
    for name in names {
        streams.push(register(&mut client, name).await);
    }

    let (status, all, link, _) = page(&cluster, leader, "/api/v1/nodes").await;
    assert_eq!((status, link), (200, None));
    assert_eq!(all, names);

    // Two at a time, following the links: every node once, in id order.
    let mut seen = Vec::new();
    let mut next = Some("/api/v1/nodes?status=ready&limit=2".to_owned());
    let mut pages = 0;
    while let Some(path) = next.take() {
        let (status, ids, link, body) = page(&cluster, leader, &path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(ids.len() <= 2, "{path}: {ids:?}");
        seen.extend(ids);
        pages += 1;
        next = link.map(|l| {
            assert!(l.ends_with(">; rel=\"next\""), "{l}");
            assert!(l.contains("status=ready&"), "the filter carries over: {l}");
            l.trim_start_matches('<')
                .split('>')
                .next()
                .unwrap()
                .to_owned()
        });
    }
    assert_eq!(seen, names, "in {pages} pages");
    assert_eq!(pages, 3);

    let (status, lost, link, _) = page(&cluster, leader, "/api/v1/nodes?status=lost").await;
    assert_eq!((status, lost.len(), link), (200, 0, None));
    let (status, after, _, _) = page(&cluster, leader, "/api/v1/nodes?after=gpu-c").await;
    assert_eq!(status, 200);
    assert_eq!(after, names[3..]);

    for (path, named) in [
        ("/api/v1/nodes?status=gone", "status=\"gone\""),
        ("/api/v1/nodes?limit=0", "limit=0"),
        ("/api/v1/nodes?limit=10001", "limit=10001"),
    ] {
        let (status, _, _, body) = page(&cluster, leader, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(named), "{path}: {body}");
    }
    drop(streams);
}
