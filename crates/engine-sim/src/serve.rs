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
use crate::knobs::LoadCrash;
use crate::load::{crash_at, hang_forever, load, share};
use crate::logs::Logger;
use crate::models::{self, ModelSpec};
use crate::persona::Engine;
use crate::rendezvous::Membership;
use crate::routes::{DummyHealthApp, EngineApp};
use crate::state::{EngineState, Phase, ServingFacts};
use crate::workers::Workers;
use llmgw_tokenizer::ModelTokenizer;

/// Runs the engine; returns how the process must end.
pub async fn run(cfg: ServeConfig, mut log: Logger) -> Ending {
    match run_inner(cfg, &mut log).await {
        Ok(ending) => ending,
        Err(failure) => failures::report(&log, &failure),
    }
}

async fn run_inner(cfg: ServeConfig, log: &mut Logger) -> Result<Ending, Failure> {
    let started = Instant::now();
    let ignore_term = cfg
        .knobs
        .faults
        .contains(&crate::knobs::Fault::IgnoreSigterm);
    if ignore_term {
        // Before any worker starts: an ignored signal stays ignored across
        // exec, so the whole process group shrugs SIGTERM off.
        crate::sys::ignore_sigterm();
    }
    let vllm = cfg.persona.engine == Engine::Vllm;
    log_arguments(&cfg, log);
    tokio::time::sleep(share(&cfg, 0.05)).await;

    let model = check_model(&cfg, log)?;
    let tokenizer = load_tokenizer(&cfg)?;
    check_topology(&cfg)?;
    let use_ray = uses_ray(&cfg)?;
    // vLLM binds its port before the engine starts so no one can take it
    // during the load, but listens only when ready: connections are refused.
    let early_socket = if vllm && !cfg.headless {
        Some(bind(&cfg)?)
    } else {
        None
    };

    let mut loaded = load(
        &cfg,
        log,
        &model.spec,
        &model.arch,
        model.max_model_len,
        use_ray,
    )
    .await?;
    let facts = ServingFacts {
        kv_capacity: loaded.kv_tokens,
        max_model_len: model.max_model_len,
        eos_token_id: model.spec.eos_token_id,
        embedding_dim: model.spec.is_embedding().then_some(model.spec.hidden_size),
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
    let ranks = crate::kv_events::dp_ranks(&cfg, loaded.kv_tokens).await?;
    let state = EngineState::new(cfg.clone(), *log, facts, ranks, tokenizer);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut membership = loaded.membership.take();

    // Ranks that serve no API: vLLM headless and SGLang's non-zero ranks.
    if (vllm && cfg.headless) || (!vllm && cfg.node_rank > 0) {
        if !vllm {
            serve_health_only(&state, stop_rx)?;
        }
        return Ok(wait_for_end(
            &state,
            &stop_tx,
            membership.as_mut(),
            &mut loaded.workers,
            Signals::install(ignore_term),
            false,
        )
        .await);
    }

    let socket = match early_socket {
        Some(s) => s,
        None => bind(&cfg)?,
    };
    if vllm {
        log_vllm_routes(&cfg, log, model.spec.is_embedding());
    }
    let listener = listen(socket)?;
    // Python's default SIGTERM action applies until the server runs; only
    // now do the engines install their handlers.
    let signals = Signals::install(ignore_term);
    serve_api(&state, listener, stop_rx);
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

/// The arguments as each engine echoes them at start, with the warnings
/// its release's parser gave.
fn log_arguments(cfg: &ServeConfig, log: &Logger) {
    if cfg.persona.engine == Engine::Vllm {
        log.api(
            "INFO",
            "api_server.py:1839",
            &format!("vLLM API server version {}", cfg.persona.version_string()),
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
        // What the release's parser warned about (deprecated options, a
        // `--model` option), as vLLM's logger prints it.
        for warning in &cfg.parse_warnings {
            log.api("WARNING", "argparse_utils.py:206", warning);
        }
        return;
    }
    // SGLang warns through logging before any handler exists: Python's
    // last-resort handler prints the bare message.
    for warning in &cfg.parse_warnings {
        log.raw_err(&format!("{warning}\n"));
    }
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

/// The model as the engine resolved it.
struct ResolvedModel {
    spec: ModelSpec,
    /// The architecture the config names (a fault can rename it).
    arch: String,
    max_model_len: u64,
}

/// The model checks an engine makes before loading: known, of a supported
/// architecture, its heads divisible by the tensor-parallel size.
fn check_model(cfg: &ServeConfig, log: &Logger) -> Result<ResolvedModel, Failure> {
    let vllm = cfg.persona.engine == Engine::Vllm;
    let spec = models::find(&cfg.model).ok_or_else(|| Failure::ModelNotFound(cfg.model.clone()))?;
    let arch = if crash_at(cfg, LoadCrash::Arch) {
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
    Ok(ResolvedModel {
        spec,
        arch,
        max_model_len,
    })
}

/// The model's own tokenizer from a local `--tokenizer` directory; the
/// engines fail to start when it cannot be read.
fn load_tokenizer(cfg: &ServeConfig) -> Result<Option<Arc<ModelTokenizer>>, Failure> {
    let Some(dir) = &cfg.tokenizer_dir else {
        return Ok(None);
    };
    ModelTokenizer::load(dir)
        .map(|tokenizer| Some(Arc::new(tokenizer)))
        .map_err(|err| Failure::Tokenizer {
            dir: dir.display().to_string(),
            reason: err.to_string(),
        })
}

/// A multi-node replica's rank and node count fit its world.
fn check_topology(cfg: &ServeConfig) -> Result<(), Failure> {
    if cfg.nnodes <= 1 {
        return Ok(());
    }
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
    Ok(())
}

/// Whether vLLM runs its workers on Ray: asked for, or (in releases that
/// allow it) a one-node world larger than the GPUs this node sees.
fn uses_ray(cfg: &ServeConfig) -> Result<bool, Failure> {
    if cfg.persona.engine != Engine::Vllm {
        return Ok(false);
    }
    let oversized = cfg.nnodes == 1 && cfg.local_gpus_needed() > cfg.visible_gpus;
    let use_ray =
        cfg.backend == Some(Backend::Ray) || (oversized && !cfg.persona.refuses_oversized_world());
    if !use_ray && oversized && cfg.visible_gpus > 0 {
        return Err(Failure::WorldTooLarge {
            world: cfg.local_gpus_needed(),
            gpus: cfg.visible_gpus,
        });
    }
    Ok(use_ray)
}

/// SGLang's non-zero ranks answer `/health` and nothing else.
fn serve_health_only(state: &Arc<EngineState>, stop: watch::Receiver<bool>) -> Result<(), Failure> {
    let cfg = &state.cfg;
    let listener = listen(bind(cfg)?)?;
    state.log.uvicorn(&format!(
        "Uvicorn running on http://{}:{} (Press CTRL+C to quit)",
        cfg.shown_host, cfg.port
    ));
    state.set_phase(Phase::Serving);
    tokio::spawn(crate::http::serve(
        listener,
        Arc::new(DummyHealthApp {
            state: state.clone(),
        }),
        stop,
    ));
    Ok(())
}

/// vLLM's lines between the load and the listening socket: the tasks, the
/// server's address and every route.
fn log_vllm_routes(cfg: &ServeConfig, log: &Logger, embedding: bool) {
    let tasks = if embedding {
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
        ("/tokenize", "POST"),
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

/// Starts the API server: vLLM serves at once, SGLang after its warm-up.
fn serve_api(
    state: &Arc<EngineState>,
    listener: tokio::net::TcpListener,
    stop: watch::Receiver<bool>,
) {
    let cfg = &state.cfg;
    let log = state.log;
    log.uvicorn(&format!("Started server process [{}]", std::process::id()));
    log.uvicorn("Waiting for application startup.");
    log.uvicorn("Application startup complete.");
    let app = Arc::new(EngineApp {
        state: state.clone(),
    });
    tokio::spawn(crate::http::serve(listener, app, stop));
    if cfg.log_stats {
        tokio::spawn(crate::stats_log::run(state.clone()));
    }
    if cfg.persona.engine == Engine::Vllm {
        state.set_phase(Phase::Serving);
    } else {
        log.uvicorn(&format!(
            "Uvicorn running on http://{}:{} (Press CTRL+C to quit)",
            cfg.shown_host, cfg.port
        ));
        let warm = state.clone();
        tokio::spawn(async move { sglang_warmup(&warm).await });
    }
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
        // A host name binds to what it resolves to, as the engines' servers do.
        h => match h.parse() {
            Ok(ip) => ip,
            Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(h, cfg.port))
                .ok()
                .and_then(|mut addrs| addrs.next())
                .map(|addr| addr.ip())
                .ok_or_else(in_use)?,
        },
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

/// SIGTERM and SIGINT streams, installed once serving starts.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install(ignore_term: bool) -> Self {
        Self {
            term: if ignore_term {
                None
            } else {
                signal(SignalKind::terminate()).ok()
            },
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
