//! Failures: each engine's error tail (golden files) and exit status, and
//! the faults injected while serving.

use std::time::Duration;

use crate::common::*;

/// Runs to exit and returns (status text, stdout+stderr).
fn run_to_exit(persona: &str, model: &str, extra: &[&str], env: &[(&str, &str)]) -> (String, Sim) {
    let mut sim = Sim::start(persona, model, extra, env);
    let status = sim
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{persona} did not exit:\n{}", sim.output()));
    (describe(status), sim)
}

fn golden_name(persona: &str, case: &str) -> String {
    format!("{}-{case}.txt", persona.replace('=', "-"))
}

#[test]
fn heads_not_divisible_by_tp() {
    for persona in PERSONAS {
        let (status, sim) = run_to_exit(
            persona,
            "meta-llama/Llama-3.1-8B-Instruct",
            &[if is_vllm(persona) { "-tp" } else { "--tp-size" }, "3"],
            &[],
        );
        if is_vllm(persona) {
            assert_eq!(status, "exit code 1", "{persona}");
            assert!(sim.stderr().contains("ValueError: Total number of attention heads (32) must be divisible by tensor parallel size (3)."));
        } else {
            assert_eq!(status, "signal 9", "{persona}");
        }
        assert_golden_tail(&golden_name(persona, "heads"), &sim.stderr());
    }
}

#[test]
fn load_crashes_end_with_the_engines_tails() {
    for persona in PERSONAS {
        for (case, fault) in [
            ("kv-cache", "crash_on_load:kv_cache"),
            ("oom", "crash_on_load:oom"),
            ("arch", "crash_on_load:arch"),
            ("free-memory", "crash_on_load:free_memory"),
        ] {
            let (status, sim) = run_to_exit(persona, SMALL, &[], &[("LLMGW_SIM_FAULT", fault)]);
            assert!(refused(sim.port), "{persona} {case}: never listened");
            // SGLang's scheduler failures take the tree down with SIGKILL; a
            // scheduler killed from outside is reported by the main process.
            let expected = if is_vllm(persona) || case == "free-memory" {
                "exit code 1"
            } else {
                "signal 9"
            };
            assert_eq!(status, expected, "{persona} {case}:\n{}", sim.output());
            assert_golden_tail(&golden_name(persona, case), &sim.stderr());
        }
    }
}

#[test]
fn seventy_b_does_not_fit_one_gpu_but_fits_four() {
    let (status, sim) = run_to_exit("vllm=0.34.0", "meta-llama/Llama-3.1-70B-Instruct", &[], &[]);
    assert_eq!(status, "exit code 1");
    assert!(
        sim.stdout()
            .contains("torch.OutOfMemoryError: CUDA out of memory."),
        "{}",
        sim.output()
    );
    assert!(sim.stderr().ends_with("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}\n"));
    let sim = Sim::ready(
        "vllm=0.34.0",
        "meta-llama/Llama-3.1-70B-Instruct",
        &["-tp", "4", "--max-model-len", "32k"],
        &[],
    );
    assert_eq!(
        get(sim.port, "/v1/models").unwrap().json()["data"][0]["max_model_len"],
        32000
    );
}

#[test]
fn unknown_model_fails_like_a_missing_repository() {
    for persona in PERSONAS {
        let (status, sim) = run_to_exit(persona, "nobody/no-such-model", &[], &[]);
        assert_eq!(status, "exit code 1", "{persona}");
        assert_golden_tail(&golden_name(persona, "model-not-found"), &sim.stderr());
    }
}

#[test]
fn visible_gpus_are_checked_against_the_world() {
    // vLLM 0.34 refuses a world larger than the node outright.
    let (status, sim) = run_to_exit(
        "vllm=0.34.0",
        "meta-llama/Llama-3.1-8B-Instruct",
        &["-tp", "4"],
        &[("CUDA_VISIBLE_DEVICES", "0,1")],
    );
    assert_eq!(status, "exit code 1");
    assert!(sim.stderr().contains("ValueError: World size (4) is larger than the number of available GPUs (2) in this node."), "{}", sim.stderr());
    let (status, sim) = run_to_exit("vllm=0.34.0", SMALL, &[], &[("CUDA_VISIBLE_DEVICES", "")]);
    assert_eq!(status, "exit code 1");
    assert!(
        sim.stdout()
            .contains("RuntimeError: No CUDA GPUs are available"),
        "{}",
        sim.output()
    );
    // SGLang fails in its scheduler on a device it cannot see.
    let (status, sim) = run_to_exit(
        "sglang=0.5.10",
        "meta-llama/Llama-3.1-8B-Instruct",
        &["--tp", "4"],
        &[("CUDA_VISIBLE_DEVICES", "0,1")],
    );
    assert_eq!(status, "signal 9");
    assert!(
        sim.stderr().contains("CUDA error: invalid device ordinal"),
        "{}",
        sim.stderr()
    );
}

