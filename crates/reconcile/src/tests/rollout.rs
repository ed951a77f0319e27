//! Rolling updates, round by round: a changed launch spec replaces replicas
//! make-before-break; what engines never see changes nothing; failures roll
//! back.

use llmgw_state::{Command, ModelSpec, ShardState};

use super::{World, node};
use crate::{Order, desired_by_node, managed_models};

fn entry(replicas: u32, engine_args: &[&str], extra: serde_json::Value) -> Command {
    let mut spec = serde_json::json!({
        "name": "m",
        "source": "org/m",
        "replicas": replicas,
        "profiles": [{"name": "p", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 40,
                      "engine_args": engine_args}],
    });
    for (key, value) in extra.as_object().expect("a map") {
        spec[key] = value.clone();
    }
    let spec = ModelSpec::from_stored(spec);
    assert!(spec.model().is_ok(), "{:?}", spec.model());
    Command::PutModel {
        name: "m".into(),
        spec,
        replicas,
        at_ms: 1,
    }
}

fn put(w: &mut World, command: Command) {
    assert_eq!(w.fleet.apply(&command), llmgw_state::Outcome::Applied);
}

/// Two ready replicas of `m` on nodes with room for more.
fn running_two(extra: serde_json::Value) -> World {
    let mut w = World::new(&[node("a", 2, None), node("b", 2, None)]);
    put(&mut w, entry(2, &["--max-model-len", "4096"], extra));
    w.round();
    for id in w.replicas_of("m") {
        w.set_all(&id, ShardState::Ready, None);
    }
    w
}

/// Each live replica's order, by replica id.
fn orders(w: &World) -> Vec<(String, Order)> {
    let models = managed_models(&w.fleet);
    let mut out: Vec<(String, Order)> = desired_by_node(&w.fleet, &models)
        .into_values()
        .flatten()
        .map(|d| (d.shard_id.trim_end_matches("-r0").to_owned(), d.order))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn args_of(order: &Order) -> Option<Vec<String>> {
    match order {
        Order::Run(spec) => Some(spec.engine_args.clone()),
        _ => None,
    }
}

#[test]
fn a_changed_spec_replaces_every_replica_one_at_a_time_before_stopping_the_old() {
    let mut w = running_two(serde_json::json!({}));
    let old = w.replicas_of("m");
    put(
        &mut w,
        entry(2, &["--max-model-len", "8192"], serde_json::json!({})),
    );
    for (id, order) in orders(&w) {
        assert!(
            matches!(order, Order::Keep { .. }),
            "{id} runs the old spec and is kept as it runs, not asked to run the new one: {order:?}"
        );
    }
    assert_eq!(w.round(), ["place_replica"], "one surge replica");
    assert!(w.round().is_empty(), "the old ones wait for it");
    let new: Vec<String> = w
        .replicas_of("m")
        .into_iter()
        .filter(|id| !old.contains(id))
        .collect();
    assert_eq!(new.len(), 1);
    let replaced = w.fleet.replicas[&new[0]]
        .replaces
        .clone()
        .expect("a replacement");
    let (_, order) = orders(&w)
        .into_iter()
        .find(|(id, _)| *id == new[0])
        .unwrap();
    assert_eq!(
        args_of(&order).unwrap(),
        ["--max-model-len", "8192"],
        "the new replica runs the new spec"
    );

    w.set_all(&new[0], ShardState::Ready, None);
    let kinds = w.round();
    assert_eq!(kinds, ["stop_replica", "place_replica"]);
    let stop = w.fleet.replicas[&replaced]
        .stop
        .clone()
        .expect("old one goes");
    assert!(
        stop.drain_deadline_ms.is_some(),
        "drained, not cut: {stop:?}"
    );
    assert!(stop.reason.contains("took over"), "{}", stop.reason);

    for id in w.replicas_of("m") {
        if w.fleet.replicas[&id].stop.is_none() {
            w.set_all(&id, ShardState::Ready, None);
        } else {
            w.set_all(&id, ShardState::Stopped, None);
        }
    }
    assert_eq!(w.round(), ["remove_replica", "stop_replica"]);
    for id in w.replicas_of("m") {
        if w.fleet.replicas[&id].stop.is_some() {
            w.set_all(&id, ShardState::Stopped, None);
        }
    }
    assert_eq!(
        w.round(),
        ["remove_replica", "finish_rollout"],
        "complete once all run the new spec"
    );
    let left = w.replicas_of("m");
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|id| !old.contains(id)), "{left:?}");
    let rollout = w.fleet.models["m"].rollout.clone().unwrap();
    assert!(rollout.completed_at_ms.is_some());
    assert!(w.round().is_empty(), "then nothing more");
}

