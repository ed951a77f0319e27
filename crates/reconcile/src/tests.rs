//! Reconciliation round by round: each test applies what `decide` proposes
//! and checks what the next round wants.

use std::collections::BTreeMap;

use llmgw_state::{
    Command, FleetState, Gpu, NodeInventory, NodeStatus, Outcome, ReplicaState, ShardFailure,
    ShardState,
};

use crate::{
    Desired, Memory, Order, PlanSettings, decide, desired_by_node, kv_event_addresses,
    managed_models,
};

fn node(id: &str, gpus: u32, fabric: Option<&str>) -> Command {
    Command::RegisterNode {
        id: id.into(),
        mgmt_addr: format!("10.0.0.{}", id.len() + gpus as usize),
        inventory: NodeInventory {
            hostname: id.into(),
            gpus: (0..gpus)
                .map(|index| Gpu {
                    index,
                    model: "NVIDIA H100 80GB HBM3".into(),
                    memory_mb: 81_559,
                    nvlink_peers: (0..gpus).filter(|p| *p != index).collect(),
                    ..Gpu::default()
                })
                .collect(),
            engines: vec!["vllm".into()],
            ..NodeInventory::default()
        },
        fabrics: fabric.map(|f| vec![f.to_owned()]).unwrap_or_default(),
        labels: BTreeMap::new(),
        at_ms: 1,
    }
}

fn model(name: &str, replicas: u32, nodes: u32, gpus_per_node: u32) -> Command {
    let spec = serde_json::json!({
        "name": name,
        "source": format!("org/{name}"),
        "replicas": replicas,
        "profiles": [{
            "name": "p", "engine": "vllm", "nodes": nodes, "gpus_per_node": gpus_per_node,
            "tensor_parallel": gpus_per_node, "pipeline_parallel": nodes,
            "min_gpu_memory_gb": 40
        }]
    });
    Command::PutModel {
        name: name.into(),
        spec: llmgw_state::ModelSpec::from_stored(spec),
        replicas,
        at_ms: 1,
    }
}

struct World {
    fleet: FleetState,
    memory: Memory,
    settings: PlanSettings,
    now_ms: u64,
}

impl World {
    fn new(commands: &[Command]) -> World {
        let mut fleet = FleetState::default();
        for command in commands {
            assert_eq!(fleet.apply(command), Outcome::Applied, "{command}");
        }
        World {
            fleet,
            memory: Memory::default(),
            settings: PlanSettings::default(),
            now_ms: 1_000,
        }
    }

    /// One round: decide, apply every command, return their kinds.
    fn round(&mut self) -> Vec<String> {
        let commands = decide(&self.fleet, &mut self.memory, &self.settings, self.now_ms);
        let mut kinds = Vec::new();
        for command in commands {
            assert_eq!(self.fleet.apply(&command), Outcome::Applied, "{command}");
            kinds.push(command.kind().to_owned());
        }
        kinds
    }

    fn set_all(&mut self, replica: &str, state: ShardState, failure: Option<&str>) {
        let ranks: Vec<u32> = self.fleet.replicas[replica]
            .shards
            .iter()
            .map(|s| s.rank)
            .collect();
        for rank in ranks {
            let command = Command::SetShardState {
                replica: replica.into(),
                rank,
                state,
                pid: Some(100 + rank),
                failure: failure.map(|m| ShardFailure {
                    message: m.into(),
                    output_tail: vec!["Traceback (most recent call last):".into()],
                    at_ms: self.now_ms,
                }),
                seq: 0,
                at_ms: self.now_ms,
            };
            assert_eq!(self.fleet.apply(&command), Outcome::Applied);
        }
    }

    fn replicas_of(&self, model: &str) -> Vec<String> {
        self.fleet
            .replicas
            .values()
            .filter(|r| r.model == model)
            .map(|r| r.id.clone())
            .collect()
    }

    fn node_of(&self, replica: &str) -> String {
        self.fleet.replicas[replica].shards[0].node.clone()
    }
}

#[test]
fn desired_replicas_are_placed_once_and_then_left_alone() {
    let mut w = World::new(&[node("a", 8, None), node("b", 8, None), model("m", 2, 1, 1)]);
    assert_eq!(w.round(), vec!["place_replica", "place_replica"]);
    assert_eq!(w.round(), Vec::<String>::new());
    let ids = w.replicas_of("m");
    let nodes: Vec<String> = ids.iter().map(|r| w.node_of(r)).collect();
    assert_ne!(nodes[0], nodes[1], "replicas spread across nodes");
}

