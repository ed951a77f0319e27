//! Creating a database so that a power cut can never leave a half-made one.
//!
//! RocksDB writes `CURRENT` before our synced creation marker; a cut in
//! between would leave a database that looks like one that lost its WAL
//! (refused at the next start). So a new database is made in a sibling
//! directory, marked, closed and renamed into place, and the parent
//! directory is synced: `dir` is either empty or holds a marked database.

use std::path::{Path, PathBuf};

use crate::error::StoreError;

fn creating(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".creating");
    dir.with_file_name(name)
}

/// Creates the database for `dir` with `make` (which opens it, writes the
/// marker and closes it when it returns) and moves it into place.
pub(crate) fn create(
    dir: &Path,
    make: impl FnOnce(&Path) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let io = |what: &str, path: &Path, e: std::io::Error| StoreError::Corrupt {
        path: dir.to_owned(),
        detail: format!("{what} {}: {e}", path.display()),
    };
    if let Ok(mut entries) = std::fs::read_dir(dir)
        && let Some(entry) = entries.next()
    {
        let name = entry.map(|e| e.file_name()).unwrap_or_default();
        return Err(StoreError::Corrupt {
            path: dir.to_owned(),
            detail: format!(
                "the directory holds files ({} among them) but no RocksDB database \
                 (CURRENT is missing)",
                name.to_string_lossy()
            ),
        });
    }
    let staging = creating(dir);
    // A leftover from a start that was cut short: nothing in it was ever
    // used, since it never got its final name.
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io("removing", &staging, e))?;
    }
    std::fs::create_dir_all(&staging).map_err(|e| io("creating", &staging, e))?;
    make(&staging)?;
    std::fs::rename(&staging, dir).map_err(|e| io("renaming into place", &staging, e))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent).map_err(|e| io("syncing", parent, e))?;
    }
    Ok(())
}

/// fsync on a directory: makes the names in it (a rename) durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
