//! A small tmpfs over a data directory, which a test fills to leave it
//! short of space and frees again. Needs root (mount).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs; dropping it unmounts it (lazily, so a process still
/// holding files there cannot keep it busy).
pub struct Tmpfs {
    mountpoint: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_mb` MiB on `dir` (created if missing).
    pub fn mount(dir: &Path, size_mb: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(dir)
            .status()
            .map_err(|e| format!("mount: {e}"))?;
        if !status.success() {
            return Err(format!(
                "mount -t tmpfs on {} exited with {status}",
                dir.display()
            ));
        }
        Ok(Tmpfs {
            mountpoint: dir.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    fn filler(&self) -> PathBuf {
        self.mountpoint.join("test-filler")
    }

    /// Fills the filesystem until `leave_mb` MiB are free; the MiB free
    /// afterwards.
    pub fn fill(&self, leave_mb: u64) -> Result<u64, String> {
        let free = || {
            llmgw_procfs::free_bytes(&self.mountpoint)
                .map_err(|e| format!("statvfs {}: {e}", self.mountpoint.display()))
        };
        let size = free()?.saturating_sub(leave_mb << 20);
        let chunk = vec![0x5au8; 1 << 20];
        let path = self.filler();
        let fail = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = std::fs::File::create(&path).map_err(fail)?;
        let mut written = 0u64;
        while written < size {
            let n = chunk.len().min((size - written) as usize);
            std::io::Write::write_all(&mut file, &chunk[..n]).map_err(fail)?;
            written += n as u64;
        }
        file.sync_all().map_err(fail)?;
        Ok(free()? >> 20)
    }

    /// Gives back what [`Tmpfs::fill`] took.
    pub fn free(&self) -> Result<(), String> {
        let path = self.filler();
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mountpoint)
            .status();
    }
}
