use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::{
    Command, FleetState, Gpu, KvEventPorts, Leadership, ModelSpec, NodeInventory, NodeStatus,
    Outcome, RejectionKind, ReplicaState, ScaleDecision, SeedModel, Shard, ShardFailure,
    ShardState,
};

fn register(id: &str, at_ms: u64) -> Command {
    Command::RegisterNode {
        id: id.to_owned(),
        mgmt_addr: format!("10.0.0.1:{}", 7000 + id.len()),
        inventory: NodeInventory {
            hostname: id.to_owned(),
            gpus: (0..4)
                .map(|index| Gpu {
                    index,
                    model: "H100".to_owned(),
                    memory_mb: 81_920,
                    nvlink_peers: vec![],
                    ..Gpu::default()
                })
                .collect(),
            engines: vec!["vllm".to_owned()],
            ..NodeInventory::default()
        },
        fabrics: vec!["ib-a".to_owned()],
        labels: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
        at_ms,
    }
}

fn put_model(name: &str, replicas: u32) -> Command {
    Command::PutModel {
        name: name.to_owned(),
        spec: ModelSpec::from_stored(serde_json::json!({
            "name": name, "source": format!("org/{name}"), "replicas": replicas, "profiles": [],
        })),
        replicas,
        at_ms: 5,
    }
}

/// A model between 1 and 4 replicas, starting at `replicas`.
fn put_autoscaled_model(name: &str, replicas: u32, max: u32) -> Command {
    put_sleepy_model(name, replicas, max, None)
}

/// An autoscaled model, in sleep mode when `sleep_after` is some.
fn put_sleepy_model(name: &str, replicas: u32, max: u32, sleep_after: Option<&str>) -> Command {
    Command::PutModel {
        name: name.to_owned(),
        spec: ModelSpec::from_stored(serde_json::json!({
            "name": name, "source": format!("org/{name}"), "replicas": replicas, "profiles": [],
            "autoscale": {"min_replicas": 1, "max_replicas": max,
                          "target_requests_per_replica": 8,
                          "scale_up_window": "30s", "scale_down_window": "5m",
                          "sleep_after": sleep_after},
        })),
        replicas,
        at_ms: 5,
    }
}

fn scale(name: &str, from: u32, to: u32) -> Command {
    Command::ScaleModel {
        name: name.to_owned(),
        decision: ScaleDecision {
            from,
            to,
            requests_low: 20,
            requests_high: 30,
            ready_replicas: from,
            target_per_replica: 8,
            window_ms: 30_000,
            at_ms: 9,
            woken_by_request: false,
            yielded_to: None,
            above_target: None,
            saturated: false,
            released_for_waiting: false,
        },
        at_ms: 9,
    }
}

fn shard(node: &str, gpus: &[u32], rank: u32) -> Shard {
    Shard {
        node: node.to_owned(),
        gpus: gpus.to_vec(),
        // Distinct per GPU: every test node shares one host.
        port: 9000 + 10 * gpus.first().copied().unwrap_or(0) as u16 + rank as u16,
        rank,
        state: ShardState::Ready,
        pid: Some(1),
        last_failure: None,
        state_changed_at_ms: 0,
        report_seq: 0,
    }
}

fn place(id: &str, model: &str, shards: Vec<Shard>) -> Command {
    Command::PlaceReplica {
        id: id.to_owned(),
        model: model.to_owned(),
        profile: "tp1".to_owned(),
        shards,
        fabric: None,
        rendezvous_port: None,
        replaces: None,
        spec_fingerprint: None,
        served_names: None,
        kv_event_ports: None,
        at_ms: 10,
    }
}

fn rejected_kind(outcome: Outcome) -> RejectionKind {
    match outcome {
        Outcome::Rejected(rejection) => rejection.kind,
        Outcome::Applied => panic!("expected a rejection"),
    }
}

#[test]
fn register_creates_a_ready_node_and_reregistration_keeps_the_cordon() {
    let mut state = FleetState::default();
    assert_eq!(state.apply(&register("gpu-1", 1)), Outcome::Applied);
    assert_eq!(state.nodes["gpu-1"].status, NodeStatus::Ready);
    state.apply(&Command::Cordon {
        id: "gpu-1".into(),
        at_ms: 2,
    });
    state.apply(&Command::SetNodeStatus {
        id: "gpu-1".into(),
        status: NodeStatus::Lost,
        based_on: None,
        at_ms: 3,
    });
    state.apply(&register("gpu-1", 4));
    let node = &state.nodes["gpu-1"];
    assert!(node.cordoned, "re-registration must not lift a cordon");
    assert_eq!(node.status, NodeStatus::Ready);
    assert_eq!(node.status_changed_at_ms, 4);
    assert_eq!(node.registered_at_ms, 1);
}

#[test]
fn commands_on_unknown_nodes_are_rejected_without_change() {
    let mut state = FleetState::default();
    let before = state.hash();
    for command in [
        Command::Cordon {
            id: "nope".into(),
            at_ms: 1,
        },
        Command::SetNodeStatus {
            id: "nope".into(),
            status: NodeStatus::Unreachable,
            based_on: None,
            at_ms: 1,
        },
        Command::StartDrain {
            id: "nope".into(),
            deadline_ms: 9,
            at_ms: 1,
        },
    ] {
        assert_eq!(
            rejected_kind(state.apply(&command)),
            RejectionKind::NotFound
        );
    }
    assert_eq!(state.hash(), before);
}

