//! The agent against fake control-plane peers (real tonic servers): the
//! redirect to the leader, registration with the whole inventory,
//! heartbeats, commands with acks, and fencing by leader term. Then the real
//! `llmgw agent` binary killed with SIGKILL under load, restarted, and
//! adopting its engines.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmgw_agent::{LaunchSpec, StreamClient, Supervisor, TermStore, group_members};
use llmgw_catalog::Engine;
use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::control_message::Body as Down;
use llmgw_proto::agent::{Registered, ShardState, StartShard, StopShard};
use llmgw_test_kit::process::signal_pid;
use llmgw_test_kit::{engine_sim_bin, free_port, llmgw_bin, wait_until};
use support::control_plane::FakePeer;
use support::*;

const LONG: Duration = Duration::from_secs(60);

fn start_cmd(spec: &LaunchSpec) -> Down {
    Down::Start(StartShard {
        spec: Some(spec.to_proto()),
    })
}

fn stop_cmd(shard: &str) -> Down {
    Down::Stop(StopShard {
        shard_id: shard.into(),
        reason: "test".into(),
    })
}

async fn wait_status(
    peer: &FakePeer,
    conn: usize,
    shard: &str,
    state: ShardState,
) -> llmgw_proto::agent::ShardStatus {
    peer.wait_for(
        &format!("{shard} {}", state.as_str_name()),
        LONG,
        |c, body| match body {
            Up::ShardStatus(s) if c >= conn && s.shard_id == shard && s.state == state as i32 => {
                Some(s.clone())
            }
            _ => None,
        },
    )
    .await
}

async fn wait_ack(peer: &FakePeer, id: u64) -> llmgw_proto::agent::CommandAck {
    peer.wait_for(
        &format!("ack of command {id}"),
        LONG,
        |_, body| match body {
            Up::Ack(a) if a.command_id == id => Some(a.clone()),
            _ => None,
        },
    )
    .await
}

fn agent_config(work_dir: &Path, servers: &[String]) -> llmgw_config::AgentConfig {
    let yaml = agent_yaml(work_dir, servers);
    llmgw_config::AgentConfig::parse("agent.yaml", &yaml).expect("test agent.yaml is valid")
}

