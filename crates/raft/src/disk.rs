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
    /// `Err` with what to do when the data directory is below its reserve:
    /// the check on every client write.
    pub fn check(&self) -> Result<(), ControlError> {
        self.check_against(self.min_free)
    }

    /// The check on the leader's own decisions: down to half the reserve.
    pub fn check_decision(&self) -> Result<(), ControlError> {
        self.check_against(self.min_free / 2)
    }

    fn check_against(&self, floor: u64) -> Result<(), ControlError> {
        if floor == 0 {
            return Ok(());
        }
        match free_bytes(&self.dir) {
            Ok(free) if free < floor => Err(ControlError::DiskFull(format!(
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
/// the voter furthest along that has room, so writes go on elsewhere. With
/// no such voter the leader stays: moving would refuse writes all the
/// same, and every new term restarts the liveness grace and the agents'
/// streams.
pub(crate) fn spawn_disk_watch(control: ControlPlane) {
    tokio::spawn(async move {
        let mut logged = false;
        let mut staying_logged = false;
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
                staying_logged = false;
            }
            if low.is_err() && metrics.state == ServerState::Leader {
                match voter_with_room(&control, &metrics).await {
                    Some(to) => {
                        tracing::warn!(to, "low on disk space: handing leadership over");
                        let _ = control.raft().trigger().transfer_leader(to).await;
                        staying_logged = false;
                    }
                    None if !staying_logged => {
                        tracing::warn!(
                            "low on disk space, and so is every other voter (or it cannot say): \
                             staying leader; client writes are refused until space is freed, \
                             liveness and placement go on from the reserve"
                        );
                        staying_logged = true;
                    }
                    None => {}
                }
            }
        }
    });
}

/// The other voters, furthest along first; the first that says it has
/// room above its reserve.
async fn voter_with_room(
    control: &ControlPlane,
    metrics: &openraft::RaftMetrics<crate::TypeConfig>,
) -> Option<u64> {
    let membership = metrics.membership_config.membership();
    let mut candidates: Vec<(Option<u64>, u64)> = metrics
        .replication
        .iter()
        .flat_map(|replication| replication.iter())
        .filter(|(id, _)| **id != control.id())
        .filter(|(id, _)| membership.voter_ids().any(|voter| voter == **id))
        .map(|(id, matched)| (matched.as_ref().map(|m| m.index), *id))
        .collect();
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    for (_, id) in candidates {
        let Some(node) = membership.get_node(&id) else {
            continue;
        };
        match control.remote_status(node).await {
            Ok(status) if !status.disk_low => return Some(id),
            _ => {}
        }
    }
    None
}