#[test]
fn drain_cordons_and_blocks_uncordon_until_finished() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    let drain = Command::StartDrain {
        id: "gpu-1".into(),
        deadline_ms: 100,
        at_ms: 2,
    };
    assert_eq!(state.apply(&drain), Outcome::Applied);
    assert!(state.nodes["gpu-1"].cordoned && state.nodes["gpu-1"].draining);
    assert_eq!(rejected_kind(state.apply(&drain)), RejectionKind::Conflict);
    let uncordon = Command::Uncordon {
        id: "gpu-1".into(),
        at_ms: 3,
    };
    assert_eq!(
        rejected_kind(state.apply(&uncordon)),
        RejectionKind::Conflict
    );
    state.apply(&Command::FinishDrain {
        id: "gpu-1".into(),
        at_ms: 4,
    });
    assert!(state.drains.is_empty());
    assert!(
        state.nodes["gpu-1"].cordoned,
        "a drained node stays cordoned"
    );
    assert_eq!(state.apply(&uncordon), Outcome::Applied);
    assert!(!state.nodes["gpu-1"].cordoned);
}

#[test]
fn placement_is_checked_against_catalog_nodes_ranks_and_gpus() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    let unknown_model = place("r1", "llama", vec![shard("gpu-1", &[0], 0)]);
    assert_eq!(
        rejected_kind(state.apply(&unknown_model)),
        RejectionKind::NotFound
    );
    state.apply(&put_model("llama", 2));
    assert_eq!(state.apply(&unknown_model), Outcome::Applied);
    let placed = &state.replicas["r1"];
    assert_eq!(
        placed.shards[0].state,
        ShardState::Pending,
        "placement starts pending"
    );
    assert_eq!(placed.state(), ReplicaState::Placed);

    let same_gpu = place("r2", "llama", vec![shard("gpu-1", &[0, 1], 0)]);
    assert_eq!(
        rejected_kind(state.apply(&same_gpu)),
        RejectionKind::Conflict
    );
    let gap = place("r3", "llama", vec![shard("gpu-1", &[2], 1)]);
    assert_eq!(rejected_kind(state.apply(&gap)), RejectionKind::Invalid);
    let other_node = place("r4", "llama", vec![shard("gpu-9", &[2], 0)]);
    assert_eq!(
        rejected_kind(state.apply(&other_node)),
        RejectionKind::NotFound
    );
    let duplicate = place("r1", "llama", vec![shard("gpu-1", &[3], 0)]);
    assert_eq!(
        rejected_kind(state.apply(&duplicate)),
        RejectionKind::Conflict
    );
    // GPUs the node does not have, or one GPU given to a replica twice.
    let absent = place("r5", "llama", vec![shard("gpu-1", &[7], 0)]);
    assert_eq!(rejected_kind(state.apply(&absent)), RejectionKind::Invalid);
    let twice_in_a_shard = place("r6", "llama", vec![shard("gpu-1", &[2, 2], 0)]);
    assert_eq!(
        rejected_kind(state.apply(&twice_in_a_shard)),
        RejectionKind::Invalid
    );
    let twice_across_ranks = place(
        "r7",
        "llama",
        vec![shard("gpu-1", &[2], 0), shard("gpu-1", &[2], 1)],
    );
    assert_eq!(
        rejected_kind(state.apply(&twice_across_ranks)),
        RejectionKind::Invalid
    );
    assert_eq!(state.replicas.keys().collect::<Vec<_>>(), ["r1"]);
}

#[test]
fn shard_transitions_keep_the_last_failure() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    state.apply(&put_model("llama", 1));
    state.apply(&place("r1", "llama", vec![shard("gpu-1", &[0], 0)]));
    let failure = ShardFailure {
        message: "exit status 1".into(),
        output_tail: vec!["CUDA out of memory".into()],
        at_ms: 20,
    };
    state.apply(&Command::SetShardState {
        replica: "r1".into(),
        rank: 0,
        state: ShardState::Failed,
        pid: None,
        failure: Some(failure.clone()),
        seq: 0,
        at_ms: 20,
    });
    assert_eq!(state.replicas["r1"].state(), ReplicaState::Failed);
    state.apply(&Command::SetShardState {
        replica: "r1".into(),
        rank: 0,
        state: ShardState::Ready,
        pid: Some(42),
        failure: None,
        seq: 0,
        at_ms: 30,
    });
    let shard = &state.replicas["r1"].shards[0];
    assert_eq!(shard.pid, Some(42));
    assert_eq!(shard.last_failure.as_ref(), Some(&failure));
    assert_eq!(state.replicas["r1"].state(), ReplicaState::Ready);
    let bad_rank = Command::SetShardState {
        replica: "r1".into(),
        rank: 7,
        state: ShardState::Ready,
        pid: None,
        failure: None,
        seq: 0,
        at_ms: 31,
    };
    assert_eq!(
        rejected_kind(state.apply(&bad_rank)),
        RejectionKind::NotFound
    );
}

