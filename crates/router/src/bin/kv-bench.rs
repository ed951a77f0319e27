//! kv-bench: cache-aware routing against load-only balancing and
//! prompt-prefix affinity, on a fleet of simulated engines with real prefix
//! caches that publish KV events.
//!
//! For each workload and each policy it starts a fresh fleet of
//! `llmgw-engine-sim` processes (vLLM 0.34 persona; prefix caches capped,
//! prefill time proportional to uncached tokens, one prefill at a time per
//! engine) and a router in this process, runs the workload, and prints the
//! engines' own prefix-cache hit rate (their `/metrics` counters), client
//! TTFT p50/p90, output tokens/s, and the router's time per routing
//! decision (its own `llmgw_router_kv_decision_seconds_total`).
//!
//! Workloads:
//! * `shared`: few long shared contexts (a document, a tool manual) each
//!   followed by a short unique question, arriving at a fixed rate;
//! * `multiturn`: conversations behind one long system prompt, each
//!   growing turn by turn with the engine's own answers;
//! * `chat`: as many conversations, twice as many turns, behind a system
//!   prompt just long enough that every request's first 256 bytes are alike;
//! * `agentic`: fewer, longer conversations whose turns add more than the
//!   shared prompt holds;
//! * `unique`: prompts that share nothing, at a fixed rate.
//!
//! See docs/performance.md, section "Cache-aware routing".

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use llmgw_config::BalancePolicy;
use llmgw_kv_events::Endpoints;
use llmgw_router::{Endpoint, RoutedModel, Router, RoutingTable, RunningRouter, Settings};
use tokio::sync::watch;

const SOURCE: &str = "Qwen/Qwen2.5-0.5B-Instruct";
const MODEL: &str = "bench";

struct Options {
    sim: PathBuf,
    engines: usize,
    base_port: u16,
    /// Prefix cache per engine, in tokens.
    cache_tokens: u64,
    prefill_per_token_us: u64,
    workloads: Vec<String>,
    policies: Vec<BalancePolicy>,
    /// Scales every workload's request count.
    scale: f64,
    /// The cache-aware cost of one request of load, in tokens.
    load_weight_tokens: f64,
    /// Routers in front of the fleet, each with its own index; clients
    /// spread over them.
    routers: usize,
    /// Stop the first router this long into each run and start a fresh
    /// one on its port (its index rebuilt from the replay sockets).
    restart_router_after: Option<Duration>,
}

