//! The supervisor against real `llmgw-engine-sim` processes: launch through
//! the adapters' real command lines, readiness, crash and hang while
//! loading, out of memory while serving, stop with SIGKILL escalation,
//! drain, and refusals before launch.

mod support;

use std::time::{Duration, Instant};

use llmgw_agent::group_members;
use llmgw_catalog::Engine;
use llmgw_proto::agent::ShardState;
use llmgw_test_kit::process::signal_group;
use llmgw_test_kit::{free_port, wait_until};
use support::*;

const LONG: Duration = Duration::from_secs(60);

fn all_gone(pids: &[i32]) -> bool {
    pids.iter().all(|p| group_members(*p).is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_and_sglang_shards_become_ready_and_serve() {
    // Long enough a load that the first health check always sees it.
    let mut h = Harness::new(&NodeSetup {
        load_time: "1s",
        ..NodeSetup::default()
    });
    let (pv, ps) = (free_port(), free_port());
    assert!(h.start(spec("v0", Engine::Vllm, &[0], pv)).accepted);
    assert!(h.start(spec("s0", Engine::Sglang, &[1, 2], ps)).accepted);
    let ready = h.wait_for("v0", ShardState::Ready, LONG).await;
    assert_eq!(ready.port, u32::from(pv));
    assert!(ready.pid > 0);
    h.wait_for("s0", ShardState::Ready, LONG).await;
    assert_eq!(
        h.states("v0")[..3],
        [ShardState::Starting, ShardState::Loading, ShardState::Ready]
    );
    assert!(h.states("s0").contains(&ShardState::Loading));
    let (status, body) = completion(pv, 4).unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _) = completion(ps, 4).unwrap();
    assert_eq!(status, 200);

    // Registration lists both with their spec hashes.
    let running = h.supervisor.running();
    assert_eq!(running.len(), 2);
    assert!(running.iter().all(|r| r.spec_hash.len() == 16));

    // Starting the same spec again is acknowledged and changes nothing.
    let pid = h.supervisor.pids("v0");
    let again = h.start(spec("v0", Engine::Vllm, &[0], pv));
    assert!(again.accepted, "{again:?}");
    assert!(again.message.contains("already runs"), "{}", again.message);
    assert_eq!(h.supervisor.pids("v0"), pid);
    // A different spec under the same id is refused.
    let other = h.start(spec("v0", Engine::Vllm, &[3], pv));
    assert!(!other.accepted);
    assert!(
        other.message.contains("different spec"),
        "{}",
        other.message
    );

    let pids: Vec<i32> = ["v0", "s0"]
        .iter()
        .flat_map(|s| h.supervisor.pids(s))
        .collect();
    assert!(h.supervisor.stop("v0", "test").accepted);
    assert!(h.supervisor.stop("s0", "test").accepted);
    let stopped = h.wait_for("v0", ShardState::Stopped, LONG).await;
    assert_eq!(stopped.exit_code, Some(0), "{stopped:?}");
    h.wait_for("s0", ShardState::Stopped, LONG).await;
    assert!(all_gone(&pids));
    // Stopping again is idempotent.
    let again = h.supervisor.stop("v0", "test");
    assert!(
        again.accepted && again.message.contains("not running"),
        "{again:?}"
    );
    assert!(h.supervisor.running().is_empty());
    assert!(llmgw_agent::read_state_files(h.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_while_loading_is_failed_with_the_engines_error_tail() {
    let mut h = Harness::new(&NodeSetup::default());
    let mut s = spec("crash", Engine::Vllm, &[0], free_port());
    s.env
        .insert("LLMGW_SIM_FAULT".into(), "crash_on_load:kv_cache".into());
    assert!(h.start(s).accepted);
    let failed = h.wait_for("crash", ShardState::Failed, LONG).await;
    assert_eq!(failed.exit_code, Some(1), "{failed:?}");
    assert!(
        failed.message.contains("exited with code 1 while loading"),
        "{}",
        failed.message
    );
    let golden = std::fs::read_to_string(
        repo_root().join("crates/engine-sim/tests/golden/vllm-0.11.1-kv-cache.txt"),
    )
    .or_else(|_| {
        std::fs::read_to_string(
            repo_root().join("crates/engine-sim/tests/golden/vllm-0.11.0-kv-cache.txt"),
        )
    })
    .unwrap();
    let want: Vec<&str> = golden
        .lines()
        .rev()
        .take(5)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let got: Vec<String> = failed.output_tail[failed.output_tail.len() - 5..]
        .iter()
        .map(|l| normalize_pids(l))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        failed.output_tail.last().unwrap(),
        &format!(
            "(APIServer pid={}) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{'EngineCore_DP0': 1}}",
            failed.pid
        )
    );
    assert!(
        failed
            .output_tail
            .iter()
            .any(|l| l.contains("ValueError: No available memory for the cache blocks"))
    );
    assert!(all_gone(&[failed.pid as i32]));
    assert!(h.supervisor.running().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_while_loading_fails_after_the_startup_timeout_and_leaves_nothing() {
    let setup = NodeSetup {
        startup_timeout: Duration::from_secs(3),
        ..NodeSetup::default()
    };
    let mut h = Harness::new(&setup);
    let mut s = spec("hang", Engine::Vllm, &[0, 1], free_port());
    s.env
        .insert("LLMGW_SIM_FAULT".into(), "hang_on_load:weights".into());
    let started = Instant::now();
    assert!(h.start(s).accepted);
    let pids = h.supervisor.pids("hang");
    // The engine and its two workers, one process group.
    assert!(
        wait_until(LONG, || async { group_members(pids[0]).len() >= 3 }).await,
        "the engine's workers did not start"
    );
    let failed = h.wait_for("hang", ShardState::Failed, LONG).await;
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert!(
        failed
            .message
            .contains("not ready within startup_timeout 3s"),
        "{}",
        failed.message
    );
    assert!(!failed.output_tail.is_empty());
    assert!(group_members(pids[0]).is_empty(), "group left behind");
}

/// Serves `/health` with 200 and a model list naming only `other` on
/// `port`, as another fleet's engine would.
fn foreign_engine(port: u16) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut request = [0u8; 2048];
            let n = conn.read(&mut request).unwrap_or(0);
            let body = if String::from_utf8_lossy(&request[..n]).contains("/v1/models") {
                r#"{"object":"list","data":[{"id":"other","object":"model"}]}"#
            } else {
                "{}"
            };
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_port_another_engine_answers_is_never_ready() {
    // The port is free when the agent checks it, and taken right after
    // (two engines started at once on one host). SGLang binds its port only
    // once loaded, so for the whole load the port's answers come from the
    // other process.
    let mut h = Harness::new(&NodeSetup {
        load_time: "1s",
        ..NodeSetup::default()
    });
    let port = free_port();
    assert!(h.start(spec("s0", Engine::Sglang, &[0], port)).accepted);
    foreign_engine(port);
    let failed = h.wait_for("s0", ShardState::Failed, LONG).await;
    assert!(
        !h.states("s0").contains(&ShardState::Ready),
        "reported ready on an engine that is not its own: {:#?}",
        h.history
    );
    let saw_the_other = h.history.iter().any(|s| {
        s.shard_id == "s0"
            && s.state == ShardState::Loading as i32
            && s.message.contains(r#"serves ["other"], not `"#)
    });
    assert!(saw_the_other, "{:#?}", h.history);
    assert!(
        failed.message.contains("while loading"),
        "{}",
        failed.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_while_serving_is_reported_with_the_tail() {
    let mut h = Harness::new(&NodeSetup::default());
    let port = free_port();
    let mut s = spec("oom", Engine::Vllm, &[0], port);
    s.env
        .insert("LLMGW_SIM_FAULT".into(), "oom_after_tokens:40".into());
    assert!(h.start(s).accepted);
    h.wait_for("oom", ShardState::Ready, LONG).await;
    // Bounded: the engine dies after 40 tokens.
    for _ in 0..20 {
        if completion(port, 16).is_err() {
            break;
        }
    }
    let failed = h.wait_for("oom", ShardState::Failed, LONG).await;
    assert!(
        failed.message.contains("while serving"),
        "{}",
        failed.message
    );
    assert_eq!(failed.exit_code, Some(1));
    assert!(
        failed
            .output_tail
            .iter()
            .any(|l| l.contains("torch.OutOfMemoryError: CUDA out of memory")),
        "{:#?}",
        failed.output_tail
    );
    assert!(
        failed
            .output_tail
            .iter()
            .any(|l| l.contains("EngineCore encountered a fatal error."))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_ignoring_sigterm_is_killed_after_stop_timeout() {
    let setup = NodeSetup {
        stop_timeout: Duration::from_secs(2),
        ..NodeSetup::default()
    };
    let mut h = Harness::new(&setup);
    let mut s = spec("stubborn", Engine::Vllm, &[0, 1], free_port());
    s.env
        .insert("LLMGW_SIM_FAULT".into(), "ignore_sigterm".into());
    assert!(h.start(s).accepted);
    h.wait_for("stubborn", ShardState::Ready, LONG).await;
    let pgid = h.supervisor.pids("stubborn")[0];
    assert!(group_members(pgid).len() >= 3);
    let asked = Instant::now();
    assert!(h.supervisor.stop("stubborn", "test").accepted);
    let stopped = h.wait_for("stubborn", ShardState::Stopped, LONG).await;
    assert!(asked.elapsed() >= Duration::from_secs(2));
    assert!(
        stopped.message.contains("killed with SIGKILL"),
        "{}",
        stopped.message
    );
    assert_eq!(stopped.signal, Some(libc::SIGKILL), "{stopped:?}");
    assert!(group_members(pgid).is_empty(), "group left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_requests_in_flight_then_stops() {
    let mut h = Harness::new(&NodeSetup::default());
    let port = free_port();
    let mut s = spec("drain", Engine::Vllm, &[0], port);
    // Slow enough that a 60-token request is still running when the drain begins.
    s.env.insert("LLMGW_SIM_ITL".into(), "30ms".into());
    assert!(h.start(s).accepted);
    h.wait_for("drain", ShardState::Ready, LONG).await;
    let request = std::thread::spawn(move || {
        http(
            port,
            "POST",
            "/v1/completions",
            r#"{"model":"qwen-small","prompt":"hi","max_tokens":60,"ignore_eos":true}"#,
        )
    });
    let metrics_busy = || {
        http(port, "GET", "/metrics", "")
            .ok()
            .and_then(|(_, b)| llmgw_agent::requests_in_flight(&b))
            .is_some_and(|n| n >= 1.0)
    };
    assert!(
        wait_until(LONG, || async { metrics_busy() }).await,
        "no request in flight"
    );
    let asked = Instant::now();
    assert!(
        h.supervisor
            .drain("drain", Duration::from_secs(30), "test")
            .accepted
    );
    h.wait_for("drain", ShardState::Draining, LONG).await;
    let stopped = h.wait_for("drain", ShardState::Stopped, LONG).await;
    assert!(
        stopped.message.contains("no requests in flight"),
        "{}",
        stopped.message
    );
    let (status, body) = request.join().unwrap().expect("request finished");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
    assert!(asked.elapsed() < Duration::from_secs(30));
    // Draining something already stopped is acknowledged.
    assert!(
        h.supervisor
            .drain("drain", Duration::from_secs(1), "again")
            .accepted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_that_cannot_work_are_refused_before_anything_starts() {
    let mut h = Harness::new(&NodeSetup::default());
    let busy_port = free_port();
    let _holder = std::net::TcpListener::bind(("127.0.0.1", busy_port)).unwrap();
    for (spec, want) in launches_refused_by_validation(busy_port) {
        refused_and_failed_without_a_process(&mut h, spec, &want).await;
    }
    a_missing_engine_binary_is_refused(h.dir.path()).await;

    // Nothing ran: no engine log was ever opened.
    assert!(h.logs().is_empty(), "{:?}", h.logs());
    assert!(h.supervisor.running().is_empty());

    a_gpu_held_by_a_running_shard_is_refused_for_the_next(&mut h).await;
}

/// Each launch the node's checks refuse, with words its refusal must hold.
/// `busy_port` is one some other process holds.
fn launches_refused_by_validation(busy_port: u16) -> Vec<(llmgw_agent::LaunchSpec, String)> {
    let changed = |id: &str, engine, gpus: &[u32], change: fn(&mut llmgw_agent::LaunchSpec)| {
        let mut spec = spec(id, engine, gpus, free_port());
        change(&mut spec);
        spec
    };
    let cases = [
        (
            changed("r-count", Engine::Vllm, &[0], |s| {
                s.gpus_per_node = 2;
                s.tensor_parallel = 2;
            }),
            "profile `tp1` needs 2 GPU(s) on this node, but the shard was assigned 1",
        ),
        (
            changed("r-flag", Engine::Vllm, &[0], |s| {
                s.engine_args = vec!["--port".into(), "9999".into()];
            }),
            "engine argument \"--port\" sets --port, which llmgw manages",
        ),
        (
            changed("r-tp", Engine::Sglang, &[0], |s| {
                s.engine_args = vec!["--tp=2".into()];
            }),
            "sets --tp-size, which llmgw manages",
        ),
        (
            changed("r-args", Engine::Sglang, &[0], |s| {
                s.engine_args = vec!["--max-model-len".into(), "8192".into()];
            }),
            "engine_args of profile `tp1` are refused by sglang 0.5.10: engine_args[0]: --max-model-len is not an option of sglang 0.5.10; did you mean --context-length (vLLM calls it --max-model-len)?",
        ),
        (
            spec("r-gpu", Engine::Vllm, &[9], free_port()),
            "GPU 9 is not on this node (it has GPUs 0, 1, 2, 3, 4, 5, 6, 7)",
        ),
        (
            changed("r-mem", Engine::Vllm, &[0], |s| s.min_gpu_memory_gb = 141),
            "has 85 GB, profile `tp1` needs 141 GB",
        ),
        (
            changed("r-model", Engine::Vllm, &[0], |s| {
                s.gpu_models = vec!["A100".into()];
            }),
            "is a NVIDIA H100 80GB HBM3, profile `tp1` accepts only [\"A100\"]",
        ),
        (
            changed("r-fabric", Engine::Vllm, &[0, 1], two_nodes_of_two),
            "a multi-node shard needs a fabric",
        ),
        (
            changed("r-fabric2", Engine::Vllm, &[0, 1], |s| {
                two_nodes_of_two(s);
                s.fabric = Some("ib-z".into());
            }),
            "fabric `ib-z` is not configured on this node",
        ),
    ];
    let busy = (
        spec("r-port", Engine::Vllm, &[0], busy_port),
        format!("port {busy_port} on 127.0.0.1 is taken by another process"),
    );
    cases
        .into_iter()
        .map(|(spec, want)| (spec, want.to_string()))
        .chain([busy])
        .collect()
}

fn two_nodes_of_two(spec: &mut llmgw_agent::LaunchSpec) {
    spec.nodes = 2;
    spec.gpus_per_node = 2;
    spec.tensor_parallel = 4;
    spec.master_port = free_port();
}

/// The start is refused with `want`, and the shard is reported failed
/// with it, no process behind it.
async fn refused_and_failed_without_a_process(
    h: &mut Harness,
    spec: llmgw_agent::LaunchSpec,
    want: &str,
) {
    let id = spec.shard_id.clone();
    let outcome = h.start(spec);
    assert!(!outcome.accepted, "{id}: {outcome:?}");
    assert!(
        outcome.message.contains(want),
        "{id}: {:?} lacks {want:?}",
        outcome.message
    );
    let failed = h.wait_for(&id, ShardState::Failed, LONG).await;
    assert!(failed.message.contains(want), "{id}: {}", failed.message);
    assert_eq!(failed.pid, 0, "{id}: something was started");
}

/// A node whose vLLM points nowhere refuses the start and reports it failed.
async fn a_missing_engine_binary_is_refused(work_dir: &std::path::Path) {
    let mut facts = node_facts(work_dir, &NodeSetup::default());
    facts.context.engines.vllm.as_mut().unwrap().bin = "/opt/nowhere/bin/vllm".into();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let other = tempfile::tempdir().unwrap();
    let (sup, _) = llmgw_agent::Supervisor::new(
        supervisor_config(other.path(), &NodeSetup::default()),
        facts,
        tx,
    )
    .unwrap();
    let outcome = sup.start(spec("r-bin", Engine::Vllm, &[0], free_port()), false, 1);
    assert!(!outcome.accepted);
    assert!(
        outcome
            .message
            .contains("engine program /opt/nowhere/bin/vllm does not exist"),
        "{}",
        outcome.message
    );
    let status = rx.recv().await.unwrap();
    assert_eq!(status.state, ShardState::Failed as i32);
}

async fn a_gpu_held_by_a_running_shard_is_refused_for_the_next(h: &mut Harness) {
    assert!(
        h.start(spec("holder", Engine::Vllm, &[4], free_port()))
            .accepted
    );
    let busy = h.start(spec("r-busy", Engine::Vllm, &[4], free_port()));
    assert!(!busy.accepted);
    assert!(
        busy.message.contains("GPU 4 is in use by shard holder"),
        "{}",
        busy.message
    );
    assert!(h.supervisor.stop("holder", "test").accepted);
    h.wait_for("holder", ShardState::Stopped, LONG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_supervisor_adopts_live_engines_and_removes_stale_files() {
    let setup = NodeSetup::default();
    let mut h = Harness::new(&setup);
    let port = free_port();
    assert!(h.start(spec("keep", Engine::Vllm, &[0], port)).accepted);
    let ready = h.wait_for("keep", ShardState::Ready, LONG).await;
    let pids = h.supervisor.pids("keep");

    // A state file whose process is another one than recorded (same pid,
    // other start time), and one that is not JSON at all.
    let shards = llmgw_agent::shards_dir(h.dir.path());
    let mut record = llmgw_agent::read_state_files(h.dir.path())[0]
        .1
        .clone()
        .unwrap();
    record.shard_id = "gone".into();
    record.processes[0].start_time += 1;
    std::fs::write(
        shards.join("gone.json"),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
    std::fs::write(shards.join("junk.json"), "{").unwrap();

    let mut adoptions = h.restart(&setup);
    adoptions.sort_by_key(|a| format!("{a:?}"));
    assert_eq!(adoptions.len(), 3, "{adoptions:?}");
    assert!(adoptions.contains(&llmgw_agent::Adoption::Adopted {
        shard_id: "keep".into(),
        pids: pids.clone()
    }));
    let stale: Vec<_> = adoptions
        .iter()
        .filter(|a| matches!(a, llmgw_agent::Adoption::Stale { .. }))
        .collect();
    assert_eq!(stale.len(), 2, "{adoptions:?}");
    let left: Vec<String> = llmgw_agent::read_state_files(h.dir.path())
        .into_iter()
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["keep.json"]);

    // Same engine, still serving, reported ready as adopted.
    assert_eq!(completion(port, 4).unwrap().0, 200);
    let adopted = h.wait_for("keep", ShardState::Ready, LONG).await;
    assert_eq!(adopted.pid, ready.pid);
    assert!(
        adopted.message.starts_with("adopted"),
        "{}",
        adopted.message
    );
    let running = h.supervisor.running();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].pid, ready.pid);
    // A start with the same spec is just acknowledged.
    let again = h.start(spec("keep", Engine::Vllm, &[0], port));
    assert!(
        again.accepted && again.message.contains("already runs"),
        "{again:?}"
    );

    // Not a child any more: its death is noticed through /proc.
    signal_group(pids[0], libc::SIGKILL);
    let failed = h.wait_for("keep", ShardState::Failed, LONG).await;
    assert!(
        failed.message.contains("while serving"),
        "{}",
        failed.message
    );
    assert!(
        failed.message.contains("exit status is unknown"),
        "{}",
        failed.message
    );
    assert!(llmgw_agent::read_state_files(h.dir.path()).is_empty());
}

/// The next status the supervisor sends, whatever it is.
async fn next_status(h: &mut Harness) -> llmgw_proto::agent::ShardStatus {
    let status = tokio::time::timeout(LONG, h.events.recv())
        .await
        .expect("no status within the deadline")
        .expect("the status channel closed");
    h.history.push(status.clone());
    status
}

/// A shard id runs once: the leader replaces a failed replica under new
/// ids, so a start naming a shard that already ended here comes from a
/// leader that never heard it end (the report lost with a stream). It is
/// told again, tail and all, and nothing is launched twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_ended_is_reported_again_not_launched_again() {
    let setup = NodeSetup::default();
    let mut h = Harness::new(&setup);
    let port = free_port();
    assert!(h.start(spec("once", Engine::Vllm, &[0], port)).accepted);
    h.wait_for("once", ShardState::Ready, LONG).await;
    let pids = h.supervisor.pids("once");
    signal_group(pids[0], libc::SIGKILL);
    let failed = h.wait_for("once", ShardState::Failed, LONG).await;
    assert!(!failed.output_tail.is_empty(), "{failed:?}");

    let again = h.start(spec("once", Engine::Vllm, &[0], port));
    assert!(
        !again.accepted && again.message.contains("already ended"),
        "{again:?}"
    );
    let resent = next_status(&mut h).await;
    assert_eq!(resent.state, ShardState::Failed as i32, "{resent:?}");
    assert_eq!(resent.message, failed.message);
    assert_eq!(resent.output_tail, failed.output_tail);
    assert!(resent.seq > failed.seq, "a resent status must be news");
    assert!(h.supervisor.running().is_empty());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something serves on the ended shard's port"
    );
}

/// An engine that died while the agent was down: the leader still counts
/// it as running, so the restarted agent reports it failed with the
/// engine's last output, and a start naming it (the leader's `Registered`)
/// launches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_died_while_the_agent_was_down_is_reported_failed() {
    let setup = NodeSetup::default();
    let mut h = Harness::new(&setup);
    let port = free_port();
    assert!(h.start(spec("gone", Engine::Vllm, &[0], port)).accepted);
    h.wait_for("gone", ShardState::Ready, LONG).await;
    let record_path = llmgw_agent::shards_dir(h.dir.path()).join("gone.json");
    let record = std::fs::read(&record_path).unwrap();
    let pids = h.supervisor.pids("gone");
    // The agent "stops" here: its record stays as it was when the engine
    // died, which this supervisor (still running) would otherwise remove.
    signal_group(pids[0], libc::SIGKILL);
    h.wait_for("gone", ShardState::Failed, LONG).await;
    std::fs::write(&record_path, &record).unwrap();
    // A worker the engine started, in a group of its own, outlived it.
    let mut leftover = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg("600")
            .env("LLMGW_SHARD_STATE_FILE", &record_path)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    h.guard.add(leftover.id() as i32);
    // Until it has exec'd, the child still has this test's environment.
    let tagged_as = record_path.to_string_lossy().into_owned();
    let pgid = leftover.id() as i32;
    assert!(
        wait_until(LONG, || {
            let tagged =
                llmgw_procfs::groups_tagged("LLMGW_SHARD_STATE_FILE", &tagged_as).contains(&pgid);
            async move { tagged }
        })
        .await,
        "the leftover never carried its tag"
    );

    let adoptions = h.restart(&setup);
    assert!(
        matches!(adoptions.as_slice(), [llmgw_agent::Adoption::Stale { .. }]),
        "{adoptions:?}"
    );
    let reported = next_status(&mut h).await;
    assert_eq!(reported.shard_id, "gone");
    assert_eq!(reported.state, ShardState::Failed as i32, "{reported:?}");
    assert!(
        reported.message.contains("while the agent was not running"),
        "{}",
        reported.message
    );
    assert!(!reported.output_tail.is_empty(), "{reported:?}");
    assert!(!reported.replica_id.is_empty(), "{reported:?}");
    assert!(llmgw_agent::read_state_files(h.dir.path()).is_empty());
    assert!(
        wait_until(LONG, || {
            let exited = leftover.try_wait().ok().flatten().is_some();
            async move { exited }
        })
        .await,
        "a process the dead engine left still runs"
    );

    let again = h.start(spec("gone", Engine::Vllm, &[0], port));
    assert!(!again.accepted, "{again:?}");
    assert!(h.supervisor.running().is_empty());
}

/// A metrics endpoint that fails is not an idle engine: a drain keeps the
/// engine serving until its deadline instead of stopping it with requests
/// in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_never_takes_unreadable_metrics_for_an_idle_engine() {
    use std::io::{Read, Write};
    let mut h = Harness::new(&NodeSetup::default());
    let port = free_port();
    let mut s = spec("blind", Engine::Vllm, &[0], port);
    s.env.insert("LLMGW_SIM_ITL".into(), "25ms".into());
    s.env
        .insert("LLMGW_SIM_FAULT".into(), "metrics_error".into());
    assert!(h.start(s).accepted);
    h.wait_for("blind", ShardState::Ready, LONG).await;

    // A stream read up to its first token is in flight for sure.
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body =
        r#"{"model":"qwen-small","prompt":"hi","max_tokens":40,"ignore_eos":true,"stream":true}"#;
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&read).contains("data:") {
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first token");
        read.extend_from_slice(&buf[..n]);
    }
    let stream = std::thread::spawn(move || {
        let _ = socket.read_to_end(&mut read);
        String::from_utf8_lossy(&read).into_owned()
    });

    assert!(
        h.supervisor
            .drain("blind", Duration::from_secs(10), "test")
            .accepted
    );
    let stopped = h.wait_for("blind", ShardState::Stopped, LONG).await;
    assert!(
        stopped.message.contains("could not be read") && stopped.message.contains("500"),
        "{}",
        stopped.message
    );
    let answer = stream.join().unwrap();
    assert!(answer.contains("[DONE]"), "the stream was cut: {answer}");
}

/// An engine whose state file cannot be written is not left running: a
/// restarted agent would neither adopt nor stop it, and would start the
/// shard a second time on the same GPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_state_file_cannot_be_written_does_not_run() {
    let mut h = Harness::new(&NodeSetup::default());
    let port = free_port();
    // The file is written through a temporary next to it: a directory of
    // that name makes the write fail as a full or read-only disk would.
    let shards = llmgw_agent::shards_dir(h.dir.path());
    std::fs::create_dir_all(shards.join(".unrecorded.json.tmp")).unwrap();
    let outcome = h.start(spec("unrecorded", Engine::Vllm, &[0], port));
    assert!(
        !outcome.accepted && outcome.message.contains("state file"),
        "{outcome:?}"
    );
    let failed = h.wait_for("unrecorded", ShardState::Failed, LONG).await;
    assert!(failed.message.contains("state file"), "{}", failed.message);
    assert!(failed.pid > 0, "{failed:?}");
    let pids = [failed.pid as i32];
    assert!(
        wait_until(LONG, || async { all_gone(&pids) }).await,
        "the engine runs without a record: {pids:?}"
    );
    assert!(h.supervisor.running().is_empty());
}

/// An engine launched in sleep mode sleeps and wakes as the leader asks,
/// and an agent restarted under a sleeping engine adopts it asleep (never
/// ready: routers would send it requests it refuses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_engine_wakes_when_asked_and_is_adopted_asleep() {
    let setup = NodeSetup::default();
    let mut h = Harness::new(&setup);
    let port = free_port();
    let mut sleepy = spec("sleepy", Engine::Vllm, &[0], port);
    sleepy.sleep_mode = true;
    assert!(h.start(sleepy.clone()).accepted);
    h.wait_for("sleepy", ShardState::Ready, LONG).await;
    let asked = h.start_asleep(sleepy.clone(), true);
    assert!(
        asked.accepted && asked.message.contains("wanted asleep"),
        "{asked:?}"
    );
    let asleep = h.wait_for("sleepy", ShardState::Sleeping, LONG).await;
    assert!(
        asleep.message.contains("asleep after"),
        "{}",
        asleep.message
    );
    assert_eq!(
        completion(port, 4).unwrap().0,
        503,
        "asleep, it serves nothing"
    );

    h.restart(&setup);
    let adopted = h.wait_for("sleepy", ShardState::Sleeping, LONG).await;
    assert!(
        adopted.message.starts_with("adopted") && adopted.message.contains("asleep"),
        "{}",
        adopted.message
    );
    assert!(h.start_asleep(sleepy, false).accepted);
    let awake = h.wait_for("sleepy", ShardState::Ready, LONG).await;
    assert!(
        awake.message.contains("woken from sleep"),
        "{}",
        awake.message
    );
    assert_eq!(completion(port, 4).unwrap().0, 200);
}
