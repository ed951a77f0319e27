//! The autoscaling benchmark: an arrival trace against autoscaled models
//! on `llmgw dev` (three peers with mTLS, agents, simulated engines with a
//! cold start and a prefill queue, the standalone router), and how the
//! fleet follows it. Traces: a step in arrivals, steady load with noise, a
//! diurnal day compressed, two models whose peaks are half a day apart on
//! one pool of GPUs. Prints a timeline per model (arrivals, replicas
//! wanted, ready, starting, TTFT p90, failures) and: scale actions and
//! reversals, requests inside the TTFT SLO, failed requests, GPU time
//! against a fleet provisioned for each model's peak throughout, and for a
//! step how long the fleet took to follow it.
//!
//!     cargo build --release -p llmgw-cli -p llmgw-engine-sim -p llmgw-fleet-sim
//!     target/release/scale-bench --trace step --base-rate 1.5 --step 5
//!     target/release/scale-bench --trace diurnal --day-s 600
//!     target/release/scale-bench --trace two-models --max-replicas 2
//!     target/release/scale-bench --trace two-models --nodes 4 --max-replicas 4 --warm-up-s 120
//!     target/release/scale-bench --trace rollout --nodes 4 --min-replicas 4 --max-replicas 4 --base-rate 4 --during-s 240
//!     target/release/scale-bench --trace from-zero --min-replicas 0 --before-s 120 --during-s 60 --after-s 30

mod report;
mod trace;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use llmgw_api::{ModelExplanation, ReplicaState, ReplicaView, RolloutPhase, RolloutView, paths};
use llmgw_test_kit::dev::{Dev, DevAdmin};
use reqwest::Method;
use serde_json::json;

use crate::report::{FleetSample, Outcome, RoutingSample};
use crate::trace::{Phases, Shape, Trace};

#[derive(Debug, Clone, Parser)]
struct Args {
    #[arg(long, value_enum, default_value_t = Shape::Step)]
    trace: Shape,
    /// Requests a second of a step (before and after it) and of steady load.
    #[arg(long, default_value_t = 1.5)]
    base_rate: f64,
    /// The step: arrivals multiply by this.
    #[arg(long, default_value_t = 5.0)]
    step: f64,
    #[arg(long, default_value_t = 60)]
    before_s: u64,
    /// How long the step lasts, or the steady load.
    #[arg(long, default_value_t = 120)]
    during_s: u64,
    #[arg(long, default_value_t = 150)]
    after_s: u64,
    /// A diurnal day's midnight and noon, in requests a second.
    #[arg(long, default_value_t = 0.3)]
    low_rate: f64,
    #[arg(long, default_value_t = 6.0)]
    peak_rate: f64,
    /// How long a compressed day lasts.
    #[arg(long, default_value_t = 600)]
    day_s: u64,
    /// The most the rate departs from the trace's shape, a fraction; it
    /// changes every 10 s (not for a step).
    #[arg(long, default_value_t = 0.2)]
    noise: f64,
    /// Replays the same noise.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A simulated engine's cold start (weights loading).
    #[arg(long, default_value = "15s")]
    cold_start: String,
    /// Prefill per prompt token: one prefill at a time per engine, so an
    /// engine saturates and queues.
    #[arg(long, default_value = "10ms")]
    prefill_per_token: String,
    #[arg(long, default_value_t = 1)]
    min_replicas: u32,
    #[arg(long, default_value_t = 3)]
    max_replicas: u32,
    #[arg(long, default_value_t = 1)]
    target_requests_per_replica: u32,
    #[arg(long, default_value = "10s")]
    scale_up_window: String,
    #[arg(long, default_value = "60s")]
    scale_down_window: String,
    /// Requests the router sends a replica at once (the models'
    /// `max_requests_per_replica`); the rest wait at the router.
    #[arg(long)]
    max_requests_per_replica: Option<u32>,
    /// TTFT p90 the models should meet, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    slo_ms: u64,
    /// Also give the autoscaler the SLO as its `ttft_p90_slo` target.
    #[arg(long)]
    ttft_target: bool,
    /// Simulated GPU nodes (`llmgw dev --nodes`): the fourth is an A100
    /// node with four GPUs more.
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    /// The timeline's rows, in seconds.
    #[arg(long, default_value_t = 10)]
    window_s: u64,
    /// Runs the trace this long before the measured run: the fleet has
    /// been following the load, as a serving fleet has, instead of starting
    /// every model at `min_replicas` wherever the trace begins. Its
    /// requests and samples are left out of the figures.
    #[arg(long, default_value_t = 0)]
    warm_up_s: u64,
}