#[test]
fn a_stop_order_drains_then_stops_and_the_first_order_stands() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    state.apply(&put_model("llama", 1));
    state.apply(&place("r1", "llama", vec![shard("gpu-1", &[0], 0)]));
    assert_eq!(state.replicas["r1"].state(), ReplicaState::Placed);
    set_shard(&mut state, ShardState::Ready);
    assert_eq!(state.replicas["r1"].state(), ReplicaState::Ready);
    let drain = Command::StopReplica {
        id: "r1".into(),
        reason: "node gpu-1 drains".into(),
        drain_deadline_ms: Some(500),
        at_ms: 40,
    };
    assert_eq!(state.apply(&drain), Outcome::Applied);
    assert_eq!(state.replicas["r1"].state(), ReplicaState::Draining);
    let stop = Command::StopReplica {
        id: "r1".into(),
        reason: "scaled down".into(),
        drain_deadline_ms: None,
        at_ms: 50,
    };
    assert_eq!(state.apply(&stop), Outcome::Applied);
    let order = state.replicas["r1"].stop.clone().unwrap();
    assert_eq!(order.reason, "node gpu-1 drains");
    assert_eq!(order.drain_deadline_ms, Some(500));
    set_shard(&mut state, ShardState::Stopped);
    assert_eq!(state.replicas["r1"].state(), ReplicaState::Stopped);
    assert_eq!(
        state.gpu_holder("gpu-1", 0),
        None,
        "a stopped shard frees its GPUs"
    );
}

#[test]
fn removing_a_failed_replica_keeps_its_failure_on_the_model() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    state.apply(&put_model("llama", 1));
    state.apply(&place("r1", "llama", vec![shard("gpu-1", &[0], 0)]));
    let failure = crate::ReplicaFailure {
        replica: "r1".into(),
        node: "gpu-1".into(),
        failure: ShardFailure {
            message: "exit status 1".into(),
            output_tail: vec!["torch.OutOfMemoryError: CUDA out of memory".into()],
            at_ms: 60,
        },
    };
    let remove = Command::RemoveReplica {
        id: "r1".into(),
        failure: Some(failure.clone()),
        at_ms: 60,
    };
    assert_eq!(state.apply(&remove), Outcome::Applied);
    assert!(state.replicas.is_empty());
    assert_eq!(state.models["llama"].last_failure.as_ref(), Some(&failure));
    state.apply(&put_model("llama", 3));
    assert_eq!(
        state.models["llama"].last_failure.as_ref(),
        Some(&failure),
        "scaling keeps the failure"
    );
}

fn set_shard(state: &mut FleetState, shard_state: ShardState) {
    let command = Command::SetShardState {
        replica: "r1".into(),
        rank: 0,
        state: shard_state,
        pid: Some(7),
        failure: None,
        seq: 0,
        at_ms: 30,
    };
    assert_eq!(state.apply(&command), Outcome::Applied);
}

#[test]
fn an_unknown_command_from_a_newer_peer_decodes_and_is_a_no_op() {
    let wire = r#"{"type":"rebalance_fabric","fabric":"ib-a","at_ms":5}"#;
    let command: Command = serde_json::from_str(wire).expect("unknown tag decodes");
    assert_eq!(command, Command::Unknown);
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    let before = state.hash();
    assert_eq!(state.apply(&command), Outcome::Applied);
    assert_eq!(state.hash(), before);
}

#[test]
fn a_superseded_leaderships_decisions_are_refused_at_apply() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    let old = Leadership { term: 4, leader: 1 };
    let new = Leadership { term: 5, leader: 2 };
    // The old leader judged the node down from a stale table; its decision
    // reached the log only under the new leadership (forwarded, or
    // proposed again after a re-election).
    let stale = Command::Decided {
        leader: old,
        commands: vec![Command::SetNodeStatus {
            id: "gpu-1".into(),
            status: NodeStatus::Unreachable,
            based_on: None,
            at_ms: 2,
        }],
        at_ms: 2,
    };
    let before = state.hash();
    assert_eq!(
        rejected_kind(state.apply_entry(new, &stale)),
        RejectionKind::Conflict
    );
    assert_eq!(state.hash(), before, "a refused decision changes nothing");
    assert_eq!(state.nodes["gpu-1"].status, NodeStatus::Ready);
    // A second leader of the same term is another leadership too.
    let same_term = Leadership { term: 4, leader: 3 };
    assert_eq!(
        rejected_kind(state.apply_entry(same_term, &stale)),
        RejectionKind::Conflict
    );
    // Appended by the leadership that decided it, it applies.
    assert_eq!(state.apply_entry(old, &stale), Outcome::Applied);
    assert_eq!(state.nodes["gpu-1"].status, NodeStatus::Unreachable);
    // Commands outside `Decided` (operators' writes, agents' reports) apply
    // whoever appended them.
    assert_eq!(
        state.apply_entry(new, &register("gpu-2", 3)),
        Outcome::Applied
    );
}

