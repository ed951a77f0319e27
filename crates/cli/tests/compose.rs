//! `deploy/compose` end to end on this machine's Docker daemon: the image
//! from `scripts/image`, three peers, three simulated GPU nodes and the
//! router in their own containers, each with its own hostname and
//! certificate. Under a bounded chat load through the router it kills the
//! leader's container, cuts a follower off the network and back, restarts
//! an agent's container and restarts all three peers one at a time; then
//! `deploy/compose/down` must leave nothing behind.
//!
//! Without a Docker daemon (or docker-compose) the test prints `SKIPPED:`
//! and why, and passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use llmgw_api::{ClusterView, ReplicaState, ReplicaView};
use llmgw_test_kit::{chat, free_port, poll_until_ok};

const DEADLINE: Duration = Duration::from_secs(180);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Why this machine cannot run the test, if it cannot.
fn unavailable() -> Option<String> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Ok(out) if out.status.success() => {}
        Ok(out) => return Some(format!("no Docker daemon answers: {}", text(&out).trim())),
        Err(e) => return Some(format!("docker is not installed: {e}")),
    }
    // deploy/compose/up installs docker-compose when it can.
    let setup = run(Command::new(repo_root().join("scripts/setup")).arg("--compose"));
    if !setup.status.success() {
        return Some(format!("cannot install docker-compose: {}", text(&setup)));
    }
    None
}

/// One compose project: its own name, image tag, secrets and router port.
struct Compose {
    project: String,
    image: String,
    secrets: tempfile::TempDir,
    router_port: u16,
    up: bool,
}

impl Compose {
    fn dir() -> PathBuf {
        repo_root().join("deploy/compose")
    }

    fn env(&self, command: &mut Command) {
        command
            .current_dir(Self::dir())
            .env("COMPOSE_PROJECT_NAME", &self.project)
            .env("LLMGW_IMAGE", &self.image)
            .env("LLMGW_SECRETS", self.secrets.path())
            .env("LLMGW_ROUTER_PORT", self.router_port.to_string());
    }

    fn compose(&self, args: &[&str]) -> Output {
        let mut command = Command::new("docker-compose");
        command.args(args);
        self.env(&mut command);
        run(&mut command)
    }

    /// A docker-compose command that must succeed.
    fn must(&self, args: &[&str]) {
        let out = self.compose(args);
        assert!(
            out.status.success(),
            "docker-compose {args:?}: {}",
            text(&out)
        );
    }

    fn script(&self, name: &str) -> Output {
        let mut command = Command::new(Self::dir().join(name));
        self.env(&mut command);
        run(&mut command)
    }

    /// `llmgw ctl ... -o json` from the router's container (never faulted),
    /// against all three peers, with the read token: what it printed.
    fn ctl(&self, args: &[&str]) -> Result<Output, String> {
        let token = std::fs::read_to_string(self.secrets.path().join("admin-read.token"))
            .map_err(|e| e.to_string())?;
        let mut full = vec![
            "exec",
            "-T",
            "-e",
            "LLMGW_TOKEN",
            "router",
            "llmgw",
            "ctl",
            "--api",
            "https://server-1:7480,https://server-2:7480,https://server-3:7480",
            "--ca",
            "/etc/llmgw/secrets/ca.pem",
            "-o",
            "json",
        ];
        full.extend_from_slice(args);
        let mut command = Command::new("docker-compose");
        command.args(&full).env("LLMGW_TOKEN", token.trim());
        self.env(&mut command);
        let out = run(&mut command);
        if !out.status.success() {
            return Err(text(&out));
        }
        Ok(out)
    }

    /// `llmgw ctl cluster`, read through the admin API's contract.
    fn cluster(&self) -> Result<ClusterView, String> {
        let out = self.ctl(&["cluster"])?;
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", text(&out)))
    }

    /// `llmgw ctl replicas`, read through the admin API's contract.
    fn replicas(&self) -> Result<Vec<ReplicaView>, String> {
        let out = self.ctl(&["replicas"])?;
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", text(&out)))
    }

