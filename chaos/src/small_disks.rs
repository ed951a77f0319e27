//! Small disks under a chaos cluster's peers: a tmpfs of
//! [`SMALL_DISK_MB`] over each peer's data directory
//! ([`llmgw_test_kit::Tmpfs`]), which a schedule fills to leave a peer
//! short of space (`raft.min_free_disk_mb`) and frees again. Needs root.

use llmgw_test_kit::Tmpfs;

use crate::cluster::{Cluster, ClusterError};

/// Each peer's data disk: far more than a run writes, little enough to
/// fill in a moment.
pub const SMALL_DISK_MB: u64 = 512;

impl Cluster {
    /// Mounts a small disk over every peer's data directory (before the
    /// peers start).
    pub fn mount_small_disks(&mut self) -> Result<(), ClusterError> {
        let ids: Vec<u64> = self.peers.keys().copied().collect();
        for id in ids {
            let data = self.peers[&id].layout.data_dir.clone();
            let disk = Tmpfs::mount(&data, SMALL_DISK_MB)
                .map_err(|e| ClusterError::Disk(format!("peer {id}: {e}")))?;
            self.small_disks.insert(id, disk);
        }
        Ok(())
    }

    /// Frees every small disk a schedule filled (healing): a disk with
    /// nothing to free is left as it is.
    pub fn free_small_disks(&self) -> Vec<u64> {
        self.small_disks
            .iter()
            .filter(|(_, disk)| disk.free().is_ok())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Peer `id`'s small disk (small-disk runs only).
    pub fn small_disk(&self, id: u64) -> Result<&Tmpfs, String> {
        self.small_disks
            .get(&id)
            .ok_or_else(|| format!("peer {id} has no small disk (not a disk-full run)"))
    }
}
