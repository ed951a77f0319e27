//! openraft's own storage test suite, run against the RocksDB store.

use llmgw_store::{LogStore, StateMachineStore, TypeConfig};
use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use tempfile::TempDir;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for RocksBuilder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = llmgw_store::open(dir.path()).expect("open a fresh store");
        Ok((dir, store.log, store.state_machine))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(RocksBuilder).await
}
