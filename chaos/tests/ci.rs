//! The chaos suite's CI subset: a few short scenarios against a real cluster
//! in network namespaces, and proof that the checks can fail.
//!
//! The scenarios need root and `ip netns`; without them each test prints
//! `SKIPPED: <why>` and returns. They also need the `llmgw` binary: build
//! it first with `cargo build -p llmgw-cli` (or point `LLMGW_BIN` at one);
//! a missing binary fails the test with that instruction.

use std::collections::BTreeMap;

use llmgw_chaos::history::{OpRecord, Outcome};
use llmgw_chaos::invariants;
use llmgw_chaos::linearizability::{RegOp, RegRet};
use llmgw_chaos::{RunOptions, RunReport, scenario};
use llmgw_test_kit::{llmgw_bin, one_cluster_at_a_time};

fn options(forge: bool) -> RunOptions {
    options_with(forge, false)
}

fn options_with(forge: bool, forge_gpu: bool) -> RunOptions {
    RunOptions {
        bin: llmgw_bin(),
        work_dir: std::env::temp_dir().join("llmgw-chaos-tests"),
        keep: false,
        workers: 3,
        verbose: true,
        forge_leader_sample: forge,
        forge_gpu_double: forge_gpu,
    }
}

/// Runs one scenario, or `None` (after saying why) where namespaces are
/// not available.
fn run(name: &str, seed: u64, forge: bool) -> Option<RunReport> {
    run_with(name, seed, options(forge))
}

fn run_with(name: &str, seed: u64, options: RunOptions) -> Option<RunReport> {
    // One cluster at a time: three peers with fsync each on a 2-core machine.
    let _serial = one_cluster_at_a_time();
    if let Err(why) = llmgw_chaos::preflight() {
        llmgw_test_kit::skipped(&format!("chaos {name}"), &why);
        return None;
    }
    let scenario = scenario::find(name).expect("scenario in the catalogue");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let report = runtime
        .block_on(scenario::run(scenario, seed, &options))
        .unwrap_or_else(|e| panic!("{name} seed {seed} could not run: {e}"));
    print!("{}", llmgw_chaos::details(&report));
    print!("{}", llmgw_chaos::summary(std::slice::from_ref(&report)));
    Some(report)
}

/// Runs `scenario` with seed 1: every check in `checks` ran, and none was
/// violated.
fn runs_clean(scenario: &str, checks: &[&str]) {
    let Some(report) = run(scenario, 1, false) else {
        return;
    };
    for name in checks {
        checked(&report, name);
    }
    assert_eq!(report.violations(), 0, "{}", llmgw_chaos::details(&report));
}

fn checked<'a>(report: &'a RunReport, name: &str) -> &'a invariants::Checked {
    report
        .checked
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("invariant {name} was not checked: {report:?}"))
}

#[test]
fn leader_sigkill_keeps_every_invariant() {
    let Some(report) = run("leader-sigkill", 1, false) else {
        return;
    };
    for name in [
        invariants::LEADERSHIPS_FORWARD,
        invariants::LEADER_AFTER_HEALING,
        invariants::STATE_HASHES,
        invariants::ACKED_WRITES,
        invariants::LINEARIZABLE,
        invariants::NO_LEFTOVERS,
    ] {
        checked(&report, name);
    }
    assert_eq!(report.violations(), 0, "{}", llmgw_chaos::details(&report));
    assert!(
        report
            .faults
            .iter()
            .filter(|f| f.contains("SIGKILL"))
            .count()
            >= 2,
        "the leader was killed twice: {:?}",
        report.faults
    );
    assert!(report.ops_ok >= 20, "the load ran: {report:?}");
}

#[test]
fn a_forged_leadership_going_back_is_reported_as_that_exact_violation() {
    let Some(report) = run("leader-isolated-minority", 2, true) else {
        return;
    };
    let order = checked(&report, invariants::LEADERSHIPS_FORWARD);
    assert_eq!(
        order.violations.len(),
        1,
        "{}",
        llmgw_chaos::details(&report)
    );
    let violation = &order.violations[0];
    assert!(
        violation.starts_with("peer ") && violation.contains("its leadership went back"),
        "{violation}"
    );
    // Everything else held: the forged sample is the only violation.
    assert_eq!(report.violations(), 1, "{}", llmgw_chaos::details(&report));
    let kept = report
        .kept
        .as_ref()
        .expect("a run with a violation keeps its logs");
    assert!(kept.join("history.txt").exists());
    let _ = std::fs::remove_dir_all(kept);
}

