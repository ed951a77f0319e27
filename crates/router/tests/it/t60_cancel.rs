//! A client that goes away cancels the engine's request.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use llmgw_router::Endpoint;

use crate::common::*;

/// Sum of a gauge over its label sets in the engine's Prometheus page.
async fn engine_gauge(sim: &Sim, name: &str) -> Option<f64> {
    let (_, text) = get(&format!("{}/metrics", sim.url())).await?;
    let prefix = format!("{name}{{");
    Some(
        text.lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_the_upstream_request() {
    // 200 tokens 50 ms apart: ten seconds if nobody cancels it.
    let sim = Sim::start(
        SMALL,
        &["m"],
        &[
            ("LLMGW_SIM_ITL", "50ms"),
            ("LLMGW_SIM_OUTPUT_TOKENS", "400"),
        ],
    );
    sim.wait_ready().await;
    let router = TestRouter::start(
        test_settings(),
        vec![model("m", &[], vec![Endpoint::ready(sim.url())])],
    )
    .await;

    let request = Request::post(format!("{}/v1/chat/completions", router.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_body("m", true, 200))))
        .unwrap();
    let response = client().request(request).await.expect("stream starts");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(20), body.frame())
        .await
        .expect("first chunk within 20 s");
    assert!(first.is_some());
    assert_eq!(
        engine_gauge(&sim, "vllm:num_requests_running").await,
        Some(1.0)
    );

    drop(body);
    let cancelled = wait_until(Duration::from_secs(5), || async {
        engine_gauge(&sim, "vllm:num_requests_running").await == Some(0.0)
    })
    .await;
    assert!(
        cancelled,
        "the engine kept generating for a client that left"
    );
    let metrics_url = format!("{}/metrics", router.url());
    let outstanding = format!(
        "llmgw_router_endpoint_outstanding_requests{{endpoint=\"{}\"}}",
        sim.url()
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            get(&metrics_url)
                .await
                .is_some_and(|(_, m)| metric(&m, &outstanding) == Some(0.0))
        })
        .await,
        "the router still counts the abandoned request"
    );
}