fn parse_options() -> anyhow::Result<Options> {
    let exe = std::env::current_exe()?;
    let mut o = Options {
        sim: exe.with_file_name("llmgw-engine-sim"),
        engines: 8,
        base_port: 19100,
        cache_tokens: 6000,
        prefill_per_token_us: 100,
        workloads: vec![
            "shared".into(),
            "multiturn".into(),
            "chat".into(),
            "agentic".into(),
            "unique".into(),
        ],
        policies: vec![
            BalancePolicy::LeastOutstanding,
            BalancePolicy::PrefixAffinity,
            BalancePolicy::CacheAware,
        ],
        scale: 1.0,
        load_weight_tokens: Settings::default().load_weight_tokens,
        routers: 1,
        restart_router_after: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sim" => o.sim = value()?.into(),
            "--engines" => o.engines = value()?.parse()?,
            "--base-port" => o.base_port = value()?.parse()?,
            "--cache-tokens" => o.cache_tokens = value()?.parse()?,
            "--prefill-per-token-us" => o.prefill_per_token_us = value()?.parse()?,
            "--workloads" => o.workloads = value()?.split(',').map(str::to_owned).collect(),
            "--scale" => o.scale = value()?.parse()?,
            "--load-weight-tokens" => o.load_weight_tokens = value()?.parse()?,
            "--routers" => o.routers = value()?.parse::<usize>()?.max(1),
            "--restart-router-after" => {
                o.restart_router_after = Some(Duration::from_secs_f64(value()?.parse()?))
            }
            "--policies" => {
                o.policies = value()?
                    .split(',')
                    .map(|p| match p {
                        "least_outstanding" => Ok(BalancePolicy::LeastOutstanding),
                        "prefix_affinity" => Ok(BalancePolicy::PrefixAffinity),
                        "cache_aware" => Ok(BalancePolicy::CacheAware),
                        other => bail!("unknown policy {other}"),
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            "-h" | "--help" => {
                println!(
                    "kv-bench [--engines 8] [--cache-tokens 6000] [--prefill-per-token-us 100] \
                     [--workloads shared,multiturn,chat,agentic,unique] [--policies least_outstanding,prefix_affinity,cache_aware] \
                     [--scale 1.0] [--load-weight-tokens 250] [--routers 1] [--restart-router-after SECONDS] [--sim PATH] [--base-port 19100]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}; see --help"),
        }
    }
    if o.restart_router_after.is_some() && o.routers < 2 {
        bail!(
            "--restart-router-after needs --routers 2 or more: the figures come from a router that stays"
        );
    }
    if !o.sim.exists() {
        bail!(
            "{} not found: build it (cargo build --release -p llmgw-engine-sim) or pass --sim",
            o.sim.display()
        );
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    let o = parse_options()?;
    let runtime = llmgw_runtime::multi_thread_runtime()?;
    runtime.block_on(run(o))
}

fn policy_name(policy: BalancePolicy) -> &'static str {
    match policy {
        BalancePolicy::LeastOutstanding => "load only (least outstanding)",
        BalancePolicy::PrefixAffinity => "prompt-prefix affinity",
        BalancePolicy::CacheAware => "cache-aware",
    }
}

async fn run(o: Options) -> anyhow::Result<()> {
    println!(
        "kv-bench: {} engines, prefix cache {} tokens each ({} in all), prefill {} us/token, one prefill at a time per engine",
        o.engines,
        o.cache_tokens,
        o.cache_tokens * o.engines as u64,
        o.prefill_per_token_us
    );
    for name in &o.workloads {
        let workload = Workload::named(name, o.scale)?;
        println!(
            "\n## {name}: {} (working set about {} tokens, {:.1}x the fleet's cache)",
            workload.describe(),
            workload.working_set(),
            workload.working_set() as f64 / (o.cache_tokens * o.engines as u64) as f64
        );
        println!(
            "{:<32} {:>9} {:>9} {:>9} {:>10} {:>6} {:>9} {:>8} {:>8}",
            "policy",
            "hit rate",
            "TTFT p50",
            "TTFT p90",
            "out tok/s",
            "errors",
            "decision",
            "index",
            "rebuild"
        );
        for policy in &o.policies {
            let fleet = Fleet::start(&o).await?;
            let result = run_one(&o, &fleet, *policy, &workload).await;
            drop(fleet);
            let r = result?;
            let or_dash = |text: Option<String>| text.unwrap_or_else(|| "-".to_string());
            println!(
                "{:<32} {:>8.1}% {:>7.0}ms {:>7.0}ms {:>10.0} {:>6} {:>9} {:>8} {:>8}",
                policy_name(*policy),
                r.hit_rate * 100.0,
                r.ttft_p50.as_secs_f64() * 1000.0,
                r.ttft_p90.as_secs_f64() * 1000.0,
                r.output_tokens_per_s,
                r.errors,
                or_dash(
                    r.decision
                        .map(|d| format!("{:.1}us", d.as_secs_f64() * 1e6))
                ),
                or_dash(r.rebuild.map(|_| format!("{:.0}", r.index_entries))),
                or_dash(
                    r.rebuild
                        .map(|d| format!("{:.0}ms", d.as_secs_f64() * 1000.0))
                ),
            );
            if let Some(a) = r.agreement.filter(|a| a.samples > 0) {
                let share = |n: u64| n as f64 * 100.0 / a.samples as f64;
                println!(
                    "  {} routers' indexes over {} requests sampled during the run: {:.1}% identical on every engine, {:.1}% name the same engines as holding the longest prefix",
                    o.routers - usize::from(o.restart_router_after.is_some()),
                    a.samples,
                    share(a.identical),
                    share(a.same_best)
                );
            }
        }
    }
    Ok(())
}

/// The simulated engines, killed on drop.
struct Fleet {
    children: Vec<Child>,
    endpoints: Vec<Endpoint>,
}

impl Fleet {
    async fn start(o: &Options) -> anyhow::Result<Fleet> {
        let mut children = Vec::new();
        let mut endpoints = Vec::new();
        for i in 0..o.engines {
            let port = o.base_port + 3 * i as u16;
            let (stream, replay) = (port + 1, port + 2);
            let config = format!(
                r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{stream}","replay_endpoint":"tcp://*:{replay}","topic":""}}"#
            );
            let child = Command::new(&o.sim)
                .args(["serve", SOURCE, "--host", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .args(["--served-model-name", MODEL, "--kv-events-config", &config])
                .env("LLMGW_SIM_PERSONA", "vllm=0.34.0")
                .env("LLMGW_SIM_LOAD_TIME", "200ms")
                .env("LLMGW_SIM_TTFT", "5ms")
                .env("LLMGW_SIM_ITL", "5ms")
                .env("LLMGW_SIM_OUTPUT_TOKENS", "16")
                .env(
                    "LLMGW_SIM_PREFILL_PER_TOKEN",
                    format!("{}us", o.prefill_per_token_us),
                )
                .env("LLMGW_SIM_PREFIX_CACHE_TOKENS", o.cache_tokens.to_string())
                .env("CUDA_VISIBLE_DEVICES", "0")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(
                    std::env::temp_dir().join(format!("kv-bench-engine-{i}.log")),
                )?)
                .spawn()
                .with_context(|| format!("starting {}", o.sim.display()))?;
            children.push(child);
            endpoints.push(
                Endpoint::ready(format!("http://127.0.0.1:{port}")).with_kv_events(Some(
                    Endpoints {
                        stream: format!("127.0.0.1:{stream}"),
                        replay: Some(format!("127.0.0.1:{replay}")),
                        topic: String::new(),
                    },
                )),
            );
        }
        let fleet = Fleet {
            children,
            endpoints,
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        for endpoint in &fleet.endpoints {
            loop {
                let health = client.get(format!("{}/health", endpoint.url)).send().await;
                if health.is_ok_and(|r| r.status().is_success()) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "{} not healthy within 60s; its log is in {}",
                        endpoint.url,
                        std::env::temp_dir().join("kv-bench-engine-*.log").display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(fleet)
    }

    /// Prefix-cache (queried, hit) tokens summed over the fleet.
    async fn prefix_counters(&self, client: &reqwest::Client) -> anyhow::Result<(f64, f64)> {
        let mut sums = (0.0, 0.0);
        for endpoint in &self.endpoints {
            let page = metrics_page(client, &endpoint.url).await?;
            sums.0 +=
                llmgw_prometheus::metric(&page, "vllm:prefix_cache_queries_total").unwrap_or(0.0);
            sums.1 +=
                llmgw_prometheus::metric(&page, "vllm:prefix_cache_hits_total").unwrap_or(0.0);
        }
        Ok(sums)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Outcome {
    hit_rate: f64,
    ttft_p50: Duration,
    ttft_p90: Duration,
    output_tokens_per_s: f64,
    errors: usize,
    decision: Option<Duration>,
    index_entries: f64,
    /// Cache-aware only: how long a fresh router took to rebuild the index.
    rebuild: Option<Duration>,
    /// Cache-aware with two routers or more that stay up.
    agreement: Option<Agreement>,
}

async fn run_one(
    o: &Options,
    fleet: &Fleet,
    policy: BalancePolicy,
    workload: &Workload,
) -> anyhow::Result<Outcome> {
    let table = RoutingTable {
        keys: Default::default(),
        models: vec![RoutedModel {
            name: MODEL.into(),
            aliases: vec![],
            mapped_aliases: Vec::new(),
            endpoints: fleet.endpoints.clone(),
            unavailable_reason: None,
            wakes_on_request: false,
            max_requests_per_replica: None,
        }],
    };
    let (tx, _) = watch::channel(Arc::new(table));
    let settings = Settings {
        policy,
        metrics_interval: Duration::from_millis(500),
        load_weight_tokens: o.load_weight_tokens,
        ..Settings::default()
    };
    let mut routers = Vec::new();
    for _ in 0..o.routers {
        routers.push(
            Router::new(settings.clone(), &tx)
                .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                .await?,
        );
    }
    let bases: Vec<String> = routers
        .iter()
        .map(|r| format!("http://{}", r.local_addr()))
        .collect();
    // The last router is never restarted: its figures are reported.
    let base = bases.last().expect("at least one router").clone();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .build()?;
    if policy == BalancePolicy::CacheAware {
        for base in &bases {
            wait_followed(&client, base, o.engines).await?;
        }
    }
    let restart = o.restart_router_after.map(|after| {
        let first = routers.remove(0);
        let (tx, settings) = (tx.clone(), settings.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let addr = first.local_addr();
            drop(first);
            // The same port, so clients find it again; a fresh index. The
            // old listener closes as its tasks wind down.
            let mut tries = 0;
            loop {
                match Router::new(settings.clone(), &tx).bind(addr).await {
                    Ok(router) => return Ok(router),
                    Err(_) if tries < 100 => tries += 1,
                    Err(e) => return Err(e),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    });
    let before = fleet.prefix_counters(&client).await?;
    let started = Instant::now();
    let running = AtomicBool::new(true);
    let probing = policy == BalancePolicy::CacheAware && routers.len() >= 2;
    let (results, agreement) = tokio::join!(
        async {
            let results = workload.run(&client, &bases).await;
            running.store(false, Ordering::Relaxed);
            results
        },
        async {
            match probing {
                true => Some(probe_agreement(&client, &routers, fleet, &running).await),
                false => None,
            }
        }
    );
    let wall = started.elapsed();
    if let Some(restart) = restart {
        let restarted = restart.await??;
        drop(restarted);
    }
    let after = fleet.prefix_counters(&client).await?;
    let router_page = metrics_page(&client, &base).await?;
    let mut ttfts: Vec<Duration> = results.iter().filter_map(|r| r.ttft).collect();
    ttfts.sort();
    let errors = results.iter().filter(|r| r.ttft.is_none()).count();
    let output: u64 = results.iter().map(|r| r.output_tokens).sum();
    let queried = after.0 - before.0;
    let decisions = llmgw_prometheus::metric(
        &router_page,
        "llmgw_router_kv_decisions_total{how=\"cache\"}",
    )
    .unwrap_or(0.0);
    let decision_seconds =
        llmgw_prometheus::metric(&router_page, "llmgw_router_kv_decision_seconds_total")
            .unwrap_or(0.0);
    let index_entries =
        llmgw_prometheus::metric(&router_page, "llmgw_router_kv_index_entries").unwrap_or(0.0);
    let rebuild = if policy == BalancePolicy::CacheAware {
        Some(rebuild_time(&tx, &client, index_entries, o.engines).await?)
    } else {
        None
    };
    Ok(Outcome {
        hit_rate: if queried > 0.0 {
            (after.1 - before.1) / queried
        } else {
            0.0
        },
        ttft_p50: percentile(&ttfts, 0.5),
        ttft_p90: percentile(&ttfts, 0.9),
        output_tokens_per_s: output as f64 / wall.as_secs_f64(),
        errors,
        decision: (decisions > 0.0).then(|| Duration::from_secs_f64(decision_seconds / decisions)),
        index_entries,
        rebuild,
        agreement,
    })
}

/// How far the indexes of routers that stayed up agreed during a run.
#[derive(Default)]
struct Agreement {
    samples: u64,
    /// Every router saw the same cached prefix on every engine.
    identical: u64,
    /// Every router names the same engines as holding the longest cached
    /// prefix: the cache side of their decisions agrees.
    same_best: u64,
}

/// The request most recently sent, for [`probe_agreement`].
static LATEST_REQUEST: Mutex<Option<serde_json::Value>> = Mutex::new(None);

/// While the workload runs, asks every router what each engine holds of
/// the request most recently sent.
async fn probe_agreement(
    client: &reqwest::Client,
    routers: &[RunningRouter],
    fleet: &Fleet,
    running: &AtomicBool,
) -> Agreement {
    let urls: Vec<&str> = fleet.endpoints.iter().map(|e| e.url.as_str()).collect();
    let mut agreement = Agreement::default();
    while running.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Some(messages) = LATEST_REQUEST.lock().unwrap().take() else {
            continue;
        };
        let Some(tokens) = tokenize(client, urls[0], &messages).await else {
            continue;
        };
        let views: Vec<Vec<u64>> = routers
            .iter()
            .map(|r| r.cached_prefix_tokens(&urls, &tokens))
            .collect();
        let best = |view: &Vec<u64>| -> Vec<usize> {
            let most = view.iter().copied().max().unwrap_or(0);
            (0..view.len()).filter(|&i| view[i] == most).collect()
        };
        let first = best(&views[0]);
        agreement.samples += 1;
        agreement.identical += u64::from(views.iter().all(|v| v == &views[0]));
        // Equal sets: a router whose index is empty (every engine "best")
        // disagrees with one that knows where the prefix is.
        agreement.same_best += u64::from(views.iter().all(|v| best(v) == first));
    }
    agreement
}

/// The prompt's token ids, from an engine's `/tokenize`.
async fn tokenize(
    client: &reqwest::Client,
    engine: &str,
    messages: &serde_json::Value,
) -> Option<Vec<u32>> {
    #[derive(serde::Deserialize)]
    struct Tokens {
        tokens: Vec<u32>,
    }
    let body = serde_json::json!({"model": MODEL, "messages": messages});
    let response = client
        .post(format!("{engine}/tokenize"))
        .json(&body)
        .send()
        .await
        .ok()?;
    response.json::<Tokens>().await.ok().map(|t| t.tokens)
}

/// A router started now, with the fleet idle: how long until its index
/// holds what the router that saw the traffic holds (rebuilt from the
/// engines' replay sockets alone).
async fn rebuild_time(
    table: &watch::Sender<Arc<RoutingTable>>,
    client: &reqwest::Client,
    entries: f64,
    engines: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let settings = Settings {
        policy: BalancePolicy::CacheAware,
        ..Settings::default()
    };
    let fresh = Router::new(settings, table)
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await?;
    let base = format!("http://{}", fresh.local_addr());
    loop {
        let page = metrics_page(client, &base).await?;
        let have = llmgw_prometheus::metric(&page, "llmgw_router_kv_index_entries").unwrap_or(0.0);
        let followed =
            llmgw_prometheus::metric(&page, "llmgw_router_kv_engines_followed").unwrap_or(0.0);
        if followed as usize == engines && have >= entries {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("a fresh router's index holds {have} of {entries} entries after 60s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_followed(client: &reqwest::Client, base: &str, engines: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = metrics_page(client, base).await?;
        let followed =
            llmgw_prometheus::metric(&page, "llmgw_router_kv_engines_followed").unwrap_or(0.0);
        let unreachable =
            llmgw_prometheus::metric(&page, "llmgw_router_kv_engines_unreachable").unwrap_or(0.0);
        if followed as usize == engines && unreachable == 0.0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the router follows {followed} engines ({unreachable} unreachable) after 30s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `/metrics` page of the router or an engine at `base`.
async fn metrics_page(client: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    Ok(client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// One request's outcome: TTFT (none when it failed) and output tokens.
struct Sample {
    ttft: Option<Duration>,
    output_tokens: u64,
    answer: String,
}

/// Sends one streamed chat and reads it to the end.
async fn chat(client: &reqwest::Client, base: &str, messages: &serde_json::Value) -> Sample {
    let failed = Sample {
        ttft: None,
        output_tokens: 0,
        answer: String::new(),
    };
    let started = Instant::now();
    *LATEST_REQUEST.lock().unwrap() = Some(messages.clone());
    let body = serde_json::json!({"model": MODEL, "stream": true, "messages": messages});
    let Ok(mut response) = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
    else {
        return failed;
    };
    if !response.status().is_success() {
        return failed;
    }
    let mut ttft = None;
    let mut text = String::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        ttft.get_or_insert_with(|| started.elapsed());
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let mut answer = String::new();
    let mut output_tokens = 0;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(event) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        if let Some(piece) = event["choices"][0]["delta"]["content"].as_str()
            && !piece.is_empty()
        {
            answer.push_str(piece);
            output_tokens += 1;
        }
    }
    Sample {
        ttft: ttft.filter(|_| text.contains("[DONE]")),
        output_tokens,
        answer,
    }
}

/// Deterministic text of `tokens` simulated tokens (four bytes each):
/// three letters and a space, drawn by splitmix64 from `seed`, so texts of
/// different seeds share nothing.
fn text(seed: u64, tokens: usize) -> String {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut out = String::with_capacity(tokens * 4);
    for _ in 0..tokens {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        for i in 0..3 {
            out.push((b'a' + ((z >> (i * 16)) % 26) as u8) as char);
        }
        out.push(' ');
    }
    out
}

enum Workload {
    /// `contexts` shared contexts of `context_tokens`, each request one of
    /// them plus a unique `query_tokens` question, `rate` a second.
    Shared {
        contexts: usize,
        context_tokens: usize,
        query_tokens: usize,
        requests: usize,
        rate: f64,
    },
    /// `sessions` conversations behind one `system_tokens` prompt, each
    /// `turns` long, adding `turn_tokens` of user text and the engine's
    /// answer every turn.
    MultiTurn {
        sessions: usize,
        turns: usize,
        system_tokens: usize,
        turn_tokens: usize,
    },
    /// Prompts of `prompt_tokens` sharing nothing, `rate` a second.
    Unique {
        prompt_tokens: usize,
        requests: usize,
        rate: f64,
    },
}

impl Workload {
    fn named(name: &str, scale: f64) -> anyhow::Result<Workload> {
        let n = |count: f64| ((count * scale).round() as usize).max(1);
        Ok(match name {
            "shared" => Workload::Shared {
                contexts: 16,
                context_tokens: 2000,
                query_tokens: 200,
                requests: n(1200.0),
                rate: 50.0,
            },
            "multiturn" => Workload::MultiTurn {
                sessions: n(64.0),
                turns: 6,
                system_tokens: 500,
                turn_tokens: 150,
            },
            // A chat service: many conversations behind one short system
            // prompt (still longer than the 256 bytes prefix affinity
            // hashes), so what a conversation has built up soon outweighs
            // what it shares with every other.
            "chat" => Workload::MultiTurn {
                sessions: n(64.0),
                turns: 12,
                system_tokens: 80,
                turn_tokens: 100,
            },
            // Fewer, longer conversations, each turn adding more than the
            // shared prompt holds: what a session has built up is where
            // the cache is.
            "agentic" => Workload::MultiTurn {
                sessions: n(16.0),
                turns: 10,
                system_tokens: 200,
                turn_tokens: 300,
            },
            "unique" => Workload::Unique {
                prompt_tokens: 500,
                requests: n(600.0),
                rate: 40.0,
            },
            other => {
                bail!(
                    "unknown workload {other}; expected shared, multiturn, chat, agentic or unique"
                )
            }
        })
    }

    fn describe(&self) -> String {
        match self {
            Workload::Shared {
                contexts,
                context_tokens,
                query_tokens,
                requests,
                rate,
            } => format!(
                "{requests} requests at {rate}/s, each one of {contexts} shared {context_tokens}-token contexts and a unique {query_tokens}-token question"
            ),
            Workload::MultiTurn {
                sessions,
                turns,
                system_tokens,
                turn_tokens,
            } => format!(
                "{sessions} concurrent conversations of {turns} turns behind one {system_tokens}-token system prompt, {turn_tokens} user tokens a turn plus the answer"
            ),
            Workload::Unique {
                prompt_tokens,
                requests,
                rate,
            } => format!("{requests} unrelated {prompt_tokens}-token prompts at {rate}/s"),
        }
    }

    /// Distinct prompt tokens the workload touches.
    fn working_set(&self) -> usize {
        match self {
            Workload::Shared {
                contexts,
                context_tokens,
                query_tokens,
                requests,
                ..
            } => contexts * context_tokens + requests * query_tokens,
            Workload::MultiTurn {
                sessions,
                turns,
                system_tokens,
                turn_tokens,
            } => system_tokens + sessions * turns * (turn_tokens + 16 + 8),
            Workload::Unique {
                prompt_tokens,
                requests,
                ..
            } => prompt_tokens * requests,
        }
    }

    /// Runs the workload, request `i` (or conversation `i`) through
    /// `bases[i % len]`.
    async fn run(&self, client: &reqwest::Client, bases: &[String]) -> Vec<Sample> {
        match self {
            Workload::Shared {
                contexts,
                context_tokens,
                query_tokens,
                requests,
                rate,
            } => {
                let contexts: Vec<String> = (0..*contexts)
                    .map(|c| text(1000 + c as u64, *context_tokens))
                    .collect();
                let messages = (0..*requests).map(|i| {
                    let context = &contexts[(i * 7919 + i / 3) % contexts.len()];
                    serde_json::json!([
                        {"role": "system", "content": context},
                        {"role": "user", "content": text(1_000_000 + i as u64, *query_tokens)},
                    ])
                });
                open_loop(client, bases, messages.collect(), *rate).await
            }
            Workload::Unique {
                prompt_tokens,
                requests,
                rate,
            } => {
                let messages = (0..*requests)
                    .map(|i| {
                        serde_json::json!([{"role": "user", "content": text(5_000_000 + i as u64, *prompt_tokens)}])
                    })
                    .collect();
                open_loop(client, bases, messages, *rate).await
            }
            Workload::MultiTurn {
                sessions,
                turns,
                system_tokens,
                turn_tokens,
            } => {
                let system = text(77, *system_tokens);
                let tasks: Vec<_> = (0..*sessions)
                    .map(|s| {
                        let client = client.clone();
                        let base = bases[s % bases.len()].clone();
                        let system = system.clone();
                        let (turns, turn_tokens) = (*turns, *turn_tokens);
                        tokio::spawn(async move {
                            // Staggered starts: sessions are at different turns.
                            tokio::time::sleep(Duration::from_millis(37 * s as u64)).await;
                            let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
                            let mut samples = Vec::new();
                            for t in 0..turns {
                                messages.push(serde_json::json!({"role": "user", "content": text((s * 100 + t) as u64, turn_tokens)}));
                                let sample = chat(&client, &base, &serde_json::Value::Array(messages.clone())).await;
                                messages.push(serde_json::json!({"role": "assistant", "content": sample.answer.clone()}));
                                samples.push(sample);
                            }
                            samples
                        })
                    })
                    .collect();
                let mut all = Vec::new();
                for task in tasks {
                    all.extend(task.await.unwrap_or_default());
                }
                all
            }
        }
    }
}

/// Sends `messages` at `rate` a second whatever the answers' pace (an open
/// loop: a slow fleet queues, as it would for real clients).
async fn open_loop(
    client: &reqwest::Client,
    bases: &[String],
    messages: Vec<serde_json::Value>,
    rate: f64,
) -> Vec<Sample> {
    let started = tokio::time::Instant::now();
    let mut tasks = BTreeMap::new();
    for (i, message) in messages.into_iter().enumerate() {
        tokio::time::sleep_until(started + Duration::from_secs_f64(i as f64 / rate)).await;
        let client = client.clone();
        let base = bases[i % bases.len()].clone();
        tasks.insert(
            i,
            tokio::spawn(async move { chat(&client, &base, &message).await }),
        );
    }
    let mut samples = Vec::new();
    for (_, task) in tasks {
        if let Ok(sample) = task.await {
            samples.push(sample);
        }
    }
    samples
}