#[test]
fn a_failed_replica_is_stopped_removed_with_its_failure_and_retried_after_backoff() {
    let mut w = World::new(&[node("a", 8, None), model("m", 1, 1, 1)]);
    w.round();
    let first = w.replicas_of("m").remove(0);
    w.set_all(
        &first,
        ShardState::Failed,
        Some("engine exited with status 1"),
    );
    assert_eq!(w.round(), vec!["stop_replica"]);
    assert_eq!(w.round(), vec!["remove_replica"]);
    let failure = w.fleet.models["m"]
        .last_failure
        .clone()
        .expect("failure kept");
    assert!(failure.failure.message.contains("status 1"));
    assert!(w.round().is_empty(), "no retry before the backoff");
    w.now_ms += w.settings.retry_base_ms;
    assert_eq!(w.round(), vec!["place_replica"]);
}

#[test]
fn repeated_failures_on_one_node_move_the_replica_to_another() {
    let mut w = World::new(&[node("a", 8, None), node("b", 8, None), model("m", 1, 1, 1)]);
    w.round();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let id = w.replicas_of("m").remove(0);
        nodes.push(w.node_of(&id));
        w.set_all(&id, ShardState::Failed, Some("CUDA error"));
        w.round();
        w.round();
        w.now_ms += w.settings.retry_max_ms;
        assert_eq!(w.round(), vec!["place_replica"]);
    }
    let last = w.replicas_of("m").remove(0);
    assert_eq!(nodes[0], nodes[1], "the first retry may stay");
    assert_ne!(w.node_of(&last), nodes[0], "avoided after two failures");
}

#[test]
fn a_lost_nodes_replica_is_removed_and_placed_elsewhere() {
    let mut w = World::new(&[node("a", 8, None), node("b", 8, None), model("m", 1, 1, 1)]);
    w.round();
    let id = w.replicas_of("m").remove(0);
    w.set_all(&id, ShardState::Ready, None);
    let lost = w.node_of(&id);
    w.fleet.apply(&Command::SetNodeStatus {
        id: lost.clone(),
        status: NodeStatus::Unreachable,
        based_on: None,
        at_ms: 2_000,
    });
    assert!(w.round().is_empty(), "unreachable is not lost yet");
    w.fleet.apply(&Command::SetNodeStatus {
        id: lost.clone(),
        status: NodeStatus::Lost,
        based_on: None,
        at_ms: 3_000,
    });
    assert_eq!(w.round(), vec!["remove_replica"]);
    assert_eq!(w.round(), vec!["place_replica"]);
    let new = w.replicas_of("m").remove(0);
    assert_ne!(w.node_of(&new), lost);
}

#[test]
fn a_drain_is_make_before_break_and_finishes() {
    let mut w = World::new(&[node("a", 8, None), node("b", 8, None), model("m", 1, 1, 1)]);
    w.round();
    let old = w.replicas_of("m").remove(0);
    w.set_all(&old, ShardState::Ready, None);
    let drained = w.node_of(&old);
    w.fleet.apply(&Command::StartDrain {
        id: drained.clone(),
        deadline_ms: w.now_ms + 60_000,
        at_ms: w.now_ms,
    });
    assert_eq!(w.round(), vec!["place_replica"], "replacement first");
    assert!(
        w.round().is_empty(),
        "the old one serves until the new one is ready"
    );
    let new = w.replicas_of("m").into_iter().find(|r| *r != old).unwrap();
    assert_eq!(
        w.fleet.replicas[&new].replaces.as_deref(),
        Some(old.as_str())
    );
    assert_ne!(w.node_of(&new), drained);
    w.set_all(&new, ShardState::Ready, None);
    assert_eq!(w.round(), vec!["stop_replica"]);
    assert_eq!(w.fleet.replicas[&old].state(), ReplicaState::Draining);
    assert!(w.round().is_empty(), "no second stop, no extra replica");
    w.set_all(&old, ShardState::Stopped, None);
    assert_eq!(w.round(), vec!["remove_replica"]);
    assert_eq!(w.round(), vec!["finish_drain"]);
    assert!(!w.fleet.nodes[&drained].draining);
    assert!(w.fleet.nodes[&drained].cordoned);
    assert!(w.round().is_empty());
}

#[test]
fn scaling_down_drains_the_extra_replicas() {
    let mut w = World::new(&[node("a", 8, None), node("b", 8, None), model("m", 2, 1, 1)]);
    w.round();
    for id in w.replicas_of("m") {
        w.set_all(&id, ShardState::Ready, None);
    }
    w.fleet.apply(&model("m", 1, 1, 1));
    assert_eq!(w.round(), vec!["stop_replica"]);
    assert!(w.round().is_empty());
}

