//! The stored snapshot: meta and data as one RocksDB value, so a reader can
//! never pair one snapshot's meta with another's data, and one lock around
//! every replacement, so a snapshot is stored only when it is newer than
//! the one already there.
//!
//! Value layout: the meta's JSON length as 8 big-endian bytes, the meta as
//! JSON, then the data (the fleet state as JSON).

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rocksdb::{DB, WriteBatch};

use crate::db::CF_SNAPSHOT;
use crate::log_store::{synced, to_json};
use crate::types::{SnapshotData, TypeConfig};

pub(crate) type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

/// The key of the one-value snapshot.
const KEY_CURRENT: &[u8] = b"current";
/// Earlier releases kept meta and data under two keys; read once, then
/// replaced by [`KEY_CURRENT`] at the next store.
const LEGACY_META: &[u8] = b"meta";
const LEGACY_DATA: &[u8] = b"data";

/// A snapshot as it rests on disk.
#[derive(Debug)]
pub(crate) struct Stored {
    pub meta: SnapshotMeta,
    pub data: SnapshotData,
}

impl Stored {
    pub fn index(&self) -> Option<u64> {
        self.meta.last_log_id.map(|id| id.index)
    }
}

/// Serialises every replacement of the stored snapshot. Clones share it.
#[derive(Clone, Default)]
pub(crate) struct SnapshotLock(Arc<Mutex<()>>);

impl SnapshotLock {
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn cf(db: &DB) -> &rocksdb::ColumnFamily {
    db.cf_handle(CF_SNAPSHOT)
        .expect("snapshot column family exists")
}

fn encode(meta: &SnapshotMeta, data: &[u8]) -> io::Result<Vec<u8>> {
    let meta = to_json(meta)?;
    let mut value = Vec::with_capacity(8 + meta.len() + data.len());
    value.extend_from_slice(&(meta.len() as u64).to_be_bytes());
    value.extend_from_slice(&meta);
    value.extend_from_slice(data);
    Ok(value)
}

fn decode(value: &[u8]) -> Result<Stored, String> {
    let (len, rest) = value
        .split_first_chunk::<8>()
        .ok_or("the snapshot record is shorter than its header")?;
    let len = usize::try_from(u64::from_be_bytes(*len)).unwrap_or(usize::MAX);
    if len > rest.len() {
        return Err(format!(
            "the snapshot record says its meta is {len} bytes but only {} follow",
            rest.len()
        ));
    }
    let (meta, data) = rest.split_at(len);
    let meta = serde_json::from_slice(meta)
        .map_err(|e| format!("the snapshot meta does not decode: {e}"))?;
    Ok(Stored {
        meta,
        data: data.to_vec(),
    })
}

/// The stored snapshot, if any. Legacy two-key snapshots are read from one
/// RocksDB snapshot, so the pair is consistent too.
pub(crate) fn read(db: &DB) -> Result<Option<Stored>, String> {
    let cf = cf(db);
    if let Some(value) = db
        .get_cf(cf, KEY_CURRENT)
        .map_err(|e| format!("reading the snapshot: {e}"))?
    {
        return decode(&value).map(Some);
    }
    let view = db.snapshot();
    let meta = view
        .get_cf(cf, LEGACY_META)
        .map_err(|e| format!("reading the snapshot meta: {e}"))?;
    let data = view
        .get_cf(cf, LEGACY_DATA)
        .map_err(|e| format!("reading the snapshot data: {e}"))?;
    match (meta, data) {
        (None, None) => Ok(None),
        (Some(meta), Some(data)) => Ok(Some(Stored {
            meta: serde_json::from_slice(&meta)
                .map_err(|e| format!("the snapshot meta does not decode: {e}"))?,
            data,
        })),
        _ => Err("the snapshot is incomplete (meta and data do not match)".to_owned()),
    }
}

/// Stores `meta` and `data` (synced) if they are newer than the stored
/// snapshot. The caller holds the [`SnapshotLock`]. Returns whether it
/// stored them.
pub(crate) fn store_if_newer(
    db: &DB,
    _held: &MutexGuard<'_, ()>,
    meta: &SnapshotMeta,
    data: &[u8],
) -> io::Result<bool> {
    let stored = read(db).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let new_index = meta.last_log_id.map(|id| id.index);
    if let Some(stored) = &stored
        && stored.index() >= new_index
    {
        return Ok(false);
    }
    let mut batch = WriteBatch::default();
    put(db, &mut batch, meta, data)?;
    db.write_opt(batch, &synced()).map_err(io::Error::other)?;
    Ok(true)
}

/// Adds the replacement of the stored snapshot to `batch`.
pub(crate) fn put(
    db: &DB,
    batch: &mut WriteBatch,
    meta: &SnapshotMeta,
    data: &[u8],
) -> io::Result<()> {
    let cf = cf(db);
    batch.put_cf(cf, KEY_CURRENT, encode(meta, data)?);
    batch.delete_cf(cf, LEGACY_META);
    batch.delete_cf(cf, LEGACY_DATA);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_short_one_is_refused() {
        let meta = SnapshotMeta::default();
        let value = encode(&meta, b"{\"x\":1}").unwrap();
        let back = decode(&value).unwrap();
        assert_eq!(back.meta, meta);
        assert_eq!(back.data, b"{\"x\":1}");
        assert!(decode(&value[..5]).is_err());
        let mut lying = value.clone();
        lying[7] = 0xff;
        assert!(decode(&lying).unwrap_err().contains("only"));
    }
}
