//! What survives a reopen, and what a damaged database does on open.

use std::path::Path;

use llmgw_state::Command;
use llmgw_store::{Entry, LogId, StoreError, Vote};
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{EntryPayload, RaftLogReader};

fn entry(index: u64) -> Entry {
    Entry {
        log_id: LogId::new(
            openraft::impls::leader_id_adv::LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(Command::RetirePeer {
            peer: index,
            at_ms: index,
        }),
    }
}

async fn write_some(dir: &Path) {
    let mut store = llmgw_store::open(dir).expect("open a fresh store");
    store
        .log
        .save_vote(&Vote::new_committed(1, 1))
        .await
        .expect("save vote");
    store
        .log
        .append((0..50).map(entry), IOFlushed::noop())
        .await
        .expect("append");
}

fn files_with_suffix(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect()
}

#[tokio::test]
async fn vote_and_log_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    write_some(dir.path()).await;
    let mut store = llmgw_store::open(dir.path()).expect("reopen");
    assert_eq!(
        store.log.read_vote().await.unwrap(),
        Some(Vote::new_committed(1, 1))
    );
    let entries = store.log.try_get_log_entries(0..50).await.unwrap();
    assert_eq!(entries.len(), 50);
    assert_eq!(entries[49].log_id.index, 49);
    assert!(!store.is_pristine());
}

#[tokio::test]
async fn a_new_store_is_pristine() {
    let dir = tempfile::tempdir().unwrap();
    let store = llmgw_store::open(dir.path()).expect("open");
    assert!(store.is_pristine());
    drop(store);
    let store = llmgw_store::open(dir.path()).expect("reopen an empty store");
    assert!(store.is_pristine());
}

#[tokio::test]
async fn a_store_whose_wal_was_deleted_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    write_some(dir.path()).await;
    let wals = files_with_suffix(dir.path(), ".log");
    assert!(!wals.is_empty(), "the writes are in the WAL");
    for wal in wals {
        std::fs::remove_file(wal).unwrap();
    }
    let error = llmgw_store::open(dir.path()).err().expect("must refuse");
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");
    assert!(
        error.to_string().contains("corrupt or truncated"),
        "{error}"
    );
}

// A WAL cut short is what a power cut leaves: tests/torn_tail.rs shows it
// opening without the torn record, and corruption inside synced data
// still refused.
