//! The simulated fleet against a real three-peer control plane: every node
//! registers with the leader, and re-homes when it is SIGKILLed, with no
//! node marked unreachable.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use llmgw_fleet_sim::Fleet;
use serde_json::Value;

const NODES: usize = 60;

fn llmgw_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("LLMGW_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(|d| d.parent()).unwrap().join("llmgw");
    assert!(
        bin.exists(),
        "{} does not exist: build it with `cargo build -p llmgw-cli`",
        bin.display()
    );
    bin
}

struct Peers(Vec<(u64, String, Option<Child>)>);

impl Drop for Peers {
    fn drop(&mut self) {
        for (_, _, child) in &mut self.0 {
            if let Some(mut child) = child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

async fn get(http: &reqwest::Client, url: &str) -> Option<Value> {
    http.get(url).send().await.ok()?.json().await.ok()
}

async fn leader(http: &reqwest::Client, peers: &Peers) -> Option<(u64, String)> {
    for (_, admin, child) in &peers.0 {
        if child.is_none() {
            continue;
        }
        let view = get(http, &format!("{admin}/api/v1/cluster")).await?;
        let id = view["leader_id"].as_u64()?;
        let (_, leader_admin, leader_child) = peers.0.iter().find(|(i, _, _)| *i == id)?;
        if leader_child.is_some() {
            return Some((id, leader_admin.clone()));
        }
    }
    None
}

/// Nodes the leader holds a stream for, and nodes not `ready`.
async fn fleet_view(http: &reqwest::Client, admin: &str) -> Option<(usize, usize)> {
    let nodes = get(http, &format!("{admin}/api/v1/nodes")).await?;
    let nodes = nodes.as_array()?;
    let connected = nodes
        .iter()
        .filter(|n| n["stream"]["connected"] == true)
        .count();
    let down = nodes.iter().filter(|n| n["status"] != "ready").count();
    Some((connected, down))
}

async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{what}: not within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn last_log_index(http: &reqwest::Client, admin: &str) -> Option<u64> {
    let index = llmgw_fleet_sim::metric(http, admin, "llmgw_raft_last_log_index").await?;
    Some(index as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_registers_and_rehomes_without_going_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let layouts = llmgw_dev::plan_peers(dir.path(), 3, false).unwrap();
    let mut peers = Peers(Vec::new());
    for layout in &layouts {
        let extra = "liveness:\n  node_ttl: 3s\n  lost_after: 10s\n  leader_grace: 5s\n";
        std::fs::write(
            &layout.config,
            llmgw_dev::server_yaml(layout, &layouts, extra),
        )
        .unwrap();
        let log = std::fs::File::create(&layout.log).unwrap();
        let child = Command::new(llmgw_bin())
            .args(["server", "--config"])
            .arg(&layout.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        peers.0.push((layout.id, layout.admin_url(), Some(child)));
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let servers: Vec<String> = layouts.iter().map(|l| l.grpc.to_string()).collect();
    let (_, admin) = until("a leader", || leader(&http, &peers)).await;
    let log_before = until("the leader's log index", || last_log_index(&http, &admin)).await;
    let fleet = Fleet::spawn("sim", NODES, &servers, Duration::from_millis(500));
    let (first, admin) = until("every simulated node registered", || async {
        let (id, admin) = leader(&http, &peers).await?;
        let (connected, down) = fleet_view(&http, &admin).await?;
        (connected == NODES && down == 0).then_some((id, admin))
    })
    .await;
    assert_eq!(fleet.stats().registered, NODES);
    // Registrations that arrive together share log entries.
    let entries = last_log_index(&http, &admin).await.unwrap() - log_before;
    assert!(
        entries < NODES as u64,
        "{NODES} registrations took {entries} log entries"
    );
    let nodes = get(&http, &format!("{admin}/api/v1/nodes")).await.unwrap();
    let one = &nodes[0];
    assert_eq!(one["inventory"]["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(one["fabrics"].as_array().unwrap().len(), 1);

    let index = peers.0.iter().position(|(id, _, _)| *id == first).unwrap();
    if let Some(mut child) = peers.0[index].2.take() {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let admin = until("the fleet re-homed to a new leader", || async {
        let (id, admin) = leader(&http, &peers).await?;
        let (connected, _) = fleet_view(&http, &admin).await?;
        (id != first && connected == NODES).then_some(admin)
    })
    .await;
    // Past the grace period and a TTL: still nobody unreachable.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (connected, down) = fleet_view(&http, &admin).await.unwrap();
    assert_eq!((connected, down), (NODES, 0));
    fleet.stop();
}