impl Args {
    fn trace(&self) -> Trace {
        let phases = Phases {
            base_rate: self.base_rate,
            step: self.step,
            before_s: self.before_s as f64,
            during_s: self.during_s as f64,
            after_s: self.after_s as f64,
            low_rate: self.low_rate,
            peak_rate: self.peak_rate,
            day_s: self.day_s as f64,
            warm_up_s: self.warm_up_s as f64,
        };
        Trace::new(self.trace, phases, self.noise, self.seed)
    }
}

/// The benchmark's models: one, or two for `two-models`.
fn model_names(trace: &Trace) -> Vec<String> {
    match trace.models() {
        1 => vec!["scale-bench".to_owned()],
        n => (0..n)
            .map(|i| format!("scale-bench-{}", char::from(b'a' + i as u8)))
            .collect(),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = llmgw_runtime::multi_thread_runtime()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let trace = args.trace();
    let models = model_names(&trace);
    let work = tempfile::tempdir()?;
    let nodes = args.nodes.to_string();
    let dev = Dev::start(&work.path().join("dev"), &["--nodes", &nodes]);
    dev.wait_printed("Press Ctrl-C", Duration::from_secs(300))
        .await;
    let dev_file = dev.dev_file().context("dev.json")?;
    let router = dev_file
        .router
        .clone()
        .context("dev.json names no router")?;
    let admin = DevAdmin::new(&dev_file);
    for model in &models {
        put_model(&admin, &args, model, 1).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    for model in &models {
        while fleet_sample(&admin, model, 0.0)
            .await
            .is_none_or(|s| s.ready < args.min_replicas.max(1))
        {
            if Instant::now() > deadline {
                bail!("no ready replica of {model} within 180s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The router reads the control plane once a second: the first
        // request must not reach it before the model does.
        while !routed(&router, model).await {
            if Instant::now() > deadline {
                bail!("the router did not route {model} within 180s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    println!(
        "scale-bench: trace {:?} for {:.0}s{} over {} model(s); cold start {}, target {} \
         request(s) a replica{}{}, windows {} up / {} down, {} to {} replicas a model",
        args.trace,
        trace.duration_s(),
        match args.warm_up_s {
            0 => String::new(),
            s => format!(" after a {s}s warm-up"),
        },
        models.len(),
        args.cold_start,
        args.target_requests_per_replica,
        if args.ttft_target {
            format!(", TTFT p90 target {} ms", args.slo_ms)
        } else {
            String::new()
        },
        args.max_requests_per_replica
            .map_or(String::new(), |most| format!(
                ", at most {most} a replica from the router"
            )),
        args.scale_up_window,
        args.scale_down_window,
        args.min_replicas,
        args.max_replicas
    );

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(256)
        .build()?;
    // The measured run's zero: requests of the warm-up are sent before it.
    let started = Instant::now() + Duration::from_secs(args.warm_up_s);
    let total_s = trace.duration_s();
    let samples = Arc::new(Mutex::new(vec![Vec::new(); models.len()]));
    let sampler = {
        let (samples, admin, models) = (
            Arc::clone(&samples),
            DevAdmin::new(&dev_file),
            models.clone(),
        );
        tokio::spawn(async move {
            tokio::time::sleep_until(started.into()).await;
            while started.elapsed().as_secs_f64() < total_s + 5.0 {
                let at_s = started.elapsed().as_secs_f64();
                for (i, model) in models.iter().enumerate() {
                    if let Some(s) = fleet_sample(&admin, model, at_s).await {
                        samples.lock().unwrap()[i].push(s);
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let routing = {
        let (admin, router, models) = (DevAdmin::new(&dev_file), router.clone(), models.clone());
        tokio::spawn(async move { watch_routing(&admin, &router, &models, started, total_s).await })
    };
    let rollout = trace.rollout_at_s().map(|at_s| {
        let (admin, args, model) = (DevAdmin::new(&dev_file), args.clone(), models[0].clone());
        tokio::spawn(async move { roll_out(&admin, &args, &model, started, at_s).await })
    });
    let sent = send_trace(&http, &router, &trace, &models, started).await;
    let (warm_up, outcomes): (Vec<Outcome>, Vec<Outcome>) =
        sent.into_iter().partition(|o| o.sent_s < 0.0);
    if args.warm_up_s > 0 {
        println!(
            "warm-up: {} requests in the {}s before the measured run, {} failed (left out below)",
            warm_up.len(),
            args.warm_up_s,
            warm_up.iter().filter(|o| o.ttft.is_none()).count()
        );
    }
    let _ = sampler.await;
    let routing = routing.await.unwrap_or_default();
    let rollout = match rollout {
        Some(task) => Some(task.await??),
        None => None,
    };
    let mut last = Vec::new();
    for model in &models {
        let explained: ModelExplanation = admin
            .get(&paths::explain(model))
            .await
            .map_err(anyhow::Error::msg)?;
        last.push(explained.scaling.unwrap_or_default());
    }
    let samples = samples.lock().unwrap().clone();
    report::print(&report::Run {
        trace: &trace,
        models: &models,
        outcomes: &outcomes,
        samples: &samples,
        routing: &routing,
        last_decisions: &last,
        slo: Duration::from_millis(args.slo_ms),
        window_s: args.window_s as f64,
        max_replicas: args.max_replicas,
        rollout,
    });
    drop(dev);
    Ok(())
}

/// Changes the model's launch spec at `at_s` and waits until every
/// replica runs it and is ready (or the run's samples end).
async fn roll_out(
    admin: &DevAdmin,
    args: &Args,
    model: &str,
    started: Instant,
    at_s: f64,
) -> Result<report::RolloutRun> {
    tokio::time::sleep_until((started + Duration::from_secs_f64(at_s)).into()).await;
    let changed_s = started.elapsed().as_secs_f64();
    put_model(admin, args, model, 2).await?;
    let give_up = started + Duration::from_secs_f64(args.during_s as f64 + 60.0);
    loop {
        let view: RolloutView = admin
            .get(&paths::rollout(model))
            .await
            .map_err(anyhow::Error::msg)?;
        let complete = view.phase == RolloutPhase::Complete
            && view.outdated == 0
            && view.updated_ready == view.desired;
        if complete || Instant::now() >= give_up {
            return Ok(report::RolloutRun {
                changed_s,
                done_s: complete.then(|| started.elapsed().as_secs_f64()),
                max_unavailable: view.policy.max_unavailable,
                max_surge: view.policy.max_surge,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Puts the model's entry; `revision` goes into its engines' environment,
/// so a new one changes the launch spec and rolls the replicas.
async fn put_model(admin: &DevAdmin, args: &Args, model: &str, revision: u32) -> Result<()> {
    let mut autoscale = json!({
        "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
        "target_requests_per_replica": args.target_requests_per_replica,
        "scale_up_window": args.scale_up_window,
        "scale_down_window": args.scale_down_window,
    });
    if let Some(most) = args.max_requests_per_replica {
        autoscale["max_requests_per_replica"] = json!(most);
    }
    if args.ttft_target {
        autoscale["ttft_p90_slo"] = json!(format!("{}ms", args.slo_ms));
    }
    let entry = json!({
        "name": model,
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": args.min_replicas.max(1),
        "profiles": [{"name": "tp1", "engine": "vllm", "gpus_per_node": 1,
                      "min_gpu_memory_gb": 16, "gpu_models": ["L40S", "A100"],
                      "env": {"LLMGW_SIM_ITL": "40ms",
                              "LLMGW_SIM_LOAD_TIME": args.cold_start,
                              "LLMGW_SIM_PREFILL_PER_TOKEN": args.prefill_per_token,
                              "LLMGW_BENCH_REVISION": revision.to_string()}}],
        "autoscale": autoscale,
    });
    let (status, body) = admin
        .send(Method::PUT, &paths::model(model), Some(entry.to_string()))
        .await
        .map_err(anyhow::Error::msg)?;
    if status != 200 {
        bail!("PUT {model}: {status} {body}");
    }
    Ok(())
}

/// Sends every model's requests at the trace's rate, open loop, and waits
/// for them all; `started` is the measured run's zero, the warm-up's
/// requests come before it.
async fn send_trace(
    http: &reqwest::Client,
    router: &str,
    trace: &Trace,
    models: &[String],
    started: Instant,
) -> Vec<Outcome> {
    let mut schedule: Vec<(f64, usize)> = (0..models.len())
        .flat_map(|m| trace.arrivals(m).into_iter().map(move |at| (at, m)))
        .collect();
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut tasks = Vec::new();
    for (seq, (at, model)) in schedule.into_iter().enumerate() {
        let when = match at < 0.0 {
            true => started - Duration::from_secs_f64(-at),
            false => started + Duration::from_secs_f64(at),
        };
        tokio::time::sleep_until(when.into()).await;
        let (http, router, name) = (http.clone(), router.to_owned(), models[model].clone());
        tasks.push(tokio::spawn(async move {
            Outcome {
                model,
                sent_s: at,
                ttft: ttft(&http, &router, &name, seq).await,
            }
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        if let Ok(outcome) = task.await {
            outcomes.push(outcome);
        }
    }
    outcomes
}

/// Time to the first byte of a streamed chat read to `[DONE]`; none when
/// it failed. Every prompt is its own (request `seq`'s), so engines
/// prefill it whole: a busy engine queues.
async fn ttft(http: &reqwest::Client, router: &str, model: &str, seq: usize) -> Option<Duration> {
    let prompt = format!(
        "Request {seq}: tell me about the weather in city number {seq} today, tomorrow and the day after, briefly."
    );
    let sent = Instant::now();
    let mut response = http
        .post(format!("{router}/v1/chat/completions"))
        .json(&json!({"model": model, "stream": true, "max_tokens": 12,
                      "messages": [{"role": "user", "content": prompt}]}))
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let mut first = None;
    let mut text = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        text.extend_from_slice(&chunk);
        // A held request's keep-alive comments (`: ...`) come before any
        // token: the first token is the first `data:` event.
        if first.is_none() && contains(&text, b"data:") {
            first = Some(sent.elapsed());
        }
    }
    let done = String::from_utf8_lossy(&text)
        .trim_end()
        .ends_with("data: [DONE]");
    first.filter(|_| done)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// How often the routing watcher looks: the lag it reports is known to
/// within this.
const ROUTING_SAMPLE: Duration = Duration::from_millis(100);

/// Per model, every `ROUTING_SAMPLE`: the replicas the control plane
/// calls ready, and the ready endpoints the router routes to.
async fn watch_routing(
    admin: &DevAdmin,
    router: &str,
    models: &[String],
    started: Instant,
    total_s: f64,
) -> Vec<Vec<RoutingSample>> {
    let mut samples = vec![Vec::new(); models.len()];
    tokio::time::sleep_until(started.into()).await;
    while started.elapsed().as_secs_f64() < total_s + 5.0 {
        let at_s = started.elapsed().as_secs_f64();
        let replicas: Option<Vec<ReplicaView>> = admin.get(paths::REPLICAS).await.ok();
        let routed = router_ready_endpoints(router).await;
        if let (Some(replicas), Some(routed)) = (replicas, routed) {
            for (i, model) in models.iter().enumerate() {
                samples[i].push(RoutingSample {
                    at_s,
                    control_plane_ready: replicas
                        .iter()
                        .filter(|r| r.replica.model == *model && r.state == ReplicaState::Ready)
                        .count() as u32,
                    router_ready: routed.get(model).copied().unwrap_or(0),
                });
            }
        }
        tokio::time::sleep(ROUTING_SAMPLE).await;
    }
    samples
}

/// The router's ready endpoints per model, from its `/v1/models`.
async fn router_ready_endpoints(router: &str) -> Option<std::collections::HashMap<String, u32>> {
    let listed: serde_json::Value = reqwest::get(format!("{router}/v1/models"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    Some(
        listed["data"]
            .as_array()?
            .iter()
            .filter_map(|m| {
                Some((
                    m["id"].as_str()?.to_owned(),
                    m["ready_endpoints"].as_u64().unwrap_or(0) as u32,
                ))
            })
            .collect(),
    )
}

/// Whether the router lists `model` with a ready endpoint.
async fn routed(router: &str, model: &str) -> bool {
    let Ok(response) = reqwest::get(format!("{router}/v1/models")).await else {
        return false;
    };
    let Ok(listed) = response.json::<serde_json::Value>().await else {
        return false;
    };
    listed["data"].as_array().is_some_and(|models| {
        models
            .iter()
            .any(|m| m["id"] == model && m["ready_endpoints"].as_u64().unwrap_or(0) > 0)
    })
}

async fn fleet_sample(admin: &DevAdmin, model: &str, at_s: f64) -> Option<FleetSample> {
    let replicas: Vec<ReplicaView> = admin.get(paths::REPLICAS).await.ok()?;
    let explained: ModelExplanation = admin.get(&paths::explain(model)).await.ok()?;
    let mine = || replicas.iter().filter(|r| r.replica.model == model);
    Some(FleetSample {
        at_s,
        desired: explained.desired,
        ready: mine().filter(|r| r.state == ReplicaState::Ready).count() as u32,
        starting: mine()
            .filter(|r| {
                matches!(
                    r.state,
                    ReplicaState::Placed | ReplicaState::Starting | ReplicaState::Loading
                )
            })
            .count() as u32,
    })
}
