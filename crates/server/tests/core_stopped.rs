//! A peer whose Raft core stops on a storage error (here ENOSPC on its log,
//! with the free-space reserve switched off) must not go on serving a
//! state frozen in time while `/healthz` says ok: it exits non-zero, naming
//! why, so its supervisor starts it again, and the rest of the cluster
//! keeps taking writes. The data directory is a small tmpfs, so this needs
//! root.

use std::time::{Duration, Instant};

use llmgw_test_kit::{Cluster, DEADLINE};

const BROKEN_PEER: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_raft_core_stopped_exits_non_zero() {
    // No reserve: the log itself runs into ENOSPC.
    let Some((mut cluster, tmpfs)) = Cluster::start_with_tmpfs(
        "Raft core stopped",
        "raft:\n  min_free_disk_mb: 0\n",
        BROKEN_PEER,
        160,
    ) else {
        return;
    };
    let leader = cluster.wait_leader().await;
    let (status, body) = cluster.put_model(leader, "before").await.unwrap();
    assert_eq!(status, 200, "{body}");

    tmpfs.fill(0).unwrap();
    // Every write is appended on the broken peer too, and fails there.
    let writer = if BROKEN_PEER == 1 { 3 } else { 1 };
    let started = Instant::now();
    let mut health = None;
    let exited = loop {
        let child = cluster
            .peer_mut(BROKEN_PEER)
            .child
            .as_mut()
            .expect("started");
        if let Some(exit) = child.try_wait().expect("the peer's status") {
            break exit;
        }
        if let Ok(answer) = cluster.get(BROKEN_PEER, "/healthz").await {
            health = Some(answer);
        }
        let _ = cluster
            .put_model(writer, &format!("m{}", started.elapsed().as_millis()))
            .await;
        assert!(
            started.elapsed() < DEADLINE,
            "peer {BROKEN_PEER} still runs {:?} after its disk filled; /healthz last said \
             {health:?}\n{}",
            started.elapsed(),
            cluster.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    cluster.peer_mut(BROKEN_PEER).child = None;
    assert!(!exited.success(), "exited with {exited}");
    let log = cluster.log_text(BROKEN_PEER);
    let said = log
        .lines()
        .find(|line| line.contains("the Raft core stopped"))
        .unwrap_or_else(|| panic!("the peer says why it exits:\n{log}"));
    println!(
        "peer {BROKEN_PEER} {exited} {:.1}s after its disk filled: {said}",
        started.elapsed().as_secs_f64()
    );

    // The other two go on taking writes.
    cluster
        .eventually("a write through the peers that still run", || async {
            match cluster.put_model(writer, "after").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    drop(cluster);
    drop(tmpfs);
}
