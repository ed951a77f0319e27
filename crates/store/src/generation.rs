//! Noticing a database that lost its latest WAL.
//!
//! RocksDB flushes the recovered WAL to a table file on every open, so a
//! marker written once stays readable after a later WAL is deleted, and a
//! store that lost the writes of its last session would open as an older
//! one. Every open therefore bumps a generation number, first in RocksDB
//! (synced, so it lives in the new WAL) and then in a small file next to
//! it (written durably). The store must never be behind the file: if it
//! is, the WAL holding the newer generation, and every write after it, is
//! gone. A power cut between the two writes leaves the store ahead, which
//! is fine.

use std::io::Write;
use std::path::Path;

use rocksdb::{DB, WriteBatch};

use crate::db::CF_META;
use crate::log_store::synced;

const KEY_GENERATION: &[u8] = b"generation";
/// In the database directory; RocksDB ignores files it does not know.
pub(crate) const FILE: &str = "LLMGW-GENERATION";

/// Checks the generation and starts the next one.
pub(crate) fn advance(db: &DB, dir: &Path) -> Result<(), String> {
    let meta = db.cf_handle(CF_META).expect("meta column family exists");
    let stored = db
        .get_cf(meta, KEY_GENERATION)
        .map_err(|e| format!("reading the generation: {e}"))?
        .map(|bytes| parse(&bytes))
        .transpose()?
        .unwrap_or(0);
    let file = dir.join(FILE);
    let recorded = match std::fs::read(&file) {
        Ok(bytes) => parse(&bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(format!("reading {}: {e}", file.display())),
    };
    if stored < recorded {
        return Err(format!(
            "the database is at generation {stored} but {} says {recorded}: the WAL of its last \
             run, with writes it had acknowledged, is missing (were WAL files deleted?)",
            file.display()
        ));
    }
    let next = stored.max(recorded) + 1;
    let mut batch = WriteBatch::default();
    batch.put_cf(meta, KEY_GENERATION, next.to_string());
    db.write_opt(batch, &synced())
        .map_err(|e| format!("writing the generation: {e}"))?;
    write_durably(dir, &file, next).map_err(|e| format!("writing {}: {e}", file.display()))
}

fn parse(bytes: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "generation {:?} is not a number",
                String::from_utf8_lossy(bytes)
            )
        })
}

fn write_durably(dir: &Path, file: &Path, generation: u64) -> std::io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    {
        let mut out = std::fs::File::create(&tmp)?;
        writeln!(out, "{generation}")?;
        out.sync_all()?;
    }
    std::fs::rename(&tmp, file)?;
    crate::create::sync_dir(dir)
}
