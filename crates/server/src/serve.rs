//! Running one control-plane peer: Raft, its gRPC listener, the admin API.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use llmgw_raft::{ControlPlane, PeerSpec, RaftSettings, StartError};
use llmgw_tls::Tls;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};

use llmgw_catalog::Catalog;

use crate::admin_listener::{AdminListener, Caller};
use crate::agents::{AgentStreams, Hub, LivenessSettings, run_liveness, write_reports};
use crate::api::{self, ApiState};
use crate::load_history::LoadHistory;
use crate::reconcile::{PlanSettings, run_reconciler};
use crate::security::Security;

/// Everything a peer needs to run, resolved from server.yaml.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub id: u64,
    pub data_dir: PathBuf,
    pub grpc_listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub peers: Vec<PeerSpec>,
    pub raft: RaftSettings,
    pub security: Security,
    pub liveness: LivenessSettings,
    pub placement: PlanSettings,
    /// The OpenAI router inside this peer; `None` runs none.
    pub router_listen: Option<SocketAddr>,
    /// How long API keys' per-minute usage is kept.
    pub usage_retention: std::time::Duration,
    /// server.yaml `cluster_id`: the id a cluster formed by these peers
    /// takes.
    pub cluster_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} server failed: {message}")]
    Serve { what: &'static str, message: String },
    #[error(
        "the Raft core stopped ({0}); this peer exited rather than serve frozen state, \
         and its supervisor may start it again"
    )]
    RaftStopped(String),
}

/// Runs the peer until `shutdown` resolves.
pub async fn serve(
    options: ServerOptions,
    seed_catalog: Option<Catalog>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let data_dir = create_raft_dir(&options)?;
    let tls = options
        .security
        .start(options.id, options.grpc_listen, options.admin_listen)?;
    let control = ControlPlane::start(
        options.id,
        &data_dir,
        options.raft.clone(),
        options.peers.clone(),
        tls.clone(),
    )
    .await?;
    let (grpc_listener, admin_listener) = bind_listeners(&options).await?;
    tracing::info!(
        id = options.id,
        grpc = %options.grpc_listen,
        admin = %options.admin_listen,
        admin_scheme = if tls.is_some() { "https" } else { "http" },
        "llmgw server peer started"
    );

    let hub = Arc::new(Hub::for_peer(options.id));
    let core_stopped = Arc::new(std::sync::OnceLock::new());
    let shutdown = shutdown_or_core_stopped(control.clone(), shutdown, core_stopped.clone());
    let stop_rx = spawn_shutdown_watch(hub.clone(), shutdown);
    let agents = spawn_agent_loops(&control, &hub, &options, &stop_rx);
    let load_history = LoadHistory::default();
    tokio::spawn(crate::autoscale::run_autoscaler(
        control.clone(),
        load_history.clone(),
        stop_rx.clone(),
    ));
    let router = start_router(
        &control,
        options.router_listen,
        options.id,
        options.usage_retention,
    )?;
    let grpc = spawn_grpc(
        &control,
        agents,
        grpc_listener,
        tls.clone(),
        stop_rx.clone(),
    );
    spawn_bootstrap(control.clone(), seed_catalog);

    let app = admin_app(&options, &control, hub, load_history, stop_rx.clone());
    let admin_listener =
        AdminListener::new(admin_listener, tls.clone()).map_err(|source| ServerError::Listen {
            what: "admin API",
            addr: options.admin_listen,
            source,
        })?;
    let admin_result = serve_admin(admin_listener, app, stop_rx).await;
    drop(router);
    control.shutdown().await;
    let grpc_result = grpc.await;
    if let Some(why) = core_stopped.get() {
        return Err(ServerError::RaftStopped(why.clone()));
    }
    served(admin_result, grpc_result)
}

