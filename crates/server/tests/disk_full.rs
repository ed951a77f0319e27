//! A peer whose data directory runs out of space: writes through it are
//! refused with a clear error, reads are still served, the rest of the
//! cluster keeps taking writes, and once space returns the peer takes
//! writes again without a restart. The data directory is a small tmpfs,
//! so this needs root; it prints SKIPPED otherwise.

use llmgw_api::ErrorBody;
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
