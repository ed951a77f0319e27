//! SIGTERM as each release handles it: abort (vLLM 0.11), drain with a
//! deadline (vLLM current), drain without one and 503 (SGLang).

use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::*;

/// Starts a slow stream and waits until the engine counts it running.
fn slow_stream(sim: &Sim, running_metric: &str) -> JoinHandle<Option<Reply>> {
    let port = sim.port;
    let handle = std::thread::spawn(move || {
        post(
            port,
            "/v1/chat/completions",
            &chat_body(SMALL, 30, true, ""),
        )
    });
    assert!(
        wait_until_blocking(Duration::from_secs(10), || sim.metric(running_metric)
            == Some(1.0)),
        "stream never ran"
    );
    handle
}

#[test]
fn vllm_0_11_aborts_in_flight_streams_and_exits_zero() {
    let mut sim = Sim::ready("vllm=0.11.0", SMALL, &[], &[("LLMGW_SIM_ITL", "100ms")]);
    let stream = slow_stream(&sim, "vllm:num_requests_running");
    sim.signal("TERM");
    let reply = stream.join().unwrap().unwrap();
    assert!(
        !reply.complete && !reply.body.contains("[DONE]"),
        "stream must be cut: {}",
        reply.body
    );
    let status = sim
        .wait_exit(Duration::from_secs(10))
        .expect("exits promptly");
    assert_eq!(describe(status), "exit code 0");
    assert!(sim.stdout().contains("Shutting down FastAPI HTTP server."));
}

#[test]
fn vllm_current_drains_with_shutdown_timeout_and_aborts_without() {
    let mut sim = Sim::ready(
        "vllm=0.34.0",
        SMALL,
        &["--shutdown-timeout", "30"],
        &[("LLMGW_SIM_ITL", "50ms")],
    );
    let stream = slow_stream(&sim, "vllm:num_requests_running");
    sim.signal("TERM");
    assert!(
        wait_until_blocking(Duration::from_secs(5), || refused(sim.port)),
        "listener stays open while draining"
    );
    let reply = stream.join().unwrap().unwrap();
    assert!(
        reply.complete && reply.body.ends_with("data: [DONE]\n\n"),
        "drained stream completes: {}",
        reply.body
    );
    assert_eq!(
        describe(sim.wait_exit(Duration::from_secs(10)).expect("exits")),
        "exit code 0"
    );
    assert!(
        sim.stdout()
            .contains("[shutdown] API server: stopping engine client mode=drain timeout=30s")
    );

    let mut sim = Sim::ready("vllm=0.34.0", SMALL, &[], &[("LLMGW_SIM_ITL", "100ms")]);
    let stream = slow_stream(&sim, "vllm:num_requests_running");
    sim.signal("TERM");
    assert!(
        !stream.join().unwrap().unwrap().complete,
        "timeout 0 aborts"
    );
    assert_eq!(
        describe(sim.wait_exit(Duration::from_secs(10)).expect("exits")),
        "exit code 0"
    );
}

#[test]
fn sglang_turns_unhealthy_drains_then_kills_itself() {
    let mut sim = Sim::ready(
        "sglang=0.5.10",
        SMALL,
        &["--enable-metrics"],
        &[("LLMGW_SIM_ITL", "100ms")],
    );
    let stream = slow_stream(&sim, "sglang:num_running_reqs");
    sim.signal("TERM");
    assert!(wait_until_blocking(Duration::from_secs(5), || get(
        sim.port, "/health"
    )
    .is_some_and(|r| r.status == 503)));
    let reply = stream.join().unwrap().unwrap();
    assert!(
        reply.complete && reply.body.ends_with("data: [DONE]\n\n"),
        "{}",
        reply.body
    );
    assert_eq!(
        describe(sim.wait_exit(Duration::from_secs(10)).expect("exits")),
        "signal 9"
    );
    let err = sim.stderr();
    assert!(
        err.contains(
            "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
        ),
        "{err}"
    );
    assert!(
        err.contains("Gracefully exiting... Remaining number of requests 1."),
        "{err}"
    );
}

#[test]
fn sigterm_during_load_ends_the_process() {
    for persona in PERSONAS {
        let mut sim = Sim::start(persona, SMALL, &[], &[("LLMGW_SIM_LOAD_TIME", "20s")]);
        assert!(wait_until_blocking(Duration::from_secs(10), || sim
            .output()
            .contains("oad")));
        let kids = children(sim.pid());
        sim.signal("TERM");
        let status = sim
            .wait_exit(Duration::from_secs(10))
            .expect("SIGTERM ends a loading engine");
        assert_eq!(describe(status), "signal 15", "{persona}");
        for (pid, _) in kids {
            assert!(
                wait_until_blocking(Duration::from_secs(10), || !alive(pid)),
                "{persona}: worker {pid} survived"
            );
        }
    }
}
