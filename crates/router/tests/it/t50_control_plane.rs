//! A standalone router learning endpoints from a control-plane peer's admin
//! API, and keeping them when the peer goes away.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use llmgw_api::{
    Model, ModelExplanation, Replica, ReplicaState, ReplicaView, Shard, ShardState, paths,
};
use llmgw_router::{ControlPlaneAccess, ControlPlaneWatcher, Router, RoutingTable};

use crate::common::*;

/// A peer's admin API, answered with the contract's own types: model `m`
/// has one ready replica whose head shard serves on `engine_port`; model
/// `idle` has none and an explanation.
fn admin_answer(path: &str, engine_port: u16) -> (u16, String) {
    let body = if path == paths::MODELS {
        serde_json::to_string(&[catalog_entry("m", &["m-alias"]), catalog_entry("idle", &[])])
    } else if path == paths::REPLICAS {
        serde_json::to_string(&[ready_replica("m", engine_port)])
    } else if path == paths::explain("idle") {
        serde_json::to_string(&ModelExplanation {
            model: "idle".into(),
            desired: 1,
            replicas: Vec::new(),
            pending: 1,
            explanation: Some("0/1 nodes fit idle profile tp8: 1 has 1 free GPU (need 8)".into()),
            detail: None,
            last_failure: None,
            scaling: None,
            last_scale: None,
        })
    } else {
        return (404, "{}".into());
    };
    (200, body.expect("the contract's types serialize"))
}

/// A catalog entry as `GET /api/v1/models` lists it.
fn catalog_entry(name: &str, aliases: &[&str]) -> Model {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "aliases": aliases,
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": 1,
        "profiles": [],
    }))
    .expect("a catalog entry")
}

/// One ready single-shard replica of `model` on node `n1`.
fn ready_replica(model: &str, engine_port: u16) -> ReplicaView {
    ReplicaView {
        state: ReplicaState::Ready,
        endpoint: Some(format!("http://127.0.0.1:{engine_port}")),
        kv_events: None,
        wanted_asleep: false,
        replica: Replica {
            id: "r1".into(),
            model: model.into(),
            profile: "tp1".into(),
            shards: vec![Shard {
                node: "n1".into(),
                gpus: vec![0],
                port: engine_port,
                rank: 0,
                state: ShardState::Ready,
                pid: Some(1),
                last_failure: None,
                state_changed_at_ms: 0,
                report_seq: 1,
            }],
            created_at_ms: 0,
            fabric: None,
            rendezvous_port: None,
            kv_event_ports: None,
            replaces: None,
            stop: None,
            spec_fingerprint: None,
            served_names: None,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_come_from_the_admin_api_and_outlive_the_peer() {
    let engine = Sim::start(SMALL, &["m", "m-alias"], &[]);
    engine.wait_ready().await;
    let engine_port = engine.port;

    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_url = format!("http://{}", admin.local_addr().unwrap());
    let admin_task = tokio::spawn(async move {
        // Connections live in this set, so aborting the task closes them
        // too (the router's client keeps connections alive).
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let (stream, _) = admin.accept().await.unwrap();
            connections.spawn(async move {
                let service =
                    service_fn(move |request: Request<hyper::body::Incoming>| async move {
                        let (status, body) = admin_answer(request.uri().path(), engine_port);
                        let mut response = Response::new(Full::new(Bytes::from(body)));
                        *response.status_mut() = status.try_into().unwrap();
                        Ok::<_, Infallible>(response)
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let watcher = ControlPlaneWatcher::spawn(
        vec![admin_url],
        ControlPlaneAccess::default(),
        RoutingTable::default(),
        Duration::from_millis(100),
        Duration::from_secs(1),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router = Router::new(test_settings(), &watcher)
        .serve(listener)
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", router.local_addr());
    let c = client();

    let learnt = wait_until(Duration::from_secs(30), || async {
        matches!(
            post(&c, &url, chat_body("m-alias", false, 2), &[]).await,
            Ok((200, _))
        )
    })
    .await;
    assert!(
        learnt,
        "the router never learnt m's endpoint from the admin API"
    );
    let (status, body) = post(&c, &url, chat_body("idle", false, 2), &[])
        .await
        .unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("0/1 nodes fit idle profile tp8"), "{body}");

    // The peer goes away: the router keeps routing to what it knew.
    admin_task.abort();
    let _ = admin_task.await;
    let table = watcher_table(&watcher);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        watcher_table(&watcher),
        table,
        "the table changed while no peer answered"
    );
    for i in 0..5 {
        let (status, body) = post(&c, &url, chat_body("m", false, 2), &[]).await.unwrap();
        assert_eq!(status, 200, "request {i} after the peer went away: {body}");
    }
}

fn watcher_table(watcher: &ControlPlaneWatcher) -> Arc<RoutingTable> {
    use llmgw_router::EndpointSource;
    Arc::clone(&watcher.subscribe().borrow())
}