#[test]
fn a_decision_nested_in_a_batch_never_escapes_the_leadership_check() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    let old = Leadership { term: 4, leader: 1 };
    let new = Leadership { term: 5, leader: 2 };
    let verdict = |status| Command::SetNodeStatus {
        id: "gpu-1".into(),
        status,
        based_on: None,
        at_ms: 2,
    };
    let smuggled = Command::Batch {
        commands: vec![
            Command::Decided {
                leader: old,
                commands: vec![verdict(NodeStatus::Lost)],
                at_ms: 2,
            },
            Command::Cordon {
                id: "gpu-1".into(),
                at_ms: 2,
            },
        ],
        at_ms: 2,
    };
    assert_eq!(state.apply_entry(new, &smuggled), Outcome::Applied);
    assert_eq!(state.nodes["gpu-1"].status, NodeStatus::Ready);
    assert!(
        state.nodes["gpu-1"].cordoned,
        "the batch's own command applies"
    );
    // Even by the leadership it names: only the entry's own command counts.
    let nested = Command::Decided {
        leader: old,
        commands: vec![Command::Decided {
            leader: old,
            commands: vec![verdict(NodeStatus::Lost)],
            at_ms: 3,
        }],
        at_ms: 3,
    };
    assert_eq!(state.apply_entry(old, &nested), Outcome::Applied);
    assert_eq!(state.nodes["gpu-1"].status, NodeStatus::Ready);
}

fn report(state: ShardState, seq: u64) -> Command {
    Command::SetShardState {
        replica: "r1".into(),
        rank: 0,
        state,
        pid: Some(7),
        failure: None,
        seq,
        at_ms: 40 + seq,
    }
}

#[test]
fn a_stale_shard_report_never_overwrites_a_newer_one() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    state.apply(&put_model("llama", 1));
    state.apply(&place("r1", "llama", vec![shard("gpu-1", &[0], 0)]));
    assert_eq!(
        state.apply(&report(ShardState::Loading, 10)),
        Outcome::Applied
    );
    assert_eq!(
        state.apply(&report(ShardState::Ready, 11)),
        Outcome::Applied
    );
    // `Loading` delivered twice, or late, lands after `Ready`.
    let before = state.hash();
    assert_eq!(
        rejected_kind(state.apply(&report(ShardState::Loading, 10))),
        RejectionKind::Conflict
    );
    assert_eq!(
        rejected_kind(state.apply(&report(ShardState::Starting, 11))),
        RejectionKind::Conflict
    );
    assert_eq!(state.hash(), before);
    assert_eq!(state.replicas["r1"].shards[0].state, ShardState::Ready);
    // A newer report applies; an unnumbered one (an older agent) too.
    assert_eq!(
        state.apply(&report(ShardState::Draining, 12)),
        Outcome::Applied
    );
    assert_eq!(
        state.apply(&report(ShardState::Stopped, 0)),
        Outcome::Applied
    );
    assert_eq!(state.replicas["r1"].shards[0].report_seq, 12);
}

#[test]
fn a_liveness_verdict_on_an_old_view_never_overwrites_a_newer_status() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    let judged_from = state.nodes["gpu-1"].status_version;
    let verdict = |status| Command::SetNodeStatus {
        id: "gpu-1".into(),
        status,
        based_on: Some(judged_from),
        at_ms: 9,
    };
    // The node re-registered after the leader judged it.
    state.apply(&register("gpu-1", 5));
    assert_eq!(
        rejected_kind(state.apply(&verdict(NodeStatus::Unreachable))),
        RejectionKind::Conflict
    );
    assert_eq!(state.nodes["gpu-1"].status, NodeStatus::Ready);
    // Judged from the current version, it applies, and moves the version on.
    let current = state.nodes["gpu-1"].status_version;
    let fresh = Command::SetNodeStatus {
        id: "gpu-1".into(),
        status: NodeStatus::Unreachable,
        based_on: Some(current),
        at_ms: 10,
    };
    assert_eq!(state.apply(&fresh), Outcome::Applied);
    assert_eq!(state.nodes["gpu-1"].status, NodeStatus::Unreachable);
    assert_eq!(
        rejected_kind(state.apply(&fresh)),
        RejectionKind::Conflict,
        "the same verdict twice is stale the second time"
    );
}

