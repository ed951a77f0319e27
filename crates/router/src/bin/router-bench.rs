//! router-bench: what the llmgw router adds to a request, measured against a
//! direct connection to a simulated engine with zero token delay.
//!
//! It starts `llmgw-engine-sim` and, as a separate process, the router (this
//! binary again, in `--serve-router` mode, so the router's memory is its
//! own), then for each target runs non-streamed chat completions at 1, 64
//! and 256 concurrent connections and 1,000 concurrent streams, and prints
//! throughput, latency percentiles, what the router adds, and its RSS.
//! Other proxies can be measured too with `--reference NAME=URL` (started by
//! hand in front of `--sim-port`). See docs/performance.md, section Router.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use llmgw_procfs::{CpuTimes, cpu_times, rss_kib, to_pid};
use llmgw_router::{Endpoint, RoutedModel, Router, RoutingTable, Settings};
use tokio::sync::watch;

const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

struct Options {
    sim: PathBuf,
    sim_port: u16,
    router_port: u16,
    seconds: f64,
    streams: usize,
    concurrency: Vec<usize>,
    /// Router threads; None: one per CPU, as `llmgw router` does.
    router_threads: Option<NonZeroUsize>,
    references: Vec<(String, String)>,
    /// Processes of a reference proxy, for its CPU and memory.
    reference_pids: Vec<(String, Vec<i32>)>,
}

