//! Load generator for `llmgw-engine-sim`: prints throughput of small
//! non-streamed chat completions, and the memory one simulator process
//! needs to hold thousands of slow streams. A program that prints figures,
//! not a test; see docs/performance.md for the command and results.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use llmgw_procfs::{cpu_seconds, rss_kib, to_pid};
use tokio::net::TcpStream;

struct Options {
    sim: String,
    sim_cpu: Option<String>,
    connections: usize,
    duration: Duration,
    streams: usize,
    port: u16,
}

fn parse_options() -> Result<Options> {
    let exe = std::env::current_exe()?;
    let sibling = exe.with_file_name("llmgw-engine-sim");
    let mut o = Options {
        sim: sibling.display().to_string(),
        sim_cpu: None,
        connections: 64,
        duration: Duration::from_secs(10),
        streams: 5000,
        port: 18555,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args
            .get(i + 1)
            .cloned()
            .with_context(|| format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--sim" => o.sim = value,
            "--sim-cpu" => o.sim_cpu = Some(value),
            "--connections" => o.connections = value.parse().context("--connections")?,
            "--seconds" => o.duration = Duration::from_secs(value.parse().context("--seconds")?),
            "--streams" => o.streams = value.parse().context("--streams")?,
            "--port" => o.port = value.parse().context("--port")?,
            other => bail!(
                "unknown option {other}; options: --sim PATH --sim-cpu N --connections N --seconds N --streams N --port N"
            ),
        }
        i += 2;
    }
    Ok(o)
}

/// Starts the simulator (optionally pinned to one CPU) and waits for it.
async fn start_sim(o: &Options, extra: &[&str], env: &[(&str, &str)]) -> Result<Child> {
    let mut cmd = match &o.sim_cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpu, &o.sim]);
            c
        }
        None => Command::new(&o.sim),
    };
    cmd.args([
        "serve",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        &o.port.to_string(),
    ])
    .args(extra)
    .env("LLMGW_SIM_LOAD_TIME", "100ms")
    .env("LLMGW_SIM_SEED", "1")
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", o.sim))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        // A simulator that exited (port taken) must not be mistaken for one
        // that listens.
        if let Some(status) = child.try_wait()? {
            bail!(
                "simulator exited with {status} before listening; is port {} taken?",
                o.port
            );
        }
        if TcpStream::connect(("127.0.0.1", o.port)).await.is_ok() {
            return Ok(child);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("simulator did not listen on port {} within 30 s", o.port)
}

fn stop_sim(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(port: u16) -> Result<Sender> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

fn chat_request(port: u16, stream: bool, max_tokens: u32) -> Request<Full<Bytes>> {
    let body = format!(
        "{{\"model\":\"Qwen/Qwen2.5-0.5B-Instruct\",\"messages\":[{{\"role\":\"user\",\"content\":\"Say hi\"}}],\"max_tokens\":{max_tokens},\"stream\":{stream}}}"
    );
    Request::post("/v1/chat/completions")
        .header("host", format!("127.0.0.1:{port}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Request::new(Full::new(Bytes::new())))
}

/// Phase 1: closed-loop non-streamed completions with zero token delay.
async fn throughput(o: &Options) -> Result<()> {
    let sim = start_sim(
        o,
        &["--max-num-seqs", "1024"],
        &[("LLMGW_SIM_TTFT", "0"), ("LLMGW_SIM_ITL", "0")],
    )
    .await?;
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..o.connections {
        let (done, errors, stop, port) = (done.clone(), errors.clone(), stop.clone(), o.port);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 16);
            let Ok(mut sender) = connect(port).await else {
                errors.fetch_add(1, Ordering::Relaxed);
                return latencies;
            };
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = match sender.send_request(chat_request(port, false, 8)).await {
                    Ok(resp) => {
                        resp.status().is_success() && resp.into_body().collect().await.is_ok()
                    }
                    Err(_) => false,
                };
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                    latencies.push(t.elapsed().as_micros() as u32);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    match connect(port).await {
                        Ok(s) => sender = s,
                        Err(_) => return latencies,
                    }
                }
            }
            latencies
        }));
    }
    // Warm up, then measure a fixed window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start_count = done.load(Ordering::Relaxed);
    let started = Instant::now();
    // CPU seconds (user + system) used so far; 0 once the process is gone.
    let cpu = |pid| cpu_seconds(pid).unwrap_or(0.0);
    let (sim_pid, own_pid) = (to_pid(sim.id()), to_pid(std::process::id()));
    let sim_cpu_start = cpu(sim_pid);
    let own_cpu_start = cpu(own_pid);
    tokio::time::sleep(o.duration).await;
    let measured = done.load(Ordering::Relaxed) - start_count;
    let elapsed = started.elapsed().as_secs_f64();
    let sim_cpu = cpu(sim_pid) - sim_cpu_start;
    let own_cpu = cpu(own_pid) - own_cpu_start;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "non-streamed chat completions, zero token delay, {} connections:",
        o.connections
    );
    println!(
        "  {:.0} requests/s over {elapsed:.1} s ({measured} requests, {} errors)",
        measured as f64 / elapsed,
        errors.load(Ordering::Relaxed)
    );
    println!("  latency p50 {} us, p99 {} us", pct(0.5), pct(0.99));
    // CPU time is what the machine's other load cannot distort: requests per
    // CPU-second is what one dedicated core would sustain.
    println!(
        "  simulator used {sim_cpu:.2} CPU-s ({:.0}% of one core): {:.0} requests per simulator CPU-second",
        100.0 * sim_cpu / elapsed,
        measured as f64 / sim_cpu.max(0.01)
    );
    println!(
        "  load generator used {own_cpu:.2} CPU-s ({:.0}% of one core)",
        100.0 * own_cpu / elapsed
    );
    stop_sim(sim);
    Ok(())
}