#[test]
fn a_forged_double_gpu_assignment_is_reported_as_that_exact_violation() {
    // A real fleet scenario (agents, engines, routers, a stream cut below
    // the TTL) with one fabricated replica sample that puts a second
    // replica on a GPU a live shard holds.
    let Some(report) = run_with("agent-cut-below-ttl", 3, options_with(false, true)) else {
        return;
    };
    for name in [
        invariants::NO_UNREACHABLE_WHILE_HEALTHY,
        invariants::REPLICAS_READY_AFTER_HEALING,
        invariants::ROUTER_HEALTHY_SERVED,
        invariants::NO_DEPOSED_COMMAND,
        "cut-node-stayed-ready",
        "replicas-untouched",
    ] {
        let c = checked(&report, name);
        assert!(c.violations.is_empty(), "{}", llmgw_chaos::details(&report));
    }
    let gpu = checked(&report, invariants::NO_GPU_TWICE);
    assert_eq!(gpu.violations.len(), 1, "{}", llmgw_chaos::details(&report));
    let violation = &gpu.violations[0];
    assert!(
        violation.starts_with("node ")
            && violation.contains(" assigned to 2 live shards: ")
            && violation.contains("-forged rank 0"),
        "{violation}"
    );
    assert_eq!(report.violations(), 1, "{}", llmgw_chaos::details(&report));
    assert!(report.router_ok >= 10, "router load ran: {report:?}");
    let kept = report
        .kept
        .as_ref()
        .expect("a run with a violation keeps its logs");
    assert!(kept.join("fleet.txt").exists());
    let _ = std::fs::remove_dir_all(kept);
}

/// The leader cut off from both peers while agents and clients still reach
/// it, for twice `lost_after`: the majority elects a new leader and the
/// agents move to it; no node is marked down, no replica is retired, and
/// no engine is stopped.
#[test]
fn a_leader_cut_off_from_its_peers_costs_the_fleet_nothing() {
    let Some(report) = run("leader-cut-from-peers-fleet", 1, false) else {
        return;
    };
    for name in [
        invariants::NO_UNREACHABLE_WHILE_HEALTHY,
        invariants::NO_RETIREMENT_WHILE_REACHABLE,
        invariants::REPLICAS_READY_AFTER_HEALING,
        invariants::ROUTER_HEALTHY_SERVED,
        invariants::NO_DEPOSED_COMMAND,
        invariants::STATE_HASHES,
        invariants::ACKED_WRITES,
    ] {
        checked(&report, name);
    }
    assert_eq!(report.violations(), 0, "{}", llmgw_chaos::details(&report));
    assert!(report.router_ok >= 10, "router load ran: {report:?}");
}

/// The leader's data disk fills up under a fleet: it refuses writes as
/// `disk_full`, hands leadership over, the fleet does not notice, and it
/// takes writes again once space returns.
#[test]
fn a_leader_whose_disk_fills_hands_over_and_costs_the_fleet_nothing() {
    runs_clean(
        "leader-disk-full-fleet",
        &[
            "full-peer-refused-writes",
            "full-peer-gave-up-leadership",
            "full-peer-writes-again",
            invariants::NO_UNREACHABLE_WHILE_HEALTHY,
            invariants::NO_RETIREMENT_WHILE_REACHABLE,
            invariants::ROUTER_HEALTHY_SERVED,
            invariants::STATE_HASHES,
            invariants::ACKED_WRITES,
        ],
    );
}

/// Every peer's data disk fills up under a fleet: no peer has room to
/// lead, so leadership stays, writes are refused, and a node whose agent
/// was killed still goes unreachable, then lost.
#[test]
fn with_every_disk_full_leadership_stays_and_dead_nodes_are_still_found() {
    runs_clean(
        "every-disk-full-fleet",
        &[
            "full-peer-refused-writes",
            "all-full-killed-agent-node-lost",
            "all-full-leadership-kept",
            "full-peer-writes-again",
            invariants::ROUTER_HEALTHY_SERVED,
            invariants::STATE_HASHES,
            invariants::ACKED_WRITES,
        ],
    );
}

/// Peers 60 ms apart each way for a minute under a fleet, idle then under
/// load: with the round trip declared, one leadership holds and writes
/// are taken throughout.
#[test]
fn peers_far_apart_keep_one_leader_and_take_writes_idle_or_loaded() {
    runs_clean(
        "slow-peer-links-fleet",
        &[
            "slow-links-delay-in-effect",
            "slow-links-one-leadership",
            "slow-links-write-after-idle",
            "slow-links-writes-under-load",
            invariants::ROUTER_HEALTHY_SERVED,
            invariants::LINEARIZABLE,
        ],
    );
}

/// A burst of registrations at and past the registration bound, with a
/// follower paused: each is answered by its size, writes keep flowing,
/// and every peer converges afterwards.
#[test]
fn a_burst_of_maximum_size_registrations_is_answered_by_size_and_writes_flow() {
    runs_clean(
        "max-size-reports-burst-fleet",
        &[
            "burst-reports-answered-by-size",
            "burst-writes-kept-flowing",
            invariants::STATE_HASHES,
            invariants::ACKED_WRITES,
            invariants::LINEARIZABLE,
        ],
    );
}

