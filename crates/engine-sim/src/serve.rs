//! One engine process from start to exit: the checks the engine makes, the
//! load with its log lines, the rendezvous of a multi-node replica, the
//! listening socket at the right moment, serving, and the end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpSocket;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::config::{Backend, ServeConfig};
use crate::failures::{self, Ending, Failure};
use crate::knobs::{Fault, LoadCrash, LoadPhase};
use crate::logs::Logger;
use crate::models::{self, ModelSpec};
use crate::persona::Engine;
use crate::rendezvous::{self, Membership};
use crate::routes::{DummyHealthApp, EngineApp};
use crate::state::{EngineState, Phase, ServingFacts};
use crate::workers::Workers;

const GIB: f64 = (1u64 << 30) as f64;
/// Activation peak and CUDA graphs, reserved before the KV cache is sized.
const OVERHEAD_GIB: f64 = 1.5;

/// Runs the engine; returns how the process must end.
pub async fn run(cfg: ServeConfig, mut log: Logger) -> Ending {
    match run_inner(cfg, &mut log).await {
        Ok(ending) => ending,
        Err(failure) => failures::report(&log, &failure),
    }
}

fn hang_at(cfg: &ServeConfig, phase: LoadPhase) -> bool {
    cfg.knobs.faults.contains(&Fault::HangOnLoad(phase))
}

fn crash_at(cfg: &ServeConfig, kind: LoadCrash) -> bool {
    cfg.knobs.faults.contains(&Fault::CrashOnLoad(kind))
}

