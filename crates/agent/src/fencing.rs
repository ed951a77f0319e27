//! Fencing: the highest leadership (Raft term, leader peer id) this agent
//! has seen, persisted in `work_dir`, so that a deposed leader cannot act on
//! a node the new leader has already reached, even across an agent restart
//! or a power cut.
//!
//! Raft may elect more than one leader in one term (a higher peer id wins
//! the term over a lower one), so leaderships are compared as
//! (term, leader id), in that order; the term alone cannot fence. A
//! cluster restored from a backup starts its terms again from the
//! backup's, below what agents have seen, and begins a new epoch, so the
//! full order is (epoch, term, leader id).
//!
//! The same file keeps the cluster this agent joined: a leader of another
//! cluster is refused, whatever its term.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A leadership: the cluster's epoch (0 from a leader that predates
/// epochs), the term and the leader's peer id (0 from a leader that
/// predates leader ids). Ordered by epoch, then term, then id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Leadership {
    pub epoch: u64,
    pub term: u64,
    pub leader: u64,
}

impl fmt::Display for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "epoch {} term {} (leader {})",
            self.epoch, self.term, self.leader
        )
    }
}

/// The verdict on a command's leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TermCheck {
    /// At or above the highest seen (which is raised to it).
    Current,
    /// Below the highest seen: refuse the command.
    Stale {
        command: Leadership,
        highest: Leadership,
    },
}

pub struct TermStore {
    path: PathBuf,
    highest: Leadership,
    /// The cluster this agent joined; `None` before its first
    /// registration (and in files from before cluster ids).
    cluster: Option<String>,
    /// The file was there: false on a first start, and on a disk that lost
    /// it.
    found: bool,
}

impl TermStore {
    pub const FILE: &'static str = "leader-term";

    /// Reads the persisted leadership. A missing or empty file is none seen
    /// yet (an empty one can only be a file created but never written: every
    /// write is synced before it replaces the file). Anything else that does
    /// not parse is an error: guessing would let a deposed leader in.
    pub fn open(work_dir: &Path) -> io::Result<Self> {
        let path = work_dir.join(Self::FILE);
        let (text, found) = match std::fs::read_to_string(&path) {
            Ok(text) => (text, true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (String::new(), false),
            Err(e) => return Err(e),
        };
        let (highest, cluster) = parse(&text).map_err(|why| {
            io::Error::other(format!(
                "{}: {why}; it holds the highest leader term this agent has seen. \
                 Check the disk, then remove the file to start from none seen",
                path.display()
            ))
        })?;
        Ok(TermStore {
            path,
            highest,
            cluster,
            found,
        })
    }

    pub fn highest(&self) -> Leadership {
        self.highest
    }

    /// The cluster this agent joined, if any yet.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// Checks the cluster a leader names in `Registered`: the one this
    /// agent joined, or the first it hears of (kept from then on). `Err`
    /// says why another is refused. An empty id (a leader that predates
    /// cluster ids) is taken on trust.
    pub fn join(&mut self, cluster: &str) -> io::Result<Result<(), String>> {
        match self.cluster.as_deref() {
            _ if cluster.is_empty() => Ok(Ok(())),
            Some(joined) if joined == cluster => Ok(Ok(())),
            Some(joined) => Ok(Err(format!(
                "the leader belongs to cluster {cluster}, but this agent joined cluster {joined} \
                 ({}): it obeys no other. If the node really moves to cluster {cluster}, stop the \
                 agent, remove that file and start it again",
                self.path.display()
            ))),
            None => {
                persist(&self.path, self.highest, Some(cluster))?;
                self.cluster = Some(cluster.to_owned());
                Ok(Ok(()))
            }
        }
    }

    /// What to tell the operator when the file is missing although this
    /// agent ran here before (it adopted `adopted` engines an earlier agent
    /// left): fencing starts again from no leadership seen, so a deposed
    /// leader's commands are obeyed until a current leader reaches the
    /// node. Never silent: the agent logs it and sends it with its
    /// registration (`llmgw ctl nodes` shows it).
    pub fn reset_warning(&self, adopted: usize) -> Option<String> {
        (!self.found && adopted > 0).then(|| {
            format!(
                "fencing reset: {} is missing although this agent adopted {adopted} running engine(s) an earlier agent left; \
                 commands of a deposed leader are not refused until a current leader reaches this node. Check the disk under the work directory",
                self.path.display()
            )
        })
    }

    /// Checks a command's leadership and durably persists a higher one
    /// before the command is acted on.
    pub fn check(&mut self, command: Leadership) -> io::Result<TermCheck> {
        if command < self.highest {
            return Ok(TermCheck::Stale {
                command,
                highest: self.highest,
            });
        }
        if command > self.highest {
            persist(&self.path, command, self.cluster.as_deref())?;
            self.highest = command;
        }
        Ok(TermCheck::Current)
    }
}

/// `TERM` (older agents), `TERM LEADER`, or `TERM LEADER EPOCH CLUSTER`
/// (`-` for no cluster yet); empty is none seen.
fn parse(text: &str) -> Result<(Leadership, Option<String>), String> {
    let mut words = text.split_whitespace();
    let Some(term) = words.next() else {
        return Ok((Leadership::default(), None));
    };
    let term = term
        .parse()
        .map_err(|e| format!("{term:?} is not a term number ({e})"))?;
    let leader = match words.next() {
        Some(leader) => leader
            .parse()
            .map_err(|e| format!("{leader:?} is not a leader id ({e})"))?,
        None => 0,
    };
    let epoch = match words.next() {
        Some(epoch) => epoch
            .parse()
            .map_err(|e| format!("{epoch:?} is not an epoch ({e})"))?,
        None => 0,
    };
    let cluster = words.next().filter(|c| *c != "-").map(str::to_owned);
    if let Some(extra) = words.next() {
        return Err(format!(
            "unexpected {extra:?} after the term, leader, epoch and cluster"
        ));
    }
    Ok((
        Leadership {
            epoch,
            term,
            leader,
        },
        cluster,
    ))
}

/// Writes a temporary file, syncs it, renames it over the old one and syncs
/// the directory: after a power cut the file holds the old leadership or
/// the new one, never a torn or empty write.
fn persist(path: &Path, leadership: Leadership, cluster: Option<&str>) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(
        file,
        "{} {} {} {}",
        leadership.term,
        leadership.leader,
        leadership.epoch,
        cluster.unwrap_or("-")
    )?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(term: u64, leader: u64) -> Leadership {
        Leadership {
            epoch: 0,
            term,
            leader,
        }
    }

