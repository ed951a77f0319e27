//! A model scaled to zero: a streamed request is answered at once with an
//! event stream that carries keep-alive comments while a replica starts,
//! then the engine's answer, or the refusal as its error event.

use std::sync::Arc;
use std::time::Duration;

use llmgw_router::{Endpoint, RoutingTable, Settings};

use crate::common::*;

fn scaled_to_zero(endpoints: Vec<Endpoint>) -> RoutingTable {
    let mut qwen = model("qwen", &[], endpoints);
    qwen.wakes_on_request = true;
    RoutingTable {
        models: vec![qwen],
        keys: Default::default(),
    }
}

fn holding(hold: Duration) -> Settings {
    Settings {
        hold_for_replica: hold,
        held_keep_alive: Duration::from_millis(100),
        ..test_settings()
    }
}

/// A chat through `router`: its status and body.
async fn chat(router: &TestRouter, stream: bool) -> (u16, String) {
    post(
        &client(),
        &format!("{}/v1/chat/completions", router.url()),
        chat_body("qwen", stream, 8),
        &[],
    )
    .await
    .expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_stream_hears_keep_alives_until_its_replica_answers() {
    let sim = Sim::start(SMALL, &["qwen"], &[]);
    sim.wait_ready().await;
    let router = TestRouter::start(holding(Duration::from_secs(60)), vec![]).await;
    router.table.send_replace(Arc::new(scaled_to_zero(vec![])));
    // The replica turns ready a while after the request arrived.
    let table = router.table.clone();
    let url = sim.url();
    let ready_later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        table.send_replace(Arc::new(scaled_to_zero(vec![Endpoint::ready(url)])));
    });
    let (status, body) = chat(&router, true).await;
    ready_later.await.expect("table update");
    assert_eq!(status, 200, "{body}");
    let comments = body
        .split("\n\n")
        .filter(|e| e.starts_with(": waiting for a replica of qwen"))
        .count();
    assert!(comments >= 2, "keep-alive comments while held: {body}");
    let read = read_stream(&body);
    assert!(read.done && read.error.is_none(), "{body}");
    assert!(!read.text.is_empty(), "{body}");
}

#[tokio::test]
async fn a_held_stream_whose_replica_never_comes_ends_with_the_refusal() {
    let router = TestRouter::start(holding(Duration::from_secs(1)), vec![]).await;
    router.table.send_replace(Arc::new(scaled_to_zero(vec![])));
    let (status, body) = chat(&router, true).await;
    assert_eq!(status, 200, "the stream began while it was held: {body}");
    let read = read_stream(&body);
    let error = read
        .error
        .unwrap_or_else(|| panic!("an error event: {body}"));
    assert!(error.contains("model_starting"), "{error}");
    assert!(
        error.contains("no replica of model `qwen` became ready"),
        "{error}"
    );
    assert!(read.done, "{body}");
    // A request that does not stream still gets the plain 503.
    let (status, body) = chat(&router, false).await;
    assert_eq!(status, 503, "{body}");
}