#[test]
fn ports_names_and_aliases_are_checked_at_apply() {
    let mut state = FleetState::default();
    state.apply(&register("gpu-1", 1));
    state.apply(&register("gpu-22", 1));
    state.apply(&put_model("llama", 2));
    state.apply(&place("r1", "llama", vec![shard("gpu-1", &[0], 0)]));
    let port = state.replicas["r1"].shards[0].port;

    // Another node on the same host, other GPUs, the same port.
    let mut clash = shard("gpu-22", &[1], 0);
    clash.port = port;
    let outcome = state.apply(&place("r2", "llama", vec![clash]));
    let Outcome::Rejected(rejection) = outcome else {
        panic!("a port held by r1 was handed out again")
    };
    assert_eq!(rejection.kind, RejectionKind::Conflict);
    assert!(
        rejection.message.contains("already used by replica r1"),
        "{rejection}"
    );
    // A rendezvous port is held like an engine port.
    let mut two = place(
        "r3",
        "llama",
        vec![shard("gpu-22", &[2], 0), shard("gpu-22", &[3], 1)],
    );
    if let Command::PlaceReplica {
        rendezvous_port, ..
    } = &mut two
    {
        *rendezvous_port = Some(port);
    }
    assert_eq!(rejected_kind(state.apply(&two)), RejectionKind::Conflict);
    // So are the KV event ports, and a replica cannot ask for one twice.
    let kv_ranks = |id: &str, gpu: u32, stream: u16, replay: u16, ranks: u16| {
        let mut command = place(id, "llama", vec![shard("gpu-22", &[gpu], 0)]);
        if let Command::PlaceReplica { kv_event_ports, .. } = &mut command {
            *kv_event_ports = Some(KvEventPorts {
                stream,
                replay,
                ranks,
            });
        }
        command
    };
    let kv = |id: &str, gpu: u32, stream: u16, replay: u16| kv_ranks(id, gpu, stream, replay, 1);
    assert_eq!(
        rejected_kind(state.apply(&kv("r5", 2, port, 40_001))),
        RejectionKind::Conflict
    );
    assert_eq!(
        rejected_kind(state.apply(&kv("r5", 2, 40_001, 40_001))),
        RejectionKind::Invalid
    );
    assert_eq!(state.apply(&kv("r5", 2, 40_001, 40_002)), Outcome::Applied);
    assert_eq!(
        state.replicas["r5"].kv_event_ports,
        Some(KvEventPorts {
            stream: 40_001,
            replay: 40_002,
            ranks: 1
        })
    );
    assert_eq!(
        rejected_kind(state.apply(&kv("r6", 3, 40_002, 40_003))),
        RejectionKind::Conflict,
        "r5's replay port is held"
    );
    // Data-parallel ranks hold a port each, after the first's.
    assert_eq!(
        rejected_kind(state.apply(&kv_ranks("r6", 3, 40_010, 40_000, 4))),
        RejectionKind::Conflict,
        "the replay ranks 40_000..=40_003 meet r5's 40_001"
    );
    assert_eq!(
        rejected_kind(state.apply(&kv_ranks("r6", 3, 40_010, 40_012, 4))),
        RejectionKind::Invalid,
        "streams 40_010..=40_013 overlap replays 40_012..=40_015"
    );
    assert_eq!(
        rejected_kind(state.apply(&kv_ranks("r6", 3, 65_534, 40_020, 4))),
        RejectionKind::Invalid,
        "rank 2 would pass port 65535"
    );
    assert_eq!(
        rejected_kind(state.apply(&kv_ranks("r6", 3, 40_010, 40_020, 0))),
        RejectionKind::Invalid
    );
    assert_eq!(
        state.apply(&kv_ranks("r6", 3, 40_010, 40_020, 4)),
        Outcome::Applied
    );
    // Another node on the same host, whose GPUs are free.
    assert_eq!(state.apply(&register("gpu-23", 1)), Outcome::Applied);
    let mut r7 = place("r7", "llama", vec![shard("gpu-23", &[0], 0)]);
    if let Command::PlaceReplica {
        shards,
        kv_event_ports,
        ..
    } = &mut r7
    {
        shards[0].port = 40_040;
        *kv_event_ports = Some(KvEventPorts {
            stream: 40_013,
            replay: 40_030,
            ranks: 1,
        });
    }
    assert_eq!(
        rejected_kind(state.apply(&r7)),
        RejectionKind::Conflict,
        "r6's fourth stream port is held"
    );
    state.apply(&Command::RemoveReplica {
        id: "r6".into(),
        failure: None,
        at_ms: 9,
    });
    // Once r1's shard stopped, its port is free.
    set_shard(&mut state, ShardState::Stopped);
    let mut reuse = shard("gpu-22", &[1], 0);
    reuse.port = port;
    assert_eq!(
        state.apply(&place("r4", "llama", vec![reuse])),
        Outcome::Applied
    );

    // Names and aliases are one namespace.
    let aliased = |name: &str, aliases: &[&str]| Command::PutModel {
        name: name.to_owned(),
        spec: ModelSpec::from_stored(serde_json::json!({
            "name": name, "aliases": aliases, "endpoints": ["http://10.9.9.9:8000/v1"],
        })),
        replicas: 1,
        at_ms: 7,
    };
    assert_eq!(state.apply(&aliased("qwen", &["chat"])), Outcome::Applied);
    for (name, aliases) in [
        ("chat", &[][..]),
        ("mistral", &["chat"][..]),
        ("phi", &["llama"][..]),
    ] {
        let before = state.hash();
        assert_eq!(
            rejected_kind(state.apply(&aliased(name, aliases))),
            RejectionKind::Conflict,
            "{name} {aliases:?}"
        );
        assert_eq!(state.hash(), before);
    }
    // A model may keep its own aliases when it is replaced.
    assert_eq!(
        state.apply(&aliased("qwen", &["chat", "qwen-latest"])),
        Outcome::Applied
    );
}

#[test]
fn retired_peers_are_remembered() {
    let mut state = FleetState::default();
    state.apply(&Command::RetirePeer { peer: 3, at_ms: 1 });
    state.apply(&Command::RetirePeer { peer: 3, at_ms: 2 });
    assert_eq!(
        state.removed_peers.iter().copied().collect::<Vec<_>>(),
        vec![3]
    );
}

fn seed(names: &[&str]) -> Command {
    let models = names
        .iter()
        .map(|name| match put_model(name, 2) {
            Command::PutModel {
                name,
                spec,
                replicas,
                ..
            } => SeedModel {
                name,
                spec,
                replicas,
            },
            _ => unreachable!("put_model makes a PutModel"),
        })
        .collect();
    Command::SeedCatalog { models, at_ms: 7 }
}

