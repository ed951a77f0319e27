//! Backup and restore as an operator does it: `llmgw ctl snapshot save`
//! while writes go on, two elections after it (the agent follows both),
//! every peer stopped and wiped, `llmgw server --restore FILE` on each,
//! start: the saved state, every write acknowledged before the save, and
//! the agent reconnects, keeps its engine and obeys the restored cluster,
//! whose terms restarted below what the agent had seen.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use llmgw_api::{ReplicaState, ReplicaView};
use llmgw_dev::L40S_PCIE;
use llmgw_test_kit::agents::Agent;
use llmgw_test_kit::{Cluster, llmgw_bin};
use serde_json::json;

fn field<'a>(text: &'a str, name: &str) -> &'a str {
    let start = text
        .find(name)
        .unwrap_or_else(|| panic!("{name} in {text}"))
        + name.len();
    text[start..]
        .split([',', ' ', '\n'])
        .next()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_saved_under_load_restores_a_new_cluster_with_the_same_state() {
    let mut cluster =
        Cluster::start("liveness:\n  node_ttl: 3s\n  lost_after: 20s\n  leader_grace: 10s\n");
    let leader = cluster.wait_leader().await;
    let mut agent = Agent::start(&cluster, "l40s-1", L40S_PCIE, 1);
    let before = qwen_placed_and_ready(&cluster, leader).await;
    let engine_pid = before.replica.shards[0].pid;
    let engines = agent.engine_pids();
    assert!(!engines.is_empty());

    // Writes go on while the backup is taken.
    let writes = Writes::start(&cluster);
    writes.wait_for_acknowledged(&cluster, 20).await;
    let acked_before_save = writes.acknowledged();
    let file = cluster.dir.path().join("backup.json");
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let saved_text = snapshot_save(&cluster, follower, &file);
    writes.stop().await;
    let hash = saved_state_hash(&saved_text);
    the_backup_holds(&file, &acked_before_save);
    // A rolling upgrade after the backup: the agent obeys two newer
    // leaders, and keeps the highest it saw.
    elect_twice_with_the_agent_following(&mut cluster).await;

    // Everything stops; every data directory is wiped; each is restored.
    for id in 1..=3 {
        cluster.kill(id);
        std::fs::remove_dir_all(&cluster.peers[(id - 1) as usize].layout.data_dir).unwrap();
    }
    for id in 1..=3 {
        restore_peer(&cluster, id, &file, &hash);
    }
    a_second_restore_is_refused(&cluster, &file);

    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_leader().await;
    cluster.wait_converged().await;
    restored_state_is_the_saved_one(&cluster, &file).await;
    nothing_acknowledged_is_lost(&cluster, &acked_before_save).await;
    assert!(
        cluster
            .model_names(1, true)
            .await
            .unwrap()
            .contains(&"qwen".to_owned())
    );
    // The agent finds the restored cluster and keeps its engine: same
    // pid, still ready, nothing placed again.
    let after = ready_with_the_agent_connected(&cluster).await;
    assert_eq!(after.replica.id, before.replica.id);
    assert_eq!(after.replica.shards[0].pid, engine_pid);
    assert_eq!(agent.engine_pids(), engines);
    // The restored cluster commands the agent: the model deleted, the
    // engine stops.
    the_agent_obeys_a_delete(&cluster, &agent).await;
    agent.kill();
}

/// The restored cluster holds exactly the saved state, but for its
/// epoch: the same cluster id, and an epoch past the saved one, begun by
/// its first leader.
async fn restored_state_is_the_saved_one(cluster: &Cluster, saved: &Path) {
    let leader = cluster.wait_leader().await;
    cluster
        .eventually("the restored cluster's epoch", || async {
            cluster
                .cluster_view(leader)
                .await?
                .epoch
                .ok_or_else(|| "no epoch yet".to_owned())
        })
        .await;
    let now = saved.with_extension("restored.json");
    snapshot_save(cluster, leader, &now);
    let read = |file: &Path| -> llmgw_store::Backup {
        serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap()
    };
    let (saved, now) = (read(saved), read(&now));
    let before = saved.fleet.cluster.clone().expect("the saved cluster's id");
    let after = now
        .fleet
        .cluster
        .clone()
        .expect("the restored cluster's id");
    assert_eq!(after.id, before.id, "a restore keeps the cluster's id");
    assert!(
        after.epoch > before.epoch && !after.new_epoch_due,
        "a restored cluster begins a later epoch: {before:?} then {after:?}"
    );
    let mut restored = now.fleet;
    restored.cluster = saved.fleet.cluster.clone();
    assert_eq!(
        restored.hash(),
        saved.fleet.hash(),
        "the restored cluster holds exactly the saved state"
    );
}

