//! Opening the database, and the checks that refuse a damaged one.

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DB, DBRecoveryMode, IteratorMode, Options};

use crate::error::StoreError;
use crate::log_store::{self, LogStore};
use crate::state_machine::{self, StateMachineStore};
use crate::types::Entry;
use crate::{acknowledged, create, damage, generation};

pub(crate) const CF_META: &str = "meta";
pub(crate) const CF_LOGS: &str = "logs";
pub(crate) const CF_SNAPSHOT: &str = "snapshot";
const KEY_CREATED: &[u8] = b"created";

/// Both halves of a peer's storage, over one database.
pub struct Store {
    pub log: LogStore,
    pub state_machine: StateMachineStore,
}

impl Store {
    /// Nothing was ever stored: no vote, no log, no snapshot. Only such a
    /// store may take part in bootstrapping a new cluster.
    pub fn is_pristine(&self) -> bool {
        self.log.is_pristine() && !self.state_machine.has_snapshot()
    }
}

/// Opens (creating if absent) the store in `dir` and verifies it.
pub fn open(dir: &Path) -> Result<Store, StoreError> {
    // RocksDB writes CURRENT when it creates a database: if it is there, a
    // database existed, and it must still hold its creation marker.
    if !dir.join("CURRENT").exists() {
        create::create(dir, |path| {
            let db = open_db(path)?;
            verify_created(&db, false).map_err(|detail| StoreError::Corrupt {
                path: path.to_owned(),
                detail,
            })
        })?;
    }
    let db = Arc::new(open_db(dir)?);
    let corrupt = |detail: String| StoreError::Corrupt {
        path: dir.to_owned(),
        detail,
    };
    verify_created(&db, true).map_err(corrupt)?;
    generation::advance(&db, dir).map_err(corrupt)?;
    verify(&db).map_err(corrupt)?;
    let now = log_store::acknowledged_now(&db).map_err(|e| corrupt(e.to_string()))?;
    let record = acknowledged::Record::open(dir, now).map_err(|e| {
        corrupt(format!(
            "cannot write {}: {e}",
            dir.join(acknowledged::FILE).display()
        ))
    })?;
    let log = LogStore::new(db.clone(), record);
    let state_machine = StateMachineStore::load(db).map_err(corrupt)?;
    let store = Store { log, state_machine };
    verify_log_covers_snapshot(&store).map_err(corrupt)?;
    Ok(store)
}

fn open_db(dir: &Path) -> Result<DB, StoreError> {
    // A power cut drops what was not synced and may tear the record being
    // written. Nothing in that record was acknowledged (openraft hears of a
    // write only after its synced write returns), so a torn tail is dropped
    // and the peer starts. Damage before the tail (a checksum mismatch
    // followed by more records) is still refused: that data was synced.
    let options = db_options(DBRecoveryMode::TolerateCorruptedTailRecords);
    match DB::open_cf_descriptors(&options, dir, families()) {
        Ok(db) => Ok(db),
        Err(source) if is_damage(&source) => {
            let detail = damage::describe(dir, source.as_ref());
            recover_torn_tail(dir, &detail).map_err(|detail| StoreError::Corrupt {
                path: dir.to_owned(),
                detail,
            })
        }
        Err(source) => Err(StoreError::Open {
            path: dir.to_owned(),
            source,
        }),
    }
}

fn db_options(recovery: DBRecoveryMode) -> Options {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    options.set_paranoid_checks(true);
    options.set_wal_recovery_mode(recovery);
    // The MANIFEST then records the WALs that were synced and closed, with
    // their sizes: one of those deleted, or cut below what was synced, is
    // refused as damage. The live WAL is not tracked there; the generation
    // file (`generation.rs`) notices when it is lost.
    options.set_track_and_verify_wals_in_manifest(true);
    options
}

fn families() -> impl Iterator<Item = ColumnFamilyDescriptor> {
    [CF_META, CF_LOGS, CF_SNAPSHOT]
        .into_iter()
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()))
}

