//! A stop the agent began and did not finish before it restarted: the
//! restarted agent finishes it, and reports the shard stopped, not adopted
//! as running and not failed.

mod support;

use std::time::Duration;

use llmgw_catalog::Engine;
use llmgw_proto::agent::ShardState;
use llmgw_test_kit::{free_port, wait_until};
use support::*;

const LONG: Duration = Duration::from_secs(60);

fn stop_recorded(h: &Harness, shard: &str) -> bool {
    llmgw_agent::read_state_files(h.dir.path())
        .into_iter()
        .filter_map(|(_, read)| read.ok())
        .any(|r| r.shard_id == shard && r.stopping.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_still_waiting_for_the_engine_is_finished_by_the_restarted_agent() {
    // The first agent would wait 60 s for the engine to honour SIGTERM.
    let mut h = Harness::new(&NodeSetup {
        stop_timeout: Duration::from_secs(60),
        ..NodeSetup::default()
    });
    let mut s = spec("stubborn", Engine::Vllm, &[0], free_port());
    s.env
        .insert("LLMGW_SIM_FAULT".into(), "ignore_sigterm".into());
    assert!(h.start(s).accepted);
    h.wait_for("stubborn", ShardState::Ready, LONG).await;
    let pgid = h.supervisor.pids("stubborn")[0];
    assert!(h.supervisor.stop("stubborn", "moved elsewhere").accepted);
    assert!(
        wait_until(LONG, || async { stop_recorded(&h, "stubborn") }).await,
        "the stop never reached the state file"
    );

    // The agent restarts while its stop waits.
    let adoptions = h.restart(&NodeSetup {
        stop_timeout: Duration::from_secs(1),
        ..NodeSetup::default()
    });
    assert!(
        matches!(
            adoptions.as_slice(),
            [llmgw_agent::Adoption::Adopted { .. }]
        ),
        "{adoptions:?}"
    );
    let stopped = h.wait_for("stubborn", ShardState::Stopped, LONG).await;
    assert!(
        stopped
            .message
            .starts_with("stopped: moved elsewhere (finished by the restarted agent)"),
        "{}",
        stopped.message
    );
    assert!(
        stopped.message.contains("killed with SIGKILL"),
        "{}",
        stopped.message
    );
    assert_eq!(
        h.states("stubborn"),
        [ShardState::Stopped],
        "never reported loading or ready again"
    );
    assert!(llmgw_agent::group_members(pgid).is_empty());
    assert!(llmgw_agent::read_state_files(h.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_ended_during_its_stop_while_the_agent_was_down_is_stopped_not_failed() {
    let setup = NodeSetup::default();
    let mut h = Harness::new(&setup);
    assert!(
        h.start(spec("leaving", Engine::Vllm, &[0], free_port()))
            .accepted
    );
    h.wait_for("leaving", ShardState::Ready, LONG).await;
    let record_path = llmgw_agent::shards_dir(h.dir.path()).join("leaving.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    assert!(h.supervisor.stop("leaving", "moved elsewhere").accepted);
    h.wait_for("leaving", ShardState::Stopped, LONG).await;
    // The agent "died" after recording the stop and before the engine was
    // gone: its state file says so, and the engine then ended.
    record["stopping"] = "stopped: moved elsewhere".into();
    std::fs::write(&record_path, serde_json::to_vec(&record).unwrap()).unwrap();

    let adoptions = h.restart(&setup);
    assert!(
        matches!(adoptions.as_slice(), [llmgw_agent::Adoption::Stale { .. }]),
        "{adoptions:?}"
    );
    let reported = h.wait_for("leaving", ShardState::Stopped, LONG).await;
    assert_eq!(
        reported.message,
        "stopped: moved elsewhere; the engine ended while the agent was restarting"
    );
    assert_eq!(h.states("leaving"), [ShardState::Stopped]);
    assert!(llmgw_agent::read_state_files(h.dir.path()).is_empty());
}