async fn hang_forever() -> ! {
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

fn share(cfg: &ServeConfig, fraction: f64) -> Duration {
    cfg.knobs.load_time.mul_f64(fraction)
}

/// Everything loading established, for serving.
struct Loaded {
    kv_tokens: u64,
    workers: Workers,
    membership: Option<Membership>,
}

async fn run_inner(cfg: ServeConfig, log: &mut Logger) -> Result<Ending, Failure> {
    let started = Instant::now();
    let vllm = cfg.persona.engine == Engine::Vllm;
    let v = cfg.persona.version_string();
    if vllm {
        log.api(
            "INFO",
            "api_server.py:1839",
            &format!("vLLM API server version {v}"),
        );
        let args: Vec<String> = cfg
            .given
            .iter()
            .map(|(k, val)| format!("'{k}': {val}"))
            .collect();
        log.api(
            "INFO",
            "utils.py:233",
            &format!(
                "non-default args: {{'model_tag': '{}', {}}}",
                cfg.model,
                args.join(", ")
            ),
        );
        if cfg.given.iter().any(|(k, _)| k == "model") && cfg.persona.at_least((0, 12, 0)) {
            log.api(
                "WARNING",
                "argparse_utils.py:206",
                "With `vllm serve`, you should provide the model as a positional argument or in a config file instead of via the `--model` option. The `--model` option will be removed in a future version.",
            );
        }
        if !cfg.persona.at_least((0, 12, 0))
            && cfg.given.iter().any(|(k, _)| k == "disable_log_requests")
        {
            log.api(
                "WARNING",
                "api_server.py:1652",
                "`--disable-log-requests` is deprecated and has been replaced with `--enable-log-requests`. This will be removed in v0.12.0. Please use `--enable-log-requests` if you would like to turn on request logging.",
            );
        }
    } else {
        if cfg.persona.at_least((0, 5, 10)) {
            log.raw_err("/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py:26: UserWarning: 'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended entrypoint.\n  warnings.warn(\n");
        }
        let args: Vec<String> = cfg
            .given
            .iter()
            .map(|(k, val)| format!("{k}={val}"))
            .collect();
        log.sglang(
            None,
            &format!("server_args=ServerArgs({})", args.join(", ")),
        );
    }
    tokio::time::sleep(share(&cfg, 0.05)).await;

    let spec = models::find(&cfg.model).ok_or_else(|| Failure::ModelNotFound(cfg.model.clone()))?;
    let arch = if crash_at(&cfg, LoadCrash::Arch) {
        format!("{}Sim", spec.architecture)
    } else {
        spec.architecture.clone()
    };
    if vllm {
        log.api(
            "INFO",
            "model.py:547",
            &format!("Resolved architecture: {arch}"),
        );
    }
    if !models::SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
        return Err(Failure::UnsupportedArch(arch));
    }
    let max_model_len = cfg.max_model_len.unwrap_or(spec.max_position_embeddings);
    if vllm {
        log.api(
            "INFO",
            "model.py:1510",
            &format!("Using max model len {max_model_len}"),
        );
    }
    if spec.num_attention_heads % cfg.tp != 0 {
        return Err(Failure::HeadsNotDivisible {
            heads: spec.num_attention_heads,
            tp: cfg.tp,
        });
    }
    if cfg.nnodes > 1 {
        if cfg.node_rank >= cfg.nnodes {
            return Err(Failure::NodeRankOutOfRange {
                rank: cfg.node_rank,
                nnodes: cfg.nnodes,
            });
        }
        if !cfg.world_size().is_multiple_of(cfg.nnodes) {
            return Err(Failure::NnodesDoesNotDivide {
                world: cfg.world_size(),
                nnodes: cfg.nnodes,
            });
        }
    }
    let local = cfg.local_world();
    let use_ray = vllm
        && (cfg.backend == Some(Backend::Ray)
            || (cfg.nnodes == 1
                && local > cfg.visible_gpus
                && !cfg.persona.refuses_oversized_world()));
    if vllm && !use_ray && cfg.nnodes == 1 && local > cfg.visible_gpus && cfg.visible_gpus > 0 {
        return Err(Failure::WorldTooLarge {
            world: cfg.world_size(),
            gpus: cfg.visible_gpus,
        });
    }
    // vLLM binds its port before the engine starts so no one can take it
    // during the load, but listens only when ready: connections are refused.
    let early_socket = if vllm && !cfg.headless {
        Some(bind(&cfg)?)
    } else {
        None
    };

    let mut loaded = load(&cfg, log, &spec, &arch, max_model_len, use_ray).await?;
    let kv_capacity = loaded.kv_tokens;
    let facts = ServingFacts {
        kv_capacity,
        max_model_len,
        eos_token_id: spec.eos_token_id,
        embedding_dim: spec.is_embedding().then_some(spec.hidden_size),
    };
    if vllm {
        log.core(
            "INFO",
            "core.py:216",
            &format!(
                "init engine (profile, create kv cache, warmup model) took {:.2} seconds",
                started.elapsed().as_secs_f64()
            ),
        );
    }
    let state = EngineState::new(cfg.clone(), *log, facts);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut membership = loaded.membership.take();

    // Ranks that serve no API: vLLM headless and SGLang's non-zero ranks.
    if (vllm && cfg.headless) || (!vllm && cfg.node_rank > 0) {
        if !vllm {
            let listener = listen(bind(&cfg)?)?;
            log.uvicorn(&format!(
                "Uvicorn running on http://{}:{} (Press CTRL+C to quit)",
                cfg.shown_host, cfg.port
            ));
            state.set_phase(Phase::Serving);
            tokio::spawn(crate::http::serve(
                listener,
                Arc::new(DummyHealthApp {
                    state: state.clone(),
                }),
                stop_rx.clone(),
            ));
        }
        return Ok(wait_for_end(
            &state,
            &stop_tx,
            membership.as_mut(),
            &mut loaded.workers,
            Signals::install(),
            false,
        )
        .await);
    }

    let socket = match early_socket {
        Some(s) => s,
        None => bind(&cfg)?,
    };
    if vllm {
        let tasks = if spec.is_embedding() {
            "['embed']"
        } else {
            "['generate']"
        };
        let (label, start) = if cfg.persona.at_least((0, 12, 0)) {
            (
                "Supported tasks",
                format!(
                    "Starting vLLM server on http://{}:{}",
                    cfg.shown_host, cfg.port
                ),
            )
        } else {
            (
                "Supported_tasks",
                format!(
                    "Starting vLLM API server 0 on http://{}:{}",
                    cfg.shown_host, cfg.port
                ),
            )
        };
        log.api("INFO", "api_server.py:1634", &format!("{label}: {tasks}"));
        log.api("INFO", "api_server.py:1912", &start);
        log.api("INFO", "launcher.py:34", "Available routes are:");
        for (route, methods) in [
            ("/openapi.json", "GET, HEAD"),
            ("/docs", "GET, HEAD"),
            ("/health", "GET"),
            ("/load", "GET"),
            ("/ping", "POST"),
            ("/ping", "GET"),
            ("/version", "GET"),
            ("/v1/models", "GET"),
            ("/v1/chat/completions", "POST"),
            ("/v1/completions", "POST"),
            ("/v1/embeddings", "POST"),
            ("/metrics", "GET"),
        ] {
            log.api(
                "INFO",
                "launcher.py:42",
                &format!("Route: {route}, Methods: {methods}"),
            );
        }
    }
    let listener = listen(socket)?;
    // Python's default SIGTERM action applies until the server runs; only
    // now do the engines install their handlers.
    let signals = Signals::install();
    log.uvicorn(&format!("Started server process [{}]", std::process::id()));
    log.uvicorn("Waiting for application startup.");
    log.uvicorn("Application startup complete.");
    let app = Arc::new(EngineApp {
        state: state.clone(),
    });
    tokio::spawn(crate::http::serve(listener, app, stop_rx));
    if vllm {
        state.set_phase(Phase::Serving);
    } else {
        log.uvicorn(&format!(
            "Uvicorn running on http://{}:{} (Press CTRL+C to quit)",
            cfg.shown_host, cfg.port
        ));
        let warm = state.clone();
        tokio::spawn(async move { sglang_warmup(&warm).await });
    }
    Ok(wait_for_end(
        &state,
        &stop_tx,
        membership.as_mut(),
        &mut loaded.workers,
        signals,
        true,
    )
    .await)
}