/// A WAL whose last record is at full length but damaged (zeroed or stale
/// blocks after a power cut) is refused by RocksDB's tail tolerance. Read
/// read-only up to the first damaged record, the store is compared with
/// what it acknowledged (`acknowledged.rs`): holding all of it, the damage
/// was the unsynced tail, and the store opens without it. Otherwise, or
/// with no record to compare, it stays refused with `detail`.
fn recover_torn_tail(dir: &Path, detail: &str) -> Result<DB, String> {
    let Some(acknowledged) = acknowledged::read(dir) else {
        return Err(detail.to_owned());
    };
    let point_in_time = db_options(DBRecoveryMode::PointInTime);
    let missing = {
        let db = DB::open_cf_descriptors_read_only(&point_in_time, dir, families(), false)
            .map_err(|e| {
                format!("{detail}; read up to the damage, it does not open either: {e}")
            })?;
        let recovered = log_store::recovered(&db, &acknowledged)
            .map_err(|e| format!("{detail}; read up to the damage: {e}"))?;
        acknowledged.missing_from(&recovered)
    };
    if let Some(missing) = missing {
        return Err(format!(
            "{detail}; read up to the damage, the store lacks what it acknowledged: {missing}, \
             so the damage is in synced data, not a torn tail"
        ));
    }
    tracing::warn!(
        dir = %dir.display(),
        "the WAL's last record was damaged at full length (a torn write at a power cut); \
         everything acknowledged is before it, so it is dropped: {detail}"
    );
    DB::open_cf_descriptors(&point_in_time, dir, families())
        .map_err(|e| format!("{detail}; opening up to the damage failed: {e}"))
}

/// A new database gets a synced creation marker before anything else; an
/// existing one without it lost writes (for example its WAL files).
fn verify_created(db: &DB, existed: bool) -> Result<(), String> {
    let meta = db.cf_handle(CF_META).expect("meta column family exists");
    let marker = db
        .get_cf(meta, KEY_CREATED)
        .map_err(|e| format!("reading the creation marker: {e}"))?;
    match (marker, existed) {
        (Some(_), _) => Ok(()),
        (None, false) => {
            let mut batch = rocksdb::WriteBatch::default();
            batch.put_cf(meta, KEY_CREATED, b"llmgw-store-v1");
            db.write_opt(batch, &log_store::synced())
                .map_err(|e| format!("writing the creation marker: {e}"))
        }
        (None, true) => Err(
            "the database exists but its creation marker is gone, so writes it had \
             acknowledged are missing (were WAL or table files deleted?)"
                .to_owned(),
        ),
    }
}

fn is_damage(error: &rocksdb::Error) -> bool {
    use rocksdb::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::Corruption | ErrorKind::IOError | ErrorKind::InvalidArgument
    ) && !error.to_string().contains("lock")
}

/// Reads everything back once: each log entry decodes, sits under its own
/// index, and the indices are contiguous; the vote and purge point decode.
fn verify(db: &DB) -> Result<(), String> {
    log_store::read_meta(db).map_err(|e| e.to_string())?;
    let cf = db.cf_handle(CF_LOGS).expect("logs column family exists");
    let mut previous: Option<u64> = None;
    for item in db.iterator_cf(cf, IteratorMode::Start) {
        let (key, value) = item.map_err(|e| format!("reading the log: {e}"))?;
        let index = log_store::decode_index(&key)
            .ok_or_else(|| format!("log key of {} bytes, expected 8", key.len()))?;
        let entry: Entry = serde_json::from_slice(&value)
            .map_err(|e| format!("log entry {index} does not decode: {e}"))?;
        if entry.log_id.index != index {
            return Err(format!(
                "log entry stored under index {index} says it is entry {}",
                entry.log_id.index
            ));
        }
        if let Some(previous) = previous
            && index != previous + 1
        {
            return Err(format!(
                "log entries {} to {} are missing",
                previous + 1,
                index - 1
            ));
        }
        previous = Some(index);
    }
    state_machine::verify_snapshot(db)
}

/// Entries the log no longer holds must be inside the snapshot.
fn verify_log_covers_snapshot(store: &Store) -> Result<(), String> {
    let purged = store.log.last_purged_index();
    let snapshot = store.state_machine.snapshot_last_index();
    if let Some(purged) = purged
        && snapshot.is_none_or(|snapshot| snapshot < purged)
    {
        return Err(format!(
            "the log was purged up to entry {purged} but the snapshot {} ",
            match snapshot {
                Some(index) => format!("only reaches entry {index}"),
                None => "is missing".to_owned(),
            }
        ));
    }
    if let (Some(first), Some(purged)) = (store.log.first_index(), purged)
        && first != purged + 1
    {
        return Err(format!(
            "the log was purged up to entry {purged} but starts at entry {first}"
        ));
    }
    Ok(())
}