/// Every peer restored from a backup after two elections: the restored
/// cluster begins a later epoch and its agents obey it, although its
/// terms are below the ones they obeyed.
#[test]
fn agents_obey_a_cluster_restored_after_two_elections() {
    runs_clean(
        "restore-after-elections-fleet",
        &[
            "restored-cluster-begins-a-later-epoch",
            "agents-obey-the-restored-cluster",
            invariants::LEADERSHIPS_FORWARD,
            invariants::NO_DEPOSED_COMMAND,
            invariants::STATE_HASHES,
            invariants::ACKED_WRITES,
        ],
    );
}

/// A model's rolling update whose leader is killed with a replacement in
/// flight: the new leader finishes it make-before-break, and no request
/// for the model fails.
#[test]
fn a_rollout_survives_its_leaders_death() {
    runs_clean(
        "leader-failover-during-rollout-fleet",
        &[
            "rollout-completed",
            "exactly-one-replacement",
            "ready-never-below-desired",
            invariants::ROUTER_HEALTHY_SERVED,
            invariants::NO_RETIREMENT_WHILE_REACHABLE,
            invariants::NO_GPU_TWICE,
        ],
    );
}

/// An autoscaled scale-up whose leader is killed right after it placed
/// the new replica: that replica serves, no second one is placed, and the
/// load that asked for it is answered.
#[test]
fn a_scale_up_survives_its_leaders_death() {
    runs_clean(
        "leader-failover-during-scale-up-fleet",
        &[
            "scale-up-carried-on",
            "one-replica-added",
            "long-chats-answered",
            invariants::ROUTER_HEALTHY_SERVED,
            invariants::NO_GPU_TWICE,
        ],
    );
}

/// A developer's entry point: `CHAOS_SCENARIO=name CHAOS_SEED=n cargo test
/// -p llmgw-chaos --test ci -- --ignored --nocapture one_named_scenario`.
#[test]
#[ignore = "runs the scenario named in CHAOS_SCENARIO"]
fn one_named_scenario() {
    let name = std::env::var("CHAOS_SCENARIO").expect("CHAOS_SCENARIO names a scenario");
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut options = options(false);
    options.keep = std::env::var_os("CHAOS_KEEP").is_some();
    let Some(report) = run_with(&name, seed, options) else {
        return;
    };
    assert_eq!(report.violations(), 0, "{}", llmgw_chaos::details(&report));
}

fn op(
    id: u64,
    key: &str,
    op: RegOp,
    outcome: Outcome,
    invoke_us: u64,
    complete_us: u64,
) -> OpRecord {
    OpRecord {
        id,
        worker: 0,
        peer: 1,
        key: key.to_owned(),
        op,
        invoke_us,
        complete_us,
        outcome,
    }
}

#[test]
fn a_fabricated_lost_write_fails_linearizability_and_presence() {
    // The shape of a write acknowledged by a deposed leader: acked, then
    // read as absent, and missing from a peer's catalog.
    let ops = vec![
        op(
            1,
            "reg-0",
            RegOp::Write("a".into()),
            Outcome::Ok(RegRet::Ok),
            0,
            10,
        ),
        op(
            2,
            "reg-0",
            RegOp::Write("b".into()),
            Outcome::Ok(RegRet::Ok),
            20,
            30,
        ),
        op(
            3,
            "reg-0",
            RegOp::Read,
            Outcome::Ok(RegRet::Value(Some("a".into()))),
            40,
            50,
        ),
        op(
            4,
            "once-x",
            RegOp::Write("x1".into()),
            Outcome::Ok(RegRet::Ok),
            0,
            5,
        ),
        op(
            5,
            "reg-1",
            RegOp::Write("c".into()),
            Outcome::Unknown("timed out".into()),
            0,
            5,
        ),
        op(
            6,
            "reg-1",
            RegOp::Read,
            Outcome::Ok(RegRet::Value(None)),
            60,
            70,
        ),
    ];
    let lin = invariants::linearizable(&ops);
    assert_eq!(lin.violations.len(), 1, "{lin:?}");
    assert!(lin.violations[0].starts_with("key reg-0: "), "{lin:?}");
    assert!(lin.violations[0].contains("op 3"), "{lin:?}");

    let mut catalogs = BTreeMap::new();
    catalogs.insert(
        1,
        Ok(BTreeMap::from([(
            "once-x".to_owned(),
            Some("x1".to_owned()),
        )])),
    );
    catalogs.insert(2, Ok(BTreeMap::new()));
    let present = invariants::acknowledged_writes(&ops, &catalogs);
    assert_eq!(
        present.violations,
        vec!["peer 2 lacks 1 of 1 acknowledged writes: once-x".to_owned()]
    );
}