/// SGLang's warm-up: `/health` 503 until one generation succeeds.
async fn sglang_warmup(state: &Arc<EngineState>) {
    let cfg = &state.cfg;
    let log = state.log;
    if !cfg.skip_warmup {
        tokio::time::sleep(share(cfg, 0.1)).await;
        log.uvicorn(&format!(
            "127.0.0.1:{} - \"GET /model_info HTTP/1.1\" 200 OK",
            40000 + (std::process::id() % 20000)
        ));
        log.sglang(
            Some(0),
            "Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ",
        );
        log.uvicorn(&format!(
            "127.0.0.1:{} - \"POST /generate HTTP/1.1\" 200 OK",
            40000 + (std::process::id() % 20000)
        ));
    }
    if state.phase() == Phase::Starting {
        state.set_phase(Phase::Serving);
    }
    log.sglang(None, "The server is fired up and ready to roll!");
}

fn bind(cfg: &ServeConfig) -> Result<TcpSocket, Failure> {
    let in_use = || Failure::PortInUse {
        host: cfg.host.clone(),
        port: cfg.port,
    };
    let ip: std::net::IpAddr = match cfg.host.as_str() {
        "" | "0.0.0.0" => std::net::Ipv4Addr::UNSPECIFIED.into(),
        "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
        h => h.parse().map_err(|_| in_use())?,
    };
    let addr = SocketAddr::new(ip, cfg.port);
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|_| in_use())?;
    let _ = socket.set_reuseaddr(true);
    socket.bind(addr).map_err(|_| in_use())?;
    Ok(socket)
}

fn listen(socket: TcpSocket) -> Result<tokio::net::TcpListener, Failure> {
    socket.listen(4096).map_err(|_| Failure::PortInUse {
        host: String::new(),
        port: 0,
    })
}

