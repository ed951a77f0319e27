//! A peer whose data directory runs out of space: writes through it are
//! refused with a clear error, reads are still served, the rest of the
//! cluster keeps taking writes, and once space returns the peer takes
//! writes again without a restart. The data directory is a small tmpfs,
//! so this needs root; it prints SKIPPED otherwise.

use llmgw_api::{ErrorBody, NodeStatus};
use llmgw_dev::H100_IB_A;
use llmgw_test_kit::agents::Agent;
use llmgw_test_kit::{Cluster, decode};

const FULL_PEER: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_directory_refuses_writes_serves_reads_and_recovers_by_itself() {
    let Some((cluster, tmpfs)) = Cluster::start_with_tmpfs(
        "disk full",
        "raft:\n  min_free_disk_mb: 16\n",
        FULL_PEER,
        160,
    ) else {
        return;
    };
    cluster.wait_leader().await;
    let (status, body) = cluster.put_model(FULL_PEER, "before").await.unwrap();
    assert_eq!(status, 200, "{body}");

    tmpfs.fill(8).unwrap();
    let (status, body) = cluster.put_model(FULL_PEER, "while-full").await.unwrap();
    assert_eq!(status, 507, "{body}");
    let refusal = decode::<ErrorBody>(&body).error;
    assert_eq!(refusal.kind, "disk_full", "{body}");
    let message = refusal.message;
    assert!(
        message.contains(&tmpfs.path().display().to_string()) && message.contains("reads"),
        "the refusal names the directory and says reads go on: {message}"
    );
    // Reads are served from the full peer.
    let names = cluster.model_names(FULL_PEER, false).await.unwrap();
    assert!(names.contains(&"before".to_owned()), "{names:?}");
    // The rest of the cluster takes writes (a full leader hands over).
    let other = if FULL_PEER == 1 { 3 } else { 1 };
    cluster
        .eventually("a write through a peer with room", || async {
            match cluster.put_model(other, "elsewhere").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let leader = cluster.wait_leader().await;
    assert_ne!(leader, FULL_PEER, "a peer without room does not lead");

    tmpfs.free().unwrap();
    cluster
        .eventually("writes through the peer once space returns", || async {
            match cluster.put_model(FULL_PEER, "after").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let hash = cluster.wait_converged().await;
    assert_eq!(cluster.own_state(FULL_PEER).await.unwrap().1, hash);
    let names = cluster.model_names(FULL_PEER, true).await.unwrap();
    for name in ["before", "elsewhere", "after"] {
        assert!(names.contains(&name.to_owned()), "{name}: {names:?}");
    }
    drop(cluster);
    drop(tmpfs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_peer_low_on_disk_the_leader_stays_refuses_writes_and_still_judges_liveness() {
    let liveness = "liveness:\n  node_ttl: 2s\n  lost_after: 5s\n  leader_grace: 6s\n";
    let Some((cluster, disks)) = Cluster::start_with_tmpfs_on(
        "every peer low on disk",
        &format!("raft:\n  min_free_disk_mb: 32\n{liveness}"),
        &[1, 2, 3],
        160,
    ) else {
        return;
    };
    let leader = cluster.wait_leader().await;
    let mut agent = Agent::start(&cluster, "n1", H100_IB_A, leader);
    cluster
        .eventually("the node ready", || async {
            match cluster.node(leader, "n1").await?.record.status {
                NodeStatus::Ready => Ok(()),
                other => Err(other.as_str().to_owned()),
            }
        })
        .await;

    // Every peer below the 32 MiB reserve, none below half of it.
    for disk in &disks {
        disk.fill(24).unwrap();
    }
    let (status, body) = cluster.put_model(leader, "while-low").await.unwrap();
    assert_eq!(status, 507, "{body}");
    // No peer has room: handing leadership over would help nothing and
    // restart every agent stream each time.
    let leaders = cluster
        .leaders_over(std::time::Duration::from_secs(8))
        .await;
    assert_eq!(
        leaders,
        [leader],
        "leadership moved with no peer to take writes"
    );

    // Liveness still commits its verdicts from the reserve.
    agent.kill();
    cluster
        .eventually("the killed agent's node unreachable", || async {
            match cluster.node(leader, "n1").await?.record.status {
                NodeStatus::Unreachable | NodeStatus::Lost => Ok(()),
                other => Err(other.as_str().to_owned()),
            }
        })
        .await;

    for disk in &disks {
        disk.free().unwrap();
    }
    cluster
        .eventually("writes once space returns", || async {
            match cluster.put_model(leader, "after").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    drop(cluster);
    drop(disks);
}
