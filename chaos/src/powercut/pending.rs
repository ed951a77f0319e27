//! What a power cut takes away: every change to a file's data since that
//! file was last fsynced, kept as an undo log and rolled back on a cut.
//!
//! Writes reach the backing file at once (reads see them, as they would
//! see the page cache); each one records what it replaced. `fsync` on a
//! file forgets its records: that data is durable. A cut undoes the rest,
//! newest first. With tearing, one file keeps a prefix of its unsynced
//! bytes in write order, as a disk that wrote part of a sequential log
//! before the power went.
//!
//! Metadata (create, rename, unlink, mkdir) is durable at once here: a
//! simplification against real filesystems, where a name is durable only
//! after its directory is fsynced. Files created and never synced still
//! come back empty, which is what breaks careless rename-into-place.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// One change to a file's data that is not durable yet.
#[derive(Debug, Clone)]
enum Change {
    /// `len` bytes written at `offset`; before it the file was `old_len`
    /// long and held `old` where the write landed (inside `old_len`).
    Write {
        offset: u64,
        len: u64,
        old_len: u64,
        old: Vec<u8>,
    },
    /// The file was truncated from `old_len`; `old_tail` held the bytes
    /// past the new end.
    Truncate { old_len: u64, old_tail: Vec<u8> },
}

/// The undo log of every file, by inode.
#[derive(Debug, Default)]
pub struct Pending {
    /// (sequence, inode, change) in the order they happened.
    log: Vec<(u64, u64, Change)>,
    next: u64,
}

/// What a cut did, for the fault log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutReport {
    pub files: usize,
    pub changes_dropped: usize,
    pub bytes_dropped: u64,
    /// The file that kept part of its unsynced bytes: (path, kept, of).
    pub torn: Option<(PathBuf, u64, u64)>,
}

impl Pending {
    /// Records a write of `len` bytes at `offset` to `file` (inode `ino`),
    /// before it is made.
    pub fn before_write(&mut self, ino: u64, file: &File, offset: u64, len: u64) -> io::Result<()> {
        let old_len = file.metadata()?.len();
        let overlap_end = (offset + len).min(old_len);
        let mut old = vec![0; overlap_end.saturating_sub(offset) as usize];
        if !old.is_empty() {
            file.read_exact_at(&mut old, offset)?;
        }
        self.push(
            ino,
            Change::Write {
                offset,
                len,
                old_len,
                old,
            },
        );
        Ok(())
    }

    /// Records a truncation of `file` to `new_len`, before it is made.
    pub fn before_truncate(&mut self, ino: u64, file: &File, new_len: u64) -> io::Result<()> {
        let old_len = file.metadata()?.len();
        let mut old_tail = vec![0; old_len.saturating_sub(new_len) as usize];
        if !old_tail.is_empty() {
            file.read_exact_at(&mut old_tail, new_len)?;
        }
        self.push(ino, Change::Truncate { old_len, old_tail });
        Ok(())
    }

    fn push(&mut self, ino: u64, change: Change) {
        self.log.push((self.next, ino, change));
        self.next += 1;
    }

    /// `fsync`/`fdatasync` of inode `ino`: its data is durable.
    pub fn synced(&mut self, ino: u64) {
        self.log.retain(|(_, i, _)| *i != ino);
    }

