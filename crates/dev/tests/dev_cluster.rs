//! `llmgw dev` end to end, as a newcomer runs it: the whole cluster comes
//! up and serves a streaming chat through its router; the leader is
//! SIGKILLed and chat still works; SIGINT leaves no process behind.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn llmgw_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("LLMGW_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join("llmgw");
    assert!(
        bin.exists(),
        "{} does not exist: build it with `cargo build -p llmgw-cli -p llmgw-engine-sim`",
        bin.display()
    );
    bin
}

struct Dev {
    child: Option<Child>,
    work_dir: PathBuf,
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(40);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Whatever dev.json names must not outlive a failed test either.
        for pid in pids(&self.work_dir) {
            signal(pid, libc::SIGKILL);
        }
    }
}

#[allow(unsafe_code)]
fn signal(pid: i32, signal: i32) {
    if pid > 1 {
        // SAFETY: kill(2) with plain integers.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

fn dev_json(work_dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(work_dir.join("dev.json")).unwrap()).unwrap()
}

/// Every process dev.json names, and every engine the agents recorded.
fn pids(work_dir: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(bytes) = std::fs::read(work_dir.join("dev.json"))
        && let Ok(dev) = serde_json::from_slice::<Value>(&bytes)
    {
        out.extend(
            dev["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["pid"].as_i64())
                .map(|p| p as i32),
        );
    }
    for entry in std::fs::read_dir(work_dir).into_iter().flatten().flatten() {
        out.extend(llmgw_dev::engine_groups(&entry.path()));
    }
    out
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
        })
        .is_some_and(|zombie| !zombie)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A streamed chat through the router: the concatenated content.
async fn stream_chat(http: &reqwest::Client, router: &str) -> Result<String, String> {
    let response = http
        .post(format!("{router}/v1/chat/completions"))
        .json(&serde_json::json!({
            "model": "qwen-0.5b",
            "stream": true,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "Hello!"}]
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!(
            "{}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        ));
    }
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !text.trim_end().ends_with("data: [DONE]") {
        return Err(format!("the stream did not end with [DONE]: {text}"));
    }
    let mut content = String::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if let Ok(chunk) = serde_json::from_str::<Value>(line)
            && let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str()
        {
            content.push_str(piece);
        }
    }
    Ok(content)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_serves_chat_survives_a_leader_kill_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let work_dir = dir.path().join("dev");
    let port = free_port();
    let mut child = Command::new(llmgw_bin())
        .args(["dev", "--port", &port.to_string(), "--work-dir"])
        .arg(&work_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut dev = Dev {
        child: Some(child),
        work_dir: work_dir.clone(),
    };
    // dev prints its progress, then the tables, then this line.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("dev| {line}");
            if line.contains("Press Ctrl-C") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(240))
        .expect("llmgw dev did not become ready within 240 s");

    let dev_file = dev_json(&work_dir);
    let router = dev_file["router"].as_str().unwrap().to_owned();
    assert_eq!(router, format!("http://127.0.0.1:{port}"));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let answer = stream_chat(&http, &router).await.unwrap();
    assert!(!answer.is_empty());

    // SIGKILL the leader named by the control plane, by its pid in dev.json.
    let api = dev_file["api"][0].as_str().unwrap();
    // The admin API is HTTPS with the dev CA and wants the read token,
    // both named in dev.json.
    let ca = dev_file["ca"].as_str().expect("dev.json names the CA");
    let token_file = dev_file["read_token_file"].as_str().unwrap();
    let token = std::fs::read_to_string(token_file).unwrap();
    let admin = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .use_preconfigured_tls(llmgw_tls::https_client_config(std::path::Path::new(ca)).unwrap())
        .build()
        .unwrap();
    let cluster: Value = admin
        .get(format!("{api}/api/v1/cluster"))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let leader = cluster["leader_id"].as_u64().unwrap();
    let leader_pid = dev_file["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "server" && p["id"].as_u64() == Some(leader))
        .and_then(|p| p["pid"].as_i64())
        .unwrap() as i32;
    // A bounded load loop runs through the router while the leader dies:
    // the router talks to engines directly, so not one request may fail.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (http, router, stop) = (http.clone(), router.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            for _ in 0..400 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                match stream_chat(&http, &router).await {
                    Ok(answer) if !answer.is_empty() => ok += 1,
                    Ok(_) => failed.push("empty answer".to_owned()),
                    Err(why) => failed.push(why),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(leader_pid, libc::SIGKILL);
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for worker in workers {
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
    // And after the new leader took over.
    let answer = stream_chat(&http, &router).await.unwrap();
    assert!(!answer.is_empty());

    let every = pids(&work_dir);
    assert!(
        every.len() >= 8,
        "3 peers, 3 agents, a router, engines: {every:?}"
    );
    let mut child = dev.child.take().unwrap();
    signal(child.id() as i32, libc::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "llmgw dev did not exit after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<i32> = every.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "processes left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
