//! The autoscaling benchmark: a step in arrivals against an autoscaled
//! model on `llmgw dev` (three peers with mTLS, agents, simulated engines
//! with a cold start and a prefill queue, the standalone router), and how
//! the fleet follows it. Prints a timeline (arrivals, replicas wanted,
//! ready, TTFT p90, failures) and: how long after the step the scale-up was
//! decided, how long after each new replica was ready it served its first
//! request, when TTFT p90 was back under the SLO, failed requests, and the
//! GPU time used against a fleet provisioned for the peak throughout.
//!
//!     cargo build --release -p llmgw-cli -p llmgw-engine-sim -p llmgw-fleet-sim
//!     target/release/scale-bench --base-rate 1.5 --step 5

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use llmgw_api::{ModelExplanation, ReplicaState, ReplicaView, paths};
use llmgw_test_kit::dev::{Dev, DevAdmin};
use reqwest::Method;
use serde_json::json;

const MODEL: &str = "scale-bench";

#[derive(Debug, Parser)]
struct Args {
    /// Requests a second before and after the step.
    #[arg(long, default_value_t = 1.5)]
    base_rate: f64,
    /// The step: arrivals multiply by this.
    #[arg(long, default_value_t = 5.0)]
    step: f64,
    #[arg(long, default_value_t = 60)]
    before_s: u64,
    #[arg(long, default_value_t = 120)]
    during_s: u64,
    #[arg(long, default_value_t = 150)]
    after_s: u64,
    /// A simulated engine's cold start (weights loading).
    #[arg(long, default_value = "15s")]
    cold_start: String,
    /// Prefill per prompt token: one prefill at a time per engine, so an
    /// engine saturates and queues.
    #[arg(long, default_value = "10ms")]
    prefill_per_token: String,
    #[arg(long, default_value_t = 3)]
    max_replicas: u32,
    #[arg(long, default_value_t = 1)]
    target_requests_per_replica: u32,
    #[arg(long, default_value = "10s")]
    scale_up_window: String,
    #[arg(long, default_value = "60s")]
    scale_down_window: String,
    /// TTFT p90 the model should meet, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    slo_ms: u64,
}

/// One request: when it was sent (since the start), its TTFT, whether it
/// succeeded.
#[derive(Clone, Copy)]
struct Outcome {
    sent_s: f64,
    ttft: Option<Duration>,
}

