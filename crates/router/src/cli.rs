//! `llmgw router --config router.yaml`.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use llmgw_catalog::Catalog;
use llmgw_config::RouterConfig;
use tokio::sync::watch;

use crate::control_plane::{ControlPlaneAccess, ControlPlaneWatcher, POLL_INTERVAL};
use crate::error::RouterError;
use crate::serve::Router;
use crate::settings::Settings;
use crate::table::{EndpointSource, RoutingTable, static_table};

#[derive(Debug, Args)]
pub struct RouterArgs {
    /// router.yaml: listen address, endpoints or control-plane peers,
    /// balancing, timeouts, keys.
    #[arg(long, short, default_value = "router.yaml")]
    pub config: PathBuf,
}

/// Loads the config and serves until SIGINT or SIGTERM.
pub fn run_cli(args: &RouterArgs) -> Result<(), RouterError> {
    llmgw_runtime::init_logging("info");
    let config = RouterConfig::load(&args.config)?;
    let settings = Settings::from_config(&config)?;
    let mut catalog = config.models.clone();
    if let Some(file) = &config.catalog {
        catalog.models.extend(read_catalog(file)?.models);
    }
    let runtime = llmgw_runtime::multi_thread_runtime().map_err(RouterError::Runtime)?;
    runtime.block_on(async move {
        let table = static_table(&catalog);
        // The source must outlive the router: it owns the table's sender.
        let source = if config.control_plane.is_empty() {
            Source::Static(watch::channel(Arc::new(table)).0)
        } else {
            // Managed models come from the control plane; only router-only
            // models (with endpoints) are static.
            let static_only = RoutingTable {
                keys: Default::default(),
                models: table
                    .models
                    .into_iter()
                    .filter(|m| !m.endpoints.is_empty())
                    .collect(),
            };
            Source::ControlPlane(ControlPlaneWatcher::spawn(
                config.control_plane.clone(),
                ControlPlaneAccess::from_config(&config)?,
                static_only,
                POLL_INTERVAL,
                settings.connect_timeout,
            )?)
        };
        let (source, waker, usage_sink): (&dyn EndpointSource, _, _) = match &source {
            Source::Static(sender) => (sender as &dyn EndpointSource, None, None),
            Source::ControlPlane(watcher) => (
                watcher as &dyn EndpointSource,
                Some(watcher.waker()),
                Some(watcher.usage_sink()),
            ),
        };
        let threads = config
            .threads
            .and_then(NonZeroUsize::new)
            .or_else(|| std::thread::available_parallelism().ok())
            .unwrap_or(NonZeroUsize::MIN);
        let mut router = Router::new(settings, source);
        if let Some(waker) = waker {
            router = router.with_waker(waker);
        }
        if let Some(sink) = usage_sink {
            router = router.with_usage_sink(
                sink,
                crate::usage::reporter_name("router"),
                config.usage_report_interval,
            );
        }
        let router = router.bind_threads(config.listen, threads)?;
        tracing::info!(listen = %router.local_addr(), threads, "llmgw router serving");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(RouterError::Runtime)?;
        tokio::select! {
            _ = router.wait() => {}
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
            _ = term.recv() => tracing::info!("SIGTERM; stopping"),
        }
        Ok(())
    })
}

enum Source {
    Static(watch::Sender<Arc<RoutingTable>>),
    ControlPlane(ControlPlaneWatcher),
}

fn read_catalog(file: &PathBuf) -> Result<Catalog, RouterError> {
    let text = std::fs::read_to_string(file).map_err(|source| RouterError::CatalogRead {
        file: file.clone(),
        source,
    })?;
    llmgw_catalog::parse_catalog(&file.display().to_string(), &text).map_err(|problems| {
        RouterError::CatalogInvalid {
            file: file.clone(),
            message: problems.to_string(),
        }
    })
}
