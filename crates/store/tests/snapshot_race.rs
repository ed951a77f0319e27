//! Building and installing snapshots at the same time, as openraft does: it
//! builds in a task of its own and may install a newer snapshot from the
//! leader meanwhile. The stored snapshot must never go back, meta and data
//! must always belong together, and the store must reopen afterwards.

use llmgw_state::{Command, FleetState};
use llmgw_store::{Entry, LogId, StateMachineStore, StoredMembership, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, Membership, RaftSnapshotBuilder};

type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

/// Models in the base state: enough JSON (about 1.5 MB) that building a
/// snapshot takes long enough for an install to land in the middle.
const MODELS: usize = 4_000;
const ITERATIONS: u64 = 40;

fn log_id(index: u64) -> LogId {
    LogId::new(
        openraft::impls::leader_id_adv::LeaderId {
            term: 1,
            node_id: 1,
        },
        index,
    )
}

/// Every state in this test carries its own index as the highest retired
/// peer id, so a snapshot's data says which index it is.
fn marker(fleet: &FleetState) -> Option<u64> {
    fleet.removed_peers.iter().next_back().copied()
}

fn membership() -> StoredMembership {
    StoredMembership::new(
        Some(log_id(0)),
        Membership::new_with_defaults(vec![[1].into()], [1]),
    )
}

fn base_fleet() -> FleetState {
    let mut fleet = FleetState::default();
    for i in 0..MODELS {
        fleet.apply(&Command::PutModel {
            name: format!("model-{i:05}"),
            spec: llmgw_state::ModelSpec::from_stored(serde_json::json!({
                "source": format!("org/some-rather-long-model-name-{i}"),
                "profiles": [{"name": "tp1", "engine": "vllm", "gpus_per_node": 1,
                              "engine_args": ["--max-model-len", "8192", "--enable-prefix-caching"]}],
            })),
            replicas: 1,
            at_ms: i as u64,
        });
    }
    fleet
}

fn snapshot_of(fleet: &FleetState, index: u64) -> (SnapshotMeta, Vec<u8>) {
    let mut fleet = fleet.clone();
    fleet.apply(&Command::RetirePeer {
        peer: index,
        at_ms: index,
    });
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(index)),
        last_membership: membership(),
    };
    (meta, serde_json::to_vec(&fleet).unwrap())
}

async fn apply_one(sm: &mut StateMachineStore, index: u64) {
    let entry = Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command::RetirePeer {
            peer: index,
            at_ms: index,
        }),
    };
    let stream = futures::stream::iter([Ok((entry, None))]);
    sm.apply(stream).await.expect("apply");
}

/// Meta and data of a stored snapshot must describe the same index.
fn check_pair(meta: &SnapshotMeta, data: &[u8]) -> Result<u64, String> {
    let fleet: FleetState = serde_json::from_slice(data).map_err(|e| e.to_string())?;
    let meta_index = meta.last_log_id.map(|id| id.index);
    if marker(&fleet) != meta_index {
        return Err(format!(
            "snapshot meta says index {meta_index:?} but its data is the state at {:?}",
            marker(&fleet)
        ));
    }
    Ok(meta_index.unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_build_and_install_never_store_an_older_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = llmgw_store::open(dir.path()).expect("open");
    let mut log = store.log;
    let mut sm = store.state_machine;
    let base = base_fleet();
    let (meta, data) = snapshot_of(&base, 1);
    sm.install_snapshot(&meta, data)
        .await
        .expect("install base");

    let mut problems = Vec::new();
    let mut installed = 1;
    for _ in 0..ITERATIONS {
        // Apply one entry (state A), then build a snapshot of A while a
        // newer snapshot B from "the leader" is installed.
        let a = installed + 1;
        apply_one(&mut sm, a).await;
        let b = a + 5;
        let fleet_b = sm.applied().read().unwrap().fleet.clone();
        let (meta_b, data_b) = snapshot_of(&fleet_b, b);

        let mut builder = sm.get_snapshot_builder().await;
        let build = tokio::spawn(async move { builder.build_snapshot().await });
        let mut installer = sm.clone();
        let install =
            tokio::spawn(async move { installer.install_snapshot(&meta_b, data_b).await });
        let mut reader = sm.clone();
        let read = tokio::spawn(async move {
            let mut torn = Vec::new();
            for _ in 0..4 {
                if let Some(s) = reader.get_current_snapshot().await.expect("read snapshot")
                    && let Err(why) = check_pair(&s.meta, &s.snapshot)
                {
                    torn.push(why);
                }
                tokio::task::yield_now().await;
            }
            torn
        });
        let built = build.await.unwrap().expect("build");
        install.await.unwrap().expect("install");
        problems.extend(read.await.unwrap());
        if let Err(why) = check_pair(&built.meta, &built.snapshot) {
            problems.push(format!("the built snapshot: {why}"));
        }
        installed = b;
        // openraft purges the log behind an installed snapshot.
        log.purge(log_id(b)).await.expect("purge");

        let stored = sm
            .get_current_snapshot()
            .await
            .expect("read snapshot")
            .expect("a snapshot is stored");
        match check_pair(&stored.meta, &stored.snapshot) {
            Ok(index) if index < b => {
                problems.push(format!(
                    "after installing {b} the stored snapshot went back to {index}"
                ));
                break;
            }
            Ok(_) => {}
            Err(why) => problems.push(why),
        }
    }
    drop((log, sm));
    let reopened = llmgw_store::open(dir.path());
    assert!(
        problems.is_empty(),
        "{} problem(s), first: {}; reopening: {:?}",
        problems.len(),
        problems[0],
        reopened.as_ref().err().map(ToString::to_string)
    );
    let mut reopened = reopened.expect("the store reopens after the race");
    let (index, _) = reopened.state_machine.state_hash();
    assert_eq!(index, Some(installed));
    let applied = reopened.state_machine.applied();
    assert_eq!(marker(&applied.read().unwrap().fleet), Some(installed));
    let stored = reopened
        .state_machine
        .get_current_snapshot()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(check_pair(&stored.meta, &stored.snapshot), Ok(installed));
}
