//! Files that must survive a power cut: written to a temporary name,
//! fsynced, renamed into place, and the directory fsynced, so that after a
//! cut the file is either the old version or the new one, never empty or
//! torn (a rename without the fsyncs can leave a zero-length file on ext4
//! and XFS).

use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `bytes` durably. With `keep_previous`, the version
/// it replaces stays next to it as `<name>.prev` (the last good copy).
pub fn write(path: &Path, bytes: &[u8], keep_previous: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other(format!("{} has no directory", path.display())))?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no file name", path.display())))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    if keep_previous && path.exists() {
        let previous = previous(path);
        let _ = std::fs::remove_file(&previous);
        std::fs::hard_link(path, &previous)?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}

/// `<name>.prev` next to `path`.
pub fn previous(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".prev");
    path.with_file_name(name)
}

/// Removes `path` (and its last good copy) durably.
pub fn remove(path: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(previous(path));
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match path.parent() {
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}

/// fsync on a directory makes the names in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_and_keeps_the_previous_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write(&path, b"one", true).unwrap();
        assert!(!previous(&path).exists());
        write(&path, b"two", true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read(previous(&path)).unwrap(), b"one");
        remove(&path).unwrap();
        assert!(!path.exists() && !previous(&path).exists());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(names.is_empty(), "no temporary file left: {names:?}");
    }
}
