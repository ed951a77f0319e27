//! Disk space: a peer whose data directory runs low refuses client writes
//! with a clear error instead of letting RocksDB hit ENOSPC (which openraft
//! treats as fatal), keeps serving reads from memory, hands leadership to
//! a peer with room, and takes writes again by itself once space returns.
//! The reserve left below the threshold is what Raft itself still needs:
//! entries replicated from a healthy leader and snapshots.

use std::path::PathBuf;
use std::time::Duration;

use openraft::ServerState;

use crate::control::ControlPlane;
use crate::error::ControlError;

pub use llmgw_procfs::free_bytes;

/// The data directory and the space that must stay free in it.
#[derive(Debug, Clone)]
pub(crate) struct DiskGuard {
    pub dir: PathBuf,
    pub min_free: u64,
}

impl DiskGuard {
    /// `Err` with what to do when the data directory is below its reserve.
    pub fn check(&self) -> Result<(), ControlError> {
        if self.min_free == 0 {
            return Ok(());
        }
        match free_bytes(&self.dir) {
            Ok(free) if free < self.min_free => Err(ControlError::DiskFull(format!(
                "the data directory {} has {} MiB free, below the {} MiB reserve \
                 (raft.min_free_disk_mb): writes are refused until space is freed there; \
                 reads are still served",
                self.dir.display(),
                free >> 20,
                self.min_free >> 20
            ))),
            // A statvfs failure says nothing about space: do not refuse.
            _ => Ok(()),
        }
    }
}

/// On the leader, every second: with too little space, hand leadership to
/// the voter that is furthest along, so writes go on elsewhere.
pub(crate) fn spawn_disk_watch(control: ControlPlane) {
    tokio::spawn(async move {
        let mut logged = false;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let metrics = control.metrics();
            if metrics.state == ServerState::Shutdown {
                return;
            }
            let low = control.disk().check();
            if let Err(why) = &low {
                if !logged {
                    tracing::warn!("{why}");
                    logged = true;
                }
            } else if logged {
                tracing::info!("disk space is back above the reserve; writes are accepted again");
                logged = false;
            }
            if low.is_err() && metrics.state == ServerState::Leader {
                let best = metrics
                    .replication
                    .iter()
                    .flat_map(|replication| replication.iter())
                    .filter(|(id, _)| **id != control.id())
                    .filter(|(id, _)| {
                        metrics
                            .membership_config
                            .membership()
                            .voter_ids()
                            .any(|voter| voter == **id)
                    })
                    .max_by_key(|(_, matched)| matched.as_ref().map(|m| m.index))
                    .map(|(id, _)| *id);
                if let Some(to) = best {
                    tracing::warn!(to, "low on disk space: handing leadership over");
                    let _ = control.raft().trigger().transfer_leader(to).await;
                }
            }
        }
    });
}
