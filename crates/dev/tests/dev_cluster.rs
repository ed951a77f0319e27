//! `llmgw dev` end to end, as a newcomer runs it: the whole cluster comes
//! up and serves a streaming chat through its router; the leader is
//! SIGKILLed and chat still works; SIGINT leaves no process behind.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use llmgw_api::{ClusterView, paths};
use llmgw_dev::DevFile;
use llmgw_test_kit::dev::Dev;
use llmgw_test_kit::process::{alive, signal_pid};
use llmgw_test_kit::{admin_client, get_json, stream_chat, wait_until_blocking};

/// The model of `llmgw dev`'s demo catalog that the load uses.
const MODEL: &str = "qwen-0.5b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_serves_chat_survives_a_leader_kill_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let work_dir = dir.path().join("dev");
    let mut dev = Dev::start(&work_dir, &[]);
    // dev prints its progress, then the tables, then this line.
    dev.wait_printed("Press Ctrl-C", Duration::from_secs(240))
        .await;

    let dev_file = dev.dev_file().expect("dev.json once dev is ready");
    let router = dev_file.router.clone().expect("dev.json names the router");
    assert_eq!(router, format!("http://127.0.0.1:{}", dev.router_port));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let answer = stream_chat(&http, &router, MODEL).await.unwrap();
    assert!(!answer.is_empty());

    let leader_pid = leader_pid(&dev_file).await;
    // A bounded load loop runs through the router while the leader dies:
    // the router talks to engines directly, so not one request may fail.
    let load = ChatLoad::start(&http, &router);
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal_pid(leader_pid, libc::SIGKILL);
    tokio::time::sleep(Duration::from_secs(8)).await;
    load.stop_without_failures().await;
    // And after the new leader took over.
    let answer = stream_chat(&http, &router, MODEL).await.unwrap();
    assert!(!answer.is_empty());

    sigint_leaves_no_process_behind(&mut dev);
}

/// The pid of the leader the control plane names, from dev.json. The
/// admin API is HTTPS with the dev CA and wants the read token, both named
/// in dev.json.
async fn leader_pid(dev_file: &DevFile) -> i32 {
    let api = &dev_file.api[0];
    let ca = dev_file.ca.as_deref().expect("dev.json names the CA");
    let token_file = dev_file
        .read_token_file
        .as_deref()
        .expect("dev.json names the read token");
    let token = std::fs::read_to_string(token_file).unwrap();
    let admin = admin_client(Some(Path::new(ca)));
    let cluster: ClusterView = get_json(
        &admin,
        &format!("{api}{}", paths::CLUSTER),
        Some(token.trim()),
    )
    .await
    .unwrap();
    let leader = cluster.leader_id.expect("a leader once dev is ready");
    dev_file
        .processes
        .iter()
        .find(|p| p.role == "server" && p.id.as_u64() == Some(leader))
        .map(|p| i32::try_from(p.pid).unwrap())
        .expect("dev.json names the leader's process")
}

/// Four workers streaming chats through the router until stopped (at
/// most 400 each).
struct ChatLoad {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<(u32, Vec<String>)>>,
}

impl ChatLoad {
    fn start(http: &reqwest::Client, router: &str) -> ChatLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..4)
            .map(|_| {
                let (http, router, stop) = (http.clone(), router.to_owned(), stop.clone());
                tokio::spawn(chat_worker(http, router, stop))
            })
            .collect();
        ChatLoad { stop, workers }
    }

    /// Stops the workers; every request they made must have been answered.
    async fn stop_without_failures(self) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut ok, mut failed) = (0, Vec::new());
        for worker in self.workers {
            let (o, f) = worker.await.unwrap();
            ok += o;
            failed.extend(f);
        }
        println!(
            "load through the router across the leader kill: {ok} ok, {} failed",
            failed.len()
        );
        assert!(
            failed.is_empty(),
            "{} requests failed: {failed:?}",
            failed.len()
        );
        assert!(ok >= 20, "the load loop ran: {ok} requests");
    }
}

/// Answered chats, and why the others failed.
async fn chat_worker(
    http: reqwest::Client,
    router: String,
    stop: Arc<AtomicBool>,
) -> (u32, Vec<String>) {
    let (mut ok, mut failed) = (0u32, Vec::new());
    for _ in 0..400 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match stream_chat(&http, &router, MODEL).await {
            Ok(answer) if !answer.is_empty() => ok += 1,
            Ok(_) => failed.push("empty answer".to_owned()),
            Err(why) => failed.push(why),
        }
    }
    (ok, failed)
}

fn sigint_leaves_no_process_behind(dev: &mut Dev) {
    let every = dev.pids();
    assert!(
        every.len() >= 8,
        "3 peers, 3 agents, a router, engines: {every:?}"
    );
    dev.interrupt();
    assert!(
        dev.wait_exit(Duration::from_secs(60)),
        "llmgw dev did not exit after SIGINT:\n{}",
        dev.output()
    );
    let nothing_left = wait_until_blocking(Duration::from_secs(20), || {
        every.iter().all(|pid| !alive(*pid))
    });
    let left: Vec<i32> = every.iter().copied().filter(|p| alive(*p)).collect();
    assert!(nothing_left, "processes left behind: {left:?}");
}