    /// The inode is gone (unlinked): nothing of it to roll back.
    pub fn forget(&mut self, ino: u64) {
        self.synced(ino);
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// Inodes with unsynced changes, and how many bytes they wrote.
    pub fn unsynced_bytes(&self) -> BTreeMap<u64, u64> {
        let mut out = BTreeMap::new();
        for (_, ino, change) in &self.log {
            if let Change::Write { len, .. } = change {
                *out.entry(*ino).or_default() += len;
            }
        }
        out
    }

    /// The power cut: rolls every unsynced change back in the files
    /// `path_of` finds, newest first. With `tear = Some((ino, keep))`, that
    /// inode keeps the first `keep` of its unsynced written bytes.
    pub fn cut(
        &mut self,
        path_of: impl Fn(u64) -> Option<PathBuf>,
        tear: Option<(u64, u64)>,
    ) -> io::Result<CutReport> {
        let mut report = CutReport::default();
        let log = std::mem::take(&mut self.log);
        let mut files = BTreeMap::new();
        // How many written bytes of the torn inode stay, counted from its
        // oldest unsynced write.
        let (torn_ino, mut keep) = match tear {
            Some((ino, keep)) => (Some(ino), keep),
            None => (None, 0),
        };
        let torn_total: u64 = torn_ino
            .map(|ino| self_bytes(&log, ino))
            .unwrap_or_default();
        let mut kept_of_torn = 0;
        // Decide, oldest first, which writes of the torn inode survive
        // whole, and which one survives in part.
        let mut survives: BTreeMap<u64, u64> = BTreeMap::new();
        if let Some(ino) = torn_ino {
            for (seq, i, change) in &log {
                if *i != ino {
                    continue;
                }
                match change {
                    Change::Write { len, .. } if keep > 0 => {
                        let part = (*len).min(keep);
                        survives.insert(*seq, part);
                        keep -= part;
                        kept_of_torn += part;
                    }
                    // Once a byte is lost, nothing written after it stays:
                    // the disk wrote this file's log in order.
                    _ => break,
                }
            }
        }
        for (seq, ino, change) in log.into_iter().rev() {
            let Some(path) = path_of(ino) else { continue };
            let file = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
            {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            files.insert(ino, path.clone());
            let partial = survives.get(&seq).copied();
            match change {
                Change::Write {
                    offset,
                    len,
                    old_len,
                    old,
                } => {
                    if partial == Some(len) {
                        continue;
                    }
                    let mut kept = vec![0; partial.unwrap_or(0) as usize];
                    if !kept.is_empty() {
                        file.read_exact_at(&mut kept, offset)?;
                    }
                    file.write_all_at(&old, offset)?;
                    file.set_len(old_len)?;
                    if !kept.is_empty() {
                        file.write_all_at(&kept, offset)?;
                    }
                    report.changes_dropped += 1;
                    report.bytes_dropped += len - kept.len() as u64;
                }
                Change::Truncate { old_len, old_tail } => {
                    let new_len = old_len - old_tail.len() as u64;
                    file.set_len(old_len)?;
                    file.write_all_at(&old_tail, new_len)?;
                    report.changes_dropped += 1;
                }
            }
        }
        report.files = files.len();
        if let Some(ino) = torn_ino
            && let Some(path) = files.get(&ino)
        {
            report.torn = Some((path.clone(), kept_of_torn, torn_total));
        }
        Ok(report)
    }
}

fn self_bytes(log: &[(u64, u64, Change)], ino: u64) -> u64 {
    log.iter()
        .filter(|(_, i, _)| *i == ino)
        .map(|(_, _, c)| match c {
            Change::Write { len, .. } => *len,
            Change::Truncate { .. } => 0,
        })
        .sum()
}

/// Writes `data` at `offset` after recording it.
pub fn write_at(
    pending: &mut Pending,
    ino: u64,
    file: &File,
    offset: u64,
    data: &[u8],
) -> io::Result<()> {
    pending.before_write(ino, file, offset, data.len() as u64)?;
    file.write_all_at(data, offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The path helper for tests and callers that key files by path.
    fn path_fn(map: &BTreeMap<u64, PathBuf>) -> impl Fn(u64) -> Option<PathBuf> + '_ {
        move |ino| map.get(&ino).cloned()
    }

    fn open(path: &Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    }

    #[test]
    fn unsynced_writes_are_rolled_back_and_synced_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let map = BTreeMap::from([(1, a.clone()), (2, b.clone())]);
        let mut pending = Pending::default();
        let fa = open(&a);
        let fb = open(&b);
        write_at(&mut pending, 1, &fa, 0, b"synced-").unwrap();
        pending.synced(1);
        write_at(&mut pending, 1, &fa, 7, b"lost").unwrap();
        write_at(&mut pending, 1, &fa, 0, b"SYNCED").unwrap();
        write_at(&mut pending, 2, &fb, 0, b"never synced").unwrap();
        let report = pending.cut(path_fn(&map), None).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"synced-");
        assert_eq!(std::fs::read(&b).unwrap(), b"");
        assert_eq!(report.changes_dropped, 3);
        assert!(pending.is_empty());
    }

    #[test]
    fn a_torn_file_keeps_a_prefix_of_its_unsynced_bytes_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("wal");
        let map = BTreeMap::from([(1, a.clone())]);
        let mut pending = Pending::default();
        let fa = open(&a);
        write_at(&mut pending, 1, &fa, 0, b"head|").unwrap();
        pending.synced(1);
        write_at(&mut pending, 1, &fa, 5, b"one|").unwrap();
        write_at(&mut pending, 1, &fa, 9, b"two|").unwrap();
        write_at(&mut pending, 1, &fa, 13, b"three|").unwrap();
        let report = pending.cut(path_fn(&map), Some((1, 6))).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"head|one|tw");
        assert_eq!(report.torn, Some((a, 6, 14)));
    }

    #[test]
    fn truncations_are_undone() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("f");
        let map = BTreeMap::from([(1, a.clone())]);
        let mut pending = Pending::default();
        let fa = open(&a);
        write_at(&mut pending, 1, &fa, 0, b"0123456789").unwrap();
        pending.synced(1);
        pending.before_truncate(1, &fa, 4).unwrap();
        fa.set_len(4).unwrap();
        pending.cut(path_fn(&map), None).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"0123456789");
    }
}