#[test]
fn scaling_aliases_and_rollout_settings_restart_nothing() {
    let mut w = running_two(serde_json::json!({}));
    let before = orders(&w);
    put(
        &mut w,
        entry(
            2,
            &["--max-model-len", "4096"],
            serde_json::json!({"aliases": ["m-latest"], "rollout": {"max_surge": 2}}),
        ),
    );
    assert!(w.round().is_empty(), "nothing to roll");
    assert_eq!(
        orders(&w),
        before,
        "the running replicas are told exactly what they were launched with"
    );
    assert!(w.fleet.models["m"].rollout.is_none());
    let replica = &w.fleet.replicas[&w.replicas_of("m")[0]];
    assert_eq!(replica.served_names.as_deref(), Some(&["m".to_owned()][..]));
}

#[test]
fn a_rollout_whose_new_replicas_keep_failing_rolls_back_and_the_old_ones_stay() {
    let mut w = running_two(serde_json::json!({}));
    let old = w.replicas_of("m");
    let old_orders = orders(&w);
    put(
        &mut w,
        entry(2, &["--max-model-len", "999999"], serde_json::json!({})),
    );
    for attempt in 1..=3 {
        w.now_ms += w.settings.retry_max_ms;
        assert_eq!(w.round(), ["place_replica"], "attempt {attempt}");
        let new = w
            .replicas_of("m")
            .into_iter()
            .find(|id| !old.contains(id))
            .unwrap();
        w.set_all(&new, ShardState::Failed, Some("max_model_len is too large"));
        assert_eq!(w.round(), ["stop_replica"]);
        assert_eq!(w.round(), ["remove_replica"]);
        assert_eq!(
            w.fleet.models["m"].rollout.as_ref().unwrap().failures,
            attempt
        );
    }
    assert_eq!(w.round(), ["rollback_model"]);
    let record = &w.fleet.models["m"];
    let rollout = record.rollout.clone().unwrap();
    assert!(
        rollout
            .rollback
            .as_deref()
            .unwrap()
            .contains("3 new replica(s)"),
        "{rollout:?}"
    );
    assert_eq!(w.replicas_of("m"), old, "the old replicas never stopped");
    assert_eq!(orders(&w), old_orders, "and run the spec they always ran");
    assert_eq!(w.round(), ["finish_rollout"], "nothing left to replace");
}

#[test]
fn with_no_room_for_a_surge_only_max_unavailable_lets_an_old_replica_go_first() {
    let mut w = World::new(&[node("a", 1, None), node("b", 1, None)]);
    put(&mut w, entry(2, &[], serde_json::json!({})));
    w.round();
    for id in w.replicas_of("m") {
        w.set_all(&id, ShardState::Ready, None);
    }
    put(
        &mut w,
        entry(2, &["--enforce-eager"], serde_json::json!({})),
    );
    w.now_ms += w.settings.retry_max_ms;
    assert!(
        w.round().is_empty(),
        "no GPU for a surge, and none may go down"
    );

    put(
        &mut w,
        entry(
            2,
            &["--enforce-eager"],
            serde_json::json!({"rollout": {"max_surge": 1, "max_unavailable": 1}}),
        ),
    );
    w.now_ms += w.settings.retry_max_ms;
    assert_eq!(w.round(), ["stop_replica"], "one old replica drains first");
    let going: Vec<String> = w
        .replicas_of("m")
        .into_iter()
        .filter(|id| w.fleet.replicas[id].stop.is_some())
        .collect();
    assert_eq!(going.len(), 1);
    assert!(
        w.fleet.replicas[&going[0]]
            .stop
            .as_ref()
            .unwrap()
            .reason
            .contains("max_unavailable"),
    );
}

#[test]
fn a_rollback_decided_twice_applies_once() {
    let mut w = running_two(serde_json::json!({}));
    put(
        &mut w,
        entry(2, &["--enforce-eager"], serde_json::json!({})),
    );
    let broken = w.fleet.models["m"].spec.launch_fingerprint().to_owned();
    let rollback = Command::RollbackModel {
        name: "m".into(),
        reason: "failing".into(),
        from: Some(broken.clone()),
        at_ms: 5,
    };
    assert_eq!(w.fleet.apply(&rollback), llmgw_state::Outcome::Applied);
    let restored = w.fleet.models["m"].spec.launch_fingerprint().to_owned();
    assert_ne!(restored, broken);
    assert!(
        matches!(w.fleet.apply(&rollback), llmgw_state::Outcome::Rejected(_)),
        "the second copy must not swap the broken spec back"
    );
    assert_eq!(w.fleet.models["m"].spec.launch_fingerprint(), restored);
}