#[test]
fn hang_on_load_never_listens_nor_exits() {
    for persona in PERSONAS {
        let mut sim = Sim::start(
            persona,
            SMALL,
            &[],
            &[("LLMGW_SIM_FAULT", "hang_on_load:weights")],
        );
        assert!(wait_until_blocking(Duration::from_secs(10), || sim
            .output()
            .contains("oad")));
        assert!(
            sim.wait_exit(Duration::from_secs(2)).is_none(),
            "{persona}: exited"
        );
        assert!(refused(sim.port), "{persona}");
    }
}

#[test]
fn crash_mid_stream_cuts_or_sends_an_error_event() {
    for persona in PERSONAS {
        let sim = Sim::ready(
            persona,
            SMALL,
            &[],
            &[("LLMGW_SIM_FAULT", "crash_mid_stream:cut@2")],
        );
        let reply = post(
            sim.port,
            "/v1/chat/completions",
            &chat_body(SMALL, 10, true, ""),
        )
        .unwrap();
        assert!(!reply.complete, "{persona}: stream must be cut");
        assert!(!reply.body.contains("[DONE]"), "{persona}");
        let sim = Sim::ready(
            persona,
            SMALL,
            &[],
            &[("LLMGW_SIM_FAULT", "crash_mid_stream:error_event@2")],
        );
        let reply = post(
            sim.port,
            "/v1/chat/completions",
            &chat_body(SMALL, 10, true, ""),
        )
        .unwrap();
        let events = reply.events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{persona}"
        );
        let error: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(error["error"]["code"], 500, "{persona}: {events:?}");
    }
}

#[test]
fn oom_after_tokens_kills_the_engine() {
    for persona in PERSONAS {
        let mut sim = Sim::ready(
            persona,
            SMALL,
            &[],
            &[
                ("LLMGW_SIM_FAULT", "oom_after_tokens:30"),
                ("LLMGW_SIM_ITL", "20ms"),
            ],
        );
        let port = sim.port;
        let first = post(
            port,
            "/v1/chat/completions",
            &chat_body(SMALL, 20, false, ""),
        )
        .unwrap();
        assert_eq!(first.status, 200, "{persona}");
        let second = post(
            port,
            "/v1/chat/completions",
            &chat_body(SMALL, 20, false, ""),
        )
        .unwrap();
        assert_eq!(
            (second.status, second.body.as_str()),
            (500, ""),
            "{persona}: in-flight request gets an empty 500"
        );
        let status = sim
            .wait_exit(Duration::from_secs(10))
            .expect("engine exits after OOM");
        assert_eq!(
            describe(status),
            if is_vllm(persona) {
                "exit code 1"
            } else {
                "signal 9"
            },
            "{persona}"
        );
        assert!(sim.output().contains("CUDA out of memory"), "{persona}");
        if is_vllm(persona) {
            assert!(
                sim.stdout()
                    .contains("EngineCore encountered a fatal error."),
                "{persona}"
            );
        }
    }
}

#[test]
fn unhealthy_and_stalled_engines_fail_health() {
    for persona in PERSONAS {
        let mut sim = Sim::start(persona, SMALL, &[], &[("LLMGW_SIM_FAULT", "unhealthy")]);
        assert!(wait_until_blocking(Duration::from_secs(20), || sim
            .output()
            .contains("Application startup complete.")));
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(get(sim.port, "/health").unwrap().status, 503, "{persona}");
        assert!(sim.wait_exit(Duration::from_millis(100)).is_none());
    }
    let sim = Sim::start(
        "sglang=0.5.10",
        SMALL,
        &[],
        &[
            ("LLMGW_SIM_FAULT", "stall"),
            ("SGLANG_HEALTH_CHECK_TIMEOUT", "1"),
        ],
    );
    assert!(wait_until_blocking(Duration::from_secs(20), || sim
        .output()
        .contains("fired up")));
    assert_eq!(get(sim.port, "/health").unwrap().status, 503);
    assert!(
        sim.stderr().contains("Health check failed."),
        "{}",
        sim.stderr()
    );
}

#[test]
fn a_tokenizer_directory_that_cannot_be_read_fails_the_start() {
    let (status, sim) = run_to_exit(
        "vllm=0.34.0",
        SMALL,
        &["--tokenizer", "/nonexistent/tokenizer"],
        &[],
    );
    assert_eq!(status, "exit code 1");
    assert!(
        sim.stderr()
            .contains("OSError: Can't load tokenizer for '/nonexistent/tokenizer'"),
        "{}",
        sim.stderr()
    );
}
