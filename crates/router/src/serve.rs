//! Running the router: the accept loop and its background tasks (engine
//! metrics, health probes, forgetting endpoints that left the table).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::endpoints::Registry;
use crate::engine_load::scrape_loop;
use crate::error::RouterError;
use crate::front::serve_connection;
use crate::kv::{KvState, follow_loop};
use crate::metrics::Metrics;
use crate::probes::probe_loop;
use crate::resume::ResumeMemory;
use crate::service::Shared;
use crate::settings::Settings;
use crate::table::{EndpointSource, RoutingTable};
use crate::upstream::{IDLE_LIMIT, Upstream, drive_own_reactor};
use llmgw_config::BalancePolicy;

/// A router not yet listening.
pub struct Router {
    shared: Arc<Shared>,
}

/// A listening router; dropping it stops the accept loop and the background
/// tasks. Connections already accepted finish on their own when the router
/// serves on the caller's runtime, and are closed with their threads when
/// it has threads of its own ([`Router::bind_threads`]).
pub struct RunningRouter {
    local_addr: SocketAddr,
    tasks: JoinSet<()>,
    kv: Arc<KvState>,
    /// Dropped to stop the router's own threads.
    _stop_threads: Option<watch::Sender<()>>,
}

impl Router {
    pub fn new(settings: Settings, source: &dyn EndpointSource) -> Self {
        let upstream = Upstream::new(settings.connect_timeout);
        let resume_memory = Arc::new(ResumeMemory::new(settings.resume.memory_cap_bytes));
        let kv = Arc::new(KvState::new(settings.kv_index_max_entries));
        Router {
            shared: Arc::new(Shared {
                kv,
                settings,
                resume_memory,
                upstream,
                registry: Arc::new(Registry::default()),
                metrics: Arc::new(Metrics::default()),
                table: source.subscribe(),
                waker: None,
                held_requests: std::sync::atomic::AtomicUsize::new(0),
                queues: crate::queue::Queues::default(),
                limiter: Arc::default(),
                usage: Default::default(),
            }),
        }
    }

