//! Shard state files after a power cut: a torn or empty file never leaves
//! an engine running that the agent does not know about, and a last good
//! copy is used when there is one.

mod support;

use std::time::Duration;

use llmgw_agent::{Adoption, group_members};
use llmgw_catalog::Engine;
use llmgw_proto::agent::ShardState;
use llmgw_test_kit::{free_port, wait_until};
use support::*;

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_state_file_never_leaves_an_engine_nobody_tracks() {
    let setup = NodeSetup::default();
    let mut h = Harness::new(&setup);
    let port = free_port();
    assert!(h.start(spec("torn", Engine::Vllm, &[0], port)).accepted);
    h.wait_for("torn", ShardState::Ready, LONG).await;
    let pids = h.supervisor.pids("torn");
    let file = llmgw_agent::shards_dir(h.dir.path()).join("torn.json");
    // What a power cut does to a file renamed into place without fsync.
    std::fs::write(&file, b"").unwrap();

    let adoptions = h.restart(&setup);
    let adopted = adoptions
        .iter()
        .any(|a| matches!(a, Adoption::Adopted { shard_id, .. } if shard_id == "torn"));
    if !adopted {
        // Not adopted: then the engine must not be left holding its GPU
        // and port behind the agent's back.
        assert!(
            wait_until(LONG, || async { group_members(pids[0]).is_empty() }).await,
            "the untracked engine was not stopped"
        );
        let why = adoptions
            .iter()
            .find_map(|a| match a {
                Adoption::Stale { file, why } if file.ends_with("torn.json") => Some(why.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("the torn file is reported: {adoptions:?}"));
        assert!(why.contains("stopped"), "{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_state_file_falls_back_to_the_last_good_copy() {
    let setup = NodeSetup::default();
    let mut h = Harness::new(&setup);
    let port = free_port();
    assert!(h.start(spec("keep", Engine::Vllm, &[0], port)).accepted);
    let ready = h.wait_for("keep", ShardState::Ready, LONG).await;
    let pids = h.supervisor.pids("keep");
    let shards = llmgw_agent::shards_dir(h.dir.path());
    // The last good copy, and a newer write torn in the middle.
    let good = std::fs::read(shards.join("keep.json")).unwrap();
    std::fs::write(shards.join("keep.json.prev"), &good).unwrap();
    std::fs::write(shards.join("keep.json"), &good[..good.len() / 2]).unwrap();

    let adoptions = h.restart(&setup);
    assert!(
        adoptions.contains(&Adoption::Adopted {
            shard_id: "keep".into(),
            pids: pids.clone()
        }),
        "{adoptions:?}"
    );
    let adopted = h.wait_for("keep", ShardState::Ready, LONG).await;
    assert_eq!(adopted.pid, ready.pid);
    assert_eq!(completion(port, 4).unwrap().0, 200);
    // The good copy is back in place for the next restart.
    let records = llmgw_agent::read_state_files(h.dir.path());
    assert!(
        records
            .iter()
            .any(|(p, r)| p.ends_with("keep.json") && r.is_ok()),
        "{records:?}"
    );
    assert!(h.supervisor.stop("keep", "test").accepted);
    h.wait_for("keep", ShardState::Stopped, LONG).await;
}
