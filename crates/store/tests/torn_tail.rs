//! What a power cut leaves in the WAL, and what real damage looks like.
//!
//! A power cut drops whatever was not synced and may tear the last record
//! being written. Nothing in that record was acknowledged (openraft hears of
//! an append only after its synced write returns), so the store must drop
//! it and open. Damage to data that was synced is still refused.

use std::path::{Path, PathBuf};

use llmgw_state::Command;
use llmgw_store::{Entry, LogId, StoreError, Vote};
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{EntryPayload, RaftLogReader};

fn log_id(index: u64) -> LogId {
    LogId::new(
        openraft::impls::leader_id_adv::LeaderId {
            term: 1,
            node_id: 1,
        },
        index,
    )
}

fn entry(index: u64) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command::RetirePeer {
            peer: index,
            at_ms: index,
        }),
    }
}

/// The WAL RocksDB is writing now: the highest-numbered `.log` file.
fn current_wal(dir: &Path) -> PathBuf {
    let mut wals: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    wals.sort();
    wals.pop().expect("a WAL file")
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Vote and entries 0..50, one synced append each, as openraft sends them.
async fn write_acknowledged(store: &mut llmgw_store::Store) {
    store
        .log
        .save_vote(&Vote::new_committed(1, 1))
        .await
        .unwrap();
    for index in 0..50 {
        store
            .log
            .append([entry(index)], IOFlushed::noop())
            .await
            .unwrap();
    }
}

/// Where a large batch (entries 50..400, more than one 32 KiB WAL block)
/// sits in the WAL, written after the 50 acknowledged entries.
struct Batch {
    wal: PathBuf,
    /// The WAL's length before and after the batch.
    from: u64,
    to: u64,
    /// The acknowledged record as it was before the batch.
    record_before: Vec<u8>,
}

/// Writes the acknowledged entries, then the batch; closes the store.
async fn a_batch_after_the_acknowledged(dir: &Path) -> Batch {
    let mut store = llmgw_store::open(dir).unwrap();
    write_acknowledged(&mut store).await;
    let wal = current_wal(dir);
    let from = len(&wal);
    let record_before = std::fs::read(dir.join("LLMGW-ACKNOWLEDGED")).unwrap();
    store
        .log
        .append((50..400).map(entry), IOFlushed::noop())
        .await
        .unwrap();
    let to = len(&wal);
    drop(store);
    Batch {
        wal,
        from,
        to,
        record_before,
    }
}

#[tokio::test]
async fn a_torn_last_record_is_dropped_and_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    // The append in flight when the power went: a large batch, so the cut
    // lands inside it.
    let Batch { wal, from, to, .. } = a_batch_after_the_acknowledged(dir.path()).await;
    let torn = from + (to - from) / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(torn)
        .unwrap();

    opens_with_what_was_acknowledged_and_keeps_working(dir.path()).await;
}

/// The store opens with the vote and the 50 acknowledged entries, none of
/// the torn batch, and goes on appending.
async fn opens_with_what_was_acknowledged_and_keeps_working(dir: &Path) {
    let mut store = llmgw_store::open(dir)
        .unwrap_or_else(|e| panic!("a torn unacknowledged tail must not stop the peer: {e}"));
    assert_eq!(
        store.log.read_vote().await.unwrap(),
        Some(Vote::new_committed(1, 1))
    );
    let entries = store.log.try_get_log_entries(0..1000).await.unwrap();
    assert_eq!(
        entries.len(),
        50,
        "every acknowledged entry, and none of the torn batch"
    );
    store
        .log
        .append([entry(50)], IOFlushed::noop())
        .await
        .unwrap();
    drop(store);
    let mut store = llmgw_store::open(dir).unwrap();
    let entries = store.log.try_get_log_entries(0..1000).await.unwrap();
    assert_eq!(entries.len(), 51);
}