    /// Lets the router ask for a replica of a model scaled to zero when a
    /// request for it arrives (without one it holds the request all the
    /// same, for a replica another router asked for).
    pub fn with_waker(mut self, waker: Arc<dyn crate::wake::ModelWaker>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.waker = Some(waker);
        }
        self
    }

    /// Reports what keyed requests used to the control plane through
    /// `sink`, every `every`, as `reporter` (a name unique to this router
    /// process). Spawns the reporting task on the current runtime.
    pub fn with_usage_sink(
        self,
        sink: Arc<dyn crate::usage::UsageSink>,
        reporter: String,
        every: std::time::Duration,
    ) -> Self {
        self.shared.limiter.set_reporter(&reporter);
        tokio::spawn(crate::usage::report_loop(
            Arc::downgrade(&self.shared),
            sink,
            reporter,
            every,
        ));
        self
    }

    pub async fn bind(self, addr: SocketAddr) -> Result<RunningRouter, RouterError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| RouterError::Bind { addr, source })?;
        self.serve(listener)
    }

    /// Serves on a listener the caller opened (e.g. `llmgw server`, or a
    /// test that picked a free port).
    pub fn serve(self, listener: TcpListener) -> Result<RunningRouter, RouterError> {
        let local_addr = listener.local_addr().map_err(|source| RouterError::Bind {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        let mut tasks = self.background_tasks();
        let kv = Arc::clone(&self.shared.kv);
        tasks.spawn(accept_loop(listener, self.shared));
        Ok(RunningRouter {
            local_addr,
            tasks,
            kv,
            _stop_threads: None,
        })
    }

    /// Serves client traffic on `threads` threads of its own, each running
    /// a single-threaded runtime with its own listening socket on `addr`
    /// (`SO_REUSEPORT`: the kernel spreads connections over them). A
    /// request and its engine connection stay on the thread that accepted
    /// it, so relaying never wakes a second thread: on a multi-threaded
    /// runtime, handing work between workers cost a `futex` call for most
    /// requests. Engine metrics and probes run on the caller's runtime.
    pub fn bind_threads(
        self,
        addr: SocketAddr,
        threads: NonZeroUsize,
    ) -> Result<RunningRouter, RouterError> {
        let (stop, stopped) = watch::channel(());
        let mut local_addr = addr;
        for reactor in 1..=threads.get() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(RouterError::Runtime)?;
            // The first socket picks the port when `addr` asks for any;
            // the others join it.
            let listener = {
                let _inside = runtime.enter();
                reuse_port_listener(local_addr)
                    .map_err(|source| RouterError::Bind { addr, source })?
            };
            local_addr = listener
                .local_addr()
                .map_err(|source| RouterError::Bind { addr, source })?;
            let shared = Arc::clone(&self.shared);
            let mut stopped = stopped.clone();
            std::thread::Builder::new()
                .name(format!("llmgw-router-{reactor}"))
                .spawn(move || {
                    drive_own_reactor(reactor);
                    runtime.block_on(async move {
                        tokio::select! {
                            () = accept_loop(listener, shared) => {}
                            _ = stopped.changed() => {}
                        }
                    });
                })
                .map_err(RouterError::Runtime)?;
        }
        Ok(RunningRouter {
            local_addr,
            tasks: self.background_tasks(),
            kv: Arc::clone(&self.shared.kv),
            _stop_threads: Some(stop),
        })
    }

    fn background_tasks(&self) -> JoinSet<()> {
        let shared = &self.shared;
        let mut tasks = JoinSet::new();
        if !shared.settings.metrics_interval.is_zero() {
            tasks.spawn(scrape_loop(
                shared.upstream.clone(),
                Arc::clone(&shared.registry),
                shared.table.clone(),
                shared.settings.metrics_interval,
            ));
        }
        tasks.spawn(probe_loop(
            shared.upstream.clone(),
            Arc::clone(&shared.registry),
            shared.settings.probe_interval,
        ));
        tasks.spawn(forget_departed(
            Arc::clone(&shared.registry),
            shared.table.clone(),
        ));
        tasks.spawn(close_idle_connections(shared.upstream.clone()));
        if shared.settings.policy == BalancePolicy::CacheAware {
            tasks.spawn(follow_loop(Arc::clone(&shared.kv), shared.table.clone()));
        }
        tasks
    }
}

fn reuse_port_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl RunningRouter {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// For each engine of `urls`, how many of `tokens` its KV cache holds
    /// as a prefix, by this router's index: what kv-bench compares between
    /// routers to measure how far their indexes agree.
    #[doc(hidden)]
    pub fn cached_prefix_tokens(&self, urls: &[&str], tokens: &[u32]) -> Vec<u64> {
        self.kv.cached_tokens(urls, tokens)
    }

    /// Runs until a background task ends, which happens only on a panic.
    pub async fn wait(mut self) {
        let _ = self.tasks.join_next().await;
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let (stream, _peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off briefly
                // rather than spin, and keep serving.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(stream, Arc::clone(&shared)));
    }
}

async fn close_idle_connections(upstream: Upstream) {
    let mut every = tokio::time::interval(IDLE_LIMIT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        upstream.close_idle(IDLE_LIMIT);
    }
}

async fn forget_departed(registry: Arc<Registry>, mut table: watch::Receiver<Arc<RoutingTable>>) {
    while table.changed().await.is_ok() {
        let current = Arc::clone(&table.borrow_and_update());
        let live: HashSet<&str> = current
            .models
            .iter()
            .flat_map(|m| m.endpoints.iter().map(|e| e.url.as_str()))
            .collect();
        registry.retain(&live);
    }
    // A source that stopped publishing (a static table) keeps its last
    // table; this task simply has nothing more to do.
    std::future::pending::<()>().await;
}