#[test]
fn a_multi_node_replica_gets_one_fabric_and_a_rendezvous_port() {
    let mut w = World::new(&[
        node("a", 8, Some("ib-a")),
        node("b", 8, Some("ib-a")),
        node("c", 8, None),
        model("big", 1, 2, 8),
    ]);
    assert_eq!(w.round(), vec!["place_replica"]);
    let id = w.replicas_of("big").remove(0);
    let replica = &w.fleet.replicas[&id];
    assert_eq!(replica.fabric.as_deref(), Some("ib-a"));
    let port = replica.rendezvous_port.expect("rendezvous port");
    let nodes: Vec<&str> = replica.shards.iter().map(|s| s.node.as_str()).collect();
    assert!(!nodes.contains(&"c"), "never on a node without a fabric");
    let models = managed_models(&w.fleet);
    let desired = desired_by_node(&w.fleet, &models);
    for shard in &replica.shards {
        let Order::Run(spec) = &desired[&shard.node][0].order else {
            panic!("shards run")
        };
        assert_eq!(spec.master_port, u32::from(port));
        assert_eq!(spec.nodes, 2);
        assert_eq!(spec.rank, shard.rank);
        assert_eq!(spec.gpus.len(), 8);
    }
}

#[test]
fn ports_are_unique_per_host_and_not_reused_at_once() {
    let mut w = World::new(&[node("a", 8, None), model("m", 4, 1, 1)]);
    w.round();
    let mut ports: Vec<u16> = w
        .fleet
        .replicas
        .values()
        .map(|r| r.shards[0].port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 4);
    let id = w.replicas_of("m").remove(0);
    let freed = w.fleet.replicas[&id].shards[0].port;
    w.fleet.apply(&Command::RemoveReplica {
        id,
        failure: None,
        at_ms: 5,
    });
    w.round();
    let newest = w
        .fleet
        .replicas
        .values()
        .map(|r| r.shards[0].port)
        .max()
        .unwrap();
    assert!(newest > *ports.last().unwrap(), "rotates past {freed}");
}

#[test]
fn a_data_parallel_replica_holds_a_kv_event_port_pair_per_rank() {
    let spec = serde_json::json!({
        "name": "dp", "source": "org/dp", "replicas": 2,
        "profiles": [{"name": "p", "engine": "vllm", "nodes": 1, "gpus_per_node": 4,
                      "tensor_parallel": 2, "pipeline_parallel": 1, "data_parallel": 2,
                      "min_gpu_memory_gb": 40}]
    });
    let put = Command::PutModel {
        name: "dp".into(),
        spec: llmgw_state::ModelSpec::from_stored(spec),
        replicas: 2,
        at_ms: 1,
    };
    let mut w = World::new(&[node("a", 8, None), put]);
    w.round();
    let replicas: Vec<_> = w.fleet.replicas.values().cloned().collect();
    assert_eq!(replicas.len(), 2);
    let mut held: Vec<u16> = w.fleet.ports_held().map(|(_, port, _)| port).collect();
    assert_eq!(
        held.len(),
        2 * (1 + 2 * 2),
        "an engine port and two per rank each"
    );
    held.sort_unstable();
    held.dedup();
    assert_eq!(held.len(), 10, "no port held twice");
    let models = managed_models(&w.fleet);
    let desired = desired_by_node(&w.fleet, &models);
    for replica in &replicas {
        let kv = replica.kv_event_ports.expect("KV event ports");
        assert_eq!(kv.ranks, 2);
        let shard = &replica.shards[0];
        let order = desired["a"]
            .iter()
            .find(|d| matches!(&d.order, Order::Run(s) if s.replica_id == replica.id))
            .expect("the shard's order");
        let Order::Run(spec) = &order.order else {
            unreachable!()
        };
        assert_eq!((spec.data_parallel, spec.tensor_parallel), (2, 2));
        assert_eq!(spec.gpus.len(), 4);
        assert_eq!(spec.port, u32::from(shard.port));
        assert_eq!(spec.kv_events_port, u32::from(kv.stream));
        let view = kv_event_addresses(&w.fleet, replica).expect("addresses");
        assert_eq!(view.ranks, 2);
    }
}