/// Two elections, each waited out until the agent's stream is open on
/// the new leader (so it has obeyed it).
async fn elect_twice_with_the_agent_following(cluster: &mut Cluster) {
    for _ in 0..2 {
        let old = cluster.wait_leader().await;
        cluster.kill(old);
        let new = cluster
            .eventually("a new leader", || async {
                match cluster.wait_leader().await {
                    leader if leader != old => Ok(leader),
                    leader => Err(format!("peer {leader} still leads")),
                }
            })
            .await;
        cluster
            .eventually("the agent on the new leader", || async {
                let nodes = cluster.nodes(new).await?;
                match nodes.first().and_then(|node| node.stream.as_ref()) {
                    Some(stream) if stream.connected => Ok(()),
                    other => Err(format!("stream {other:?}")),
                }
            })
            .await;
        cluster.spawn(old);
    }
}

async fn the_agent_obeys_a_delete(cluster: &Cluster, agent: &Agent) {
    let leader = cluster.wait_leader().await;
    let (status, body) = cluster
        .send(leader, reqwest::Method::DELETE, "/api/v1/models/qwen", None)
        .await
        .unwrap();
    assert_eq!(status, 204, "{body}");
    cluster
        .eventually("the agent stops the engine", || async {
            match agent.engine_pids().as_slice() {
                [] => Ok(()),
                running => Err(format!(
                    "engines {running:?} still run; the agent said: {}",
                    last_lines(&agent.log_text(), 3)
                )),
            }
        })
        .await;
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

async fn qwen_placed_and_ready(cluster: &Cluster, leader: u64) -> ReplicaView {
    let model = json!({
        "name": "qwen", "source": "Qwen/Qwen2.5-0.5B-Instruct", "replicas": 1,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16}]
    });
    cluster.put_model_spec(leader, &model).await;
    cluster.eventually("qwen ready", || ready(cluster)).await
}

/// Model writes round-robin over the three peers until stopped (at most
/// 2000), keeping the names of those acknowledged.
struct Writes {
    acknowledged: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    writer: tokio::task::JoinHandle<()>,
}

impl Writes {
    fn start(cluster: &Cluster) -> Writes {
        let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let admin: Vec<String> = (1..=3).map(|id| cluster.admin(id)).collect();
        let writer = tokio::spawn(write_models(admin, acknowledged.clone(), stop.clone()));
        Writes {
            acknowledged,
            stop,
            writer,
        }
    }

    async fn wait_for_acknowledged(&self, cluster: &Cluster, at_least: usize) {
        cluster
            .eventually("some writes", || async {
                let n = self.acknowledged.lock().unwrap().len();
                if n >= at_least {
                    Ok(())
                } else {
                    Err(format!("{n} acknowledged"))
                }
            })
            .await;
    }

    fn acknowledged(&self) -> Vec<String> {
        self.acknowledged.lock().unwrap().clone()
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.writer.await.unwrap();
    }
}

async fn write_models(
    admin: Vec<String>,
    acknowledged: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) {
    let http = reqwest::Client::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) && i < 2000 {
        let name = format!("w{i:04}");
        let body = json!({"name": name, "endpoints": ["http://10.1.2.3:8000"]});
        let ok = http
            .put(format!("{}/api/v1/models/{name}", admin[i % 3]))
            .body(body.to_string())
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            acknowledged.lock().unwrap().push(name);
        }
        i += 1;
    }
}