async fn metric(port: u16, name: &str) -> Option<f64> {
    let mut sender = connect(port).await.ok()?;
    let req = Request::get("/metrics")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .ok()?;
    let body = sender
        .send_request(req)
        .await
        .ok()?
        .into_body()
        .collect()
        .await
        .ok()?
        .to_bytes();
    llmgw_prometheus::metric(&String::from_utf8_lossy(&body), name)
}

/// Phase 2: many concurrent slow streams; reports the simulator's RSS.
async fn slow_streams(o: &Options) -> Result<()> {
    let seqs = (o.streams + 100).to_string();
    let sim = start_sim(
        o,
        &["--max-num-seqs", &seqs],
        &[("LLMGW_SIM_TTFT", "100ms"), ("LLMGW_SIM_ITL", "1s")],
    )
    .await?;
    let pid = to_pid(sim.id());
    let idle_rss = rss_kib(pid).unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let chunks = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let open_started = Instant::now();
    for _ in 0..o.streams {
        let (stop, chunks, port) = (stop.clone(), chunks.clone(), o.port);
        tasks.push(tokio::spawn(async move {
            let Ok(mut sender) = connect(port).await else {
                return;
            };
            let Ok(resp) = sender.send_request(chat_request(port, true, 120)).await else {
                return;
            };
            let mut body = resp.into_body();
            while !stop.load(Ordering::Relaxed) {
                match tokio::time::timeout(Duration::from_millis(500), body.frame()).await {
                    Ok(Some(Ok(_))) => {
                        chunks.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => return,
                    Err(_) => {}
                }
            }
        }));
        // Pace connection setup so the accept queue never overflows.
        if tasks.len() % 500 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut running = 0.0;
    while Instant::now() < deadline {
        running = metric(o.port, "vllm:num_requests_running")
            .await
            .unwrap_or(0.0);
        if running as usize >= o.streams {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let opened_in = open_started.elapsed();
    // Let every stream emit a few tokens before measuring.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = rss_kib(pid).unwrap_or(0);
    let running_now = metric(o.port, "vllm:num_requests_running")
        .await
        .unwrap_or(0.0);
    println!("concurrent slow streams (ITL 1 s, 120 tokens each):");
    println!(
        "  {running_now:.0} streams running (reached {running:.0} in {:.1} s), {} chunks received",
        opened_in.as_secs_f64(),
        chunks.load(Ordering::Relaxed)
    );
    println!(
        "  simulator RSS {:.1} MiB (idle {:.1} MiB), {:.1} KiB per stream",
        rss as f64 / 1024.0,
        idle_rss as f64 / 1024.0,
        (rss.saturating_sub(idle_rss)) as f64 / running_now.max(1.0)
    );
    stop.store(true, Ordering::Relaxed);
    stop_sim(sim);
    for t in tasks {
        t.abort();
    }
    Ok(())
}

fn main() -> Result<()> {
    let o = parse_options()?;
    let rt = llmgw_runtime::multi_thread_runtime_with_workers(1)?;
    rt.block_on(async {
        throughput(&o).await?;
        slow_streams(&o).await
    })
}
