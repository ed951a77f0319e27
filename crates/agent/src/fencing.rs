//! Fencing: the highest leader term this agent has seen, persisted in
//! `work_dir`, so that a deposed leader cannot act on a node the new leader
//! has already reached, even across an agent restart.

use std::io;
use std::path::{Path, PathBuf};

/// The verdict on a command's term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TermCheck {
    /// At or above the highest seen (which is raised to it).
    Current,
    /// Below the highest seen: refuse the command.
    Stale { command: u64, highest: u64 },
}

pub struct TermStore {
    path: PathBuf,
    highest: u64,
}

impl TermStore {
    pub const FILE: &'static str = "leader-term";

    /// Reads the persisted term; a missing file is term 0, an unreadable one
    /// is an error (guessing 0 would let any deposed leader in).
    pub fn open(work_dir: &Path) -> io::Result<Self> {
        let path = work_dir.join(Self::FILE);
        let highest = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse::<u64>().map_err(|e| {
                io::Error::other(format!("{}: not a term number ({e})", path.display()))
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(TermStore { path, highest })
    }

    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// Checks a command's term and persists a higher one before the command
    /// is acted on.
    pub fn check(&mut self, term: u64) -> io::Result<TermCheck> {
        if term < self.highest {
            return Ok(TermCheck::Stale {
                command: term,
                highest: self.highest,
            });
        }
        if term > self.highest {
            let tmp = self.path.with_extension("tmp");
            std::fs::write(&tmp, format!("{term}\n"))?;
            std::fs::rename(&tmp, &self.path)?;
            self.highest = term;
        }
        Ok(TermCheck::Current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_only_go_up_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TermStore::open(dir.path()).unwrap();
        assert_eq!(store.highest(), 0);
        assert_eq!(store.check(5).unwrap(), TermCheck::Current);
        assert_eq!(store.check(5).unwrap(), TermCheck::Current);
        assert_eq!(
            store.check(4).unwrap(),
            TermCheck::Stale {
                command: 4,
                highest: 5
            }
        );
        let again = TermStore::open(dir.path()).unwrap();
        assert_eq!(again.highest(), 5);
        std::fs::write(dir.path().join(TermStore::FILE), "five").unwrap();
        assert!(TermStore::open(dir.path()).is_err());
    }
}