#[tokio::test]
async fn a_torn_unsynced_committed_index_is_dropped_and_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = llmgw_store::open(dir.path()).unwrap();
    write_acknowledged(&mut store).await;
    let wal = current_wal(dir.path());
    let acknowledged = len(&wal);
    // `committed` is written without sync: a power cut can tear it.
    store.log.save_committed(Some(log_id(40))).await.unwrap();
    let in_flight = len(&wal);
    drop(store);
    assert!(in_flight > acknowledged + 1);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(in_flight - 1)
        .unwrap();
    let mut store = llmgw_store::open(dir.path())
        .unwrap_or_else(|e| panic!("a torn committed index must not stop the peer: {e}"));
    assert_eq!(store.log.read_committed().await.unwrap(), None);
    assert_eq!(
        store.log.try_get_log_entries(0..1000).await.unwrap().len(),
        50
    );
}

#[tokio::test]
async fn corruption_inside_synced_data_is_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = llmgw_store::open(dir.path()).unwrap();
    write_acknowledged(&mut store).await;
    drop(store);
    // Flip bytes in the middle of the WAL: records after it were synced
    // and acknowledged, so this is not a torn tail.
    let wal = current_wal(dir.path());
    let mut bytes = std::fs::read(&wal).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 16] {
        *b ^= 0x5a;
    }
    std::fs::write(&wal, bytes).unwrap();
    let error = llmgw_store::open(dir.path())
        .err()
        .expect("corrupt synced data must be refused");
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");
    let message = error.to_string();
    let name = wal.file_name().unwrap().to_string_lossy().into_owned();
    assert!(message.contains(&name), "names the file {name}: {message}");
    assert!(
        message.contains("initial_cluster_state: existing"),
        "says how to rejoin without forming a new cluster: {message}"
    );
}

/// Zeroes one 4 KiB block of `wal` inside `from..to` that holds no WAL
/// block header (those start every 32 KiB), as a file system exposes a
/// block the power cut left unwritten: the record keeps its full length
/// and fails its checksum.
fn zero_a_block_inside(wal: &Path, from: u64, to: u64) {
    const PAGE: u64 = 4096;
    const WAL_BLOCK: u64 = 32 * 1024;
    let start = (from + 7).div_ceil(PAGE) * PAGE;
    let start = (start..to)
        .step_by(PAGE as usize)
        .find(|at| at % WAL_BLOCK != 0 && at + PAGE <= to)
        .expect("a page inside the record");
    let mut bytes = std::fs::read(wal).unwrap();
    let length = bytes.len();
    bytes[start as usize..(start + PAGE) as usize].fill(0);
    std::fs::write(wal, &bytes).unwrap();
    assert_eq!(len(wal), length as u64, "the file keeps its length");
}

#[tokio::test]
async fn a_torn_last_record_of_full_length_is_dropped_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let batch = a_batch_after_the_acknowledged(dir.path()).await;
    // The power went while the batch was being written: the record (written
    // only after the WAL's sync) still names entry 49, and the batch's
    // record in the WAL has a page that never reached the disk.
    let record = dir.path().join("LLMGW-ACKNOWLEDGED");
    std::fs::write(&record, &batch.record_before).unwrap();
    zero_a_block_inside(&batch.wal, batch.from, batch.to);

    // Without the record nothing proves the damaged record unacknowledged:
    // refused, as before the record existed.
    let kept = std::fs::read(&record).unwrap();
    std::fs::remove_file(&record).unwrap();
    let refused = llmgw_store::open(dir.path())
        .err()
        .expect("a damaged full-length record with no record of what was acknowledged");
    assert!(matches!(refused, StoreError::Corrupt { .. }), "{refused}");
    std::fs::write(&record, &kept).unwrap();

    opens_with_what_was_acknowledged_and_keeps_working(dir.path()).await;
}

#[tokio::test]
async fn a_damaged_last_record_that_was_acknowledged_is_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    // The last write, synced and acknowledged: the batch.
    let Batch { wal, from, to, .. } = a_batch_after_the_acknowledged(dir.path()).await;
    zero_a_block_inside(&wal, from, to);
    let error = llmgw_store::open(dir.path())
        .err()
        .expect("an acknowledged record damaged must be refused");
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("acknowledged"), "{message}");
    assert!(message.contains("399"), "names the entry lost: {message}");
    let name = wal.file_name().unwrap().to_string_lossy().into_owned();
    assert!(message.contains(&name), "names the file {name}: {message}");
}