#[test]
fn the_configured_catalog_seeds_an_empty_catalog_once() {
    let mut state = FleetState::default();
    assert_eq!(state.apply(&seed(&["llama", "qwen"])), Outcome::Applied);
    assert_eq!(state.models.keys().collect::<Vec<_>>(), ["llama", "qwen"]);
    assert_eq!(state.models["llama"].desired_replicas, 2);
    assert!(state.catalog_seeded);

    // Proposed again (an ambiguous answer, another forming peer): refused,
    // and what an operator changed since stands.
    state.apply(&Command::DeleteModel {
        name: "qwen".into(),
        at_ms: 8,
    });
    let before = state.clone();
    assert_eq!(
        rejected_kind(state.apply(&seed(&["llama", "qwen"]))),
        RejectionKind::Conflict
    );
    assert_eq!(state, before);

    // A catalog written before seeding existed (or by an operator first)
    // is never overwritten either.
    let mut written = FleetState::default();
    written.apply(&put_model("mistral", 1));
    assert_eq!(
        rejected_kind(written.apply(&seed(&["llama"]))),
        RejectionKind::Conflict
    );
    assert_eq!(written.models.keys().collect::<Vec<_>>(), ["mistral"]);
    assert!(!written.catalog_seeded);
}

#[test]
fn an_unseeded_state_encodes_as_before_seeding_existed() {
    let text = serde_json::to_string(&FleetState::default()).unwrap();
    assert!(!text.contains("catalog_seeded"), "{text}");
    let mut seeded = FleetState::default();
    seeded.apply(&seed(&["llama"]));
    let back: FleetState = serde_json::from_str(&serde_json::to_string(&seeded).unwrap()).unwrap();
    assert_eq!(back, seeded);
}

fn arb_command() -> impl Strategy<Value = Command> {
    let node = prop::sample::select(vec!["gpu-1", "gpu-2", "gpu-3"]).prop_map(str::to_owned);
    let model = prop::sample::select(vec!["llama", "qwen"]).prop_map(str::to_owned);
    let at = 0u64..1_000;
    prop_oneof![
        (node.clone(), at.clone()).prop_map(|(id, at)| register(&id, at)),
        (node.clone(), 0usize..3, at.clone()).prop_map(|(id, s, at_ms)| Command::SetNodeStatus {
            id,
            status: [NodeStatus::Ready, NodeStatus::Unreachable, NodeStatus::Lost][s],
            based_on: None,
            at_ms,
        }),
        (node.clone(), at.clone()).prop_map(|(id, at_ms)| Command::Cordon { id, at_ms }),
        (node.clone(), at.clone()).prop_map(|(id, at_ms)| Command::Uncordon { id, at_ms }),
        (node.clone(), at.clone()).prop_map(|(id, at_ms)| Command::StartDrain {
            id,
            deadline_ms: at_ms + 10,
            at_ms
        }),
        (node.clone(), at.clone()).prop_map(|(id, at_ms)| Command::FinishDrain { id, at_ms }),
        (model.clone(), 0u32..4).prop_map(|(name, n)| put_model(&name, n)),
        (model.clone(), at.clone()).prop_map(|(name, at_ms)| Command::DeleteModel { name, at_ms }),
        (0u8..4, model.clone(), node.clone(), 0u32..4).prop_map(|(r, model, node, gpu)| place(
            &format!("r{r}"),
            &model,
            vec![shard(&node, &[gpu], 0)]
        )),
        (0u8..4, 0usize..8, at.clone()).prop_map(|(r, s, at_ms)| Command::SetShardState {
            replica: format!("r{r}"),
            rank: 0,
            state: [
                ShardState::Pending,
                ShardState::Starting,
                ShardState::Loading,
                ShardState::Ready,
                ShardState::Draining,
                ShardState::Stopped,
                ShardState::Failed,
                ShardState::Sleeping
            ][s],
            pid: Some(u32::from(r)),
            failure: None,
            seq: 0,
            at_ms,
        }),
        (0u8..4, at.clone()).prop_map(|(r, at_ms)| Command::RemoveReplica {
            id: format!("r{r}"),
            failure: None,
            at_ms
        }),
        (0u8..4, any::<bool>(), at.clone()).prop_map(|(r, drain, at_ms)| Command::StopReplica {
            id: format!("r{r}"),
            reason: "test".into(),
            drain_deadline_ms: drain.then_some(at_ms + 1000),
            at_ms
        }),
        (1u64..6, at.clone()).prop_map(|(peer, at_ms)| Command::RetirePeer { peer, at_ms }),
        (model.clone(), 1u32..4).prop_map(|(name, n)| put_autoscaled_model(&name, n, 4)),
        (model.clone(), 0u32..5, 0u32..5).prop_map(|(name, from, to)| scale(&name, from, to)),
        (model.clone(), 1u32..4).prop_map(|(name, n)| put_sleepy_model(&name, n, 4, Some("1m"))),
        (model.clone(), at.clone()).prop_map(|(name, at_ms)| Command::SleepModel {
            name,
            idle_ms: 60_000,
            at_ms
        }),
        (model.clone(), at).prop_map(|(name, at_ms)| Command::WakeModel { name, at_ms }),
        Just(seed(&["llama", "qwen"])),
    ]
}

