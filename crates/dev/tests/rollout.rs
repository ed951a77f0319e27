//! Changing a running model, as an operator does on `llmgw dev`: the
//! change rolls onto the replicas make-before-break while a chat load runs
//! through the router and loses nothing, the leader killed halfway; an alias needs no restart; a
//! change whose engines fail is rolled back on its own, the old replica
//! serving throughout.

use std::time::Duration;

use llmgw_api::{ClusterView, ReplicaState, ReplicaView, RolloutPhase, RolloutView, paths};
use llmgw_test_kit::dev::{Dev, DevAdmin, peer_pid};
use llmgw_test_kit::load::ChatLoad;
use llmgw_test_kit::process::signal_pid;
use llmgw_test_kit::{DEADLINE, eventually, stream_chat};
use reqwest::Method;
use serde_json::{Value, json};

/// The demo catalog's small model (three nodes: it runs on the L40S node,
/// which has GPUs to spare for a surge replica).
const MODEL: &str = "qwen-0.5b";

/// The demo entry of `MODEL`, with `changes` laid over it.
fn entry(changes: Value) -> Value {
    let mut entry = json!({
        "name": MODEL,
        "aliases": ["qwen"],
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": 1,
        "profiles": [{"name": "tp1", "engine": "vllm", "gpus_per_node": 1,
                      "min_gpu_memory_gb": 16, "gpu_models": ["L40S", "A100"]}],
    });
    for (key, value) in changes.as_object().expect("a map") {
        entry[key] = value.clone();
    }
    entry
}

fn profile(extra: Value) -> Value {
    let mut profile = json!({"name": "tp1", "engine": "vllm", "gpus_per_node": 1,
                             "min_gpu_memory_gb": 16, "gpu_models": ["L40S", "A100"]});
    for (key, value) in extra.as_object().expect("a map") {
        profile[key] = value.clone();
    }
    json!([profile])
}

async fn put(admin: &DevAdmin, entry: &Value) {
    let (status, body) = admin
        .send(Method::PUT, &paths::model(MODEL), Some(entry.to_string()))
        .await
        .unwrap();
    assert_eq!(status, 200, "PUT {MODEL}: {body}");
}

async fn replicas(admin: &DevAdmin) -> Result<Vec<ReplicaView>, String> {
    let all: Vec<ReplicaView> = admin.get(paths::REPLICAS).await?;
    Ok(all
        .into_iter()
        .filter(|r| r.replica.model == MODEL)
        .collect())
}