    fn container(&self, service: &str) -> String {
        let out = self.compose(&["ps", "-q", service]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits until `check` passes on `ctl cluster`; returns its answer.
    async fn wait_cluster(&self, what: &str, check: impl Fn(&ClusterView) -> bool) -> ClusterView {
        let answer = poll_until_ok(DEADLINE, Duration::from_millis(500), || async {
            match self.cluster() {
                Ok(view) if check(&view) => Ok(view),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        answer.unwrap_or_else(|last| {
            panic!(
                "{what} within {DEADLINE:?}; last answer: {last}\n{}",
                self.logs()
            )
        })
    }

    async fn wait_leader(&self) -> u64 {
        let view = self
            .wait_cluster("a leader", |v| v.leader_id.is_some())
            .await;
        view.leader_id.unwrap()
    }

    /// All three peers answer in one term, their applied indexes close.
    async fn wait_all_caught_up(&self, what: &str) {
        self.wait_cluster(what, |v| {
            let applied: Vec<u64> = v
                .peers
                .iter()
                .filter_map(|p| p.last_applied_index)
                .collect();
            let terms: Vec<Option<u64>> = v.peers.iter().map(|p| p.term).collect();
            v.leader_id.is_some()
                && applied.len() == 3
                && terms.iter().all(|t| t.is_some() && *t == terms[0])
                && applied.iter().max().unwrap() - applied.iter().min().unwrap() <= 20
        })
        .await;
    }

    fn logs(&self) -> String {
        let out = self.compose(&["logs", "--no-color", "--tail", "15"]);
        text(&out)
    }

    /// Containers, networks and volumes of this project that still exist.
    fn leftovers(&self) -> Vec<String> {
        let label = format!("label=com.docker.compose.project={}", self.project);
        let mut left = Vec::new();
        for what in [
            &["ps", "-a", "-q", "--filter"][..],
            &["network", "ls", "-q", "--filter"][..],
            &["volume", "ls", "-q", "--filter"][..],
        ] {
            let out = run(Command::new("docker").args(what).arg(&label));
            left.extend(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|l| format!("{} {l}", what[0])),
            );
        }
        left
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if self.up {
            let _ = self.script("down");
        }
        let _ = Command::new("docker")
            .args(["image", "rm", "-f", &self.image])
            .output();
    }
}

/// A bounded chat load through the router: counts what succeeded and what
/// failed until `stop`, or 20 minutes at most.
fn chat_load(
    router: String,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(20 * 60);
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            match chat(&http, &router, "llama-70b").await {
                Ok(_) => {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                Err(why) => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    failures.lock().unwrap().push(why);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_host_cluster_on_docker_serves_through_kills_partitions_and_restarts() {
    if let Some(why) = unavailable() {
        llmgw_test_kit::skipped("deploy/compose", &why);
        return;
    }
    // Unique per run, even after an earlier run with the same pid was
    // killed before it could clean up.
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let run_id = format!("{:x}{:x}", std::process::id(), since_epoch.as_millis());
    let mut compose = Compose {
        project: format!("llmgwtest{run_id}"),
        image: format!("llmgw:test-{run_id}"),
        secrets: tempfile::tempdir().unwrap(),
        router_port: free_port(),
        up: false,
    };
    // Nothing from an earlier run: no image under this tag, no container,
    // network or volume of this project. A warm machine must not win the
    // start-up races a newcomer's machine loses.
    let earlier = run(Command::new("docker").args(["image", "inspect", &compose.image]));
    assert!(
        !earlier.status.success(),
        "image {} exists before this run built it",
        compose.image
    );
    let left = compose.leftovers();
    assert!(left.is_empty(), "an earlier run left: {left:?}");
    // The image from the binaries this test run built.
    let bins = Path::new(env!("CARGO_BIN_EXE_llmgw")).parent().unwrap();
    let image = run(Command::new(repo_root().join("scripts/image"))
        .args(["--from"])
        .arg(bins)
        .args(["--tag", &compose.image]));
    assert!(image.status.success(), "scripts/image: {}", text(&image));
    println!("{}", text(&image).trim());

    compose.up = true;
    let up = compose.script("up");
    assert!(
        up.status.success(),
        "deploy/compose/up: {}\n{}",
        text(&up),
        compose.logs()
    );
    let printed = text(&up);
    assert!(printed.contains("The cluster serves"), "{printed}");

    let router = format!("http://127.0.0.1:{}", compose.router_port);
    // A streamed chat, as a user would try first.
    let streamed = reqwest::Client::new()
        .post(format!("{router}/v1/chat/completions"))
        .json(&serde_json::json!({
            "model": "qwen", "stream": true, "max_tokens": 6,
            "messages": [{"role": "user", "content": "Hello!"}],
        }))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(streamed.trim_end().ends_with("data: [DONE]"), "{streamed}");

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = chat_load(
        router.clone(),
        stop.clone(),
        ok.clone(),
        failed.clone(),
        failures.clone(),
    );
    let mut timeline = Vec::new();
    let started = Instant::now();
    let mut step = |what: String| {
        println!("{:>6.1}s {what}", started.elapsed().as_secs_f64());
        timeline.push(what);
    };

    // 1. docker kill of the leader's container; a new leader takes over;
    //    the old one comes back and catches up.
    let leader = compose.wait_leader().await;
    step(format!("docker kill server-{leader} (the leader)"));
    compose.must(&["kill", &format!("server-{leader}")]);
    compose
        .wait_cluster("a new leader", |v| v.leader_id.is_some_and(|l| l != leader))
        .await;
    step(format!("new leader elected; docker start server-{leader}"));
    compose.must(&["start", &format!("server-{leader}")]);
    compose
        .wait_all_caught_up("every peer caught up after the leader kill")
        .await;

    // 2. A follower cut off the network, then reconnected under its name.
    let leader = compose.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let service = format!("server-{follower}");
    let container = compose.container(&service);
    let network = format!("{}_default", compose.project);
    step(format!("docker network disconnect {service}"));
    let cut = run(Command::new("docker").args(["network", "disconnect", &network, &container]));
    assert!(cut.status.success(), "{}", text(&cut));
    compose
        .wait_cluster("the cut follower shown unreachable", |v| {
            v.peers.iter().any(|p| p.id == follower && p.term.is_none())
        })
        .await;
    step(format!("{service} unreachable from the others"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    step(format!("docker network connect {service}"));
    let heal = run(Command::new("docker").args([
        "network", "connect", "--alias", &service, &network, &container,
    ]));
    assert!(heal.status.success(), "{}", text(&heal));
    compose
        .wait_all_caught_up("every peer caught up after the partition")
        .await;

    // 3. An agent's container restarts: its engines go with it and are
    //    started again; llama-70b's other replica (on the other 8-GPU
    //    node) serves meanwhile.
    let replicas = compose.replicas().unwrap();
    let shard = replicas
        .iter()
        .find(|r| r.replica.model == "llama-70b")
        .and_then(|r| r.replica.shards.first().cloned())
        .expect("a placed llama-70b replica");
    let node = shard.node;
    // Pids start over in a new container: the shard's last transition
    // time says whether it went through a new start.
    let changed_before = shard.state_changed_at_ms;
    step(format!("docker restart {node} (an agent with an engine)"));
    compose.must(&["restart", &node]);
    // The engine died with its container: ready again after a transition.
    let started_wait = Instant::now();
    loop {
        let replicas = compose.replicas();
        let list = replicas.as_deref().unwrap_or_default();
        let ready = list
            .iter()
            .filter(|r| r.replica.model == "llama-70b" && r.state == ReplicaState::Ready)
            .count();
        let restarted = list.iter().any(|r| {
            r.state == ReplicaState::Ready
                && r.replica.shards.first().is_some_and(|first| {
                    first.node == node && first.state_changed_at_ms > changed_before
                })
        });
        if ready == 2 && restarted {
            break;
        }
        assert!(
            started_wait.elapsed() < DEADLINE,
            "both replicas ready again, the one on {node} in a new engine: {replicas:?}\n{}",
            compose.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    step("both replicas ready again".to_owned());

    // 4. A rolling restart of the three peers (SIGTERM, start, caught up).
    for id in 1..=3 {
        step(format!("docker restart server-{id}"));
        compose.must(&["restart", &format!("server-{id}")]);
        compose
            .wait_all_caught_up(&format!(
                "every peer caught up after restarting server-{id}"
            ))
            .await;
    }
    step("rolling restart done".to_owned());

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("chat through the router: {ok} ok, {failed} failed");
    assert!(ok > 0, "no chat succeeded");
    assert_eq!(
        failed,
        0,
        "chats failed during {timeline:?}: {:?}",
        failures.lock().unwrap()
    );

    let down = compose.script("down");
    assert!(
        down.status.success(),
        "deploy/compose/down: {}",
        text(&down)
    );
    compose.up = false;
    let left = compose.leftovers();
    assert!(left.is_empty(), "left behind: {left:?}");
}
