//! `llmgw config check` as an operator runs it.

use std::path::Path;
use std::process::Command;

fn llmgw() -> Command {
    Command::new(env!("CARGO_BIN_EXE_llmgw"))
}

#[test]
fn the_original_agent_example_checks_clean() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/tests/fixtures/original-agent.yaml");
    let out = llmgw()
        .args(["config", "check"])
        .arg(&fixture)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(agent): node gpu-a-01"), "{stdout}");
}

#[test]
fn every_problem_of_every_file_is_printed_and_the_exit_code_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("agent.yaml");
    std::fs::write(
        &bad,
        "servers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nheartbeat_interval: 5\nreconect_max: 30s\n",
    )
    .unwrap();
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/models.yaml");
    let out = llmgw()
        .args(["config", "check"])
        .arg(&bad)
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("agent.yaml:3:21: heartbeat_interval: invalid duration \"5\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("agent.yaml:4:1: reconect_max: unknown key `reconect_max` (did you mean `reconnect_max`?)"),
        "{stderr}"
    );
    assert!(stderr.contains("1 of 2 file(s) have problems"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("(models): 3 model(s)"));
}

#[test]
fn a_missing_file_is_named() {
    let out = llmgw()
        .args(["config", "check", "/nonexistent/agent.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/agent.yaml: cannot read"));
}

#[test]
fn a_deeply_nested_file_is_refused_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("models.yaml");
    std::fs::write(&nested, "- ".repeat(30_000) + "x\n").unwrap();
    let out = llmgw()
        .args(["config", "check"])
        .arg(&nested)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("models.yaml:1:"), "{stderr}");
    assert!(stderr.contains("deeper than 64 levels"), "{stderr}");
}
