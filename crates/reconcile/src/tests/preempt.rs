//! GPUs moving between models, round by round: a model with no room takes
//! a lower-priority autoscaled model's replica, drained first, one at a
//! time; never below the other's floor, never from an equal priority or a
//! model whose count is the operator's.

use llmgw_state::{Command, ModelSpec, ShardState};

use super::{World, node};

/// One-GPU replicas of `name`; `autoscale` as (min, max).
fn entry(name: &str, replicas: u32, priority: u32, autoscale: Option<(u32, u32)>) -> Command {
    let mut spec = serde_json::json!({
        "name": name,
        "source": format!("org/{name}"),
        "replicas": replicas,
        "priority": priority,
        "profiles": [{"name": "p", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 40}],
    });
    if let Some((min, max)) = autoscale {
        spec["autoscale"] = serde_json::json!({
            "min_replicas": min, "max_replicas": max, "target_requests_per_replica": 8,
            "scale_up_window": "30s", "scale_down_window": "5m"});
    }
    let spec = ModelSpec::from_stored(spec);
    assert!(spec.model().is_ok(), "{:?}", spec.model());
    Command::PutModel {
        name: name.into(),
        spec,
        replicas,
        at_ms: 1,
    }
}

/// A two-GPU node full of `low`'s replicas, then `high` put.
fn full_node_then(low: Command, high: Command) -> World {
    let mut w = World::new(&[node("a", 2, None), low]);
    assert_eq!(w.round(), vec!["place_replica", "place_replica"]);
    for id in w.replicas_of("low") {
        w.set_all(&id, ShardState::Ready, None);
    }
    assert_eq!(w.fleet.apply(&high), llmgw_state::Outcome::Applied);
    w
}

#[test]
fn a_higher_priority_model_takes_a_replicas_gpus_after_it_drains() {
    let mut w = full_node_then(entry("low", 2, 0, Some((1, 2))), entry("high", 1, 10, None));
    assert_eq!(w.round(), vec!["scale_model", "stop_replica"]);
    let low = &w.fleet.models["low"];
    assert_eq!(low.desired_replicas, 1);
    let why = low.last_scale.clone().expect("the yield is recorded");
    assert_eq!(why.yielded_to.as_deref(), Some("high"));
    assert!(
        why.reason().contains("gave a replica's GPUs to model high"),
        "{}",
        why.reason()
    );
    let victim = w
        .fleet
        .replicas
        .values()
        .find(|r| r.stop.is_some())
        .expect("one replica told to go")
        .clone();
    let stop = victim.stop.as_ref().unwrap();
    assert!(
        stop.reason.contains("yielding its GPUs to model high"),
        "{}",
        stop.reason
    );
    assert!(stop.drain_deadline_ms.is_some(), "drained, never cut");

    // While it drains, nothing else yields and nothing is placed on it.
    assert!(w.round().is_empty());
    assert!(w.round().is_empty());
    w.set_all(&victim.id, ShardState::Stopped, None);
    // Its GPUs are free once its shards stopped.
    assert_eq!(w.round(), vec!["remove_replica", "place_replica"]);
    assert_eq!(w.replicas_of("high").len(), 1);
    assert_eq!(w.replicas_of("low").len(), 1);
    assert!(w.round().is_empty(), "settled");
}

#[test]
fn nothing_yields_below_its_floor_to_an_equal_priority_or_when_its_count_is_fixed() {
    for (low, high, why) in [
        (
            entry("low", 2, 0, Some((2, 2))),
            entry("high", 1, 10, None),
            "at its floor",
        ),
        (
            entry("low", 2, 5, Some((1, 2))),
            entry("high", 1, 5, None),
            "equal priority",
        ),
        (
            entry("low", 2, 0, None),
            entry("high", 1, 10, None),
            "not autoscaled",
        ),
    ] {
        let mut w = full_node_then(low, high);
        assert!(w.round().is_empty(), "{why}");
        assert_eq!(w.fleet.models["low"].desired_replicas, 2, "{why}");
        assert!(
            w.memory.unplaced.contains_key("high"),
            "{why}: high stays pending, explained"
        );
    }
}

#[test]
fn a_model_waiting_for_room_is_placed_once_gpus_free_not_after_its_backoff() {
    let mut w = full_node_then(entry("low", 2, 0, None), entry("high", 1, 0, None));
    // No room, and an equal priority yields nothing: it backs off, each
    // time for longer.
    for _ in 0..40 {
        assert!(w.round().is_empty());
        w.now_ms += 1_000;
    }
    let backed_off_until = w.memory.retry_at["high"];
    assert!(
        backed_off_until > w.now_ms + 5_000,
        "a long backoff by now: until {backed_off_until}, now {}",
        w.now_ms
    );

    // The operator takes one replica of `low` away: drained, then stopped.
    assert_eq!(
        w.fleet.apply(&entry("low", 1, 0, None)),
        llmgw_state::Outcome::Applied
    );
    assert_eq!(w.round(), vec!["stop_replica"]);
    let leaving = w
        .fleet
        .replicas
        .values()
        .find(|r| r.stop.is_some())
        .expect("one replica told to go")
        .id
        .clone();
    assert!(w.round().is_empty(), "its GPU is held while it drains");
    w.set_all(&leaving, ShardState::Stopped, None);
    assert!(w.now_ms < backed_off_until);
    assert_eq!(
        w.round(),
        vec!["remove_replica", "place_replica"],
        "placed as the GPU frees, within what was its backoff"
    );
    assert_eq!(w.replicas_of("high").len(), 1);
}
