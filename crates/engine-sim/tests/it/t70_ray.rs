//! The Ray stand-in: head and worker daemons, `ray status`, and a vLLM head
//! with the Ray backend that waits for enough GPUs in the cluster.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn ray(dir: &std::path::Path, args: &[&str], gpus: &str) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("RAY_TMPDIR", dir)
        .env("CUDA_VISIBLE_DEVICES", gpus)
        .output()
        .expect("run ray stand-in")
}

/// Stops the test's Ray daemons even when an assertion fails midway.
struct StopRay(std::path::PathBuf);

impl Drop for StopRay {
    fn drop(&mut self) {
        let _ = ray(&self.0, &["stop"], "");
    }
}

#[test]
fn ray_cluster_places_a_two_node_vllm_replica() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = StopRay(dir.path().to_path_buf());
    let gcs = free_port().to_string();
    let out = ray(
        dir.path(),
        &[
            "start",
            "--head",
            &format!("--port={gcs}"),
            "--node-ip-address=127.0.0.1",
        ],
        "0,1,2,3",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("ray start --address='127.0.0.1:{gcs}'"))
    );
    let bad = ray(dir.path(), &["start", "--bogus"], "");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).ends_with("Error: No such option: --bogus\n"));

    // The head alone has 4 GPUs; TP 8 waits for placement.
    let port = free_port();
    let mut args = engine_args("vllm=0.34.0", "meta-llama/Llama-3.1-8B-Instruct", port);
    args.extend(["-tp", "8", "--distributed-executor-backend", "ray"].map(String::from));
    let mut head = Sim::spawn(
        &args,
        &[
            ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
            ("RAY_TMPDIR", dir.path().to_str().unwrap()),
        ],
        port,
    );
    assert!(
        wait_until_blocking(Duration::from_secs(10), || head
            .stdout()
            .contains("Waiting for creating a placement group")),
        "{}",
        head.output()
    );
    assert!(refused(port));

    let out = ray(
        dir.path(),
        &["start", &format!("--address=127.0.0.1:{gcs}")],
        "0,1,2,3",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = ray(dir.path(), &["status"], "");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains(" 0.0/8.0 GPU"), "{text}");
    head.wait_healthy();

    let stopped = ray(dir.path(), &["stop"], "");
    assert!(String::from_utf8_lossy(&stopped.stdout).starts_with("Stopped all 2 Ray processes."));
    let status = head
        .wait_exit(Duration::from_secs(15))
        .expect("replica fails when its Ray nodes go");
    assert_eq!(describe(status), "exit code 1");
}