#[test]
fn replicas_of_an_entry_this_peer_cannot_read_are_left_running() {
    let mut w = World::new(&[node("a", 8, None), model("m", 1, 1, 1)]);
    w.round();
    let id = w.replicas_of("m").remove(0);
    w.set_all(&id, ShardState::Ready, None);
    // A newer peer's entry, in a shape this build does not know.
    let future = serde_json::json!({"name": "m", "serving": {"kind": "disaggregated"}});
    let put = Command::PutModel {
        name: "m".into(),
        spec: llmgw_state::ModelSpec::from_stored(future),
        replicas: 1,
        at_ms: 9,
    };
    assert_eq!(w.fleet.apply(&put), Outcome::Applied);
    assert_eq!(w.round(), Vec::<String>::new(), "nothing stopped or placed");
    let models = managed_models(&w.fleet);
    let desired = desired_by_node(&w.fleet, &models);
    assert!(
        matches!(
            &desired["a"][..],
            [Desired {
                order: Order::Keep { .. },
                ..
            }]
        ),
        "left as it runs: {desired:?}"
    );
    assert_eq!(w.replicas_of("m"), vec![id.clone()]);
    // What this leader decided itself (a drain's end, a failure) still
    // reaches the shard: stopping needs no model spec.
    let stop = Command::StopReplica {
        id,
        reason: "node a drained".into(),
        drain_deadline_ms: None,
        at_ms: 10,
    };
    assert_eq!(w.fleet.apply(&stop), Outcome::Applied);
    let desired = desired_by_node(&w.fleet, &managed_models(&w.fleet));
    assert!(
        matches!(
            &desired["a"][..],
            [Desired {
                order: Order::Stop { .. },
                ..
            }]
        ),
        "{desired:?}"
    );
}

#[test]
fn a_deleted_model_is_stopped_and_its_shards_told_to_stop() {
    let mut w = World::new(&[node("a", 8, None), model("m", 1, 1, 1)]);
    w.round();
    let id = w.replicas_of("m").remove(0);
    w.set_all(&id, ShardState::Ready, None);
    w.fleet.apply(&Command::DeleteModel {
        name: "m".into(),
        at_ms: 9,
    });
    let models = managed_models(&w.fleet);
    let desired = desired_by_node(&w.fleet, &models);
    assert!(matches!(desired["a"][0].order, Order::Stop { .. }));
    assert_eq!(w.round(), vec!["stop_replica"]);
}

#[test]
fn a_shard_that_stops_on_its_own_restarts_its_replica() {
    let mut w = World::new(&[
        node("a", 8, Some("ib-a")),
        node("b", 8, Some("ib-a")),
        model("big", 1, 2, 8),
    ]);
    w.round();
    let id = w.replicas_of("big").remove(0);
    w.set_all(&id, ShardState::Ready, None);
    w.fleet.apply(&Command::SetShardState {
        replica: id.clone(),
        rank: 1,
        state: ShardState::Stopped,
        pid: None,
        failure: None,
        seq: 0,
        at_ms: w.now_ms,
    });
    assert_eq!(w.round(), vec!["stop_replica"]);
    let models = managed_models(&w.fleet);
    let desired = desired_by_node(&w.fleet, &models);
    let rank0 = &w.fleet.replicas[&id].shards[0].node;
    assert!(
        matches!(desired[rank0][0].order, Order::Stop { .. }),
        "the healthy rank is stopped too"
    );
}

#[test]
fn bigger_models_are_placed_first_so_small_ones_do_not_fragment_their_nodes() {
    // "a-small" sorts first by name, but "z-big" needs both nodes whole.
    let mut w = World::new(&[
        node("a", 8, Some("ib-a")),
        node("b", 8, Some("ib-a")),
        node("c", 4, None),
        model("a-small", 2, 1, 1),
        model("z-big", 1, 2, 8),
    ]);
    w.round();
    assert_eq!(w.replicas_of("z-big").len(), 1, "the two-node model fits");
    for id in w.replicas_of("a-small") {
        assert_eq!(w.node_of(&id), "c");
    }
}

#[test]
fn gpus_held_by_processes_that_outlived_sigkill_are_not_placed_on() {
    let mut w = World::new(&[node("a", 2, None), model("m", 2, 1, 1)]);
    w.memory.survivor_gpus.insert("a".into(), vec![0]);
    assert_eq!(w.round(), vec!["place_replica"], "only GPU 1 is free");
    let placed = w.replicas_of("m");
    assert_eq!(w.fleet.replicas[&placed[0]].shards[0].gpus, vec![1]);
    let why = w
        .memory
        .unplaced
        .get("m")
        .expect("the second replica explained");
    assert!(why.contains("GPU"), "{why}");

    // The processes are gone: the second replica goes on GPU 0.
    w.memory.survivor_gpus.clear();
    w.now_ms += w.settings.retry_max_ms;
    assert_eq!(w.round(), vec!["place_replica"]);
    let gpus: Vec<Vec<u32>> = w
        .replicas_of("m")
        .iter()
        .map(|r| w.fleet.replicas[r].shards[0].gpus.clone())
        .collect();
    assert!(gpus.contains(&vec![0]), "{gpus:?}");
}

mod preempt;
mod rollout;
