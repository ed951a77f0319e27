//! Errors the router answers itself, and what upstream errors do (and do
//! not do) to an endpoint.

use std::time::Duration;

use http_body_util::BodyExt;
use llmgw_router::{Endpoint, Settings};

use crate::common::*;
use llmgw_test_kit::{ClosedPort, DEADLINE, eventually};

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_openai_shaped() {
    let router = router_with_unplaced_and_drained_models().await;
    let c = client();
    let chat_url = format!("{}/v1/chat/completions", router.url());

    an_unknown_model_is_named_in_the_error(&c, &chat_url).await;
    for refusal in REFUSALS {
        let url = format!("{}{}", router.url(), refusal.path);
        let (status, body) = post(&c, &url, refusal.body(), &[]).await.unwrap();
        assert_eq!(status, refusal.status, "{body}");
        for want in refusal.body_contains {
            assert!(body.contains(want), "{body}");
        }
    }
    a_body_over_the_limit_is_refused_and_the_connection_closed(&c, &chat_url).await;

    let (_, metrics) = get(&format!("{}/metrics", router.url())).await.unwrap();
    assert_eq!(
        metric(
            &metrics,
            "llmgw_router_requests_total{model=\"nowhere\",endpoint=\"none\",status=\"503\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
}

/// A request the router answers itself, and words its error must hold.
struct Refusal {
    path: &'static str,
    body: Body,
    status: u16,
    body_contains: &'static [&'static str],
}

enum Body {
    Chat { model: &'static str },
    Raw(&'static str),
}

impl Refusal {
    fn body(&self) -> String {
        match self.body {
            Body::Chat { model } => chat_body(model, false, 4),
            Body::Raw(raw) => raw.to_string(),
        }
    }
}

const REFUSALS: &[Refusal] = &[
    Refusal {
        path: "/v1/chat/completions",
        body: Body::Chat { model: "nowhere" },
        status: 503,
        body_contains: &[
            "0/3 nodes fit nowhere profile tp8",
            "\"code\":\"no_ready_replica\"",
        ],
    },
    Refusal {
        path: "/v1/chat/completions",
        body: Body::Chat { model: "drained" },
        status: 503,
        body_contains: &["draining"],
    },
    Refusal {
        path: "/v1/chat/completions",
        body: Body::Raw("{\"model\": \"nowhere\", "),
        status: 400,
        body_contains: &["\"code\":\"invalid_json\""],
    },
    Refusal {
        path: "/v1/nope",
        body: Body::Raw("{}"),
        status: 404,
        body_contains: &["\"error\""],
    },
];

/// A router with a body limit of 4 KiB, a model no node can place
/// (`nowhere`) and one whose only endpoint drains (`drained`).
async fn router_with_unplaced_and_drained_models() -> TestRouter {
    let settings = Settings {
        max_body_bytes: 4096,
        ..test_settings()
    };
    let mut nowhere = model("nowhere", &[], vec![]);
    nowhere.unavailable_reason =
        Some("0/3 nodes fit nowhere profile tp8: 3 have 2 free GPUs (need 8)".into());
    let drained = model(
        "drained",
        &[],
        vec![Endpoint::draining("http://127.0.0.1:9")],
    );
    TestRouter::start(settings, vec![nowhere, drained]).await
}

async fn an_unknown_model_is_named_in_the_error(c: &HttpClient, url: &str) {
    let (status, body) = post(c, url, chat_body("missing", false, 4), &[])
        .await
        .unwrap();
    assert_eq!(status, 404, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["param"], "model");
    assert!(v["error"]["message"].as_str().unwrap().contains("missing"));
}

async fn a_body_over_the_limit_is_refused_and_the_connection_closed(c: &HttpClient, url: &str) {
    let big = format!(r#"{{"model":"nowhere","prompt":"{}"}}"#, "x".repeat(5000));
    let request = hyper::Request::post(url)
        .body(http_body_util::Full::new(bytes::Bytes::from(big)))
        .unwrap();
    let response = c.request(request).await.unwrap();
    assert_eq!(response.status(), 413);
    // The unread rest of the body makes the connection unusable; a client
    // that is not told so pools it and fails its next request.
    assert_eq!(
        response.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..]),
        "{:?}",
        response.headers()
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("\"code\":\"request_too_large\""), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_4xx_never_ejects_but_dead_endpoints_are_ejected_and_probed_back() {
    let live = Sim::start(SMALL, &["m"], &[]);
    let dead = ClosedPort::new();
    live.wait_ready().await;
    let settings = Settings {
        consecutive_failures: 2,
        metrics_interval: Duration::from_millis(100),
        ..test_settings()
    };
    let dead_url = format!("http://127.0.0.1:{}", dead.port());
    let router = TestRouter::start(
        settings,
        vec![
            model(
                "m",
                &[],
                vec![Endpoint::ready(&dead_url), Endpoint::ready(live.url())],
            ),
            // The engine does not serve this name: it answers 404.
            model("unserved", &[], vec![Endpoint::ready(live.url())]),
        ],
    )
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", router.url());

    for stream in [false, true, false, true, true] {
        let (status, body) = post(&c, &url, chat_body("unserved", stream, 2), &[])
            .await
            .unwrap();
        assert_eq!(
            status, 404,
            "the engine's own 404 reaches the client: {body}"
        );
        // As the engine wrote it, streamed request or not: one JSON error.
        let error: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("stream {stream}: not the engine's JSON ({e}): {body}"));
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("unserved"), "{body}");
    }
    // Every request succeeds: a refused connection moves to the live engine.
    for i in 0..12 {
        let (status, body) = post(&c, &url, chat_body("m", false, 2), &[]).await.unwrap();
        assert_eq!(status, 200, "request {i}: {body}");
    }
    let metrics_url = format!("{}/metrics", router.url());
    let dead_ejected = format!("llmgw_router_endpoint_ejected{{endpoint=\"{dead_url}\"}}");
    let metrics = until_ejected(&c, &url, &metrics_url, &dead_ejected).await;
    let live_ejected = format!(
        "llmgw_router_endpoint_ejected{{endpoint=\"{}\"}}",
        live.url()
    );
    assert_eq!(
        metric(&metrics, &live_ejected),
        Some(0.0),
        "4xx ejected the engine:\n{metrics}"
    );
    assert!(
        metrics.contains("llmgw_router_retries_total{model=\"m\",reason=\"connect\"}"),
        "{metrics}"
    );
    let kv = format!(
        "llmgw_router_engine_kv_cache_usage{{endpoint=\"{}\"}}",
        live.url()
    );
    assert!(
        wait_until(Duration::from_secs(20), || async {
            get(&metrics_url)
                .await
                .is_some_and(|(_, m)| metric(&m, &kv).is_some())
        })
        .await,
        "the engine's KV usage was never read from its /metrics"
    );

    // The dead endpoint comes back: it passes /health and is re-admitted.
    let revived = Sim::start_on(dead.release(), SMALL, &["m"], &[]);
    revived.wait_ready().await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            get(&metrics_url)
                .await
                .is_some_and(|(_, m)| metric(&m, &dead_ejected) == Some(0.0))
        })
        .await,
        "a healthy endpoint was never re-admitted"
    );
}

