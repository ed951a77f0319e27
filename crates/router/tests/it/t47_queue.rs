//! A model with `max_requests_per_replica`: requests over it wait at the
//! router in arrival order, not in an engine's queue, and a replica that
//! becomes ready takes its share of them at once.

use std::sync::Arc;
use std::time::Duration;

use llmgw_router::{Endpoint, RoutingTable};

use crate::common::*;

fn limited(endpoints: Vec<Endpoint>) -> Arc<RoutingTable> {
    let mut qwen = model("qwen", &[], endpoints);
    qwen.max_requests_per_replica = Some(1);
    Arc::new(RoutingTable {
        models: vec![qwen],
        keys: Default::default(),
    })
}

async fn router_metric(router: &TestRouter, series: &str) -> Option<f64> {
    let (_, page) = get(&format!("{}/metrics", router.url())).await?;
    metric(&page, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_limit_wait_at_the_router_and_go_to_a_replica_that_becomes_ready() {
    // Each answer takes a second or more: 50 tokens, 20 ms apart.
    let env = [("LLMGW_SIM_ITL", "20ms")];
    let first = Sim::start(SMALL, &["qwen"], &env);
    let second = Sim::start(SMALL, &["qwen"], &env);
    first.wait_ready().await;
    second.wait_ready().await;
    let router = TestRouter::start(test_settings(), vec![]).await;
    router
        .table
        .send_replace(limited(vec![Endpoint::ready(first.url())]));

    let url = format!("{}/v1/chat/completions", router.url());
    let chats: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(
                async move { post(&client(), &url, chat_body("qwen", true, 50), &[]).await },
            )
        })
        .collect();
    let waiting = "llmgw_router_waiting_requests{model=\"qwen\"}";
    assert!(
        wait_until(Duration::from_secs(30), || async {
            router_metric(&router, waiting).await == Some(3.0)
        })
        .await,
        "three of four requests wait at the router while the one replica has its one: {:?}",
        router_metric(&router, waiting).await
    );
    let engine_running = "vllm:num_requests_running";
    let (_, page) = get(&format!("{}/metrics", first.url()))
        .await
        .expect("engine metrics");
    let running = metric(&page, engine_running);
    assert!(
        running.is_some_and(|n| n <= 1.0),
        "the engine holds at most one request, not four: {running:?}"
    );

    router.table.send_replace(limited(vec![
        Endpoint::ready(first.url()),
        Endpoint::ready(second.url()),
    ]));
    for chat in chats {
        let (status, body) = chat.await.expect("task").expect("an answer");
        assert_eq!(status, 200, "{body}");
        let read = read_stream(&body);
        assert!(read.done && read.error.is_none(), "a whole stream: {body}");
    }
    let answered_by_second = format!(
        "llmgw_router_requests_total{{model=\"qwen\",endpoint=\"{}\",status=\"200\"}}",
        second.url()
    );
    assert!(
        router_metric(&router, &answered_by_second)
            .await
            .is_some_and(|n| n >= 1.0),
        "the replica that became ready took waiting requests"
    );
    assert_eq!(router_metric(&router, waiting).await, Some(0.0));
    assert_eq!(
        router_metric(
            &router,
            "llmgw_router_queue_wait_seconds_count{model=\"qwen\"}"
        )
        .await,
        Some(3.0),
        "three requests waited"
    );
}
