//! Command lines fail the way argparse fails: usage, error line, exit 2, fast.

use std::time::{Duration, Instant};

use crate::common::*;

fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let out = std::process::Command::new(BIN)
        .args(args)
        .env_remove("LLMGW_SIM_PERSONA")
        .envs(env.iter().copied())
        .output()
        .expect("run simulator");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        started.elapsed(),
    )
}

#[test]
fn unknown_flag_is_an_argparse_error_for_every_persona() {
    for persona in PERSONAS {
        let port = free_port().to_string();
        let mut args: Vec<String> = engine_args(persona, SMALL, free_port());
        args.push("--no-such-flag".into());
        args.push(port);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr, took) = run(&refs, &[]);
        assert_eq!(code, Some(2), "{persona}: {stderr}");
        assert!(took < Duration::from_secs(5), "{persona}: took {took:?}");
        let last = stderr.lines().last().unwrap_or_default();
        // `vllm serve` is a subcommand: the top-level `vllm` parser reports
        // unrecognized arguments.
        let prog = if is_vllm(persona) {
            "vllm"
        } else {
            "sglang serve"
        };
        assert!(stderr.starts_with("usage: "), "{persona}: {stderr}");
        assert!(
            last.starts_with(&format!(
                "{prog}: error: unrecognized arguments: --no-such-flag"
            )),
            "{persona}: {last}"
        );
    }
}

#[test]
fn bad_choice_names_the_choices() {
    let (code, stderr, _) = run(&["serve", SMALL, "--dtype", "int3"], &[]);
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr.trim_end(),
        "usage: vllm serve [model_tag] [options]\nvllm serve: error: argument --dtype: invalid choice: 'int3' (choose from 'auto', 'bfloat16', 'float', 'float16', 'float32', 'half')"
    );
}

#[test]
fn nnodes_is_unknown_to_vllm_0_11_0_only() {
    let (code, stderr, _) = run(
        &["serve", SMALL, "-n", "2", "--help"],
        &[("LLMGW_SIM_PERSONA", "vllm=0.11.1")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr, _) = run(
        &["serve", SMALL, "-n", "2"],
        &[("LLMGW_SIM_PERSONA", "vllm=0.11.0")],
    );
    assert_eq!(code, Some(2));
    assert!(
        stderr.ends_with("\nvllm: error: unrecognized arguments: -n 2\n"),
        "{stderr}"
    );
}

#[test]
fn the_current_sglang_persona_refuses_vllm_flags_as_sglang_serve_does() {
    let (code, stderr, _) = run(
        &[
            "-m",
            "sglang.launch_server",
            "--model-path",
            SMALL,
            "--max-model-len",
            "8192",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with("usage: sglang serve [-h] --model-path MODEL_PATH\n"),
        "{stderr}"
    );
    assert!(
        stderr.ends_with("\nsglang serve: error: unrecognized arguments: --max-model-len 8192\n"),
        "{stderr}"
    );
}

#[test]
fn bad_knob_values_are_all_reported() {
    let (code, stderr, _) = run(
        &["serve", SMALL],
        &[("LLMGW_SIM_TTFT", "soon"), ("LLMGW_SIM_FAULT", "meteor")],
    );
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("LLMGW_SIM_TTFT: cannot read duration 'soon'"),
        "{stderr}"
    );
    assert!(
        stderr.contains("LLMGW_SIM_FAULT: unknown fault 'meteor'"),
        "{stderr}"
    );
}

#[test]
fn sglang_tp_abbreviation_reaches_the_heads_check() {
    // `--tp 3` must parse as --tp-size 3: the run then fails on 14 heads.
    let port = free_port();
    let mut args = engine_args("sglang=0.5.10", SMALL, port);
    args.extend(["--tp".to_string(), "3".to_string()]);
    let mut sim = Sim::spawn(&args, &[], port);
    let status = sim.wait_exit(Duration::from_secs(30)).expect("exits");
    assert!(
        sim.stderr()
            .contains("AssertionError: 14 is not divisible by 3"),
        "{}",
        sim.stderr()
    );
    assert_eq!(describe(status), "signal 9");
}

#[test]
fn version_probes_report_the_persona() {
    let persona = [("LLMGW_SIM_PERSONA", "vllm=0.11.0,sglang=0.5.10")];
    let out = std::process::Command::new(BIN)
        .arg("--version")
        .envs(persona)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0.11.0\n");
    let out = std::process::Command::new(BIN)
        .args(["-c", "import sglang; print(sglang.__version__)"])
        .envs(persona)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0.5.10\n");
}