/// `shutdown`, or the Raft core stopping on its own (a storage error such
/// as EIO, or ENOSPC past the reserve), whichever comes first; the latter
/// noted in `core_stopped`. A peer whose core stopped would go on serving
/// reads and routes from a state frozen in time while looking healthy; it
/// stops instead, so its supervisor restarts it from its disk.
async fn shutdown_or_core_stopped(
    control: ControlPlane,
    shutdown: impl Future<Output = ()> + Send + 'static,
    core_stopped: Arc<std::sync::OnceLock<String>>,
) {
    tokio::select! {
        () = shutdown => {}
        why = control.core_stopped() => {
            tracing::error!(
                reason = %why,
                "the Raft core stopped: this peer stops serving and exits non-zero"
            );
            let _ = core_stopped.set(why);
        }
    }
}

/// The directory Raft keeps its log and snapshots in, created if missing.
fn create_raft_dir(options: &ServerOptions) -> Result<PathBuf, ServerError> {
    let data_dir = options.data_dir.join("raft");
    std::fs::create_dir_all(&data_dir).map_err(|e| {
        ServerError::Config(format!(
            "cannot create data directory {}: {e}",
            data_dir.display()
        ))
    })?;
    Ok(data_dir)
}

/// The peer gRPC and admin API sockets, bound before anything serves so a
/// taken port fails the start.
async fn bind_listeners(
    options: &ServerOptions,
) -> Result<(TcpListener, TcpListener), ServerError> {
    let grpc_listener =
        listen(options.grpc_listen, AGENT_BACKLOG).map_err(|source| ServerError::Listen {
            what: "peer gRPC",
            addr: options.grpc_listen,
            source,
        })?;
    let admin_listener = TcpListener::bind(options.admin_listen)
        .await
        .map_err(|source| ServerError::Listen {
            what: "admin API",
            addr: options.admin_listen,
            source,
        })?;
    Ok((grpc_listener, admin_listener))
}

/// Waits for `shutdown`, closes the agent streams, then tells every server
/// and loop of the peer to stop through the returned receiver.
fn spawn_shutdown_watch(
    hub: Arc<Hub>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> watch::Receiver<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        // Agents re-home now rather than after their leader_timeout,
        // and the gRPC server has no open stream to wait for.
        let closed = hub.close_all();
        if closed > 0 {
            tracing::info!(
                closed,
                "closed the agent streams; agents find the next leader"
            );
        }
        let _ = stop_tx.send(true);
    });
    stop_rx
}

async fn stopped(mut stop_rx: watch::Receiver<bool>) {
    let _ = stop_rx.wait_for(|stop| *stop).await;
}