/// The command line of the replica's head engine process.
fn engine_cmdline(replica: &ReplicaView) -> Result<String, String> {
    let pid = replica.replica.shards[0]
        .pid
        .ok_or(format!("replica {} reports no pid", replica.replica.id))?;
    let raw =
        std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|e| format!("pid {pid}: {e}"))?;
    Ok(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// The one replica of `MODEL` left: ready, nothing beside it, its engine
/// started with `wanted` in its command line (or without it, `absent`).
async fn one_replica_whose_engine(
    admin: &DevAdmin,
    wanted: &str,
    present: bool,
) -> Result<ReplicaView, String> {
    let all = replicas(admin).await?;
    let [only] = all.as_slice() else {
        let states: Vec<String> = all
            .iter()
            .map(|r| format!("{} {}", r.replica.id, r.state.as_str()))
            .collect();
        return Err(format!("replicas: {}", states.join(", ")));
    };
    if only.state != ReplicaState::Ready {
        return Err(format!("{} is {}", only.replica.id, only.state.as_str()));
    }
    let cmdline = engine_cmdline(only)?;
    if cmdline.contains(wanted) != present {
        return Err(format!("{} runs `{cmdline}`", only.replica.id));
    }
    Ok(only.clone())
}

async fn rollout(admin: &DevAdmin) -> RolloutView {
    admin
        .get(&paths::rollout(MODEL))
        .await
        .unwrap_or_else(|e| panic!("rollout status: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_model_rolls_out_under_load_and_a_failing_change_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("dev"), &[]);
    dev.wait_printed("Press Ctrl-C", Duration::from_secs(240))
        .await;
    let dev_file = dev.dev_file().expect("dev.json once dev is ready");
    let router = dev_file.router.clone().expect("dev.json names the router");
    let admin = DevAdmin::new(&dev_file);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let first = eventually("the demo replica", DEADLINE, || {
        one_replica_whose_engine(&admin, "--max-model-len", false)
    })
    .await;

    // A new engine flag: the replica is replaced, make-before-break, while
    // chats keep flowing through the router.
    let load = ChatLoad::start(&http, &router, MODEL);
    load.until_answered(4).await;
    let changed = entry(json!({"profiles": profile(json!({
        "engine_args": ["--max-model-len", "2048"]}))}));
    put(&admin, &changed).await;
    // The leader dies once the surge replica is placed: the next one
    // carries the rollout on from the replicated state, placing nothing
    // twice.
    let surge = eventually("a surge replica beside the old one", DEADLINE, || async {
        let all = replicas(&admin).await?;
        all.iter()
            .find(|r| r.replica.id != first.replica.id)
            .map(|r| r.replica.id.clone())
            .ok_or(format!("{} replica(s)", all.len()))
    })
    .await;
    let cluster: ClusterView = admin.get(paths::CLUSTER).await.unwrap();
    let leader = cluster.leader_id.expect("a leader");
    signal_pid(peer_pid(&dev_file, leader), libc::SIGKILL);
    let second = eventually("the new spec running alone", DEADLINE, || {
        one_replica_whose_engine(&admin, "--max-model-len 2048", true)
    })
    .await;
    assert_eq!(second.replica.id, surge, "the surge replica took over");
    assert_eq!(
        second.replica.replaces.as_deref(),
        Some(first.replica.id.as_str())
    );
    let status = eventually("the rollout complete", DEADLINE, || async {
        let view = rollout(&admin).await;
        if view.phase == RolloutPhase::Complete && view.updated_ready == 1 {
            Ok(view)
        } else {
            Err(format!("{view:?}"))
        }
    })
    .await;
    assert!(status.can_roll_back, "{status:?}");
    let answered = load.answered();
    load.until_answered(answered + 8).await;

    // One more alias: nothing restarts, and the router maps it.
    let mut aliased = changed.clone();
    aliased["aliases"] = json!(["qwen", "qwen-latest"]);
    put(&admin, &aliased).await;
    let answer = eventually("a chat under the new alias", DEADLINE, || {
        stream_chat(&http, &router, "qwen-latest")
    })
    .await;
    assert!(!answer.is_empty());
    let still = one_replica_whose_engine(&admin, "--max-model-len 2048", true)
        .await
        .unwrap();
    assert_eq!(
        still.replica.id, second.replica.id,
        "an alias restarts nothing"
    );

    // A change whose engines fail to load: the old replica keeps serving,
    // and after two failed replicas the change is rolled back on its own.
    let mut broken = aliased.clone();
    broken["profiles"] = profile(json!({
        "engine_args": ["--max-model-len", "4096"],
        "env": {"LLMGW_SIM_FAULT": "crash_on_load:oom"}}));
    broken["rollout"] = json!({"rollback_after_failures": 2});
    put(&admin, &broken).await;
    let rolled_back = eventually("the failing change rolled back", DEADLINE, || async {
        let view = rollout(&admin).await;
        match &view.rollout {
            Some(r) if r.rollback.is_some() && view.phase == RolloutPhase::Complete => Ok(view),
            _ => Err(format!("{view:?}")),
        }
    })
    .await;
    let why = rolled_back.rollout.as_ref().unwrap();
    assert!(
        why.rollback
            .as_deref()
            .unwrap()
            .contains("2 new replica(s)"),
        "{why:?}"
    );
    let kept = one_replica_whose_engine(&admin, "--max-model-len 2048", true)
        .await
        .unwrap();
    assert_eq!(
        kept.replica.id, second.replica.id,
        "the old replica never stopped"
    );
    let (_, stored) = admin
        .send(Method::GET, &paths::model(MODEL), None)
        .await
        .unwrap();
    assert_eq!(
        stored["profiles"][0]["engine_args"],
        json!(["--max-model-len", "2048"]),
        "the catalog holds the spec that runs: {stored}"
    );
    load.stop_without_failures("through a rollout with a leader kill, an alias and a rollback")
        .await;
}
