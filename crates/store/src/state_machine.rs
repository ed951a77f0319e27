//! The state machine: the fleet state in memory, snapshots in RocksDB.
//!
//! Keeping the state in memory and persisting only snapshots makes apply a
//! memory operation; the log, synced on append, is what makes a committed
//! command durable, and a restart replays it on top of the last snapshot.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use futures::TryStreamExt;
use llmgw_state::{FleetState, Leadership, Outcome, StateHash};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use rocksdb::DB;

use crate::log_store::to_json;
use crate::snapshot::{self, SnapshotLock, SnapshotMeta, Stored};
use crate::types::{Entry, LogId, SnapshotData, StoredMembership, TypeConfig};

type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// What has been applied, shared with readers (the admin API).
#[derive(Debug, Clone, Default)]
pub struct AppliedState {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub fleet: FleetState,
}

impl AppliedState {
    /// Applies one committed log entry: what the state machine does, and
    /// what an offline backup replays.
    pub(crate) fn apply(&mut self, entry: &Entry) -> Outcome {
        self.last_applied = Some(entry.log_id);
        match &entry.payload {
            EntryPayload::Blank => Outcome::Applied,
            EntryPayload::Normal(command) => {
                let by = entry.log_id.committed_leader_id();
                let appended_by = Leadership {
                    term: by.term,
                    leader: by.node_id,
                };
                self.fleet.apply_entry(appended_by, command)
            }
            EntryPayload::Membership(membership) => {
                self.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                Outcome::Applied
            }
        }
    }
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
    /// The last snapshot this peer built or installed: its size, and how
    /// long building (encoding and storing) or installing (decoding,
    /// storing and replacing the state) took.
    pub snapshot_bytes: AtomicU64,
    pub snapshot_build_nanos: AtomicU64,
    pub snapshot_install_nanos: AtomicU64,
}

impl ApplyStats {
    fn record_snapshot(&self, bytes: usize, started: std::time::Instant, took: &AtomicU64) {
        self.snapshot_bytes.store(bytes as u64, Ordering::Relaxed);
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        took.store(nanos, Ordering::Relaxed);
    }
}

/// The state-machine half of the store; clones share the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    db: Arc<DB>,
    applied: Arc<RwLock<AppliedState>>,
    stats: Arc<ApplyStats>,
    /// Held while the stored snapshot is replaced (built or installed):
    /// openraft builds in a task of its own and may install a newer
    /// snapshot meanwhile, and the older one must never land last.
    snapshot_lock: SnapshotLock,
    /// The cluster this store belongs to, once known (a restore seeds it;
    /// a cluster's first epoch sets it). Set once: the peer transport
    /// refuses RPCs of any other cluster from then on.
    cluster_id: Arc<OnceLock<String>>,
}

pub(crate) fn verify_snapshot(db: &DB) -> Result<(), String> {
    match snapshot::read(db)? {
        None => Ok(()),
        Some(stored) => serde_json::from_slice::<FleetState>(&stored.data)
            .map(|_| ())
            .map_err(|e| format!("the snapshot does not decode: {e}")),
    }
}

fn to_openraft(stored: Stored) -> Snapshot {
    Snapshot {
        meta: stored.meta,
        snapshot: stored.data,
    }
}

impl StateMachineStore {
    /// Starts from the stored snapshot, if any; openraft replays the
    /// committed log after it.
    pub(crate) fn load(db: Arc<DB>) -> Result<Self, String> {
        let mut applied = AppliedState::default();
        if let Some(stored) = snapshot::read(&db)? {
            applied.fleet = serde_json::from_slice(&stored.data)
                .map_err(|e| format!("the snapshot does not decode: {e}"))?;
            applied.last_applied = stored.meta.last_log_id;
            applied.membership = stored.meta.last_membership;
        }
        let store = Self {
            db,
            applied: Arc::new(RwLock::new(applied)),
            stats: Arc::default(),
            snapshot_lock: SnapshotLock::default(),
            cluster_id: Arc::default(),
        };
        store.note_cluster();
        Ok(store)
    }

    /// The cluster id this store belongs to, once known; shared, so the
    /// transport sees it as soon as it is applied.
    pub fn cluster_id(&self) -> Arc<OnceLock<String>> {
        self.cluster_id.clone()
    }

    fn note_cluster(&self) {
        if self.cluster_id.get().is_some() {
            return;
        }
        let applied = self.applied.read().expect("state lock poisoned");
        if let Some(identity) = &applied.fleet.cluster {
            let _ = self.cluster_id.set(identity.id.clone());
        }
    }

    pub(crate) fn db(&self) -> &DB {
        &self.db
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
        !matches!(snapshot::read(&self.db), Ok(None))
    }

    pub(crate) fn snapshot_last_index(&self) -> Option<u64> {
        snapshot::read(&self.db).ok().flatten()?.index()
    }

    fn stored_snapshot(&self) -> io::Result<Option<Snapshot>> {
        snapshot::read(&self.db)
            .map(|stored| stored.map(to_openraft))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let started = std::time::Instant::now();
        let (meta, data) = {
            let applied = self.applied.read().expect("state lock poisoned");
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            (meta, to_json(&applied.fleet)?)
        };
        let held = self.snapshot_lock.lock();
        if snapshot::store_if_newer(&self.db, &held, &meta, &data)? {
            tracing::info!(last_log_id = ?meta.last_log_id, bytes = data.len(), "snapshot built");
            self.stats
                .record_snapshot(data.len(), started, &self.stats.snapshot_build_nanos);
            return Ok(Snapshot {
                meta,
                snapshot: data,
            });
        }
        // A snapshot at least as new (installed from the leader while this
        // one was being built) is stored already: answer with it, so
        // openraft is told what is on disk.
        let stored = self
            .stored_snapshot()?
            .ok_or_else(|| io::Error::other("a newer snapshot was reported but none is stored"))?;
        tracing::info!(
            built = ?meta.last_log_id,
            stored = ?stored.meta.last_log_id,
            "snapshot built but a newer one is stored; keeping that"
        );
        Ok(stored)
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
                applied.apply(&entry)
            };
            count += 1;
            if let Some(responder) = responder {
                responder.send(outcome);
            }
        }
        self.note_cluster();
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
        let started = std::time::Instant::now();
        let fleet: FleetState = serde_json::from_slice(&snapshot).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("received snapshot does not decode: {e}"),
            )
        })?;
        // Stored and made the applied state under one lock, so a build
        // that copied an older state cannot store it after this.
        let held = self.snapshot_lock.lock();
        if !snapshot::store_if_newer(&self.db, &held, meta, &snapshot)? {
            tracing::warn!(
                installing = ?meta.last_log_id,
                stored = ?self.snapshot_last_index(),
                "installing a snapshot not newer than the stored one; keeping the stored one on disk"
            );
        }
        {
            let mut applied = self.applied.write().expect("state lock poisoned");
            applied.fleet = fleet;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
        }
        drop(held);
        self.note_cluster();
        self.stats
            .snapshots_installed
            .fetch_add(1, Ordering::Relaxed);
        self.stats
            .record_snapshot(snapshot.len(), started, &self.stats.snapshot_install_nanos);
        tracing::info!(last_log_id = ?meta.last_log_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        self.stored_snapshot()
    }
}
