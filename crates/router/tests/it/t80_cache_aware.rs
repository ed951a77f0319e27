//! Cache-aware routing with real simulated engines publishing KV events:
//! the router sends a prompt where its prefix is cached, fills gaps from
//! the replay socket, forgets a restarted engine, and holds its memory cap.

use std::time::Duration;

use llmgw_config::BalancePolicy;
use llmgw_router::{Endpoint, KvEventEndpoints, Settings};

use crate::common::*;

struct PublishingSim {
    sim: Sim,
    stream: u16,
    replay: u16,
}

impl PublishingSim {
    fn start() -> PublishingSim {
        PublishingSim::start_on(free_port(), free_port(), free_port())
    }

    fn start_on(port: u16, stream: u16, replay: u16) -> PublishingSim {
        PublishingSim::start_with(port, stream, replay, &[])
    }

    fn start_with(port: u16, stream: u16, replay: u16, env: &[(&str, &str)]) -> PublishingSim {
        let config = format!(
            r#"{{"enable_kv_cache_events":true,"endpoint":"tcp://*:{stream}","replay_endpoint":"tcp://*:{replay}"}}"#
        );
        let sim = Sim::start_on(
            port,
            SMALL,
            &["qwen", "--kv-events-config", &config],
            &[&[("LLMGW_SIM_PREFILL_PER_TOKEN", "10us")], env].concat(),
        );
        PublishingSim {
            sim,
            stream,
            replay,
        }
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::ready(self.sim.url()).with_kv_events(Some(KvEventEndpoints {
            stream: format!("127.0.0.1:{}", self.stream),
            replay: Some(format!("127.0.0.1:{}", self.replay)),
            topic: String::new(),
        }))
    }
}

fn cache_aware() -> Settings {
    Settings {
        policy: BalancePolicy::CacheAware,
        ..test_settings()
    }
}

/// About `tokens` simulated tokens of text unique to `seed`.
fn text(seed: usize, tokens: usize) -> String {
    (0..tokens)
        .map(|i| format!("{:03} ", (seed * 7 + i * 13) % 1000))
        .collect()
}

fn chat(system: &str, user: &str) -> String {
    serde_json::json!({
        "model": "qwen",
        "max_tokens": 2,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    })
    .to_string()
}

async fn router_metric(router: &TestRouter, name: &str) -> f64 {
    let (_, page) = get(&format!("{}/metrics", router.url()))
        .await
        .expect("router metrics");
    metric(&page, name).unwrap_or(0.0)
}

async fn wait_metric(router: &TestRouter, name: &str, what: &str, ok: impl Fn(f64) -> bool) {
    let reached = wait_until(Duration::from_secs(60), || async {
        ok(router_metric(router, name).await)
    })
    .await;
    assert!(
        reached,
        "{what}: {name} is {} after 60s",
        router_metric(router, name).await
    );
}

/// A cache-aware router over `sims`, once they serve and it subscribes to
/// every one of them.
async fn following_router(sims: &[&PublishingSim]) -> TestRouter {
    for s in sims {
        s.sim.wait_ready().await;
    }
    let endpoints = sims.iter().map(|s| s.endpoint()).collect();
    let router = TestRouter::start(cache_aware(), vec![model("qwen", &[], endpoints)]).await;
    let all = sims.len() as f64;
    wait_metric(
        &router,
        "llmgw_router_kv_engines_followed",
        "subscribed to all",
        |v| v == all,
    )
    .await;
    router
}

async fn prefix_hits(sim: &Sim) -> f64 {
    let (_, page) = get(&format!("{}/metrics", sim.url()))
        .await
        .expect("engine metrics");
    metric(&page, "vllm:prefix_cache_hits_total").unwrap_or(0.0)
}

