//! The router tokenizing requests itself with the model's tokenizer
//! (`balancing.tokenizers`), checked against a real simulated engine's
//! `/tokenize`: used once they agree, dropped when they differ.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use llmgw_config::BalancePolicy;
use llmgw_router::{Endpoint, KvEventEndpoints, LocalTokenizers, Settings};

use crate::common::*;

/// A model directory with a real Hugging Face tokenizer and chat template.
fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/chatml-bpe")
}

/// A vLLM-persona engine publishing KV events; with `tokenizer`, it
/// tokenizes with the model directory's tokenizer, else its own.
fn engine(tokenizer: bool) -> (Sim, Endpoint) {
    let (stream, replay) = (free_port(), free_port());
    let config = format!(
        r#"{{"enable_kv_cache_events":true,"endpoint":"tcp://*:{stream}","replay_endpoint":"tcp://*:{replay}"}}"#
    );
    let dir = model_dir().display().to_string();
    let mut args = vec!["qwen", "--kv-events-config", &config];
    if tokenizer {
        args.extend(["--tokenizer", &dir]);
    }
    let sim = Sim::start(SMALL, &args, &[("LLMGW_SIM_PREFILL_PER_TOKEN", "10us")]);
    let endpoint = Endpoint::ready(sim.url()).with_kv_events(Some(KvEventEndpoints {
        stream: format!("127.0.0.1:{stream}"),
        replay: Some(format!("127.0.0.1:{replay}")),
        topic: String::new(),
    }));
    (sim, endpoint)
}

async fn router_over(endpoint: Endpoint) -> TestRouter {
    let tokenizers =
        LocalTokenizers::load(&BTreeMap::from([("qwen".to_string(), model_dir())]), 100)
            .expect("the fixture model directory loads");
    let settings = Settings {
        policy: BalancePolicy::CacheAware,
        tokenizers,
        ..test_settings()
    };
    let router = TestRouter::start(settings, vec![model("qwen", &[], vec![endpoint])]).await;
    let followed = wait_until(Duration::from_secs(60), || async {
        router_metric(&router, "llmgw_router_kv_engines_followed").await == 1.0
    })
    .await;
    assert!(
        followed,
        "the router never subscribed to the engine's events"
    );
    router
}

async fn router_metric(router: &TestRouter, name: &str) -> f64 {
    let (_, page) = get(&format!("{}/metrics", router.url()))
        .await
        .expect("router metrics");
    metric(&page, name).unwrap_or(0.0)
}

const SYSTEM: &str = "You are a helpful assistant. Answer briefly and cite the document.";

async fn chat_requests(router: &TestRouter, system: &str, count: usize) {
    let client = client();
    let url = format!("{}/v1/chat/completions", router.url());
    for i in 0..count {
        let body = serde_json::json!({
            "model": "qwen",
            "max_tokens": 2,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("What is the weather in Paris today? Question {i}.")},
            ],
        });
        let (status, answer) = post(&client, &url, body.to_string(), &[])
            .await
            .expect("chat");
        assert_eq!(status, 200, "{answer}");
    }
}

#[tokio::test]
async fn the_router_tokenizes_itself_once_its_tokens_agree_with_the_engine() {
    let (sim, endpoint) = engine(true);
    sim.wait_ready().await;
    let router = router_over(endpoint).await;
    chat_requests(&router, SYSTEM, 30).await;
    // Long prompts are tokenized off the connection's thread, to the same
    // tokens.
    chat_requests(&router, &SYSTEM.repeat(100), 5).await;

    let agreed = router_metric(
        &router,
        "llmgw_router_kv_tokenizer_checks_total{result=\"agreed\"}",
    )
    .await;
    let disagreed = router_metric(
        &router,
        "llmgw_router_kv_tokenizer_checks_total{result=\"disagreed\"}",
    )
    .await;
    let by_router = router_metric(&router, "llmgw_router_kv_tokenized_total{by=\"router\"}").await;
    assert_eq!(
        disagreed, 0.0,
        "the router's tokens differ from the engine's"
    );
    // A model's first 8 requests are checked (then one in 100): the other
    // 27 are tokenized by the router alone.
    assert_eq!((agreed, by_router), (8.0, 27.0));
    assert_eq!(
        router_metric(
            &router,
            "llmgw_router_kv_local_tokenizers{state=\"in_use\"}"
        )
        .await,
        1.0
    );
    // Its tokens find what the engine cached: the shared system prompt.
    let cached = router_metric(&router, "llmgw_router_kv_routed_cached_tokens_total").await;
    assert!(
        cached > 0.0,
        "no routed token was found cached by the index"
    );
}

#[tokio::test]
async fn a_router_tokenizer_that_disagrees_with_the_engine_is_dropped() {
    // The engine tokenizes its own way; the router's model directory says
    // otherwise.
    let (sim, endpoint) = engine(false);
    sim.wait_ready().await;
    let router = router_over(endpoint).await;
    chat_requests(&router, SYSTEM, 5).await;

    assert_eq!(
        router_metric(
            &router,
            "llmgw_router_kv_tokenizer_checks_total{result=\"disagreed\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        router_metric(&router, "llmgw_router_kv_tokenized_total{by=\"router\"}").await,
        0.0
    );
    assert_eq!(
        router_metric(&router, "llmgw_router_kv_tokenized_total{by=\"engine\"}").await,
        5.0
    );
    assert_eq!(
        router_metric(
            &router,
            "llmgw_router_kv_local_tokenizers{state=\"disagreed\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        router_metric(&router, "llmgw_router_kv_decisions_total{how=\"cache\"}").await,
        5.0
    );
}
