//! Every adapter's real command line, run by the supervisor against the
//! simulator persona it is written for, until every rank is ready: vLLM
//! 0.11.0 with Ray, vLLM 0.11.1 multi-node `mp`, SGLang multi-node, and the
//! single-node forms. A flag the engine does not know would end the process
//! with argparse's exit 2 and fail the shard.

mod support;

use std::time::Duration;

use llmgw_catalog::{Engine, EngineRelease, LaunchMode};
use llmgw_proto::agent::ShardState;
use llmgw_test_kit::free_port;
use support::*;

const LONG: Duration = Duration::from_secs(90);
/// 32 attention heads: TP 4 divides them.
const MODEL: &str = "meta-llama/Llama-3.2-1B-Instruct";

/// Rank `rank` of a two-node replica, TP 4 over 2 GPUs per node.
fn rank(
    engine: Engine,
    id: &str,
    rank: u32,
    gpus: &[u32],
    port: u16,
    master_port: u16,
) -> llmgw_agent::LaunchSpec {
    let mut s = spec(id, engine, gpus, port);
    s.replica_id = "multi".into();
    s.source = MODEL.into();
    s.profile = "tp4x2".into();
    s.nodes = 2;
    s.rank = rank;
    s.gpus_per_node = 2;
    s.tensor_parallel = 4;
    s.master_port = master_port;
    s.fabric = Some("ib-a".into());
    s
}

async fn run_replica(h: &mut Harness, engine: Engine, prefix: &str) {
    let master = free_port();
    let head = format!("{prefix}-r0");
    let worker = format!("{prefix}-r1");
    let head_port = free_port();
    assert!(
        h.start(rank(engine, &head, 0, &[0, 1], head_port, master))
            .accepted
    );
    let o = h.start(rank(engine, &worker, 1, &[2, 3], free_port(), master));
    assert!(o.accepted, "{o:?}");
    h.wait_for(&worker, ShardState::Ready, LONG).await;
    let ready = h.wait_for(&head, ShardState::Ready, LONG).await;
    assert!(
        ready.message.contains("/health answered 200"),
        "{}",
        ready.message
    );
    let (status, body) = http(
        head_port,
        "POST",
        "/v1/completions",
        r#"{"model":"qwen-small","prompt":"hi","max_tokens":3}"#,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let pids: Vec<i32> = [&head, &worker]
        .iter()
        .flat_map(|s| h.supervisor.pids(s))
        .collect();
    for shard in [&worker, &head] {
        assert!(h.supervisor.stop(shard, "test").accepted);
    }
    for shard in [&worker, &head] {
        h.wait_for(shard, ShardState::Stopped, LONG).await;
    }
    for pid in pids {
        assert!(
            llmgw_agent::group_members(pid).is_empty(),
            "{prefix}: group {pid} left"
        );
    }
}

fn assert_no_argparse_errors(h: &Harness) {
    for log in h.logs() {
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !text.contains("unrecognized arguments") && !text.contains(": error: "),
            "{}: {text}",
            log.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_0_11_0_ray_replica_runs_on_the_simulator() {
    let setup = NodeSetup {
        vllm_version: EngineRelease::new(0, 11, 0),
        launch_mode: LaunchMode::Ray,
        ..NodeSetup::default()
    };
    let mut h = Harness::new(&setup);
    run_replica(&mut h, Engine::Vllm, "ray").await;
    // The head ran `ray start --head` and `serve ... --distributed-executor-backend ray`.
    let names: Vec<String> = h
        .logs()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "ray-r0.ray-head.log",
        "ray-r0.engine.log",
        "ray-r1.ray-worker.log",
    ] {
        assert!(names.iter().any(|n| n == want), "{names:?}");
    }
    assert_no_argparse_errors(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_0_11_1_mp_replica_and_single_node_run_on_the_simulator() {
    let mut h = Harness::new(&NodeSetup::default());
    run_replica(&mut h, Engine::Vllm, "mp").await;
    let headless = std::fs::read_to_string(h.dir.path().join("logs/mp-r1.engine.log")).unwrap();
    assert!(headless.contains("--headless"), "{headless}");
    let port = free_port();
    assert!(h.start(spec("single", Engine::Vllm, &[4], port)).accepted);
    h.wait_for("single", ShardState::Ready, LONG).await;
    assert!(h.supervisor.stop("single", "test").accepted);
    h.wait_for("single", ShardState::Stopped, LONG).await;
    assert_no_argparse_errors(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_replica_runs_on_the_simulator() {
    let mut h = Harness::new(&NodeSetup::default());
    run_replica(&mut h, Engine::Sglang, "sgl").await;
    assert_no_argparse_errors(&h);
}
