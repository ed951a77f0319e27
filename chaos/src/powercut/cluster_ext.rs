//! Lazy disks under a chaos cluster's peers, and the power cut itself.

use rand::Rng;

use super::{CutReport, LazyDisk};
use crate::cluster::{Cluster, ClusterError};

impl Cluster {
    /// Mounts a lazy disk over every peer's data directory (before the
    /// peers start), backed by `server-<id>.disk` in the run directory.
    pub fn mount_lazy_disks(&mut self) -> Result<(), ClusterError> {
        let ids: Vec<u64> = self.peers.keys().copied().collect();
        for id in ids {
            let data = self.peers[&id].layout.data_dir.clone();
            let backing = self.dir.join(format!("server-{id}.disk"));
            let disk = LazyDisk::mount(&data, &backing)
                .map_err(|e| ClusterError::Disk(format!("peer {id}: {e}")))?;
            self.disks.insert(id, disk);
        }
        Ok(())
    }

    /// The power cut of peer `id`: SIGKILL (nothing of the peer runs
    /// afterwards), then everything its disk had not synced is dropped;
    /// with `tear`, the file with the most unsynced bytes keeps a random
    /// prefix of them. The peer stays down until `spawn`.
    pub fn power_cut(
        &mut self,
        id: u64,
        tear: Option<&mut rand::rngs::StdRng>,
    ) -> Result<CutReport, String> {
        self.kill(id);
        let disk = self
            .disks
            .get(&id)
            .ok_or_else(|| format!("peer {id} has no lazy disk (not a power-cut run)"))?;
        match tear {
            Some(rng) => disk.cut(Some(&mut |total| rng.random_range(0..=total))),
            None => disk.cut(None),
        }
        .map_err(|e| e.to_string())
    }
}

/// One line for the fault log.
pub fn describe(id: u64, cut: &CutReport) -> String {
    format!(
        "power cut peer {id}: {} unsynced change(s) in {} file(s) dropped, {} bytes{}",
        cut.changes_dropped,
        cut.files,
        cut.bytes_dropped,
        match &cut.torn {
            Some((path, kept, of)) => format!(
                "; {} torn after {kept} of {of} unsynced bytes",
                path.file_name().unwrap_or_default().to_string_lossy()
            ),
            None => String::new(),
        }
    )
}