/// `llmgw ctl snapshot save` through `peer`'s admin API; what it printed.
fn snapshot_save(cluster: &Cluster, peer: u64, file: &Path) -> String {
    let saved = Command::new(llmgw_bin())
        .args(["ctl", "--api", &cluster.admin(peer), "snapshot", "save"])
        .arg(file)
        .output()
        .expect("run llmgw ctl");
    let saved_text = String::from_utf8_lossy(&saved.stdout).into_owned();
    assert!(
        saved.status.success(),
        "{saved_text}{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    saved_text
}

/// The state hash the save printed, with the index it was taken at.
fn saved_state_hash(saved_text: &str) -> String {
    let index = field(saved_text, "index ");
    let hash = field(saved_text, "state hash ").to_owned();
    assert!(index.parse::<u64>().is_ok(), "{saved_text}");
    assert_eq!(hash.len(), 16, "{saved_text}");
    hash
}

fn the_backup_holds(file: &Path, acked_before_save: &[String]) {
    let backup: llmgw_store::Backup =
        serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let in_backup: BTreeSet<&str> = backup.fleet.models.keys().map(String::as_str).collect();
    for name in acked_before_save {
        assert!(
            in_backup.contains(name.as_str()),
            "{name} acknowledged before the save"
        );
    }
}

fn server_restore(cluster: &Cluster, id: u64, file: &Path) -> std::process::Output {
    server_with_file(cluster, id, "--restore", file)
}

/// `llmgw server --config <peer id's server.yaml> FLAG FILE`.
fn server_with_file(cluster: &Cluster, id: u64, flag: &str, file: &Path) -> std::process::Output {
    Command::new(llmgw_bin())
        .args(["server", "--config"])
        .arg(&cluster.peers[(id - 1) as usize].layout.config)
        .arg(flag)
        .arg(file)
        .output()
        .unwrap()
}

fn restore_peer(cluster: &Cluster, id: u64, file: &Path, hash: &str) {
    let out = server_restore(cluster, id, file);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(&format!("state hash {hash}")),
        "restore of peer {id}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A second restore into a restored directory is refused.
fn a_second_restore_is_refused(cluster: &Cluster, file: &Path) {
    let again = server_restore(cluster, 1, file);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("move it aside"));
}

async fn nothing_acknowledged_is_lost(cluster: &Cluster, acked_before_save: &[String]) {
    let names: BTreeSet<String> = cluster
        .model_names(1, true)
        .await
        .unwrap()
        .into_iter()
        .collect();
    for name in acked_before_save {
        assert!(names.contains(name), "{name} lost in the restore");
    }
}

async fn ready_with_the_agent_connected(cluster: &Cluster) -> ReplicaView {
    cluster
        .eventually("qwen ready after restore", || async {
            let replica = ready(cluster).await?;
            let nodes = cluster.nodes(cluster.wait_leader().await).await?;
            let stream = nodes.first().and_then(|node| node.stream.as_ref());
            if stream.is_some_and(|stream| stream.connected) {
                Ok(replica)
            } else {
                Err("the agent is not connected yet".to_owned())
            }
        })
        .await
}

/// The one replica, once it is ready, as the leader sees it.
async fn ready(cluster: &Cluster) -> Result<ReplicaView, String> {
    match cluster
        .replicas(cluster.wait_leader().await)
        .await?
        .as_slice()
    {
        [one] if one.state == ReplicaState::Ready => Ok(one.clone()),
        other => Err(format!("{other:?}")),
    }
}

/// `llmgw server --save-backup FILE` on a stopped peer's data directory.
fn server_save_backup(cluster: &Cluster, id: u64, file: &Path) -> std::process::Output {
    server_with_file(cluster, id, "--save-backup", file)
}

/// The recovery for a cluster that lost two of its three peers: the
/// survivor cannot answer `ctl snapshot save` (no quorum), so a backup is
/// written from its stopped data directory, and every peer is restored
/// from that. Nothing acknowledged before the loss is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_lost_its_majority_is_restored_from_the_survivors_data_directory() {
    let mut cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let mut acknowledged = Vec::new();
    for i in 0..30 {
        let name = format!("m{i:02}");
        let (status, body) = cluster.put_model(leader, &name).await.unwrap();
        assert_eq!(status, 200, "{body}");
        acknowledged.push(name);
    }
    // The survivor is the follower that holds every acknowledged write:
    // one that never received a write cannot give it back.
    cluster.wait_converged().await;
    let survivor = (1..=3).find(|id| *id != leader).unwrap();
    for id in (1..=3).filter(|id| *id != survivor) {
        cluster.kill(id);
    }
    let file = cluster.dir.path().join("survivor.json");
    let online = Command::new(llmgw_bin())
        .args(["ctl", "--api", &cluster.admin(survivor), "snapshot", "save"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        !online.status.success(),
        "a lone peer has no quorum to save from"
    );
    let running = server_save_backup(&cluster, survivor, &file);
    assert!(!running.status.success());
    assert!(
        String::from_utf8_lossy(&running.stderr).contains("still running"),
        "{}",
        String::from_utf8_lossy(&running.stderr)
    );

    cluster.kill(survivor);
    let saved = server_save_backup(&cluster, survivor, &file);
    let saved_text = String::from_utf8_lossy(&saved.stdout).into_owned();
    assert!(
        saved.status.success(),
        "{saved_text}{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    let hash = saved_state_hash(&saved_text);
    the_backup_holds(&file, &acknowledged);

    for id in 1..=3 {
        std::fs::remove_dir_all(&cluster.peers[(id - 1) as usize].layout.data_dir).unwrap();
        restore_peer(&cluster, id, &file, &hash);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_leader().await;
    cluster.wait_converged().await;
    restored_state_is_the_saved_one(&cluster, &file).await;
    nothing_acknowledged_is_lost(&cluster, &acknowledged).await;
}

/// A restore beside running peers is refused (it would make the restored
/// peer forget what it acknowledged to them). Forced, with a backup of
/// another cluster, the peer starts but the running peers and it refuse
/// each other's RPCs: it never takes part in their cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_beside_running_peers_is_refused_and_a_foreign_one_is_kept_apart() {
    let mut cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let ours = cluster
        .eventually("the cluster's epoch", || async {
            let view = cluster.cluster_view(leader).await?;
            view.cluster_id
                .zip(view.epoch)
                .ok_or_else(|| "no epoch yet".to_owned())
        })
        .await
        .0;
    let (status, body) = cluster.put_model(leader, "before").await.unwrap();
    assert_eq!(status, 200, "{body}");
    let file = cluster.dir.path().join("ours.json");
    snapshot_save(&cluster, leader, &file);

    let lost = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(lost);
    std::fs::remove_dir_all(&cluster.peers[(lost - 1) as usize].layout.data_dir).unwrap();
    let refused = server_restore(&cluster, lost, &file);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "restored beside running peers");
    assert!(
        stderr.contains(&format!("peer {leader} at")) && stderr.contains("is running"),
        "{stderr}"
    );
    assert!(stderr.contains("--force"), "{stderr}");

    let foreign = cluster.dir.path().join("foreign.json");
    write_as_another_cluster(&file, &foreign, "someone-else");
    let forced = Command::new(llmgw_bin())
        .args(["server", "--config"])
        .arg(&cluster.peers[(lost - 1) as usize].layout.config)
        .arg("--restore")
        .arg(&foreign)
        .arg("--force")
        .output()
        .unwrap();
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    cluster.spawn(lost);
    cluster
        .wait_log(
            lost,
            &[&format!(
                "this peer belongs to cluster someone-else, and the caller to cluster {ours}"
            )],
        )
        .await;
    // The two peers of our cluster go on; the foreign one names no leader
    // (it refuses their appends), so only theirs are asked.
    let (status, body) = cluster.put_model(leader, "after").await.unwrap();
    assert_eq!(status, 200, "{body}");
    // The other follower applies it; the foreign peer, refusing the
    // leader's appends, holds only what its own backup held.
    let other = (1..=3).find(|id| *id != leader && *id != lost).unwrap();
    cluster
        .eventually("the other follower applies the write", || async {
            let names = cluster.model_names(other, false).await?;
            if names.iter().any(|name| name == "after") {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        })
        .await;
    let names = cluster.model_names(lost, false).await.unwrap();
    assert!(names.contains(&"before".to_owned()), "{names:?}");
    assert!(!names.contains(&"after".to_owned()), "{names:?}");
}

/// The backup in `from`, as if taken from cluster `id`.
fn write_as_another_cluster(from: &Path, to: &Path, id: &str) {
    let mut backup: llmgw_store::Backup =
        serde_json::from_slice(&std::fs::read(from).unwrap()).unwrap();
    backup.fleet.cluster.as_mut().expect("an identity").id = id.to_owned();
    backup.state_hash = backup.fleet.hash().to_string();
    std::fs::write(to, serde_json::to_vec(&backup).unwrap()).unwrap();
}