fn agent_yaml(work_dir: &Path, servers: &[String]) -> String {
    let sim = engine_sim_bin();
    let fixture = repo_root().join("deploy/fixtures/nodes/h100-sxm-8x-ib-a.yaml");
    let servers: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        r#"node_id: gpu-test-01
servers: [{servers}]
mgmt_addr: 127.0.0.1
labels:
  rack: r12
heartbeat_interval: 200ms
reconnect_base: 100ms
reconnect_max: 1s
insecure: true
fabrics:
  - name: ib-a
    hcas: [mlx5_0, mlx5_1]
discovery:
  fixture: {fixture}
  prefer_nvml: false
engines:
  vllm:
    bin: {sim}
    version: "0.11.1"
    launch_mode: mp
    env:
      LLMGW_SIM_PERSONA: vllm=0.11.1
      LLMGW_SIM_LOAD_TIME: 400ms
      LLMGW_SIM_TTFT: 5ms
      LLMGW_SIM_ITL: 2ms
  sglang:
    python: {sim}
supervisor:
  work_dir: {work}
  log_lines: 40
  stop_timeout: 3s
  health_interval: 100ms
  startup_timeout: 30s
"#,
        servers = servers.join(", "),
        fixture = fixture.display(),
        sim = sim.display(),
        work = work_dir.display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_follows_the_redirect_registers_and_refuses_a_stale_term() {
    let leader = FakePeer::leader().await;
    let follower = FakePeer::follower(&leader.addr.to_string(), 3).await;
    let dir = tempfile::tempdir().unwrap();
    // A dead peer first, then the follower: the leader is reachable only
    // through the follower's redirect.
    let dead = format!("127.0.0.1:{}", free_port());
    let config = agent_config(dir.path(), &[dead, follower.addr.to_string()]);
    let (supervisor, task) = start_in_process_agent(dir.path(), config);
    let guard = GroupGuard::default();

    let register = register_reaches_the_leader_through(&leader, &follower).await;
    assert_register_describes_the_whole_node(&register);
    let ready = start_shard_at_term_5(&leader, &guard).await;
    a_deposed_leader_can_neither_stop_nor_drain(&leader, &supervisor).await;
    the_witness_and_term_store_hold_every_decision(dir.path());
    // Heartbeats keep coming.
    leader
        .wait_for("3 heartbeats", LONG, |_, body| match body {
            Up::Heartbeat(h) if h.seq >= 3 => Some(()),
            _ => None,
        })
        .await;
    the_current_leader_stops_it_and_a_repeat_is_acknowledged(&leader, ready.pid).await;
    registered_is_the_whole_set(&leader, &supervisor, &guard).await;
    a_drain_listed_in_registered_keeps_draining(&leader, &supervisor, &guard).await;
    task.abort();
}

/// Runs the agent's stream client in this process, as `llmgw agent` would,
/// and returns its supervisor for direct looks at shard state.
fn start_in_process_agent(
    work_dir: &Path,
    config: llmgw_config::AgentConfig,
) -> (Supervisor, tokio::task::JoinHandle<()>) {
    let inventory = llmgw_discovery::discover(&config.discovery, &config.fabrics);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let node = node_facts(work_dir, &NodeSetup::default());
    let (supervisor, _) = Supervisor::new(config.supervisor.clone(), node, tx).unwrap();
    let terms = TermStore::open(work_dir).unwrap();
    let client = StreamClient::new(config, inventory, supervisor.clone(), terms, rx);
    (supervisor, tokio::spawn(client.run()))
}

async fn register_reaches_the_leader_through(
    leader: &FakePeer,
    follower: &FakePeer,
) -> llmgw_proto::agent::Register {
    let register = leader
        .wait_for("Register", LONG, |_, body| match body {
            Up::Register(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert!(follower.connections() >= 1);
    assert!(matches!(
        follower.received()[0].1.body,
        Some(Up::Register(_))
    ));
    register
}

fn assert_register_describes_the_whole_node(register: &llmgw_proto::agent::Register) {
    assert_eq!(register.node_id, "gpu-test-01");
    assert_eq!(register.mgmt_addr, "127.0.0.1");
    let inv = register.inventory.as_ref().unwrap();
    assert_eq!(inv.gpu_source, "fixture");
    assert_eq!(inv.gpus.len(), 8);
    assert!(inv.gpus[0].name.contains("H100"));
    assert_eq!(inv.links.len(), 28, "one link per GPU pair");
    assert_eq!(register.fabrics.len(), 1);
    assert_eq!(register.fabrics[0].name, "ib-a");
    assert_eq!(register.fabrics[0].active_hcas, vec!["mlx5_0", "mlx5_1"]);
    assert_eq!(register.labels.get("rack").map(String::as_str), Some("r12"));
    let engines: Vec<&str> = register.engines.iter().map(|e| e.engine.as_str()).collect();
    assert_eq!(engines, ["vllm", "sglang"]);
    assert!(register.running.is_empty());
}

/// Starts shard `st-0` by command 1 of the term-5 leader; its ready status.
async fn start_shard_at_term_5(
    leader: &FakePeer,
    guard: &GroupGuard,
) -> llmgw_proto::agent::ShardStatus {
    let port = free_port();
    let spec = support::spec("st-0", Engine::Vllm, &[0], port);
    leader.send(5, 1, start_cmd(&spec)).await;
    let ack = wait_ack(leader, 1).await;
    assert!(ack.accepted, "{ack:?}");
    let ready = wait_status(leader, 1, "st-0", ShardState::Ready).await;
    guard.add(ready.pid as i32);
    assert_eq!(ready.port, u32::from(port));
    ready
}

/// A deposed leader (term 4 < 5) cannot stop `st-0`, and the agent leaves
/// the peer that sent it: it dials again and registers anew.
async fn a_deposed_leader_can_neither_stop_nor_drain(leader: &FakePeer, supervisor: &Supervisor) {
    let connections = leader.connections();
    leader.send(4, 2, stop_cmd("st-0")).await;
    let ack = wait_ack(leader, 2).await;
    assert!(!ack.accepted);
    assert!(
        ack.message.contains("term 4") && ack.message.contains("term 5"),
        "{}",
        ack.message
    );
    assert_eq!(
        supervisor.status("st-0").unwrap().state,
        ShardState::Ready as i32
    );
    assert!(
        wait_until(LONG, || async { leader.connections() > connections }).await,
        "the agent did not leave the deposed leader and come back"
    );
    // Nor drain it.
    let connections = leader.connections();
    let stale_drain = Down::Drain(llmgw_proto::agent::DrainShard {
        shard_id: "st-0".into(),
        deadline_ms: 30_000,
        reason: "a deposed leader's drain".into(),
    });
    leader.send(4, 20, stale_drain).await;
    let ack = wait_ack(leader, 20).await;
    assert!(!ack.accepted, "{ack:?}");
    assert_eq!(
        supervisor.status("st-0").unwrap().state,
        ShardState::Ready as i32
    );
    assert!(
        wait_until(LONG, || async { leader.connections() > connections }).await,
        "the agent did not leave again"
    );
}

/// The witness holds all three: the start executed, the stop and the
/// drain refused; the term store holds the highest term seen.
fn the_witness_and_term_store_hold_every_decision(work_dir: &Path) {
    let witness = std::fs::read_to_string(work_dir.join(llmgw_agent::Witness::FILE)).unwrap();
    let lines: Vec<serde_json::Value> = witness
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["kind"] == "start" && l["term"] == 5 && l["executed"] == true),
        "{witness}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["kind"] == "stop" && l["term"] == 4 && l["executed"] == false),
        "{witness}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["kind"] == "drain" && l["term"] == 4 && l["executed"] == false),
        "{witness}"
    );
    let persisted = std::fs::read_to_string(work_dir.join(TermStore::FILE)).unwrap();
    assert_eq!(
        persisted.trim(),
        "5 0 0 -",
        "term 5, from a leader without an id or an epoch, of no cluster named"
    );
}

async fn the_current_leader_stops_it_and_a_repeat_is_acknowledged(leader: &FakePeer, pid: u32) {
    leader.send(5, 3, stop_cmd("st-0")).await;
    assert!(wait_ack(leader, 3).await.accepted);
    wait_status(leader, 1, "st-0", ShardState::Stopped).await;
    leader.send(6, 4, stop_cmd("st-0")).await;
    assert!(wait_ack(leader, 4).await.accepted);
    assert!(group_members(pid as i32).is_empty());
}

fn registered(
    shards: Vec<llmgw_proto::agent::ShardSpec>,
    drains: Vec<llmgw_proto::agent::DrainShard>,
) -> Down {
    Down::Registered(Registered {
        shards,
        drains,
        ..Registered::default()
    })
}

/// `Registered` is the whole set: what is listed starts, what is kept (a
/// leader that cannot read its model) runs on, the rest stops.
async fn registered_is_the_whole_set(
    leader: &FakePeer,
    supervisor: &Supervisor,
    guard: &GroupGuard,
) {
    let listed = support::spec("st-1", Engine::Vllm, &[1], free_port());
    leader
        .send(6, 0, registered(vec![listed.to_proto()], vec![]))
        .await;
    let ready = wait_status(leader, 1, "st-1", ShardState::Ready).await;
    guard.add(ready.pid as i32);
    // The leader applied a later report of st-1 than this agent sent (an
    // earlier run of it, its clock an hour ahead): the status goes again,
    // numbered above it.
    let applied = ready.seq + 3_600_000_000;
    leader
        .send(
            6,
            0,
            Down::Registered(Registered {
                shards: vec![listed.to_proto()],
                report_seqs: [("st-1".to_owned(), applied)].into(),
                ..Registered::default()
            }),
        )
        .await;
    leader
        .wait_for(
            "st-1 READY numbered above the leader's",
            LONG,
            |_, body| match body {
                Up::ShardStatus(s) if s.shard_id == "st-1" && s.seq > applied => {
                    assert_eq!(s.state, ShardState::Ready as i32, "{s:?}");
                    Some(())
                }
                _ => None,
            },
        )
        .await;
    let kept = Down::Registered(Registered {
        keep: vec!["st-1".into()],
        ..Registered::default()
    });
    leader.send(6, 0, kept).await;
    // Commands are acted on in order: once this one is acknowledged, the
    // `Registered` before it was.
    leader.send(6, 41, stop_cmd("not-here")).await;
    assert!(wait_ack(leader, 41).await.accepted);
    assert!(
        supervisor.running().iter().any(|r| r.shard_id == "st-1"),
        "a kept shard was stopped"
    );
    leader.send(6, 0, registered(vec![], vec![])).await;
    let stopped = wait_status(leader, 1, "st-1", ShardState::Stopped).await;
    assert!(
        stopped.message.contains("not assigned to this node"),
        "{}",
        stopped.message
    );
}

/// A reconnect in the middle of a drain: `Registered` lists the shard
/// under `drains`, and it keeps draining instead of being stopped.
async fn a_drain_listed_in_registered_keeps_draining(
    leader: &FakePeer,
    supervisor: &Supervisor,
    guard: &GroupGuard,
) {
    let draining = support::spec("st-2", Engine::Vllm, &[2], free_port());
    leader
        .send(6, 0, registered(vec![draining.to_proto()], vec![]))
        .await;
    let ready = wait_status(leader, 1, "st-2", ShardState::Ready).await;
    guard.add(ready.pid as i32);
    let drain = llmgw_proto::agent::DrainShard {
        shard_id: "st-2".into(),
        deadline_ms: 60_000,
        reason: "node drain".into(),
    };
    leader.send(6, 0, registered(vec![], vec![drain])).await;
    let status = wait_status(leader, 1, "st-2", ShardState::Draining).await;
    assert!(status.message.contains("node drain"), "{}", status.message);
    assert_eq!(
        supervisor.status("st-2").unwrap().state,
        ShardState::Draining as i32,
        "a drain listed in Registered must not stop the engine"
    );
}

/// A leader that stops answering (paused, cut off) loses its agents: the
/// agent hears nothing for `leader_timeout`, leaves, and registers with
/// another peer instead of waiting on the silent one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_leaves_a_silent_leader_and_registers_elsewhere() {
    let first = FakePeer::leader().await;
    let second = FakePeer::leader().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = agent_yaml(
        dir.path(),
        &[first.addr.to_string(), second.addr.to_string()],
    ) + "leader_timeout: 1s\n";
    let config = llmgw_config::AgentConfig::parse("agent.yaml", &yaml).unwrap();
    let (_supervisor, task) = start_in_process_agent(dir.path(), config);

    first
        .wait_for("Register on the first peer", LONG, |_, body| {
            matches!(body, Up::Register(_)).then_some(())
        })
        .await;
    // Answered heartbeats keep the agent where it is, well past the timeout.
    first
        .wait_for(
            "heartbeats past leader_timeout",
            LONG,
            |_, body| match body {
                Up::Heartbeat(h) if h.seq >= 10 => Some(()),
                _ => None,
            },
        )
        .await;
    assert_eq!(
        second.connections(),
        0,
        "the agent left an answering leader"
    );

    first.set_silent(true);
    second
        .wait_for("Register on the second peer", LONG, |_, body| {
            matches!(body, Up::Register(_)).then_some(())
        })
        .await;
    assert_eq!(first.connections(), 1, "the silent peer was dialled again");
    task.abort();
}

fn spawn_agent(config: &Path, log: &Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    std::process::Command::new(llmgw_bin())
        .args(["agent", "--config"])
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("start llmgw agent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_survive_a_killed_agent_and_are_adopted_by_the_next() {
    let leader = FakePeer::leader().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_agent_config(dir.path(), &leader);
    let agent_log = dir.path().join("agent.log");
    let guard = GroupGuard::default();
    let mut first = spawn_agent(&config, &agent_log);
    guard.add(first.id() as i32);

    let ports = [free_port(), free_port()];
    let pids = start_engines_on(&leader, &ports, &guard).await;
    let load = Load::start(&ports);
    load.wait_for_served(10, "no load flowing").await;

    signal_pid(first.id() as i32, libc::SIGKILL);
    let _ = first.wait();
    let at_kill = load.served();
    load.wait_for_served(at_kill + 100, "requests were not served with no agent")
        .await;
    for pid in &pids {
        assert!(
            llmgw_agent::proc_stat(*pid as i32).is_some(),
            "engine {pid} died with its agent"
        );
    }

    let mut second = spawn_agent(&config, &agent_log);
    guard.add(second.id() as i32);
    the_next_agent_adopts(&leader, &pids).await;
    let at_adopt = load.served();
    load.wait_for_served(at_adopt + 10, "no requests after adoption")
        .await;
    load.finish_without_failures();

    the_adopted_engines_are_still_under_control(&leader, &pids).await;
    signal_pid(second.id() as i32, libc::SIGKILL);
    let _ = second.wait();
}

/// Writes the agent's config for a node whose only peer is `leader`.
fn write_agent_config(dir: &Path, leader: &FakePeer) -> PathBuf {
    let config = dir.join("agent.yaml");
    std::fs::File::create(&config)
        .unwrap()
        .write_all(agent_yaml(&dir.join("work"), &[leader.addr.to_string()]).as_bytes())
        .unwrap();
    config
}

/// Waits for the agent to register, then starts one engine per port
/// (shards `kill-0`, `kill-1`, …); their pids once ready.
async fn start_engines_on(leader: &FakePeer, ports: &[u16], guard: &GroupGuard) -> Vec<u32> {
    leader
        .wait_for("first Register", LONG, |c, body| {
            matches!(body, Up::Register(_)).then_some(c)
        })
        .await;
    for (i, port) in ports.iter().enumerate() {
        let spec = support::spec(&format!("kill-{i}"), Engine::Vllm, &[i as u32], *port);
        leader.send(1, i as u64 + 1, start_cmd(&spec)).await;
        assert!(wait_ack(leader, i as u64 + 1).await.accepted);
    }
    let mut pids = Vec::new();
    for i in 0..ports.len() {
        let ready = wait_status(leader, 1, &format!("kill-{i}"), ShardState::Ready).await;
        guard.add(ready.pid as i32);
        pids.push(ready.pid);
    }
    pids
}

/// The second agent's Register lists the running engines, and each comes
/// back ready as adopted, with the same pid.
async fn the_next_agent_adopts(leader: &FakePeer, pids: &[u32]) {
    let register = leader
        .wait_for("second Register", LONG, |c, body| match body {
            Up::Register(r) if c >= 2 => Some(r.clone()),
            _ => None,
        })
        .await;
    let mut running: Vec<(String, u32)> = register
        .running
        .iter()
        .map(|r| (r.shard_id.clone(), r.pid))
        .collect();
    running.sort();
    assert_eq!(
        running,
        vec![
            ("kill-0".to_string(), pids[0]),
            ("kill-1".to_string(), pids[1])
        ]
    );
    for (i, pid) in pids.iter().enumerate() {
        let ready = wait_status(leader, 2, &format!("kill-{i}"), ShardState::Ready).await;
        assert_eq!(ready.pid, *pid);
        assert!(ready.message.contains("adopted"), "{}", ready.message);
    }
}

async fn the_adopted_engines_are_still_under_control(leader: &FakePeer, pids: &[u32]) {
    for i in 0..2u64 {
        leader.send(1, 10 + i, stop_cmd(&format!("kill-{i}"))).await;
        assert!(wait_ack(leader, 10 + i).await.accepted);
        wait_status(leader, 2, &format!("kill-{i}"), ShardState::Stopped).await;
    }
    for pid in pids {
        assert!(group_members(*pid as i32).is_empty());
    }
}

/// A bounded load loop of completions on each engine, kept up for the
/// whole kill and restart; every answer but a 200 is a failure.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<Mutex<Vec<String>>>,
    loaders: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(ports: &[u16]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(Mutex::new(Vec::<String>::new()));
        let loaders = ports
            .iter()
            .map(|port| {
                let (port, stop, ok, failed) = (*port, stop.clone(), ok.clone(), failed.clone());
                std::thread::spawn(move || load_one(port, &stop, &ok, &failed))
            })
            .collect();
        Load {
            stop,
            ok,
            failed,
            loaders,
        }
    }

    fn served(&self) -> u64 {
        self.ok.load(Ordering::SeqCst)
    }

    async fn wait_for_served(&self, at_least: u64, what: &str) {
        assert!(
            wait_until(LONG, || async { self.served() >= at_least }).await,
            "{what}"
        );
    }

    fn finish_without_failures(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for l in std::mem::take(&mut self.loaders) {
            l.join().unwrap();
        }
        let failed = self.failed.lock().unwrap().clone();
        assert!(failed.is_empty(), "failed requests: {failed:#?}");
        eprintln!("served {} requests, none failed", self.served());
    }
}

impl Drop for Load {
    /// A failed test stops its loaders instead of leaving them on the
    /// engines for the rest of their two minutes.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn load_one(port: u16, stop: &AtomicBool, ok: &AtomicU64, failed: &Mutex<Vec<String>>) {
    let until = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        match completion(port, 4) {
            Ok((200, _)) => {
                ok.fetch_add(1, Ordering::SeqCst);
            }
            Ok((status, body)) => failed
                .lock()
                .unwrap()
                .push(format!("{port}: {status} {body}")),
            Err(e) => failed.lock().unwrap().push(format!("{port}: {e}")),
        }
    }
}