#[tokio::test]
async fn a_shared_prompt_goes_where_it_is_cached_and_a_restarted_engine_is_forgotten() {
    let mut sims: Vec<PublishingSim> = (0..3).map(|_| PublishingSim::start()).collect();
    let router = following_router(&sims.iter().collect::<Vec<_>>()).await;

    let system = text(1, 1000);
    let client = client();
    let url = format!("{}/v1/chat/completions", router.url());
    let (status, body) = post(&client, &url, chat(&system, "first"), &[])
        .await
        .expect("first");
    assert_eq!(status, 200, "{body}");
    // The first answer's blocks reach the index through the events.
    wait_metric(
        &router,
        "llmgw_router_kv_index_entries",
        "first prompt indexed",
        |v| v >= 60.0,
    )
    .await;

    for i in 0..10 {
        let (status, body) = post(&client, &url, chat(&system, &format!("question {i}")), &[])
            .await
            .expect("chat");
        assert_eq!(status, 200, "{body}");
    }
    let mut hits = Vec::new();
    for s in &sims {
        hits.push(prefix_hits(&s.sim).await);
    }
    let holder = hits
        .iter()
        .position(|h| *h > 0.0)
        .unwrap_or_else(|| panic!("no engine had a prefix hit: {hits:?}"));
    // Ten requests, each with the ~1,000-token system prompt cached.
    assert!(hits[holder] >= 10.0 * 960.0, "hits {hits:?}");
    assert_eq!(
        hits.iter().filter(|h| **h > 0.0).count(),
        1,
        "every request went to the engine holding the prompt: {hits:?}"
    );
    assert!(router_metric(&router, "llmgw_router_kv_decisions_total{how=\"cache\"}").await >= 11.0);

    // The engine holding everything restarts on the same ports: its cache
    // is empty, and so must be its share of the index.
    let old = sims.remove(holder);
    let (port, stream, replay) = (old.sim.port, old.stream, old.replay);
    drop(old);
    let restarted = PublishingSim::start_on(port, stream, replay);
    restarted.sim.wait_ready().await;
    wait_metric(
        &router,
        "llmgw_router_kv_index_entries",
        "restarted engine forgotten",
        |v| v == 0.0,
    )
    .await;
}