/// Sends chat requests for "m" until the endpoint behind `ejected_gauge`
/// shows as ejected, and returns the /metrics text that shows it. The
/// balancer draws between the endpoints at random, so how many requests
/// reach the dead one is chance: a fixed count can fall short of the
/// failure threshold. Every request must still be answered.
async fn until_ejected(
    c: &HttpClient,
    url: &str,
    metrics_url: &str,
    ejected_gauge: &str,
) -> String {
    eventually("the dead endpoint ejected", DEADLINE, || async {
        let (_, metrics) = get(metrics_url)
            .await
            .ok_or_else(|| "no answer from /metrics".to_string())?;
        let gauge = metric(&metrics, ejected_gauge);
        if gauge == Some(1.0) {
            return Ok(metrics);
        }
        let (status, body) = post(c, url, chat_body("m", false, 2), &[]).await?;
        assert_eq!(status, 200, "a request before the ejection: {body}");
        Err(format!("{ejected_gauge} is {gauge:?}"))
    })
    .await
}

/// An engine that takes connections and never answers (a hung API
/// server): a stream sent there moves to another replica after the stall
/// timeout instead of waiting out the request deadline, and the hung
/// engine is ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_to_an_engine_that_never_answers_moves_on_after_the_stall_timeout() {
    let live = Sim::start(SMALL, &["m"], &[]);
    // The kernel completes the handshakes and takes the requests; nothing
    // ever reads or answers them.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    live.wait_ready().await;
    let settings = Settings {
        stall_timeout: Duration::from_secs(1),
        consecutive_failures: 2,
        ..test_settings()
    };
    let router = TestRouter::start(
        settings,
        vec![model(
            "m",
            &[],
            vec![Endpoint::ready(&hung_url), Endpoint::ready(live.url())],
        )],
    )
    .await;
    let c = client();
    let url = format!("{}/v1/chat/completions", router.url());
    let metrics_url = format!("{}/metrics", router.url());
    let stalled = "llmgw_router_retries_total{model=\"m\",reason=\"stall_before_first_byte\"}";
    let hung_ejected = format!("llmgw_router_endpoint_ejected{{endpoint=\"{hung_url}\"}}");
    // The balancer draws at random: ask until the hung engine was drawn
    // twice (its failure threshold); every stream must still be answered,
    // well within the 60 s request deadline.
    let mut metrics = String::new();
    for i in 0..40 {
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            post(&c, &url, chat_body("m", true, 4), &[]),
        )
        .await
        .unwrap_or_else(|_| panic!("stream {i} waited on the hung engine"))
        .unwrap();
        assert_eq!(answer.0, 200, "stream {i}: {}", answer.1);
        let read = read_stream(&answer.1);
        assert!(
            read.error.is_none() && read.done,
            "stream {i}: {}",
            answer.1
        );
        metrics = get(&metrics_url).await.expect("metrics").1;
        if metric(&metrics, &hung_ejected) == Some(1.0) {
            break;
        }
    }
    assert_eq!(metric(&metrics, &hung_ejected), Some(1.0), "{metrics}");
    assert!(
        metric(&metrics, stalled).is_some_and(|n| n >= 2.0),
        "{metrics}"
    );
}