/// The load: workers, distributed init, weights, KV cache, graphs.
async fn load(
    cfg: &ServeConfig,
    log: &mut Logger,
    spec: &ModelSpec,
    arch: &str,
    max_model_len: u64,
    use_ray: bool,
) -> Result<Loaded, Failure> {
    let vllm = cfg.persona.engine == Engine::Vllm;
    let local = cfg.local_world();
    let first_rank = cfg.node_rank * local;
    let mut titles: Vec<String> = Vec::new();
    if vllm {
        if !cfg.headless {
            titles.push("VLLM::EngineCore_DP0".into());
        }
        if local > 1 || cfg.headless {
            titles.extend((0..local).map(|i| format!("VLLM::Worker_TP{}", first_rank + i)));
        }
    } else {
        titles.extend((0..local).map(|i| format!("sglang::scheduler_TP{}", first_rank + i)));
        if cfg.node_rank == 0 {
            titles.push("sglang::detokenizer".into());
        }
    }
    let workers = Workers::spawn(&titles).map_err(|e| Failure::WorkerSpawn(e.to_string()))?;
    log.core_pid = workers.pids().first().copied().unwrap_or(log.api_pid);
    let v = cfg.persona.version_string();
    if vllm && cfg.headless {
        log.api(
            "INFO",
            "serve.py:164",
            &format!(
                "Launching vLLM (v{v}) headless multiproc executor, with head node address {} for torch.distributed process group.",
                cfg.rendezvous.clone().unwrap_or_else(|| "127.0.0.1:29501".into())
            ),
        );
    }
    let scheduler = |log: &Logger, message: &str| {
        if vllm {
            log.core("INFO", "gpu_model_runner.py:2602", message);
        } else {
            log.sglang(Some(first_rank as u32), message);
        }
    };
    if vllm {
        log.core(
            "INFO",
            "core.py:644",
            "Waiting for init message from front-end.",
        );
        log.core(
            "INFO",
            "core.py:77",
            &format!(
                "Initializing a V1 LLM engine (v{v}) with config: model='{m}', speculative_config=None, tokenizer='{m}', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len={max_model_len}, download_dir=None, load_format=auto, tensor_parallel_size={}, pipeline_parallel_size={}, data_parallel_size={}, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name={}, enable_prefix_caching=True",
                cfg.tp,
                cfg.pp,
                cfg.dp,
                cfg.first_name(),
                m = cfg.model
            ),
        );
    } else {
        log.sglang(
            Some(first_rank as u32),
            "Attention backend not explicitly specified. Use flashinfer backend by default.",
        );
        log.sglang(Some(first_rank as u32), "Init torch distributed begin.");
    }
    if cfg.visible_gpus == 0 {
        return Err(Failure::NoGpus);
    }
    if !vllm && local > cfg.visible_gpus {
        return Err(Failure::InvalidDeviceOrdinal);
    }
    if vllm && !use_ray && local > cfg.visible_gpus {
        return Err(Failure::InvalidDeviceOrdinal);
    }

    // Distributed init: the multi-node rendezvous or the Ray placement.
    let membership = if cfg.nnodes > 1 {
        let addr = cfg
            .rendezvous
            .clone()
            .unwrap_or_else(|| "127.0.0.1:29501".into());
        if vllm {
            log.core(
                "INFO",
                "parallel_state.py:1165",
                &format!(
                    "world_size={} rank={first_rank} local_rank=0 distributed_init_method=tcp://{addr} backend=nccl",
                    cfg.world_size()
                ),
            );
        }
        if hang_at(cfg, LoadPhase::Distributed) {
            hang_forever().await;
        }
        let membership = if cfg.node_rank == 0 {
            let listener = rendezvous::bind_head(&addr).await.map_err(|e| match e {
                rendezvous::RendezvousError::Bind { port, .. } => {
                    Failure::RendezvousPortInUse { port }
                }
                _ => Failure::RendezvousPortInUse { port: 0 },
            })?;
            let timeout = std::env::var("VLLM_ENGINE_READY_TIMEOUT_S")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(600);
            if vllm && cfg.persona.at_least((0, 12, 0)) {
                match tokio::time::timeout(
                    Duration::from_secs(timeout),
                    rendezvous::run_head(listener, cfg.nnodes),
                )
                .await
                {
                    Ok(m) => m,
                    Err(_) => return Err(Failure::EngineReadyTimeout(timeout)),
                }
            } else {
                rendezvous::run_head(listener, cfg.nnodes).await
            }
        } else {
            match rendezvous::join(&addr, cfg.node_rank, cfg.nnodes).await {
                Ok(m) => m,
                Err(e) => {
                    log.raw_err(&format!("RuntimeError: {e}\n"));
                    return Err(Failure::RendezvousPortInUse { port: 0 });
                }
            }
        };
        Some(membership)
    } else {
        if hang_at(cfg, LoadPhase::Distributed) {
            hang_forever().await;
        }
        if use_ray {
            crate::ray::wait_for_placement(cfg, log).await;
            crate::ray::watch_cluster(cfg)
        } else {
            None
        }
    };
    if !vllm {
        log.sglang(
            Some(first_rank as u32),
            "Init torch distributed ends. mem usage=0.09 GB",
        );
    }

    // Weights.
    let total_gib = cfg.knobs.gpu_memory_gb;
    let budget_gib = total_gib * cfg.memory_fraction;
    let weights_gib = spec.weight_bytes_per_gpu(cfg.tp, cfg.pp) as f64 / GIB;
    if vllm {
        if crash_at(cfg, LoadCrash::FreeMemory) {
            return Err(Failure::FreeMemory {
                free_gib: total_gib * 0.5,
                total_gib,
                util: cfg.memory_fraction,
            });
        }
        log.core(
            "INFO",
            "gpu_model_runner.py:2602",
            &format!("Starting to load model {}...", cfg.model),
        );
    } else {
        if crash_at(cfg, LoadCrash::FreeMemory) {
            return Err(Failure::SchedulerKilled);
        }
        scheduler(
            log,
            &format!("Load weight begin. avail mem={:.2} GB", total_gib - 0.5),
        );
    }
    if hang_at(cfg, LoadPhase::Weights) {
        hang_forever().await;
    }
    let weight_time = share(cfg, 0.5);
    tokio::time::sleep(weight_time).await;
    if crash_at(cfg, LoadCrash::Oom) || weights_gib > budget_gib {
        let per_layer = weights_gib / spec.num_hidden_layers.max(1) as f64;
        return Err(Failure::CudaOom {
            tried_gib: (per_layer * 4.0).max(0.25),
            total_gib,
            free_gib: (total_gib - weights_gib.min(total_gib))
                .max(0.0)
                .min(per_layer),
        });
    }
    if vllm {
        log.core(
            "INFO",
            "default_loader.py:267",
            &format!(
                "Loading weights took {:.2} seconds",
                weight_time.as_secs_f64()
            ),
        );
        log.core(
            "INFO",
            "gpu_model_runner.py:2653",
            &format!(
                "Model loading took {weights_gib:.4} GiB and {:.6} seconds",
                weight_time.as_secs_f64()
            ),
        );
    } else {
        scheduler(
            log,
            &format!(
                "Load weight end. type={arch}, dtype=torch.bfloat16, avail mem={:.2} GB, mem usage={weights_gib:.2} GB.",
                total_gib - weights_gib
            ),
        );
    }

    // KV cache.
    if hang_at(cfg, LoadPhase::KvCache) {
        hang_forever().await;
    }
    tokio::time::sleep(share(cfg, 0.15)).await;
    let kv_gib = budget_gib - weights_gib - OVERHEAD_GIB;
    if crash_at(cfg, LoadCrash::KvCache) || kv_gib <= 0.0 {
        return Err(Failure::NoKvCache);
    }
    let per_token = spec.kv_bytes_per_token_per_gpu(cfg.tp, cfg.pp).max(1);
    let kv_tokens = (kv_gib * GIB / per_token as f64) as u64;
    if kv_tokens < max_model_len {
        if vllm {
            return Err(Failure::KvTooSmall {
                max_len: max_model_len,
                need_gib: max_model_len as f64 * per_token as f64 / GIB,
                avail_gib: kv_gib,
                est_len: kv_tokens,
            });
        }
        return Err(Failure::NoKvCache);
    }
    if vllm {
        log.core(
            "INFO",
            "gpu_worker.py:298",
            &format!("Available KV cache memory: {kv_gib:.2} GiB"),
        );
        log.core(
            "INFO",
            "kv_cache_utils.py:1087",
            &format!("GPU KV cache size: {} tokens", thousands(kv_tokens)),
        );
        log.core(
            "INFO",
            "kv_cache_utils.py:1091",
            &format!(
                "Maximum concurrency for {} tokens per request: {:.2}x",
                thousands(max_model_len),
                kv_tokens as f64 / max_model_len as f64
            ),
        );
    } else {
        let half = kv_gib / 2.0;
        scheduler(
            log,
            &format!(
                "KV Cache is allocated. #tokens: {kv_tokens}, K size: {half:.2} GB, V size: {half:.2} GB"
            ),
        );
        scheduler(
            log,
            &format!(
                "Memory pool end. avail mem={:.2} GB",
                total_gib - budget_gib + OVERHEAD_GIB
            ),
        );
        scheduler(
            log,
            &format!(
                "Capture cuda graph begin. This can take up to several minutes. avail mem={:.2} GB",
                total_gib - budget_gib + OVERHEAD_GIB
            ),
        );
    }

    // CUDA graphs.
    let graph_time = share(cfg, 0.2);
    tokio::time::sleep(graph_time).await;
    if vllm {
        log.core(
            "INFO",
            "gpu_model_runner.py:3480",
            &format!(
                "Graph capturing finished in {} secs, took 0.50 GiB",
                graph_time.as_secs().max(1)
            ),
        );
    } else {
        scheduler(
            log,
            &format!(
                "Capture cuda graph end. Time elapsed: {:.2} s. mem usage=0.50 GB. avail mem={:.2} GB.",
                graph_time.as_secs_f64(),
                total_gib - budget_gib + 1.0
            ),
        );
        scheduler(
            log,
            &format!(
                "max_total_num_tokens={kv_tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests={}, context_len={max_model_len}, available_gpu_mem={:.2} GB",
                cfg.max_num_seqs,
                total_gib - budget_gib + 1.0
            ),
        );
    }
    tokio::time::sleep(share(cfg, 0.05)).await;
    Ok(Loaded {
        kv_tokens,
        workers,
        membership,
    })
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// SIGTERM and SIGINT streams, installed once serving starts.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install() -> Self {
        Self {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }

    async fn recv(&mut self) {
        let term = async {
            match &mut self.term {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        let int = async {
            match &mut self.int {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = term => {}
            _ = int => {}
        }
    }
}

/// Serves until SIGTERM, a lost peer, or a dead worker. Ranks without the
/// API (`serving_api` false) just exit on SIGTERM.
async fn wait_for_end(
    state: &Arc<EngineState>,
    stop: &watch::Sender<bool>,
    membership: Option<&mut Membership>,
    workers: &mut Workers,
    mut signals: Signals,
    serving_api: bool,
) -> Ending {
    let lost = async {
        match membership {
            Some(m) => m.lost_peer().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = signals.recv() => {
                if !serving_api {
                    let _ = stop.send(true);
                    return Ending::Exit(0);
                }
                let ending = crate::lifecycle::shutdown(state, stop).await;
                return ending;
            }
            peer = &mut lost => {
                crate::lifecycle::engine_died(state, crate::lifecycle::Death::PeerLost(peer));
                hang_forever().await;
            }
            _ = tick.tick() => {
                if !workers.all_alive() {
                    // A GPU worker vanished (killed by hand or by the OOM
                    // killer): the engine cannot go on.
                    crate::lifecycle::engine_died(state, crate::lifecycle::Death::PeerLost("local worker".into()));
                    hang_forever().await;
                }
            }
        }
    }
}