#[tokio::test]
async fn a_router_started_late_rebuilds_its_index_from_the_replay_and_holds_its_cap() {
    let sim = PublishingSim::start();
    sim.sim.wait_ready().await;
    // Traffic before any router subscribes: only the replay has it.
    let url = format!("{}/v1/chat/completions", sim.sim.url());
    let burst: Vec<_> = (0..60)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let body = chat(&text(100 + i, 256), "go");
                post(&client(), &url, body, &[]).await.expect("chat").0
            })
        })
        .collect();
    for request in burst {
        assert_eq!(request.await.expect("task"), 200);
    }
    let router = TestRouter::start(
        cache_aware(),
        vec![model("qwen", &[], vec![sim.endpoint()])],
    )
    .await;
    // Each prompt is about 270 tokens: 16 full blocks at least, none
    // shared; all of them come back through the replay, nothing is lost.
    wait_metric(
        &router,
        "llmgw_router_kv_index_entries",
        "every block indexed",
        |v| v >= 60.0 * 16.0,
    )
    .await;
    assert!(router_metric(&router, "llmgw_router_kv_batches_replayed_total").await >= 60.0);
    assert_eq!(
        router_metric(&router, "llmgw_router_kv_batches_missed_total").await,
        0.0
    );
    assert_eq!(
        router_metric(&router, "llmgw_router_kv_blocks_orphaned_total").await,
        0.0
    );

    // The same history through a router whose index may hold 200 entries.
    let capped = TestRouter::start(
        Settings {
            kv_index_max_entries: 200,
            ..cache_aware()
        },
        vec![model("qwen", &[], vec![sim.endpoint()])],
    )
    .await;
    wait_metric(
        &capped,
        "llmgw_router_kv_blocks_stored_total",
        "replayed history",
        |v| v >= 60.0 * 16.0,
    )
    .await;
    assert!(router_metric(&capped, "llmgw_router_kv_index_entries").await <= 200.0);
    assert!(
        router_metric(&capped, "llmgw_router_kv_blocks_evicted_total").await >= 60.0 * 16.0 - 200.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_answer_resumes_on_the_survivor_caching_its_prompt() {
    // A cuts every stream after five tokens; B and C answer whole.
    let a = PublishingSim::start_with(
        free_port(),
        free_port(),
        free_port(),
        &[
            ("LLMGW_SIM_FAULT", "crash_mid_stream:cut@5"),
            ("LLMGW_SIM_OUTPUT_TOKENS", "30"),
        ],
    );
    let (b, c) = (PublishingSim::start(), PublishingSim::start());
    let router = following_router(&[&a, &b, &c]).await;
    // A holds the whole prompt, B its ~1,000-token system prompt, C nothing:
    // the request goes to A, and the rest of its answer to B.
    let system = text(7, 1000);
    let question = text(8, 200);
    let direct = |sim: &PublishingSim, user: &str| {
        (
            format!("{}/v1/chat/completions", sim.sim.url()),
            chat(&system, user),
        )
    };
    for (url, body) in [direct(&a, &question), direct(&b, "something else")] {
        let (status, answer) = post(&client(), &url, body, &[]).await.expect("warm-up");
        assert_eq!(status, 200, "{answer}");
    }
    wait_metric(
        &router,
        "llmgw_router_kv_index_entries",
        "warm-ups indexed",
        |v| v >= 130.0,
    )
    .await;
    let hits_before = [prefix_hits(&b.sim).await, prefix_hits(&c.sim).await];

    let mut request: serde_json::Value =
        serde_json::from_str(&chat(&system, &question)).expect("json");
    request["stream"] = true.into();
    request["max_tokens"] = 20.into();
    let url = format!("{}/v1/chat/completions", router.url());
    let (status, answer) = post(&client(), &url, request.to_string(), &[])
        .await
        .expect("stream");
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains("[DONE]") && !answer.contains("\"error\""),
        "{answer}"
    );
    let (_, page) = get(&format!("{}/metrics", router.url()))
        .await
        .expect("metrics");
    let resumed: f64 = page
        .lines()
        .filter(|l| {
            l.starts_with("llmgw_router_stream_resumptions_total{")
                && l.contains("outcome=\"resumed\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        resumed, 1.0,
        "the stream began on A and was resumed once:\n{page}"
    );
    let gained = [
        prefix_hits(&b.sim).await - hits_before[0],
        prefix_hits(&c.sim).await - hits_before[1],
    ];
    assert!(
        gained[0] >= 960.0 && gained[1] == 0.0,
        "the continuation went where the prompt was cached: hits gained by B and C {gained:?}"
    );
}

/// A port whose next one is free too: a second data-parallel rank
/// publishes on the port after its first's.
#[tokio::test]
async fn every_data_parallel_rank_of_an_engine_is_followed() {
    let (stream, replay) = (free_consecutive_ports(2), free_consecutive_ports(2));
    let config = format!(
        r#"{{"enable_kv_cache_events":true,"endpoint":"tcp://*:{stream}","replay_endpoint":"tcp://*:{replay}"}}"#
    );
    let sim = Sim::start_on(
        free_port(),
        SMALL,
        &[
            "qwen",
            "--kv-events-config",
            &config,
            "--data-parallel-size",
            "2",
        ],
        &[("LLMGW_SIM_PREFILL_PER_TOKEN", "10us")],
    );
    sim.wait_ready().await;
    let ranks = KvEventEndpoints {
        stream: format!("127.0.0.1:{stream}"),
        replay: Some(format!("127.0.0.1:{replay}")),
        topic: String::new(),
    }
    .ranks(2);
    assert_eq!(ranks[1].stream, format!("127.0.0.1:{}", stream + 1));
    let endpoint = Endpoint::ready(sim.url()).with_kv_event_ranks(ranks);
    let router = TestRouter::start(cache_aware(), vec![model("qwen", &[], vec![endpoint])]).await;
    wait_metric(
        &router,
        "llmgw_router_kv_engines_followed",
        "subscribed",
        |v| v == 1.0,
    )
    .await;

    // Two unrelated prompts one after the other: the engine gives them to
    // its two ranks in turn, and each rank publishes its own blocks.
    let url = format!("{}/v1/chat/completions", router.url());
    for seed in [21, 22] {
        let (status, body) = post(&client(), &url, chat(&text(seed, 400), "go"), &[])
            .await
            .expect("chat");
        assert_eq!(status, 200, "{body}");
    }
    // Each prompt is over 400 tokens: 25 full blocks at least, on one rank.
    wait_metric(
        &router,
        "llmgw_router_kv_index_entries",
        "both ranks' blocks indexed",
        |v| v >= 50.0,
    )
    .await;
    assert_eq!(
        router_metric(&router, "llmgw_router_kv_engines_unreachable").await,
        0.0
    );
}
