//! The command witness: one JSON line per command the agent acts on or
//! refuses, with the leadership that sent it, in `work_dir/commands.jsonl`.
//! It exists so that a checker that does not trust the agent's own fencing
//! can hold every executed command against the leadership history of the
//! control plane (the chaos suite does). Lines are appended, not synced: a
//! power cut may lose the last few, never reorder them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::fencing::Leadership;
use crate::report::unix_ms;

/// Past this size the log moves to `commands.jsonl.1` and starts again.
const ROTATE_BYTES: u64 = 8 << 20;

#[derive(Debug, Serialize)]
struct Line<'a> {
    at_unix_ms: u64,
    epoch: u64,
    term: u64,
    leader: u64,
    kind: &'a str,
    shard: &'a str,
    executed: bool,
}

pub struct Witness {
    path: PathBuf,
    file: Option<File>,
}

impl Witness {
    pub const FILE: &'static str = "commands.jsonl";

    /// Opens the log in `work_dir`. A log that cannot be opened costs the
    /// witness, never the agent: it says so once and goes on.
    pub fn open(work_dir: &Path) -> Self {
        let path = work_dir.join(Self::FILE);
        let file = open_append(&path);
        Witness { path, file }
    }

    /// Records one command: `executed` false for a refused one.
    pub fn record(&mut self, leadership: Leadership, kind: &str, shard: &str, executed: bool) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let line = Line {
            at_unix_ms: unix_ms(),
            epoch: leadership.epoch,
            term: leadership.term,
            leader: leadership.leader,
            kind,
            shard,
            executed,
        };
        let mut text = serde_json::to_string(&line).unwrap_or_default();
        text.push('\n');
        if let Err(e) = file.write_all(text.as_bytes()) {
            tracing::warn!(path = %self.path.display(), "command witness stopped: {e}");
            self.file = None;
            return;
        }
        if file.metadata().is_ok_and(|m| m.len() > ROTATE_BYTES) {
            let _ = std::fs::rename(&self.path, self.path.with_extension("jsonl.1"));
            self.file = open_append(&self.path);
        }
    }
}

fn open_append(path: &Path) -> Option<File> {
    match OpenOptions::new().create(true).append(true).open(path) {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot open the command witness: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_is_one_line_with_its_leadership() {
        let dir = tempfile::tempdir().unwrap();
        let mut witness = Witness::open(dir.path());
        witness.record(
            Leadership {
                epoch: 0,
                term: 3,
                leader: 2,
            },
            "start",
            "r1-r0",
            true,
        );
        witness.record(
            Leadership {
                epoch: 0,
                term: 2,
                leader: 1,
            },
            "stop",
            "r1-r0",
            false,
        );
        let text = std::fs::read_to_string(dir.path().join(Witness::FILE)).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["term"], 3);
        assert_eq!(lines[0]["leader"], 2);
        assert_eq!(lines[0]["kind"], "start");
        assert_eq!(lines[0]["executed"], true);
        assert_eq!(lines[1]["executed"], false);
    }
}
