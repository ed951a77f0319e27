//! One state file per running shard in `work_dir/shards/`, so that an agent
//! that restarts (or is killed) finds its engines again instead of starting
//! them twice or killing them.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::durable;
use crate::spec::LaunchSpec;

pub const FORMAT_VERSION: u32 = 1;

/// One process of a shard (an engine, a Ray daemon).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// `engine`, `ray-head`, `ray-worker`.
    pub role: String,
    pub pid: i32,
    pub pgid: i32,
    /// From `/proc/PID/stat`: tells this process from a later one that was
    /// given the same pid.
    pub start_time: u64,
    pub log: PathBuf,
}

/// How the shard is judged ready; kept so an adopted shard is probed the
/// same way as when it was launched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "rule")]
pub enum ReadyRule {
    VllmHealth { url: String },
    SglangHealth { url: String },
    ProcessAlive,
}

impl From<&llmgw_engines::Readiness> for ReadyRule {
    fn from(r: &llmgw_engines::Readiness) -> Self {
        match r {
            llmgw_engines::Readiness::VllmHealth { url } => {
                ReadyRule::VllmHealth { url: url.clone() }
            }
            llmgw_engines::Readiness::SglangHealth { url } => {
                ReadyRule::SglangHealth { url: url.clone() }
            }
            llmgw_engines::Readiness::ProcessAlive => ReadyRule::ProcessAlive,
        }
    }
}

impl ReadyRule {
    pub fn health_url(&self) -> Option<&str> {
        match self {
            ReadyRule::VllmHealth { url } | ReadyRule::SglangHealth { url } => Some(url),
            ReadyRule::ProcessAlive => None,
        }
    }

    /// The engine's Prometheus page, next to its health endpoint.
    pub fn metrics_url(&self) -> Option<String> {
        self.beside_health("/metrics")
    }

    /// The engine's OpenAI model list, next to its health endpoint.
    pub fn models_url(&self) -> Option<String> {
        self.beside_health("/v1/models")
    }

    /// vLLM sleep mode, level 1: weights to CPU memory, KV cache dropped.
    pub fn sleep_url(&self) -> Option<String> {
        self.vllm_only("/sleep?level=1")
    }

    pub fn wake_url(&self) -> Option<String> {
        self.vllm_only("/wake_up")
    }

    /// Answers `{"is_sleeping": bool}`.
    pub fn is_sleeping_url(&self) -> Option<String> {
        self.vllm_only("/is_sleeping")
    }

    fn vllm_only(&self, path: &str) -> Option<String> {
        match self {
            ReadyRule::VllmHealth { .. } => self.beside_health(path),
            _ => None,
        }
    }

    fn beside_health(&self, path: &str) -> Option<String> {
        let health = self.health_url()?;
        Some(match health.strip_suffix("/health") {
            Some(base) => format!("{base}{path}"),
            None => health.to_string(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub format: u32,
    pub shard_id: String,
    pub spec_hash: String,
    pub port: Option<u16>,
    /// The leader term of the command that started it.
    pub term: u64,
    /// Unix milliseconds at launch.
    pub started_unix_ms: u64,
    pub processes: Vec<ProcessRecord>,
    pub readiness: ReadyRule,
    pub spec: LaunchSpec,
    /// Why the shard is being stopped, once its stop has begun: an agent
    /// that restarts meanwhile finishes the stop instead of adopting the
    /// engine as running, or reporting its end as a crash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<String>,
}

pub fn shards_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("shards")
}

pub fn path_for(work_dir: &Path, shard_id: &str) -> PathBuf {
    shards_dir(work_dir).join(format!("{shard_id}.json"))
}

/// Writes durably (temporary file, fsync, rename, fsync of the directory),
/// so neither a crash nor a power cut leaves a half file that would lose
/// an engine; the version it replaces stays as `<shard>.json.prev`.
pub fn write(work_dir: &Path, record: &ShardRecord) -> io::Result<()> {
    let dir = shards_dir(work_dir);
    std::fs::create_dir_all(&dir)?;
    let text = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    durable::write(&path_for(work_dir, &record.shard_id), &text, true)
}

pub fn remove(work_dir: &Path, shard_id: &str) {
    if let Err(e) = durable::remove(&path_for(work_dir, shard_id)) {
        tracing::warn!(shard = shard_id, "could not remove the state file: {e}");
    }
}

/// Removes a state file by path (one that could not be read).
pub fn remove_path(path: &Path) {
    let _ = durable::remove(path);
}

fn read_one(path: &Path) -> Result<ShardRecord, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    if bytes.is_empty() {
        return Err("the file is empty".to_owned());
    }
    let record: ShardRecord = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if record.format != FORMAT_VERSION {
        return Err(format!(
            "state file format {} is not {FORMAT_VERSION}",
            record.format
        ));
    }
    Ok(record)
}

/// Reads one state file; when it is torn, empty or garbled, falls back to
/// its last good copy and puts that back in place (durably).
fn read_or_previous(path: &Path) -> Result<ShardRecord, String> {
    let why = match read_one(path) {
        Ok(record) => return Ok(record),
        Err(why) => why,
    };
    let previous = durable::previous(path);
    match read_one(&previous) {
        Ok(record) => {
            tracing::warn!(
                file = %path.display(),
                "state file unreadable ({why}); using its last good copy"
            );
            if let Ok(text) = serde_json::to_vec_pretty(&record) {
                let _ = durable::write(path, &text, false);
            }
            Ok(record)
        }
        Err(_) => Err(why),
    }
}

/// Every state file, each read (or its last good copy) or with the reason
/// it could not be.
pub fn read_all(work_dir: &Path) -> Vec<(PathBuf, Result<ShardRecord, String>)> {
    let Ok(entries) = std::fs::read_dir(shards_dir(work_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let read = read_or_previous(&path);
            (path, read)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
