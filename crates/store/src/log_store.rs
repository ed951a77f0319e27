//! The Raft log and vote in RocksDB. Every mutation is a synced write, done
//! before openraft hears it is durable.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use rocksdb::{DB, Direction, IteratorMode, WriteBatch, WriteOptions};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::acknowledged::{self, Acknowledged};
use crate::db::{CF_LOGS, CF_META};
use crate::types::{Entry, LogId, TypeConfig, Vote};

pub(crate) const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
pub(crate) const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// The log half of the store; cheap to clone, and its own reader.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    syncs: Arc<SyncStats>,
    /// What the synced writes left, recorded before each is acknowledged.
    acknowledged: Arc<acknowledged::Record>,
}

/// How long the synced writes of the Raft log and vote take: the fsync a
/// peer waits for before it acknowledges anything. Exported as metrics.
#[derive(Debug, Default)]
pub struct SyncStats {
    pub syncs: AtomicU64,
    pub nanos_total: AtomicU64,
    pub nanos_max: AtomicU64,
    /// The part of those writes spent on the acknowledged record (its own
    /// synced block, after the WAL's), so its cost can be read apart.
    pub record_nanos_total: AtomicU64,
    pub record_nanos_max: AtomicU64,
}

fn nanos_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl SyncStats {
    fn record(&self, started: Instant, record_nanos: u64) {
        let nanos = nanos_since(started);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.nanos_total.fetch_add(nanos, Ordering::Relaxed);
        self.nanos_max.fetch_max(nanos, Ordering::Relaxed);
        self.record_nanos_total
            .fetch_add(record_nanos, Ordering::Relaxed);
        self.record_nanos_max
            .fetch_max(record_nanos, Ordering::Relaxed);
    }
}

pub(crate) struct Meta {
    pub vote: Option<Vote>,
    pub last_purged: Option<LogId>,
}

pub(crate) fn read_meta(db: &DB) -> io::Result<Meta> {
    Ok(Meta {
        vote: get_json(db, CF_META, KEY_VOTE)?,
        last_purged: get_json(db, CF_META, KEY_LAST_PURGED)?,
    })
}

pub(crate) fn encode_index(index: u64) -> [u8; 8] {
    // Big-endian so RocksDB's byte order is log order.
    index.to_be_bytes()
}

pub(crate) fn decode_index(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

pub(crate) fn get_json<T: DeserializeOwned>(
    db: &DB,
    cf: &str,
    key: &[u8],
) -> io::Result<Option<T>> {
    let handle = db.cf_handle(cf).expect("column family exists");
    match db.get_cf(handle, key).map_err(io::Error::other)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{cf}/{} does not decode: {e}", String::from_utf8_lossy(key)),
            )
        }),
    }
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(io::Error::other)
}

pub(crate) fn synced() -> WriteOptions {
    let mut options = WriteOptions::default();
    options.set_sync(true);
    options
}

/// The vote and last log id `db` holds, as [`Acknowledged`] records them.
pub(crate) fn acknowledged_now(db: &DB) -> io::Result<Acknowledged> {
    let meta = read_meta(db)?;
    let logs = db.cf_handle(CF_LOGS).expect("logs column family exists");
    let last_entry = match db.iterator_cf(logs, IteratorMode::End).next() {
        None => None,
        Some(item) => {
            let (_, value) = item.map_err(io::Error::other)?;
            let entry: Entry = serde_json::from_slice(&value)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            Some(entry.log_id)
        }
    };
    Ok(Acknowledged {
        vote: meta.vote,
        last_log_id: last_entry.or(meta.last_purged),
    })
}

/// What `db` holds of what `acknowledged` names.
pub(crate) fn recovered(
    db: &DB,
    acknowledged: &Acknowledged,
) -> io::Result<acknowledged::Recovered> {
    let meta = read_meta(db)?;
    let entry_at_last = match acknowledged.last_log_id {
        None => None,
        Some(last) => {
            let logs = db.cf_handle(CF_LOGS).expect("logs column family exists");
            match db
                .get_cf(logs, encode_index(last.index))
                .map_err(io::Error::other)?
            {
                None => None,
                Some(bytes) => {
                    let entry: Entry = serde_json::from_slice(&bytes)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    Some(entry.log_id)
                }
            }
        }
    };
    Ok(acknowledged::Recovered {
        vote: meta.vote,
        last_purged: meta.last_purged,
        entry_at_last,
    })
}

impl LogStore {
    pub(crate) fn new(db: Arc<DB>, acknowledged: acknowledged::Record) -> Self {
        Self {
            db,
            syncs: Arc::default(),
            acknowledged: Arc::new(acknowledged),
        }
    }

