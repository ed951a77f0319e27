//! Engine output files: engines write straight into a file in `work_dir`
//! (a pipe would die with the agent and take the engine with it), and the
//! agent keeps the file under `log_max_bytes` and reads its tail.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// How much of the end of a file is read to find the tail.
const TAIL_WINDOW: u64 = 1024 * 1024;

/// Opens (creating) a log for appending; both stdout and stderr of the
/// engine get this file, with `O_APPEND` so that the agent may cut it.
pub fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// The last `lines` lines of the file (fewer when it is shorter).
pub fn tail(path: &Path, lines: usize) -> Vec<String> {
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(TAIL_WINDOW);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if file.read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let mut all: Vec<&str> = text.lines().collect();
    if start > 0 && !all.is_empty() {
        // The first line of the window is most likely cut.
        all.remove(0);
    }
    let skip = all.len().saturating_sub(lines);
    all[skip..].iter().map(|l| l.to_string()).collect()
}

/// When the file is larger than `max_bytes`, keeps its last half (from a
/// line start) and drops the rest. Lines the engine writes during the copy
/// may be lost; that is the price of never putting a pipe between the engine
/// and its output.
pub fn cap(path: &Path, max_bytes: u64) -> io::Result<bool> {
    let len = std::fs::metadata(path)?.len();
    if len <= max_bytes {
        return Ok(false);
    }
    let mut file = OpenOptions::new().read(true).write(true).open(path)?;
    let keep_from = len - max_bytes / 2;
    file.seek(SeekFrom::Start(keep_from))?;
    let mut kept = Vec::with_capacity((max_bytes / 2) as usize);
    file.read_to_end(&mut kept)?;
    let line_start = kept.iter().position(|b| *b == b'\n').map_or(0, |i| i + 1);
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    writeln!(
        file,
        "[llmgw-agent] log cut to its last {} bytes (log_max_bytes {max_bytes})",
        kept.len() - line_start
    )?;
    file.write_all(&kept[line_start..])?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_returns_the_last_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.log");
        std::fs::write(&path, "a\nb\nc\nd\n").unwrap();
        assert_eq!(tail(&path, 2), vec!["c", "d"]);
        assert_eq!(tail(&path, 10), vec!["a", "b", "c", "d"]);
        assert!(tail(&dir.path().join("missing"), 3).is_empty());
    }

    #[test]
    fn cap_keeps_the_newest_half_from_a_line_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.log");
        let mut text = String::new();
        for i in 0..1000 {
            text.push_str(&format!("line {i:04}\n"));
        }
        std::fs::write(&path, &text).unwrap();
        assert!(cap(&path, 4000).unwrap());
        let after = std::fs::read_to_string(&path).unwrap();
        assert!(after.len() <= 2100, "{}", after.len());
        assert!(after.starts_with("[llmgw-agent] log cut"));
        assert!(after.ends_with("line 0999\n"));
        assert!(after.lines().skip(1).all(|l| l.starts_with("line ")));
        assert!(!cap(&path, 4000).unwrap());
    }
}
