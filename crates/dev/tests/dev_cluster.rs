//! `llmgw dev` end to end, as a newcomer runs it: the whole cluster comes
//! up and serves a streaming chat through its router; the leader is
//! SIGKILLed and chat still works; SIGINT leaves no process behind.

use std::path::Path;
use std::time::Duration;

use llmgw_api::{ClusterView, paths};
use llmgw_dev::DevFile;
use llmgw_test_kit::dev::{Dev, peer_pid};
use llmgw_test_kit::load::ChatLoad;
use llmgw_test_kit::process::{alive, signal_pid};
use llmgw_test_kit::{
    DEADLINE, admin_client, eventually, get_json, stream_chat, wait_until_blocking,
};

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

    let leader = eventually("a leader", DEADLINE, || leader_other_than(&dev_file, None)).await;
    // A bounded load loop runs through the router while the leader dies and
    // another is elected: the router talks to engines directly, so not one
    // request may fail.
    let load = ChatLoad::start(&http, &router, MODEL);
    load.until_answered(4).await;
    signal_pid(peer_pid(&dev_file, leader), libc::SIGKILL);
    let answered_at_kill = load.answered();
    eventually("a new leader", DEADLINE, || {
        leader_other_than(&dev_file, Some(leader))
    })
    .await;
    load.until_answered(answered_at_kill + 20).await;
    load.stop_without_failures("across the leader kill").await;
    // And after the new leader took over.
    let answer = stream_chat(&http, &router, MODEL).await.unwrap();
    assert!(!answer.is_empty());

    sigint_leaves_no_process_behind(&mut dev);
}

/// The leader some peer of dev.json names, if it is not `previous`. The
/// admin API is HTTPS with the dev CA and wants the read token, both named
/// in dev.json; a peer that is down or names `previous` is passed over.
async fn leader_other_than(dev_file: &DevFile, previous: Option<u64>) -> Result<u64, String> {
    let ca = dev_file.ca.as_deref().expect("dev.json names the CA");
    let token_file = dev_file
        .read_token_file
        .as_deref()
        .expect("dev.json names the read token");
    let token = std::fs::read_to_string(token_file).unwrap();
    let admin = admin_client(Some(Path::new(ca)));
    let mut seen = Vec::new();
    for api in &dev_file.api {
        let url = format!("{api}{}", paths::CLUSTER);
        match get_json::<ClusterView>(&admin, &url, Some(token.trim())).await {
            Ok(view) => match view.leader_id {
                Some(leader) if Some(leader) != previous => return Ok(leader),
                named => seen.push(format!("{api} names leader {named:?}")),
            },
            Err(e) => seen.push(format!("{api}: {e}")),
        }
    }
    Err(seen.join("; "))
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