/// The fleet once a second.
struct FleetSample {
    at_s: f64,
    desired: u32,
    ready: u32,
    starting: u32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = llmgw_runtime::multi_thread_runtime()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let work = tempfile::tempdir()?;
    let dev = Dev::start(&work.path().join("dev"), &[]);
    dev.wait_printed("Press Ctrl-C", Duration::from_secs(300))
        .await;
    let dev_file = dev.dev_file().context("dev.json")?;
    let router = dev_file
        .router
        .clone()
        .context("dev.json names no router")?;
    let admin = DevAdmin::new(&dev_file);
    let entry = json!({
        "name": MODEL,
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "profiles": [{"name": "tp1", "engine": "vllm", "gpus_per_node": 1,
                      "min_gpu_memory_gb": 16, "gpu_models": ["L40S", "A100"],
                      "env": {"LLMGW_SIM_ITL": "40ms",
                              "LLMGW_SIM_LOAD_TIME": args.cold_start,
                              "LLMGW_SIM_PREFILL_PER_TOKEN": args.prefill_per_token}}],
        "autoscale": {"min_replicas": 1, "max_replicas": args.max_replicas,
                      "target_requests_per_replica": args.target_requests_per_replica,
                      "scale_up_window": args.scale_up_window,
                      "scale_down_window": args.scale_down_window},
    });
    let (status, body) = admin
        .send(Method::PUT, &paths::model(MODEL), Some(entry.to_string()))
        .await
        .map_err(anyhow::Error::msg)?;
    if status != 200 {
        bail!("PUT {MODEL}: {status} {body}");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while fleet_sample(&admin, 0.0).await.is_none_or(|s| s.ready < 1) {
        if Instant::now() > deadline {
            bail!("no ready replica of {MODEL} within 120s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "scale-bench: {} req/s for {}s, then {} req/s for {}s, then {} req/s for {}s; \
         cold start {}, target {} request(s) a replica, windows {} up / {} down, max {} replicas",
        args.base_rate,
        args.before_s,
        args.base_rate * args.step,
        args.during_s,
        args.base_rate,
        args.after_s,
        args.cold_start,
        args.target_requests_per_replica,
        args.scale_up_window,
        args.scale_down_window,
        args.max_replicas
    );

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(256)
        .build()?;
    let started = Instant::now();
    let total_s = args.before_s + args.during_s + args.after_s;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (samples, admin) = (Arc::clone(&samples), DevAdmin::new(&dev_file));
        tokio::spawn(async move {
            while started.elapsed().as_secs() < total_s + 5 {
                if let Some(s) = fleet_sample(&admin, started.elapsed().as_secs_f64()).await {
                    samples.lock().unwrap().push(s);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let outcomes = arrivals(&http, &router, &args, started).await;
    let _ = sampler.await;
    let decision: ModelExplanation = admin
        .get(&paths::explain(MODEL))
        .await
        .map_err(anyhow::Error::msg)?;
    let samples = samples.lock().unwrap();
    report(&args, &outcomes, &samples, &decision);
    drop(dev);
    Ok(())
}

/// Sends requests at the trace's rate, open loop, and waits for them all.
async fn arrivals(
    http: &reqwest::Client,
    router: &str,
    args: &Args,
    started: Instant,
) -> Vec<Outcome> {
    let mut tasks = Vec::new();
    let mut at = 0.0;
    let phases = [
        (args.before_s as f64, args.base_rate),
        (
            (args.before_s + args.during_s) as f64,
            args.base_rate * args.step,
        ),
        (
            (args.before_s + args.during_s + args.after_s) as f64,
            args.base_rate,
        ),
    ];
    for (until, rate) in phases {
        while at < until {
            tokio::time::sleep_until((started + Duration::from_secs_f64(at)).into()).await;
            let (http, router) = (http.clone(), router.to_owned());
            let sent_s = at;
            let seq = tasks.len();
            tasks.push(tokio::spawn(async move {
                Outcome {
                    sent_s,
                    ttft: ttft(&http, &router, seq).await,
                }
            }));
            at += 1.0 / rate;
        }
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
async fn ttft(http: &reqwest::Client, router: &str, seq: usize) -> Option<Duration> {
    let prompt = format!(
        "Request {seq}: tell me about the weather in city number {seq} today, tomorrow and the day after, briefly."
    );
    let sent = Instant::now();
    let mut response = http
        .post(format!("{router}/v1/chat/completions"))
        .json(&json!({"model": MODEL, "stream": true, "max_tokens": 12,
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
        first.get_or_insert_with(|| sent.elapsed());
        text.extend_from_slice(&chunk);
    }
    let done = String::from_utf8_lossy(&text)
        .trim_end()
        .ends_with("data: [DONE]");
    first.filter(|_| done)
}

async fn fleet_sample(admin: &DevAdmin, at_s: f64) -> Option<FleetSample> {
    let replicas: Vec<ReplicaView> = admin.get(paths::REPLICAS).await.ok()?;
    let explained: ModelExplanation = admin.get(&paths::explain(MODEL)).await.ok()?;
    let mine = || replicas.iter().filter(|r| r.replica.model == MODEL);
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

fn p90(mut ttfts: Vec<Duration>) -> Option<Duration> {
    if ttfts.is_empty() {
        return None;
    }
    ttfts.sort();
    Some(ttfts[((ttfts.len() - 1) as f64 * 0.9).round() as usize])
}

fn report(args: &Args, outcomes: &[Outcome], samples: &[FleetSample], last: &ModelExplanation) {
    let step_at = args.before_s as f64;
    let window = 10.0;
    let mut by_window: BTreeMap<u64, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        by_window
            .entry((o.sent_s / window) as u64)
            .or_default()
            .push(o);
    }
    println!(
        "\n{:>6} {:>8} {:>8} {:>6} {:>9} {:>10} {:>7}",
        "t (s)", "req/s", "wanted", "ready", "starting", "TTFT p90", "failed"
    );
    let slo = Duration::from_millis(args.slo_ms);
    let mut last_over_slo = None;
    for (w, sent) in &by_window {
        let from = *w as f64 * window;
        let sample = samples
            .iter()
            .rev()
            .find(|s| s.at_s >= from && s.at_s < from + window);
        let ttfts: Vec<Duration> = sent.iter().filter_map(|o| o.ttft).collect();
        let failed = sent.iter().filter(|o| o.ttft.is_none()).count();
        let p = p90(ttfts);
        if p.is_some_and(|p| p > slo) && from >= step_at {
            last_over_slo = Some(from + window);
        }
        println!(
            "{:>6.0} {:>8.1} {:>8} {:>6} {:>9} {:>8.0}ms {:>7}",
            from,
            sent.len() as f64 / window,
            sample.map_or("-".into(), |s| s.desired.to_string()),
            sample.map_or("-".into(), |s| s.ready.to_string()),
            sample.map_or("-".into(), |s| s.starting.to_string()),
            p.map_or(f64::NAN, |p| p.as_secs_f64() * 1000.0),
            failed
        );
    }
    let first_up = samples
        .iter()
        .find(|s| s.at_s >= step_at && s.desired > 1)
        .map(|s| s.at_s - step_at);
    let peak_ready = samples
        .iter()
        .find(|s| s.at_s >= step_at && s.ready >= args.max_replicas)
        .map(|s| s.at_s - step_at);
    let failed = outcomes.iter().filter(|o| o.ttft.is_none()).count();
    let gpu_s: f64 = samples
        .windows(2)
        .map(|w| f64::from(w[0].ready + w[0].starting) * (w[1].at_s - w[0].at_s))
        .sum();
    let span = samples.last().map_or(0.0, |s| s.at_s) - samples.first().map_or(0.0, |s| s.at_s);
    let static_gpu_s = f64::from(args.max_replicas) * span;
    println!("\nrequests: {} sent, {failed} failed", outcomes.len());
    println!(
        "scale-up decided (wanted > 1, sampled each second): {} after the step",
        first_up.map_or("never".into(), |s| format!("{s:.0}s"))
    );
    println!(
        "all {} replicas ready: {} after the step",
        args.max_replicas,
        peak_ready.map_or("never".into(), |s| format!("{s:.0}s"))
    );
    println!(
        "TTFT p90 over the {} ms SLO last in the 10 s window ending {}",
        args.slo_ms,
        last_over_slo.map_or("never (after the step)".into(), |t| format!(
            "{:.0}s after the step",
            t - step_at
        ))
    );
    println!(
        "GPU time: {:.0} GPU-s against {:.0} GPU-s for {} replicas throughout ({:.0} % less)",
        gpu_s,
        static_gpu_s,
        args.max_replicas,
        (1.0 - gpu_s / static_gpu_s) * 100.0
    );
    if let Some(scaling) = &last.scaling {
        println!("last decision: {scaling}");
    }
}