proptest! {
    /// Two peers applying the same log agree on every outcome and the hash,
    /// even when the log travelled through its wire encoding.
    #[test]
    fn replaying_the_same_log_is_deterministic(log in prop::collection::vec(arb_command(), 0..60)) {
        let mut leader = FleetState::default();
        let mut follower = FleetState::default();
        for command in &log {
            let wire = serde_json::to_vec(command).unwrap();
            let decoded: Command = serde_json::from_slice(&wire).unwrap();
            prop_assert_eq!(&decoded, command);
            prop_assert_eq!(leader.apply(command), follower.apply(&decoded));
        }
        prop_assert_eq!(leader.hash(), follower.hash());
        prop_assert_eq!(&leader, &follower);
    }

    /// A peer that restored a snapshot taken mid-log and applied the rest
    /// ends where a peer that applied the whole log ends.
    #[test]
    fn snapshot_then_tail_equals_whole_log(
        log in prop::collection::vec(arb_command(), 0..60),
        cut in 0usize..60,
    ) {
        let cut = cut.min(log.len());
        let mut whole = FleetState::default();
        for command in &log {
            whole.apply(command);
        }
        let mut prefix = FleetState::default();
        for command in &log[..cut] {
            prefix.apply(command);
        }
        let snapshot = serde_json::to_vec(&prefix).unwrap();
        let mut restored: FleetState = serde_json::from_slice(&snapshot).unwrap();
        prop_assert_eq!(restored.hash(), prefix.hash());
        for command in &log[cut..] {
            restored.apply(command);
        }
        prop_assert_eq!(restored.hash(), whole.hash());
    }

    /// A rejected command leaves the state exactly as it was.
    #[test]
    fn rejections_change_nothing(log in prop::collection::vec(arb_command(), 0..60)) {
        let mut state = FleetState::default();
        for command in &log {
            let before = state.clone();
            if let Outcome::Rejected(_) = state.apply(command) {
                prop_assert_eq!(&state, &before);
            }
        }
    }
}

#[test]
fn a_batch_applies_each_command_on_its_own() {
    let mut one_by_one = FleetState::default();
    let commands = vec![
        register("gpu-1", 1),
        put_model("llama", 1),
        place("r1", "llama", vec![shard("gpu-1", &[0], 0)]),
        // Refused (GPU 0 is taken) without undoing the others.
        place("r2", "llama", vec![shard("gpu-1", &[0], 0)]),
        place("r3", "llama", vec![shard("gpu-1", &[1], 0)]),
    ];
    for command in &commands {
        one_by_one.apply(command);
    }
    let mut batched = FleetState::default();
    let batch = Command::Batch {
        commands,
        at_ms: 10,
    };
    let wire: Command = serde_json::from_slice(&serde_json::to_vec(&batch).unwrap()).unwrap();
    assert_eq!(batched.apply(&wire), Outcome::Applied);
    assert_eq!(batched, one_by_one);
    assert!(batched.replicas.contains_key("r3") && !batched.replicas.contains_key("r2"));
}

/// A batch of placements is checked as the same placements one by one:
/// each sees the GPUs and ports of those before it in the batch, and a
/// stop in between frees what the stopped shard held.
#[test]
fn a_batch_of_placements_sees_its_own_earlier_placements() {
    let one_by_one = |commands: &[Command]| {
        let mut state = FleetState::default();
        state.apply(&register("gpu-1", 1));
        state.apply(&put_model("llama", 9));
        for command in commands {
            state.apply(command);
        }
        state
    };
    let batched = |commands: &[Command]| {
        let mut state = FleetState::default();
        state.apply(&register("gpu-1", 1));
        state.apply(&put_model("llama", 9));
        let batch = Command::Batch {
            commands: commands.to_vec(),
            at_ms: 20,
        };
        assert_eq!(state.apply(&batch), Outcome::Applied);
        state
    };
    let mut same_port = shard("gpu-1", &[3], 0);
    same_port.port = shard("gpu-1", &[0], 0).port;
    let stop_r1 = Command::SetShardState {
        replica: "r1".into(),
        rank: 0,
        state: ShardState::Stopped,
        pid: None,
        failure: None,
        seq: 0,
        at_ms: 30,
    };
    let commands = vec![
        place("r1", "llama", vec![shard("gpu-1", &[0], 0)]),
        // GPU 0 again: refused.
        place("r2", "llama", vec![shard("gpu-1", &[0, 1], 0)]),
        // r1's port on another GPU: refused.
        place("r3", "llama", vec![same_port.clone()]),
        place("r4", "llama", vec![shard("gpu-1", &[1], 0)]),
        stop_r1,
        // Once r1 stopped, its GPU and port are free again.
        place("r5", "llama", vec![same_port]),
        place("r6", "llama", vec![shard("gpu-1", &[0], 0)]),
    ];
    let state = batched(&commands);
    assert_eq!(state, one_by_one(&commands));
    let placed: Vec<&str> = state.replicas.keys().map(String::as_str).collect();
    assert_eq!(placed, ["r1", "r4", "r5"]);
}

