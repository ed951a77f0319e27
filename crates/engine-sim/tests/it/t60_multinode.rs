//! Multi-node replicas: a real rendezvous; the head serves only when every
//! rank joined; a lost rank fails the replica the way NCCL does.

use std::time::Duration;

use crate::common::*;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn vllm_rank(rank: u32, master_port: u16, port: u16) -> Vec<String> {
    let mut args = engine_args("vllm=0.34.0", MODEL, port);
    for a in [
        "-tp",
        "4",
        "-pp",
        "2",
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
    ] {
        args.push(a.into());
    }
    args.extend([
        "--master-port".into(),
        master_port.to_string(),
        "--node-rank".into(),
        rank.to_string(),
    ]);
    if rank > 0 {
        args.push("--headless".into());
    }
    args
}

#[test]
fn vllm_mp_head_waits_for_its_headless_rank_and_dies_with_it() {
    let master = free_port();
    let head_port = free_port();
    let gpus = [("CUDA_VISIBLE_DEVICES", "0,1,2,3")];
    let mut head = Sim::spawn(&vllm_rank(0, master, head_port), &gpus, head_port);
    assert!(wait_until_blocking(Duration::from_secs(10), || head
        .stdout()
        .contains("distributed_init_method=tcp://127.0.0.1")));
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        refused(head_port),
        "head must not serve before rank 1 joins"
    );
    let other_port = free_port();
    let mut worker = Sim::spawn(&vllm_rank(1, master, other_port), &gpus, other_port);
    head.wait_healthy();
    assert!(
        worker
            .stdout()
            .contains("headless multiproc executor, with head node address 127.0.0.1:"),
        "{}",
        worker.output()
    );
    assert!(refused(other_port), "a headless rank serves nothing");
    worker.signal("KILL");
    let status = head
        .wait_exit(Duration::from_secs(15))
        .expect("head dies when a rank is lost");
    assert_eq!(describe(status), "exit code 1");
    let err = head.stderr();
    assert!(
        err.contains("NCCL error: remote process exited or there was a network error"),
        "{err}"
    );
    assert!(
        head.stdout()
            .contains("EngineCore encountered a fatal error.")
    );
    worker.wait_exit(Duration::from_secs(5));
}

#[test]
fn sglang_non_zero_rank_serves_the_dummy_health_app() {
    let dist = format!("127.0.0.1:{}", free_port());
    let ports = [free_port(), free_port()];
    let mut sims: Vec<Sim> = (0..2)
        .map(|rank| {
            let mut args = engine_args("sglang=0.5.10", MODEL, ports[rank]);
            for a in [
                "--tp",
                "8",
                "--nnodes",
                "2",
                "--dist-init-addr",
                &dist,
                "--node-rank",
                &rank.to_string(),
            ] {
                args.push(a.to_string());
            }
            Sim::spawn(&args, &[("CUDA_VISIBLE_DEVICES", "0,1,2,3")], ports[rank])
        })
        .collect();
    sims[0].wait_healthy();
    sims[1].wait_healthy();
    let dummy = get(ports[1], "/v1/models").unwrap();
    assert_eq!(dummy.status, 404, "rank 1 serves only health");
    assert_eq!(get(ports[0], "/v1/models").unwrap().status, 200);
    sims[0].signal("KILL");
    let status = sims[1]
        .wait_exit(Duration::from_secs(15))
        .expect("rank 1 dies with rank 0");
    assert_eq!(describe(status), "signal 9");
    assert!(
        sims[1].stderr().contains("ncclRemoteError"),
        "{}",
        sims[1].stderr()
    );
}

#[test]
fn a_rank_joining_twice_is_refused_by_the_head() {
    let dist = format!("127.0.0.1:{}", free_port());
    let start = |rank: u32| {
        let port = free_port();
        let mut args = engine_args("sglang=0.5.10", MODEL, port);
        for a in [
            "--tp",
            "2",
            "--pp-size",
            "3",
            "--nnodes",
            "3",
            "--dist-init-addr",
            &dist,
            "--node-rank",
            &rank.to_string(),
        ] {
            args.push(a.to_string());
        }
        Sim::spawn(&args, &[], port)
    };
    let head = start(0);
    let first = start(1);
    assert!(wait_until_blocking(Duration::from_secs(10), || head
        .stderr()
        .contains("Init torch distributed begin.")));
    std::thread::sleep(Duration::from_millis(500));
    let mut twin = start(1);
    let status = twin
        .wait_exit(Duration::from_secs(15))
        .expect("the duplicate rank fails");
    assert_eq!(describe(status), "signal 9");
    assert!(
        twin.stderr().contains(
            "torch.distributed.DistNetworkError: the head refused rank 1: node rank 1 joined twice"
        ),
        "{}",
        twin.stderr()
    );
    assert!(refused(head.port), "the head still waits for rank 2");
    drop(first);
}

#[test]
fn vllm_head_gives_up_after_the_engine_ready_timeout() {
    let master = free_port();
    let port = free_port();
    let mut head = Sim::spawn(
        &vllm_rank(0, master, port),
        &[
            ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
            ("VLLM_ENGINE_READY_TIMEOUT_S", "1"),
        ],
        port,
    );
    let status = head
        .wait_exit(Duration::from_secs(20))
        .expect("head times out");
    assert_eq!(describe(status), "exit code 1");
    assert!(
        head.stderr()
            .contains("TimeoutError: Timed out waiting for engine core processes to start."),
        "{}",
        head.stderr()
    );
    assert!(refused(port));
}
