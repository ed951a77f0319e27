//! Naming the damaged file when RocksDB refuses to open.
//!
//! RocksDB's error for a WAL that does not replay says what was wrong
//! ("checksum mismatch") but not always where; its info log (`LOG` in the
//! database directory) names the file. The operator needs both.

use std::path::Path;

/// `detail`, with the damaged file appended when RocksDB's info log names
/// one and `detail` does not.
pub(crate) fn describe(dir: &Path, detail: &str) -> String {
    if data_file_in(detail).is_some() {
        return detail.to_owned();
    }
    let log = std::fs::read_to_string(dir.join("LOG")).unwrap_or_default();
    let file = log
        .lines()
        .rev()
        .filter(|line| line.contains("Corruption") || line.contains("corrupt"))
        .find_map(data_file_in);
    match file {
        Some(file) => format!("{detail} (in {})", dir.join(file).display()),
        None => detail.to_owned(),
    }
}

/// The first RocksDB data file named in `text`: `NNNNNN.log`, `NNNNNN.sst`
/// or `MANIFEST-NNNNNN`.
fn data_file_in(text: &str) -> Option<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
        .map(|token| token.trim_end_matches('.'))
        .find(|token| {
            let numbered = |suffix: &str| {
                token.strip_suffix(suffix).is_some_and(|stem| {
                    !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit())
                })
            };
            numbered(".log") || numbered(".sst") || token.starts_with("MANIFEST-")
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_files_are_found_in_rocksdb_messages() {
        assert_eq!(
            data_file_in("/data/raft/000004.log: dropping 36 bytes; Corruption: checksum mismatch"),
            Some("000004.log".to_owned())
        );
        assert_eq!(
            data_file_in("block checksum mismatch in /d/000012.sst offset 0"),
            Some("000012.sst".to_owned())
        );
        assert_eq!(data_file_in("Corruption: checksum mismatch"), None);
        assert_eq!(data_file_in("see the LOG file."), None);
    }
}