#[test]
fn the_autoscaler_changes_a_count_it_saw_within_the_bounds_and_a_put_keeps_it() {
    let mut state = FleetState::default();
    assert_eq!(
        state.apply(&put_autoscaled_model("m", 1, 4)),
        Outcome::Applied
    );
    assert_eq!(state.apply(&scale("m", 1, 3)), Outcome::Applied);
    assert_eq!(state.models["m"].desired_replicas, 3);
    assert_eq!(state.models["m"].last_scale.as_ref().map(|d| d.to), Some(3));
    let before = state.clone();
    // Decided on a count that changed since: refused, nothing changes.
    assert_eq!(
        rejected_kind(state.apply(&scale("m", 1, 2))),
        RejectionKind::Conflict
    );
    assert_eq!(
        rejected_kind(state.apply(&scale("m", 3, 5))),
        RejectionKind::Invalid
    );
    assert_eq!(
        rejected_kind(state.apply(&scale("x", 1, 2))),
        RejectionKind::NotFound
    );
    assert_eq!(state, before);
    // The entry put again keeps what the load decided, within new bounds.
    state.apply(&put_autoscaled_model("m", 1, 4));
    assert_eq!(state.models["m"].desired_replicas, 3);
    state.apply(&put_autoscaled_model("m", 1, 2));
    assert_eq!(state.models["m"].desired_replicas, 2);
    // Without autoscale the entry's count is the count again.
    state.apply(&put_model("m", 1));
    assert_eq!(state.models["m"].desired_replicas, 1);
    assert_eq!(state.models["m"].last_scale, None);
    assert_eq!(
        rejected_kind(state.apply(&scale("m", 1, 2))),
        RejectionKind::Conflict
    );
}

#[test]
fn an_idle_model_sleeps_until_a_request_wakes_it_and_a_release_ends_its_sleep() {
    let mut state = FleetState::default();
    let entry = |sleep_after: Option<&str>| Command::PutModel {
        name: "m".to_owned(),
        spec: ModelSpec::from_stored(serde_json::json!({
            "name": "m", "source": "org/m", "replicas": 1, "profiles": [],
            "autoscale": {"min_replicas": 0, "max_replicas": 2,
                          "target_requests_per_replica": 8, "scale_up_window": "30s",
                          "scale_down_window": "5m", "sleep_after": sleep_after},
        })),
        replicas: 1,
        at_ms: 5,
    };
    let sleep = |at_ms| Command::SleepModel {
        name: "m".to_owned(),
        idle_ms: 60_000,
        at_ms,
    };
    let wake = |at_ms| Command::WakeModel {
        name: "m".to_owned(),
        at_ms,
    };
    // No sleep mode, no sleep.
    state.apply(&entry(None));
    assert_eq!(
        rejected_kind(state.apply(&sleep(6))),
        RejectionKind::Conflict
    );
    assert_eq!(state.apply(&entry(Some("1m"))), Outcome::Applied);
    assert_eq!(state.apply(&sleep(10)), Outcome::Applied);
    assert_eq!(state.models["m"].asleep_since_ms, Some(10));
    // Asleep already: the first sleep's time stays.
    state.apply(&sleep(11));
    assert_eq!(state.models["m"].asleep_since_ms, Some(10));
    // A request wakes it; its replica count stays.
    assert_eq!(state.apply(&wake(20)), Outcome::Applied);
    let record = &state.models["m"];
    assert_eq!(
        (
            record.asleep_since_ms,
            record.woken_at_ms,
            record.desired_replicas
        ),
        (None, Some(20), 1)
    );
    // Released to zero while asleep: the next replica starts awake, and
    // nothing is put to sleep while none is wanted.
    state.apply(&sleep(30));
    assert_eq!(state.apply(&scale("m", 1, 0)), Outcome::Applied);
    assert_eq!(state.models["m"].asleep_since_ms, None);
    assert_eq!(
        rejected_kind(state.apply(&sleep(40))),
        RejectionKind::Conflict
    );
    // A changed entry wakes an asleep model.
    state.apply(&wake(50));
    state.apply(&sleep(60));
    state.apply(&entry(Some("2m")));
    assert_eq!(state.models["m"].asleep_since_ms, None);
    assert_eq!(state.models["m"].woken_at_ms, Some(20));
}

#[test]
fn a_request_wakes_a_model_scaled_to_zero_once() {
    let mut state = FleetState::default();
    let from_zero = Command::PutModel {
        name: "m".to_owned(),
        spec: ModelSpec::from_stored(serde_json::json!({
            "name": "m", "source": "org/m", "replicas": 0, "profiles": [],
            "autoscale": {"min_replicas": 0, "max_replicas": 2,
                          "target_requests_per_replica": 8,
                          "scale_up_window": "30s", "scale_down_window": "5m"},
        })),
        replicas: 0,
        at_ms: 5,
    };
    let wake = Command::WakeModel {
        name: "m".to_owned(),
        at_ms: 7,
    };
    state.apply(&from_zero);
    assert_eq!(state.models["m"].desired_replicas, 0);
    assert_eq!(state.apply(&wake), Outcome::Applied);
    assert_eq!(state.models["m"].desired_replicas, 1);
    let woken = state.models["m"].last_scale.clone().unwrap();
    assert!(
        woken.reason().contains("a request arrived"),
        "{}",
        woken.reason()
    );
    // Every router holding a request may send it: the second changes nothing.
    let once = state.clone();
    assert_eq!(state.apply(&wake), Outcome::Applied);
    assert_eq!(state, once);
    assert_eq!(state.apply(&scale("m", 1, 0)), Outcome::Applied);
    state.apply(&wake);
    assert_eq!(state.models["m"].desired_replicas, 1);
    // A model that does not autoscale is never woken.
    state.apply(&put_model("n", 0));
    assert_eq!(
        rejected_kind(state.apply(&Command::WakeModel {
            name: "n".to_owned(),
            at_ms: 8
        })),
        RejectionKind::Conflict
    );
}
