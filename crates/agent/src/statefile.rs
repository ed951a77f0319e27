//! One state file per running shard in `work_dir/shards/`, so that an agent
//! that restarts (or is killed) finds its engines again instead of starting
//! them twice or killing them.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
        let health = self.health_url()?;
        Some(match health.strip_suffix("/health") {
            Some(base) => format!("{base}/metrics"),
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
}

pub fn shards_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("shards")
}

pub fn path_for(work_dir: &Path, shard_id: &str) -> PathBuf {
    shards_dir(work_dir).join(format!("{shard_id}.json"))
}

/// Writes atomically (temporary file, then rename), so a crash mid-write
/// never leaves a half file that would lose an engine.
pub fn write(work_dir: &Path, record: &ShardRecord) -> io::Result<()> {
    let dir = shards_dir(work_dir);
    std::fs::create_dir_all(&dir)?;
    let path = path_for(work_dir, &record.shard_id);
    let tmp = dir.join(format!(".{}.json.tmp", record.shard_id));
    let text = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

pub fn remove(work_dir: &Path, shard_id: &str) {
    let _ = std::fs::remove_file(path_for(work_dir, shard_id));
}

/// Every state file, each read or with the reason it could not be.
pub fn read_all(work_dir: &Path) -> Vec<(PathBuf, Result<ShardRecord, String>)> {
    let Ok(entries) = std::fs::read_dir(shards_dir(work_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let read = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<ShardRecord>(&b).map_err(|e| e.to_string()))
                .and_then(|r| {
                    if r.format == FORMAT_VERSION {
                        Ok(r)
                    } else {
                        Err(format!(
                            "state file format {} is not {FORMAT_VERSION}",
                            r.format
                        ))
                    }
                });
            (path, read)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
