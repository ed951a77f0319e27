//! The process setup every llmgw binary shares: tracing output and the
//! tokio runtime. Each binary passes its own default filter; `RUST_LOG`
//! overrides it, so operators steer every binary the same way.

use std::io::IsTerminal;

pub mod log_events;

use tracing_subscriber::EnvFilter;

/// Sends tracing output to stderr, filtered by `RUST_LOG` or, when that is
/// unset or unreadable, by `default_filter` (e.g. `"info,openraft=warn"`).
/// Colours only on a terminal, so log files stay plain text. A second call
/// in the same process keeps the first setup.
pub fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// A multi-thread runtime with I/O and timers, one worker per core.
pub fn multi_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// A multi-thread runtime with I/O, timers and exactly `workers` worker
/// threads, for benchmarks that must leave cores to the processes they
/// measure.
pub fn multi_thread_runtime_with_workers(
    workers: usize,
) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
}