    pub fn sync_stats(&self) -> Arc<SyncStats> {
        self.syncs.clone()
    }

    /// Writes `batch` and syncs it to disk, then records what it left
    /// (`change`, synced too) before returning: the record is never ahead
    /// of the WAL, and what openraft acknowledges is always in it. Both
    /// syncs count in [`SyncStats`].
    fn write_synced(
        &self,
        batch: WriteBatch,
        change: impl FnOnce(&mut Acknowledged),
    ) -> io::Result<()> {
        let started = Instant::now();
        let mut record_nanos = 0;
        let result = self
            .db
            .write_opt(batch, &synced())
            .map_err(io::Error::other)
            .and_then(|()| {
                let record_started = Instant::now();
                let recorded = self.acknowledged.update(change);
                record_nanos = nanos_since(record_started);
                recorded
            });
        self.syncs.record(started, record_nanos);
        result
    }

    fn logs(&self) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(CF_LOGS)
            .expect("logs column family exists")
    }

    fn meta(&self) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(CF_META)
            .expect("meta column family exists")
    }

    pub(crate) fn is_pristine(&self) -> bool {
        let meta = read_meta(&self.db).ok();
        let no_vote = meta
            .as_ref()
            .is_some_and(|m| m.vote.is_none() && m.last_purged.is_none());
        no_vote && self.first_index().is_none()
    }

    pub(crate) fn first_index(&self) -> Option<u64> {
        let mut iter = self.db.iterator_cf(self.logs(), IteratorMode::Start);
        iter.next()?.ok().and_then(|(key, _)| decode_index(&key))
    }

    pub(crate) fn last_purged_index(&self) -> Option<u64> {
        read_meta(&self.db).ok()?.last_purged.map(|id| id.index)
    }

    fn last_entry(&self) -> io::Result<Option<Entry>> {
        let mut iter = self.db.iterator_cf(self.logs(), IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (_, value) = item.map_err(io::Error::other)?;
                serde_json::from_slice(&value)
                    .map(Some)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i + 1,
            Bound::Unbounded => 0,
        };
        let mut entries = Vec::new();
        let mode = IteratorMode::From(&encode_index(start), Direction::Forward);
        for item in self.db.iterator_cf(self.logs(), mode) {
            let (key, value) = item.map_err(io::Error::other)?;
            let index = decode_index(&key)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad log key"))?;
            if !range.contains(&index) {
                break;
            }
            let entry: Entry = serde_json::from_slice(&value)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            entries.push(entry);
        }
        Ok(entries)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        get_json(&self.db, CF_META, KEY_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged_log_id: Option<LogId> = get_json(&self.db, CF_META, KEY_LAST_PURGED)?;
        let last_log_id = match self.last_entry()? {
            Some(entry) => Some(entry.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.meta(), KEY_VOTE, to_json(vote)?);
        self.write_synced(batch, |a| a.vote = Some(*vote))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not synced: losing it only means re-applying from the snapshot up
        // to what the leader reports as committed.
        let mut batch = WriteBatch::default();
        batch.put_cf(self.meta(), KEY_COMMITTED, to_json(&committed)?);
        self.db.write(batch).map_err(io::Error::other)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(get_json::<Option<LogId>>(&self.db, CF_META, KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::default();
        let mut last = None;
        for entry in entries {
            batch.put_cf(
                self.logs(),
                encode_index(entry.log_id.index),
                to_json(&entry)?,
            );
            last = Some(entry.log_id);
        }
        let result = self.write_synced(batch, |a| a.last_log_id = last.or(a.last_log_id));
        let report = match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::other(e.to_string())),
        };
        callback.io_completed(report);
        result
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index + 1);
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.logs(), encode_index(from), encode_index(u64::MAX));
        batch.delete_cf(self.logs(), encode_index(u64::MAX));
        // Lowered first: until the truncation is synced the WAL still
        // holds the entries, so a record naming the lower one is never
        // ahead of it.
        self.acknowledged.update(|a| a.last_log_id = last_log_id)?;
        self.write_synced(batch, |_| {})
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut batch = WriteBatch::default();
        // The purge point first, in the same atomic batch as the deletion,
        // so a crash never leaves a log with a hole and no explanation.
        batch.put_cf(self.meta(), KEY_LAST_PURGED, to_json(&log_id)?);
        batch.delete_range_cf(self.logs(), encode_index(0), encode_index(log_id.index + 1));
        self.write_synced(batch, |a| {
            if a.last_log_id.is_none_or(|last| last.index < log_id.index) {
                a.last_log_id = Some(log_id);
            }
        })
    }
}
