//! A stand-in for the `ray` CLI as vLLM's multi-node recipe uses it:
//! `ray start --head`, `ray start --address`, `ray status`, `ray stop`, and
//! the placement a `--distributed-executor-backend ray` head waits for.
//!
//! The head daemon listens on the GCS port. Worker daemons register their
//! GPUs over a connection they keep open, so a node that dies leaves the
//! cluster at once. The CLI parses like Ray's (click): unknown options are
//! `Error: No such option: --x`, exit code 2.

mod cli;
mod daemon;
mod placement;

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub use cli::cli;
pub use daemon::daemon_main;
pub use placement::{wait_for_placement, watch_cluster};

/// The hidden argv[1] that runs a Ray node daemon.
pub const DAEMON_MODE: &str = "__llmgw_sim_ray_daemon";

const DEFAULT_PORT: u16 = 6379;

pub(super) fn temp_dir(explicit: Option<&str>) -> PathBuf {
    explicit
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var("RAY_TMPDIR")
                .ok()
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/tmp/ray"))
}

pub(super) fn local_gpus() -> u64 {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => v.split(',').filter(|s| !s.trim().is_empty()).count() as u64,
        Err(_) => std::env::var("LLMGW_SIM_GPUS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(crate::knobs::DEFAULT_NODE_GPUS),
    }
}

pub(super) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Nodes of the cluster at `addr`: (node id, ip, gpus).
pub(super) async fn query(addr: &str) -> Option<Vec<(u64, String, u64)>> {
    let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let mut reader = BufReader::new(stream);
    reader.get_mut().write_all(b"STATUS\n").await.ok()?;
    let mut nodes = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim();
        if line == "END" {
            return Some(nodes);
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if let [id, ip, gpus] = parts.as_slice() {
            nodes.push((id.parse().ok()?, ip.to_string(), gpus.parse().ok()?));
        }
    }
}

pub(super) fn cluster_address(explicit: Option<&str>, dir: Option<&str>) -> Option<String> {
    explicit
        .map(str::to_string)
        .or_else(|| {
            std::env::var("RAY_ADDRESS")
                .ok()
                .filter(|s| !s.is_empty() && s != "auto")
        })
        .map(|a| a.trim_start_matches("ray://").to_string())
        .or_else(|| {
            std::fs::read_to_string(temp_dir(dir).join("ray_current_cluster"))
                .ok()
                .map(|s| s.trim().to_string())
        })
}
