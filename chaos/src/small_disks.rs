//! Small disks under a chaos cluster's peers: a tmpfs of
//! [`SMALL_DISK_MB`] over each peer's data directory, which a schedule
//! fills to leave a peer short of space (`raft.min_free_disk_mb`) and
//! frees again. Needs root (mount).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::{Cluster, ClusterError};

/// Each peer's data disk: far more than a run writes, little enough to
/// fill in a moment.
pub const SMALL_DISK_MB: u64 = 512;

/// A mounted tmpfs; dropping it unmounts it (lazily, so a peer still
/// holding files there cannot keep it busy).
pub struct SmallDisk {
    mountpoint: PathBuf,
}

impl SmallDisk {
    fn mount(dir: &Path) -> Result<SmallDisk, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={SMALL_DISK_MB}m"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .map_err(|e| format!("mount: {e}"))?;
        if !status.success() {
            return Err(format!(
                "mount -t tmpfs on {} exited with {status}",
                dir.display()
            ));
        }
        Ok(SmallDisk {
            mountpoint: dir.to_owned(),
        })
    }

    fn filler(&self) -> PathBuf {
        self.mountpoint.join("chaos-filler")
    }

    /// Fills the disk until `leave_mb` MiB are free; the MiB now free.
    pub fn fill(&self, leave_mb: u64) -> Result<u64, String> {
        let free = || {
            llmgw_raft::free_bytes(&self.mountpoint)
                .map_err(|e| format!("statvfs {}: {e}", self.mountpoint.display()))
        };
        let size = free()?.saturating_sub(leave_mb << 20);
        let chunk = vec![0x5au8; 1 << 20];
        let path = self.filler();
        let mut file =
            std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut written = 0u64;
        while written < size {
            let n = chunk.len().min((size - written) as usize);
            std::io::Write::write_all(&mut file, &chunk[..n])
                .map_err(|e| format!("{}: {e}", path.display()))?;
            written += n as u64;
        }
        Ok(free()? >> 20)
    }

    /// Gives back what [`SmallDisk::fill`] took.
    pub fn free(&self) -> Result<(), String> {
        let path = self.filler();
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mountpoint)
            .status();
    }
}

impl Cluster {
    /// Mounts a small disk over every peer's data directory (before the
    /// peers start).
    pub fn mount_small_disks(&mut self) -> Result<(), ClusterError> {
        let ids: Vec<u64> = self.peers.keys().copied().collect();
        for id in ids {
            let data = self.peers[&id].layout.data_dir.clone();
            let disk = SmallDisk::mount(&data)
                .map_err(|e| ClusterError::Disk(format!("peer {id}: {e}")))?;
            self.small_disks.insert(id, disk);
        }
        Ok(())
    }

    /// Peer `id`'s small disk (small-disk runs only).
    pub fn small_disk(&self, id: u64) -> Result<&SmallDisk, String> {
        self.small_disks
            .get(&id)
            .ok_or_else(|| format!("peer {id} has no small disk (not a disk-full run)"))
    }
}