    fn check(store: &mut TermStore, term: u64, leader: u64) -> TermCheck {
        store.check(at(term, leader)).unwrap()
    }

    #[test]
    fn leaderships_only_go_up_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TermStore::open(dir.path()).unwrap();
        assert_eq!(store.highest(), at(0, 0));
        assert_eq!(check(&mut store, 5, 1), TermCheck::Current);
        assert_eq!(check(&mut store, 5, 1), TermCheck::Current);
        assert_eq!(
            check(&mut store, 4, 3),
            TermCheck::Stale {
                command: at(4, 3),
                highest: at(5, 1)
            }
        );
        let again = TermStore::open(dir.path()).unwrap();
        assert_eq!(again.highest(), at(5, 1));
    }

    #[test]
    fn a_second_leader_of_the_same_term_fences_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TermStore::open(dir.path()).unwrap();
        assert_eq!(check(&mut store, 7, 1), TermCheck::Current);
        assert_eq!(check(&mut store, 7, 3), TermCheck::Current);
        assert_eq!(
            check(&mut store, 7, 1),
            TermCheck::Stale {
                command: at(7, 1),
                highest: at(7, 3)
            },
            "leader 1 of term 7 was superseded by leader 3 of the same term"
        );
    }

    #[test]
    fn a_new_epoch_outranks_every_term_of_the_old_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TermStore::open(dir.path()).unwrap();
        let old = Leadership {
            epoch: 1_000,
            term: 40,
            leader: 3,
        };
        let restored = Leadership {
            epoch: 2_000,
            term: 6,
            leader: 1,
        };
        assert_eq!(store.check(old).unwrap(), TermCheck::Current);
        assert_eq!(store.check(restored).unwrap(), TermCheck::Current);
        assert_eq!(
            store.check(old).unwrap(),
            TermCheck::Stale {
                command: old,
                highest: restored
            },
            "the cluster before the restore is deposed, whatever its term"
        );
        let pre_epoch = at(90, 2);
        assert!(
            matches!(store.check(pre_epoch).unwrap(), TermCheck::Stale { .. }),
            "a leader that sends no epoch ranks below any epoch"
        );
        assert_eq!(TermStore::open(dir.path()).unwrap().highest(), restored);
    }

    #[test]
    fn the_first_cluster_joined_is_kept_and_another_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TermStore::open(dir.path()).unwrap();
        assert_eq!(store.cluster(), None);
        assert_eq!(store.join("").unwrap(), Ok(()), "a leader without ids");
        assert_eq!(store.cluster(), None);
        assert_eq!(store.join("prod-a").unwrap(), Ok(()));
        check(&mut store, 4, 1);
        let mut again = TermStore::open(dir.path()).unwrap();
        assert_eq!(again.cluster(), Some("prod-a"));
        assert_eq!(again.highest(), at(4, 1));
        let refused = again.join("staging").unwrap().unwrap_err();
        assert!(refused.contains("joined cluster prod-a"), "{refused}");
        assert!(refused.contains(TermStore::FILE), "{refused}");
        assert_eq!(again.join("prod-a").unwrap(), Ok(()));
    }

    #[test]
    fn old_and_empty_files_load_and_garbage_is_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(TermStore::FILE);
        std::fs::write(&file, "5\n").unwrap();
        assert_eq!(TermStore::open(dir.path()).unwrap().highest(), at(5, 0));
        std::fs::write(&file, "").unwrap();
        assert_eq!(TermStore::open(dir.path()).unwrap().highest(), at(0, 0));
        std::fs::write(&file, "five").unwrap();
        let error = TermStore::open(dir.path()).err().unwrap().to_string();
        assert!(error.contains(&file.display().to_string()), "{error}");
        assert!(error.contains("not a term number"), "{error}");
    }

    #[test]
    fn a_missing_file_after_an_earlier_agent_is_a_warning_not_a_silent_reset() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = TermStore::open(dir.path()).unwrap();
        assert_eq!(fresh.reset_warning(0), None, "a first start is no reset");
        let warning = fresh.reset_warning(2).expect("engines adopted, no file");
        assert!(warning.contains("fencing reset"), "{warning}");
        assert!(warning.contains(TermStore::FILE), "{warning}");
        std::fs::write(dir.path().join(TermStore::FILE), "").unwrap();
        let present = TermStore::open(dir.path()).unwrap();
        assert_eq!(present.reset_warning(2), None, "the file is there");
    }
}
