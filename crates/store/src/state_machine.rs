//! The state machine: the fleet state in memory, snapshots in RocksDB.
//!
//! Keeping the state in memory and persisting only snapshots makes apply a
//! memory operation; the log, synced on append, is what makes a committed
//! command durable, and a restart replays it on top of the last snapshot.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use futures::TryStreamExt;
use llmgw_state::{FleetState, Leadership, Outcome, StateHash};
use openraft::storage::{EntryResponder, RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use rocksdb::{DB, WriteBatch};

use crate::db::CF_SNAPSHOT;
use crate::log_store::{get_json, synced, to_json};
use crate::types::{LogId, SnapshotData, StoredMembership, TypeConfig};

const KEY_META: &[u8] = b"meta";
const KEY_DATA: &[u8] = b"data";

type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

/// What has been applied, shared with readers (the admin API).
#[derive(Debug, Clone, Default)]
pub struct AppliedState {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub fleet: FleetState,
}

/// Counters for the apply path, exported as metrics.
#[derive(Debug, Default)]
pub struct ApplyStats {
    pub entries: AtomicU64,
    pub batches: AtomicU64,
    pub nanos_total: AtomicU64,
    pub nanos_max: AtomicU64,
    /// Snapshots received from a leader and installed.
    pub snapshots_installed: AtomicU64,
}

/// The state-machine half of the store; clones share the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    db: Arc<DB>,
    applied: Arc<RwLock<AppliedState>>,
    stats: Arc<ApplyStats>,
}

pub(crate) fn verify_snapshot(db: &DB) -> Result<(), String> {
    let meta: Option<SnapshotMeta> =
        get_json(db, CF_SNAPSHOT, KEY_META).map_err(|e| e.to_string())?;
    let data: Option<Vec<u8>> = {
        let cf = db
            .cf_handle(CF_SNAPSHOT)
            .expect("snapshot column family exists");
        db.get_cf(cf, KEY_DATA).map_err(|e| e.to_string())?
    };
    match (meta, data) {
        (None, None) => Ok(()),
        (Some(_), Some(data)) => serde_json::from_slice::<FleetState>(&data)
            .map(|_| ())
            .map_err(|e| format!("the snapshot does not decode: {e}")),
        _ => Err("the snapshot is incomplete (meta and data do not match)".to_owned()),
    }
}

impl StateMachineStore {
    /// Starts from the stored snapshot, if any; openraft replays the
    /// committed log after it.
    pub(crate) fn load(db: Arc<DB>) -> Result<Self, String> {
        let mut applied = AppliedState::default();
        let meta: Option<SnapshotMeta> =
            get_json(&db, CF_SNAPSHOT, KEY_META).map_err(|e| e.to_string())?;
        if let Some(meta) = meta {
            let cf = db
                .cf_handle(CF_SNAPSHOT)
                .expect("snapshot column family exists");
            let data = db
                .get_cf(cf, KEY_DATA)
                .map_err(|e| e.to_string())?
                .ok_or("the snapshot has no data")?;
            applied.fleet = serde_json::from_slice(&data)
                .map_err(|e| format!("the snapshot does not decode: {e}"))?;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership;
        }
        Ok(Self {
            db,
            applied: Arc::new(RwLock::new(applied)),
            stats: Arc::default(),
        })
    }

    /// A shared handle on the applied state, for readers.
    pub fn applied(&self) -> Arc<RwLock<AppliedState>> {
        self.applied.clone()
    }

    pub fn stats(&self) -> Arc<ApplyStats> {
        self.stats.clone()
    }

    /// The hash of the applied state and the index it reflects.
    pub fn state_hash(&self) -> (Option<u64>, StateHash) {
        let applied = self.applied.read().expect("state lock poisoned");
        (
            applied.last_applied.as_ref().map(|id| id.index),
            applied.fleet.hash(),
        )
    }

    pub(crate) fn has_snapshot(&self) -> bool {
        self.snapshot_last_index().is_some()
            || get_json::<SnapshotMeta>(&self.db, CF_SNAPSHOT, KEY_META)
                .ok()
                .flatten()
                .is_some()
    }

    pub(crate) fn snapshot_last_index(&self) -> Option<u64> {
        get_json::<SnapshotMeta>(&self.db, CF_SNAPSHOT, KEY_META)
            .ok()
            .flatten()
            .and_then(|meta| meta.last_log_id.map(|id| id.index))
    }

    fn persist_snapshot(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
        let cf = self
            .db
            .cf_handle(CF_SNAPSHOT)
            .expect("snapshot column family exists");
        let mut batch = WriteBatch::default();
        batch.put_cf(cf, KEY_META, to_json(meta)?);
        batch.put_cf(cf, KEY_DATA, data);
        self.db
            .write_opt(batch, &synced())
            .map_err(io::Error::other)
    }

    fn stored_snapshot(
        &self,
    ) -> io::Result<Option<openraft::alias::SnapshotOf<TypeConfig, SnapshotData>>> {
        let Some(meta) = get_json::<SnapshotMeta>(&self.db, CF_SNAPSHOT, KEY_META)? else {
            return Ok(None);
        };
        let cf = self
            .db
            .cf_handle(CF_SNAPSHOT)
            .expect("snapshot column family exists");
        let data = self
            .db
            .get_cf(cf, KEY_DATA)
            .map_err(io::Error::other)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "snapshot data missing"))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: data,
        }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(
        &mut self,
    ) -> Result<openraft::alias::SnapshotOf<TypeConfig, SnapshotData>, io::Error> {
        let (meta, data) = {
            let applied = self.applied.read().expect("state lock poisoned");
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            (meta, to_json(&applied.fleet)?)
        };
        self.persist_snapshot(&meta, &data)?;
        tracing::info!(last_log_id = ?meta.last_log_id, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let applied = self.applied.read().expect("state lock poisoned");
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + openraft::OptionalSend,
    {
        let started = Instant::now();
        let mut count = 0u64;
        while let Some((entry, responder)) = entries.try_next().await? {
            let outcome = {
                let mut applied = self.applied.write().expect("state lock poisoned");
                applied.last_applied = Some(entry.log_id);
                match &entry.payload {
                    EntryPayload::Blank => Outcome::Applied,
                    EntryPayload::Normal(command) => {
                        let by = entry.log_id.committed_leader_id();
                        let appended_by = Leadership {
                            term: by.term,
                            leader: by.node_id,
                        };
                        applied.fleet.apply_entry(appended_by, command)
                    }
                    EntryPayload::Membership(membership) => {
                        applied.membership =
                            StoredMembership::new(Some(entry.log_id), membership.clone());
                        Outcome::Applied
                    }
                }
            };
            count += 1;
            if let Some(responder) = responder {
                responder.send(outcome);
            }
        }
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.entries.fetch_add(count, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.nanos_total.fetch_add(nanos, Ordering::Relaxed);
        self.stats.nanos_max.fetch_max(nanos, Ordering::Relaxed);
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let fleet: FleetState = serde_json::from_slice(&snapshot).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("received snapshot does not decode: {e}"),
            )
        })?;
        self.persist_snapshot(meta, &snapshot)?;
        let mut applied = self.applied.write().expect("state lock poisoned");
        applied.fleet = fleet;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        self.stats
            .snapshots_installed
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(last_log_id = ?meta.last_log_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<openraft::alias::SnapshotOf<TypeConfig, SnapshotData>>, io::Error> {
        self.stored_snapshot()
    }
}