/// Starts the loops that act on what agents report (report writing,
/// liveness, reconciling) and returns the gRPC service agents stream to.
fn spawn_agent_loops(
    control: &ControlPlane,
    hub: &Arc<Hub>,
    options: &ServerOptions,
    stop_rx: &watch::Receiver<bool>,
) -> AgentStreams {
    let (reports, report_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(write_reports(control.clone(), report_rx));
    tokio::spawn(run_liveness(
        control.clone(),
        hub.clone(),
        options.liveness,
        stop_rx.clone(),
    ));
    tokio::spawn(run_reconciler(
        control.clone(),
        hub.clone(),
        options.placement.clone(),
        stop_rx.clone(),
    ));
    tokio::spawn(crate::epoch::run_epoch_keeper(
        control.clone(),
        hub.clone(),
        options.cluster_id.clone(),
        stop_rx.clone(),
    ));
    AgentStreams {
        control: control.clone(),
        hub: hub.clone(),
        reports,
        heartbeat_interval: options.liveness.agent_heartbeat,
        registrar: crate::agents::Registrar::spawn(control.clone()),
        claim_window: options.liveness.ttl,
    }
}

/// The OpenAI router inside this peer, when server.yaml asks for one.
fn start_router(
    control: &ControlPlane,
    listen: Option<SocketAddr>,
    peer_id: u64,
    usage_retention: std::time::Duration,
) -> Result<Option<llmgw_router::RunningRouter>, ServerError> {
    let Some(addr) = listen else {
        return Ok(None);
    };
    let table = crate::routes::publish(control.clone());
    // Client traffic gets threads of its own, one per CPU: relaying never
    // queues behind this peer's Raft and agent-stream tasks, nor they
    // behind it.
    let threads = std::thread::available_parallelism().unwrap_or(std::num::NonZeroUsize::MIN);
    // Every engine the leader places publishes its KV events: route by them.
    let settings = llmgw_router::Settings {
        policy: llmgw_config::BalancePolicy::CacheAware,
        ..llmgw_router::Settings::default()
    };
    let waker = std::sync::Arc::new(crate::wake::PeerWaker::new(control.clone()));
    let router = llmgw_router::Router::new(settings, &table)
        .with_waker(waker)
        .with_usage_sink(
            std::sync::Arc::new(crate::usage::PeerUsageSink::new(
                control.clone(),
                usage_retention,
            )),
            llmgw_router::reporter_name(&format!("peer-{peer_id}")),
            llmgw_router::USAGE_REPORT_EVERY,
        )
        .bind_threads(addr, threads)
        .map_err(|e| ServerError::Serve {
            what: "router",
            message: e.to_string(),
        })?;
    tracing::info!(addr = %router.local_addr(), "OpenAI router serving from this peer's applied state");
    Ok(Some(router))
}

/// Serves Raft and the agent streams on the peer gRPC port until stopped.
fn spawn_grpc(
    control: &ControlPlane,
    agents: AgentStreams,
    listener: TcpListener,
    tls: Option<Tls>,
    stop_rx: watch::Receiver<bool>,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    let grpc = tonic::transport::Server::builder()
        .add_service(llmgw_raft::raft_grpc_service(control.clone()))
        .add_service(agents.into_service())
        .serve_with_incoming_shutdown(
            // mTLS handshakes here; handlers see the caller's identity.
            llmgw_tls::incoming(listener, tls),
            stopped(stop_rx),
        );
    tokio::spawn(grpc)
}

/// Forms the cluster when this peer is the one to; then, on a peer of a
/// cluster formed as new, makes sure the configured catalog is seeded.
fn spawn_bootstrap(control: ControlPlane, seed_catalog: Option<Catalog>) {
    tokio::spawn(async move {
        control.bootstrap().await;
        if let Some(catalog) = seed_catalog {
            if control.settings().form_new_cluster {
                crate::seed::seed_catalog(&control, catalog).await;
            } else {
                tracing::info!(
                    "initial_cluster_state is `existing`: the configured catalog seeds only a \
                     cluster formed as `new`, and is not written"
                );
            }
        }
    });
}

fn admin_app(
    options: &ServerOptions,
    control: &ControlPlane,
    hub: Arc<Hub>,
    load_history: LoadHistory,
    stop_rx: watch::Receiver<bool>,
) -> axum::Router {
    let app = api::router(ApiState {
        control: control.clone(),
        insecure: options.security.insecure(),
        hub,
        load_history,
        placement: options.placement.clone(),
        stopping: stop_rx,
        usage_retention: options.usage_retention,
    });
    options.security.admin.protect(app)
}

async fn serve_admin(
    listener: AdminListener,
    app: axum::Router,
    stop_rx: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<Caller>(),
    )
    .with_graceful_shutdown(stopped(stop_rx))
    .await
}

/// The peer's outcome once both servers have stopped: the admin API's
/// failure first, then the gRPC server's.
fn served(
    admin: std::io::Result<()>,
    grpc: Result<Result<(), tonic::transport::Error>, JoinError>,
) -> Result<(), ServerError> {
    admin.map_err(|e| ServerError::Serve {
        what: "admin API",
        message: e.to_string(),
    })?;
    match grpc {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ServerError::Serve {
            what: "peer gRPC",
            message: e.to_string(),
        }),
        Err(e) => Err(ServerError::Serve {
            what: "peer gRPC",
            message: e.to_string(),
        }),
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

/// Connections waiting to be accepted on the gRPC port. A fleet of
/// thousands dials a new leader at once; the usual 1,024 overflows and
/// costs the rest a SYN retry (a second or more). The kernel caps it at
/// `net.core.somaxconn`.
const AGENT_BACKLOG: u32 = 8192;

fn listen(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}
