//! Power cuts for the chaos suite: a small FUSE filesystem (in the spirit
//! of Jepsen's LazyFS, written for llmgw) mounted over a peer's data
//! directory. It passes reads and writes through to a backing directory
//! but remembers every data change that was not fsynced; a cut, made while
//! the peer is stopped, rolls those back, optionally leaving a torn prefix
//! of one file's unsynced bytes. The peer then restarts on what a disk
//! would hold after losing power.
//!
//! Needs root and /dev/fuse (mounted through `fusermount3`).

mod cluster_ext;
mod fs;
mod pending;
pub mod soak;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use cluster_ext::describe;
pub use pending::CutReport;

/// One mounted lazy disk. Dropping it unmounts.
pub struct LazyDisk {
    mountpoint: PathBuf,
    backing: PathBuf,
    shared: Arc<Mutex<fs::Shared>>,
    session: Option<fuser::BackgroundSession>,
}

#[derive(Debug, thiserror::Error)]
pub enum PowerCutError {
    #[error("cannot prepare {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot mount the lazy filesystem on {path} (needs root, /dev/fuse and fusermount3): {source}"
    )]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the power cut on {path} failed: {source}")]
    Cut {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl LazyDisk {
    /// Mounts a lazy filesystem on `mountpoint`, backed by `backing`
    /// (both created if missing).
    pub fn mount(mountpoint: &Path, backing: &Path) -> Result<Self, PowerCutError> {
        for dir in [mountpoint, backing] {
            std::fs::create_dir_all(dir).map_err(|source| PowerCutError::Dir {
                path: dir.to_owned(),
                source,
            })?;
        }
        let shared = Arc::new(Mutex::new(fs::Shared::new(backing)));
        let filesystem = fs::LazyFs {
            shared: shared.clone(),
        };
        let options = [
            fuser::MountOption::FSName("llmgw-lazyfs".to_owned()),
            fuser::MountOption::AllowOther,
            fuser::MountOption::DefaultPermissions,
        ];
        let session = fuser::spawn_mount2(filesystem, mountpoint, &options).map_err(|source| {
            PowerCutError::Mount {
                path: mountpoint.to_owned(),
                source,
            }
        })?;
        Ok(LazyDisk {
            mountpoint: mountpoint.to_owned(),
            backing: backing.to_owned(),
            shared,
            session: Some(session),
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// Bytes written and not yet fsynced, per file.
    pub fn unsynced(&self) -> Vec<(PathBuf, u64)> {
        let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared
            .pending
            .unsynced_bytes()
            .into_iter()
            .filter_map(|(ino, bytes)| Some((shared.paths.get(&ino)?.clone(), bytes)))
            .collect()
    }

    /// The power cut. Call it only while nothing uses the filesystem (the
    /// peer was killed and has exited). With `tear`, the file with the most
    /// unsynced bytes keeps `tear(total)` of them (a torn tail).
    pub fn cut(
        &self,
        tear: Option<&mut dyn FnMut(u64) -> u64>,
    ) -> Result<CutReport, PowerCutError> {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let shared = &mut *shared;
        let tear = tear.and_then(|keep| {
            let unsynced = shared.pending.unsynced_bytes();
            // The record in flight when the power goes is in a WAL
            // (`NNNNNN.log`) when there is one; otherwise tear the file
            // with the most unsynced bytes.
            let is_wal = |ino: &u64| {
                shared
                    .paths
                    .get(ino)
                    .and_then(|p| p.file_name())
                    .is_some_and(|name| {
                        let name = name.to_string_lossy();
                        name.strip_suffix(".log").is_some_and(|stem| {
                            !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit())
                        })
                    })
            };
            let (ino, total) = unsynced
                .iter()
                .filter(|(ino, _)| is_wal(ino))
                .max_by_key(|(_, bytes)| **bytes)
                .or_else(|| unsynced.iter().max_by_key(|(_, bytes)| **bytes))
                .map(|(ino, bytes)| (*ino, *bytes))?;
            Some((ino, keep(total)))
        });
        let paths = &shared.paths;
        shared
            .pending
            .cut(|ino| paths.get(&ino).cloned(), tear)
            .map_err(|source| PowerCutError::Cut {
                path: self.mountpoint.clone(),
                source,
            })
    }
}

/// Lazy filesystems still mounted under `dir`, as leftovers to report.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter(|line| line.contains("llmgw-lazyfs"))
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mountpoint| Path::new(mountpoint).starts_with(dir))
        .map(|mountpoint| format!("lazy filesystem still mounted on {mountpoint}"))
        .collect()
}

impl Drop for LazyDisk {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            session.join();
        }
        // fuser's unmount can fail quietly (a straggler still in the
        // directory); detach it so no run leaves a mount behind.
        if !mounts_under(&self.mountpoint).is_empty() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
    }
}