fn parse_options() -> anyhow::Result<Options> {
    let exe = std::env::current_exe()?;
    let mut o = Options {
        sim: exe.with_file_name("llmgw-engine-sim"),
        sim_port: 18501,
        router_port: 18502,
        seconds: 5.0,
        streams: 1000,
        concurrency: vec![1, 64, 256],
        router_threads: None,
        references: Vec::new(),
        reference_pids: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sim" => o.sim = value()?.into(),
            "--sim-port" => o.sim_port = value()?.parse()?,
            "--router-port" => o.router_port = value()?.parse()?,
            "--seconds" => o.seconds = value()?.parse()?,
            "--streams" => o.streams = value()?.parse()?,
            "--concurrency" => {
                o.concurrency = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--router-threads" => o.router_threads = Some(value()?.parse()?),
            "--reference" => {
                let v = value()?;
                let (name, url) = v.split_once('=').context("--reference NAME=URL")?;
                o.references
                    .push((name.into(), url.trim_end_matches('/').into()));
            }
            "--pids" => {
                let v = value()?;
                let (name, pids) = v.split_once('=').context("--pids NAME=PID[,PID...]")?;
                let pids = pids
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .context("--pids NAME=PID[,PID...]")?;
                o.reference_pids.push((name.into(), pids));
            }
            other => bail!(
                "unknown option {other}; options: --sim PATH --sim-port N --router-port N --seconds S --streams N --concurrency 1,64,256 --router-threads N --reference NAME=URL --pids NAME=PID[,PID...]"
            ),
        }
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("--serve-router") {
        let port: u16 = args.next().context("port")?.parse()?;
        let upstream = args.next().context("upstream URL")?;
        let threads = match args.next() {
            Some(n) => n.parse().context("router threads")?,
            None => std::thread::available_parallelism()?,
        };
        return serve_router(port, upstream, threads);
    }
    let o = parse_options()?;
    if !o.sim.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p llmgw-engine-sim` or pass --sim",
            o.sim.display()
        );
    }
    let runtime = llmgw_runtime::multi_thread_runtime()?;
    runtime.block_on(run(o))
}

/// The router alone in this process, so its RSS is its own, serving as
/// `llmgw router` does: on threads of its own, one per CPU unless told.
fn serve_router(port: u16, upstream: String, threads: NonZeroUsize) -> anyhow::Result<()> {
    let runtime = llmgw_runtime::multi_thread_runtime()?;
    runtime.block_on(async move {
        let table = RoutingTable {
            keys: Default::default(),
            models: vec![RoutedModel {
                name: MODEL.into(),
                aliases: vec![],
                mapped_aliases: Vec::new(),
                endpoints: vec![Endpoint::ready(upstream)],
                unavailable_reason: None,
                wakes_on_request: false,
                max_requests_per_replica: None,
            }],
        };
        let (tx, _) = watch::channel(Arc::new(table));
        let running = Router::new(Settings::default(), &tx)
            .bind_threads(SocketAddr::from(([127, 0, 0, 1], port)), threads)?;
        running.wait().await;
        Ok(())
    })
}

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_healthy(url: &str) -> anyhow::Result<()> {
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let request = Request::get(format!("{url}/health")).body(Full::new(Bytes::new()))?;
        if let Ok(Ok(r)) =
            tokio::time::timeout(Duration::from_secs(2), client.request(request)).await
            && r.status() == 200
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{url} never became healthy")
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build(connector)
}

struct Figures {
    requests: usize,
    /// Including the warm-up, for CPU per request.
    answered: usize,
    errors: usize,
    seconds: f64,
    latencies_us: Vec<u64>,
}

impl Figures {
    fn percentile(&self, p: f64) -> u64 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        self.latencies_us[i]
    }
}

/// `workers` tasks each sending requests back to back for `seconds` (after
/// a one-second warm-up that is not counted).
async fn load(url: &str, workers: usize, seconds: f64, stream: bool) -> Figures {
    let client = client();
    let body = if stream {
        format!(
            r#"{{"model":"{MODEL}","stream":true,"max_tokens":16,"ignore_eos":true,"messages":[{{"role":"user","content":"hello"}}]}}"#
        )
    } else {
        format!(
            r#"{{"model":"{MODEL}","max_tokens":8,"messages":[{{"role":"user","content":"hello"}}]}}"#
        )
    };
    let body = Bytes::from(body);
    let target = format!("{url}/v1/chat/completions");
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let client = client.clone();
        let body = body.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            let mut answered = 0usize;
            loop {
                let now = Instant::now();
                if now >= stop_at {
                    break;
                }
                let request = Request::post(&target)
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .expect("request");
                let ok = match client.request(request).await {
                    Ok(r) if r.status() == 200 => r.into_body().collect().await.is_ok(),
                    Ok(r) => {
                        let _ = r.into_body().collect().await;
                        false
                    }
                    Err(_) => false,
                };
                answered += usize::from(ok);
                if now >= warm_until {
                    if ok {
                        latencies.push(now.elapsed().as_micros() as u64);
                    } else {
                        errors += 1;
                    }
                }
            }
            (latencies, errors, answered)
        }));
    }
    let mut figures = Figures {
        requests: 0,
        answered: 0,
        errors: 0,
        seconds,
        latencies_us: Vec::new(),
    };
    for t in tasks {
        let (l, e, a) = t.await.expect("worker");
        figures.latencies_us.extend(l);
        figures.errors += e;
        figures.answered += a;
    }
    figures.requests = figures.latencies_us.len();
    figures.latencies_us.sort_unstable();
    figures
}

async fn run(o: Options) -> anyhow::Result<()> {
    let sim_url = format!("http://127.0.0.1:{}", o.sim_port);
    let router_url = format!("http://127.0.0.1:{}", o.router_port);
    let sim = start_simulator(&o)?;
    let mut router = Command::new(std::env::current_exe()?);
    router.args(["--serve-router", &o.router_port.to_string(), &sim_url]);
    if let Some(threads) = o.router_threads {
        router.arg(threads.to_string());
    }
    let router = Guard(
        router
            .stdout(Stdio::null())
            .spawn()
            .context("start the router process")?,
    );
    wait_healthy(&sim_url).await?;
    wait_healthy(&router_url).await?;
    let router_pid = to_pid(router.0.id());
    println!(
        "router-bench: simulator pid {}, router pid {router_pid}, {} s per phase after 1 s warm-up, {} CPUs",
        sim.0.id(),
        o.seconds,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("router RSS idle: {} KiB", rss_kib(router_pid).unwrap_or(0));

    let mut targets = vec![
        Target {
            name: "direct".to_string(),
            url: sim_url.clone(),
            pids: vec![],
        },
        Target {
            name: "llmgw".to_string(),
            url: router_url.clone(),
            pids: vec![router_pid],
        },
    ];
    // Routers that wait for their worker to pass a health check (vllm-router
    // checks every 10 s or so) are measured only once they serve.
    for (name, url) in &o.references {
        wait_healthy(url)
            .await
            .with_context(|| format!("reference {name}"))?;
    }
    for (name, url) in &o.references {
        let pids = o
            .reference_pids
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, pids)| pids.clone())
            .unwrap_or_default();
        targets.push(Target {
            name: name.clone(),
            url: url.clone(),
            pids,
        });
    }
    let mut phases: Vec<(String, usize, bool)> = o
        .concurrency
        .iter()
        .map(|&c| (format!("non-streamed, {c} connections"), c, false))
        .collect();
    if o.streams > 0 {
        phases.push((
            format!("{} concurrent streams of 16 tokens", o.streams),
            o.streams,
            true,
        ));
    }
    for (label, workers, stream) in phases {
        println!("\n{label}:");
        println!(
            "  {:<14} {:>10} {:>8} {:>10} {:>10} {:>12} {:>12} {:>12} {:>15} {:>10}",
            "target",
            "req/s",
            "errors",
            "p50 us",
            "p99 us",
            "+p50 us",
            "+p99 us",
            "proxy RSS",
            "proxy CPU/req",
            "in kernel"
        );
        let mut direct: Option<(u64, u64)> = None;
        for target in &targets {
            let measured = measure(target, workers, o.seconds, stream).await;
            if target.name == "direct" {
                direct = Some(measured.percentiles());
            }
            print_row(&target.name, &measured, direct);
        }
    }
    drop(router);
    drop(sim);
    Ok(())
}

/// The simulator at zero token delay, with room for every connection.
fn start_simulator(o: &Options) -> anyhow::Result<Guard> {
    let max_seqs = (o.streams + o.concurrency.iter().max().copied().unwrap_or(0) + 64).to_string();
    let child = Command::new(&o.sim)
        .args([
            "serve",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            &o.sim_port.to_string(),
            "--max-num-seqs",
            &max_seqs,
        ])
        .env("LLMGW_SIM_LOAD_TIME", "100ms")
        .env("LLMGW_SIM_TTFT", "0")
        .env("LLMGW_SIM_ITL", "0")
        .env("LLMGW_SIM_SEED", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", o.sim.display()))?;
    Ok(Guard(child))
}

/// What is measured: the engine directly, the llmgw router or a
/// reference proxy, whose processes' CPU and memory are read.
struct Target {
    name: String,
    url: String,
    pids: Vec<i32>,
}

/// One phase against one target.
struct Measured {
    figures: Figures,
    /// The proxy's peak RSS in KiB; `None` without proxy processes.
    peak_rss_kib: Option<u64>,
    /// The proxy's CPU per answer in µs, all of it and the kernel's part;
    /// `None` without proxy processes.
    cpu_per_answer_us: Option<(f64, f64)>,
}

impl Measured {
    fn percentiles(&self) -> (u64, u64) {
        (self.figures.percentile(0.5), self.figures.percentile(0.99))
    }
}

/// Runs the load against `target`, sampling its processes' RSS every
/// 50 ms and their CPU time before and after.
async fn measure(target: &Target, workers: usize, seconds: f64, stream: bool) -> Measured {
    let pids = &target.pids;
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = Arc::clone(&peak);
        let pids = pids.clone();
        tokio::spawn(async move {
            loop {
                let rss: u64 = pids.iter().filter_map(|&pid| rss_kib(pid)).sum();
                peak.fetch_max(rss, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let cpu = || {
        pids.iter()
            .filter_map(|&pid| cpu_times(pid))
            .fold(CpuTimes::default(), |sum, t| CpuTimes {
                user_seconds: sum.user_seconds + t.user_seconds,
                system_seconds: sum.system_seconds + t.system_seconds,
            })
    };
    let cpu_before = cpu();
    let figures = load(&target.url, workers, seconds, stream).await;
    let cpu_after = cpu();
    let system_used = cpu_after.system_seconds - cpu_before.system_seconds;
    let cpu_used = cpu_after.user_seconds - cpu_before.user_seconds + system_used;
    sampler.abort();
    let measured_proxy = !pids.is_empty();
    Measured {
        peak_rss_kib: measured_proxy.then(|| peak.load(Ordering::Relaxed)),
        // The CPU window includes the warm-up, so divide by every answer.
        cpu_per_answer_us: (measured_proxy && figures.answered > 0).then(|| {
            let per_answer = 1e6 / figures.answered as f64;
            (cpu_used * per_answer, system_used * per_answer)
        }),
        figures,
    }
}

/// One table row; `direct` (p50, p99) gives what the target adds.
fn print_row(name: &str, measured: &Measured, direct: Option<(u64, u64)>) {
    let f = &measured.figures;
    let (p50, p99) = measured.percentiles();
    let added = match direct {
        Some((d50, d99)) if name != "direct" => (
            format!("{}", p50 as i64 - d50 as i64),
            format!("{}", p99 as i64 - d99 as i64),
        ),
        _ => ("-".into(), "-".into()),
    };
    println!(
        "  {:<14} {:>10.0} {:>8} {:>10} {:>10} {:>12} {:>12} {:>12} {:>15} {:>10}",
        name,
        f.requests as f64 / f.seconds,
        f.errors,
        p50,
        p99,
        added.0,
        added.1,
        measured
            .peak_rss_kib
            .map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0)),
        measured
            .cpu_per_answer_us
            .map_or("-".into(), |(all, _)| format!("{all:.0} us")),
        measured
            .cpu_per_answer_us
            .map_or("-".into(), |(_, kernel)| format!("{kernel:.0} us")),
    );
}
