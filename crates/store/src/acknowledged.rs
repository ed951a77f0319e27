//! What the store has acknowledged, kept beside the WAL so that a torn WAL
//! tail can be told from damage.
//!
//! A power cut may leave the WAL's last record at full length but with
//! garbage in it (zeroed or stale blocks after the crash on XFS, ext4
//! `data=writeback`, preallocated extents). RocksDB's tail tolerance only
//! accepts a record cut short, so such a store would refuse to open,
//! although that record was never synced and so never acknowledged. Whether
//! a damaged record was acknowledged cannot be read from the WAL itself: it
//! takes a record written after each synced write, durably, of the vote
//! and the last log id it left. At open, a WAL that RocksDB refuses is
//! read again only up to its first damaged record; if what that holds
//! covers this record, nothing acknowledged was lost and the damage was the
//! unsynced tail; otherwise the store is refused as before.
//!
//! The record is one 512-byte block, overwritten in place and synced: a
//! sector write is atomic, and an overwrite changes no file metadata, so
//! its sync is one block. It is written after the WAL's own sync, so it is
//! never ahead of the WAL: a power cut between the two leaves it behind,
//! which only makes it weaker, never wrong.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::types::{LogId, Vote};

/// In the database directory; RocksDB ignores files it does not know.
pub(crate) const FILE: &str = "LLMGW-ACKNOWLEDGED";
const BLOCK: usize = 512;

/// The vote and the last log id after a synced write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Acknowledged {
    pub vote: Option<Vote>,
    pub last_log_id: Option<LogId>,
}

impl Acknowledged {
    /// Why `recovered` (what a store holds) lacks something acknowledged;
    /// `None` when it holds all of it.
    pub(crate) fn missing_from(&self, recovered: &Recovered) -> Option<String> {
        if let Some(vote) = &self.vote {
            let kept = recovered.vote.as_ref().is_some_and(|held| {
                matches!(
                    held.partial_cmp(vote),
                    Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
                )
            });
            if !kept {
                return Some(format!(
                    "the vote {vote} was acknowledged, and the store holds {:?}",
                    recovered.vote
                ));
            }
        }
        let last = self.last_log_id?;
        let purged = recovered
            .last_purged
            .is_some_and(|purged| purged.index >= last.index);
        if purged || recovered.entry_at_last == Some(last) {
            return None;
        }
        Some(format!(
            "log entry {last} was acknowledged, and the store holds {}",
            match recovered.entry_at_last {
                Some(other) => format!("{other} at that index"),
                None => "no entry at that index".to_owned(),
            }
        ))
    }
}

/// What a store holds, read to compare with [`Acknowledged`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Recovered {
    pub vote: Option<Vote>,
    pub last_purged: Option<LogId>,
    /// The log id of the entry at the acknowledged last index, if any.
    pub entry_at_last: Option<LogId>,
}

/// The record in `dir`. `None` when there is none (a store from before
/// it) or it does not parse (a torn write of the record itself, which an
/// atomic sector write should never leave): nothing can then be proved.
pub(crate) fn read(dir: &Path) -> Option<Acknowledged> {
    let bytes = std::fs::read(dir.join(FILE)).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    serde_json::from_str(text.trim_end()).ok()
}

/// The record, kept current by the log store after each synced write.
pub(crate) struct Record {
    file: File,
    current: Mutex<Acknowledged>,
}

impl Record {
    /// Opens (creating) the record in `dir` and writes `now`: what the
    /// store holds as it opens.
    pub(crate) fn open(dir: &Path, now: Acknowledged) -> io::Result<Record> {
        let path = dir.join(FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        let record = Record {
            file,
            current: Mutex::new(now),
        };
        record.write(&now)?;
        // A new file's size and name must be durable too.
        record.file.sync_all()?;
        if let Some(parent) = path.parent() {
            File::open(parent)?.sync_all()?;
        }
        Ok(record)
    }

    /// Records a change after its synced write returned (nothing is
    /// written when it changes nothing).
    pub(crate) fn update(&self, change: impl FnOnce(&mut Acknowledged)) -> io::Result<()> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let before = *current;
        change(&mut current);
        if *current == before {
            return Ok(());
        }
        self.write(&current)
    }

    fn write(&self, acknowledged: &Acknowledged) -> io::Result<()> {
        let mut block = serde_json::to_vec(acknowledged).map_err(io::Error::other)?;
        if block.len() >= BLOCK {
            return Err(io::Error::other(format!(
                "the acknowledged record is {} bytes, over one {BLOCK}-byte block",
                block.len()
            )));
        }
        block.resize(BLOCK, b' ');
        block[BLOCK - 1] = b'\n';
        self.file.write_all_at(&block, 0)?;
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(term: u64, index: u64) -> LogId {
        LogId::new(
            openraft::impls::leader_id_adv::LeaderId { term, node_id: 1 },
            index,
        )
    }

    fn holding(vote: Option<Vote>, purged: Option<LogId>, at_last: Option<LogId>) -> Recovered {
        Recovered {
            vote,
            last_purged: purged,
            entry_at_last: at_last,
        }
    }

    #[test]
    fn what_was_acknowledged_must_be_held_exactly() {
        let acked = Acknowledged {
            vote: Some(Vote::new_committed(3, 1)),
            last_log_id: Some(id(3, 40)),
        };
        let vote = Some(Vote::new_committed(3, 1));
        assert_eq!(
            acked.missing_from(&holding(vote, None, Some(id(3, 40)))),
            None
        );
        assert_eq!(
            acked.missing_from(&holding(vote, Some(id(3, 45)), None)),
            None,
            "purged past it: it was applied into the snapshot"
        );
        let lost = acked.missing_from(&holding(vote, None, None)).unwrap();
        assert!(lost.contains("no entry at that index"), "{lost}");
        let other_term = acked
            .missing_from(&holding(vote, None, Some(id(2, 40))))
            .unwrap();
        assert!(other_term.contains("at that index"), "{other_term}");
        let old_vote = acked
            .missing_from(&holding(
                Some(Vote::new_committed(2, 1)),
                None,
                Some(id(3, 40)),
            ))
            .unwrap();
        assert!(old_vote.contains("vote"), "{old_vote}");
    }

    #[test]
    fn the_record_survives_a_reopen_and_a_garbled_one_proves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        let record = Record::open(dir.path(), Acknowledged::default()).unwrap();
        record.update(|a| a.last_log_id = Some(id(1, 7))).unwrap();
        record
            .update(|a| a.vote = Some(Vote::new_committed(1, 2)))
            .unwrap();
        let read_back = read(dir.path()).unwrap();
        assert_eq!(read_back.last_log_id, Some(id(1, 7)));
        assert_eq!(read_back.vote, Some(Vote::new_committed(1, 2)));
        assert_eq!(std::fs::metadata(dir.path().join(FILE)).unwrap().len(), 512);
        std::fs::write(dir.path().join(FILE), vec![0u8; 512]).unwrap();
        assert_eq!(read(dir.path()), None);
    }
}
