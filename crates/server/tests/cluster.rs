//! End-to-end tests of the replicated control plane: three real
//! `llmgw server` processes on 127.0.0.1 (llmgw-test-kit's `Cluster`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmgw_api::{ErrorBody, Model};
use llmgw_test_kit::{Cluster, decode, metric};
use reqwest::Method;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_any_peer_is_visible_on_all_with_equal_hashes() {
    let cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    // One write through each peer: two of them are followers and forward.
    for id in 1..=3 {
        let name = format!("model-via-{id}");
        let (status, body) = cluster
            .put_model(id, &name)
            .await
            .expect("PUT reaches the peer");
        assert_eq!(
            status, 200,
            "PUT through peer {id} (leader {leader}): {body}"
        );
        assert_eq!(decode::<Model>(&body).name, name);
    }
    let want: BTreeSet<String> = (1..=3).map(|id| format!("model-via-{id}")).collect();
    // A linearizable read on a follower sees every acknowledged write at once.
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let seen: BTreeSet<String> = cluster
        .model_names(follower, true)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(seen, want, "consistent read on follower {follower}");
    for id in 1..=3 {
        cluster
            .eventually(&format!("peer {id} has every model"), || async {
                let names: BTreeSet<String> =
                    cluster.model_names(id, false).await?.into_iter().collect();
                if names == want {
                    Ok(())
                } else {
                    Err(format!("{names:?}"))
                }
            })
            .await;
    }
    cluster.wait_converged().await;

    // Errors are JSON with a type and the right status.
    let (status, body) = cluster.get(follower, "/api/v1/models/nope").await.unwrap();
    assert_eq!(status, 404, "{body}");
    assert_eq!(decode::<ErrorBody>(&body).error.kind, "not_found");
    let (status, body) = cluster
        .send(
            follower,
            Method::PUT,
            "/api/v1/models/broken",
            Some(r#"{"name": "broken", "replicas": 2}"#.to_owned()),
        )
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert_eq!(decode::<ErrorBody>(&body).error.kind, "invalid_request");
    let (status, body) = cluster
        .send(follower, Method::POST, "/api/v1/nodes/gpu-404/cordon", None)
        .await
        .unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(
        decode::<ErrorBody>(&body).error.message.contains("gpu-404"),
        "{body}"
    );
    let (status, _) = cluster
        .send(follower, Method::DELETE, "/api/v1/models/model-via-1", None)
        .await
        .unwrap();
    assert_eq!(status, 204);
    let names = cluster.model_names(leader, true).await.unwrap();
    assert!(!names.contains(&"model-via-1".to_owned()), "{names:?}");

    // What a dashboard scrapes: the leader says so, and every peer has
    // applied the writes and timed the fsyncs it waited for.
    for id in 1..=3 {
        let (status, text) = cluster.get(id, "/metrics").await.unwrap();
        assert_eq!(status, 200);
        let text = text.as_str().unwrap_or_default().to_owned();
        let value = |name: &str| -> f64 {
            metric(&text, name)
                .unwrap_or_else(|| panic!("no {name} in peer {id}'s metrics:\n{text}"))
        };
        assert_eq!(
            value("llmgw_raft_is_leader"),
            f64::from(u8::from(id == leader))
        );
        assert!(value("llmgw_raft_applied_entries_total") >= 4.0, "{text}");
        assert!(value("llmgw_raft_log_sync_seconds_count") >= 4.0, "{text}");
        assert!(value("llmgw_raft_log_sync_seconds_sum") > 0.0, "{text}");
        assert!(value("llmgw_raft_log_sync_seconds_max") > 0.0, "{text}");
        // The acknowledged record is a part of every synced write.
        let record = value("llmgw_raft_acknowledged_record_sync_seconds_sum");
        assert!(record > 0.0, "{text}");
        assert!(record <= value("llmgw_raft_log_sync_seconds_sum"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_leader_is_killed_a_new_leader_accepts_writes_and_the_old_one_catches_up() {
    let mut cluster = Cluster::start("");
    let old_leader = cluster.wait_leader().await;
    let (status, _) = cluster
        .put_model(old_leader, "before-failover")
        .await
        .unwrap();
    assert_eq!(status, 200);
    cluster.wait_converged().await;

    cluster.kill(old_leader);
    let survivor = (1..=3).find(|id| *id != old_leader).unwrap();
    cluster
        .eventually("a write after the leader died", || async {
            match cluster.put_model(survivor, "after-failover").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, old_leader);

    cluster.spawn(old_leader);
    cluster.wait_leader().await;
    let hash = cluster.wait_converged().await;
    let names = cluster.model_names(old_leader, false).await.unwrap();
    assert!(names.contains(&"before-failover".to_owned()), "{names:?}");
    assert!(names.contains(&"after-failover".to_owned()), "{names:?}");
    assert_eq!(cluster.own_state(old_leader).await.unwrap().1, hash);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_purged_log_catches_up_by_snapshot() {
    let small_snapshots = "raft:\n  snapshot_after_logs: 20\n  keep_logs_after_snapshot: 5\n";
    let mut cluster = Cluster::start(small_snapshots);
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(follower);
    // The follower holds at most what the leader held when it died.
    let follower_holds = cluster
        .metric(leader, "llmgw_raft_last_log_index")
        .await
        .expect("the leader's last log index");
    for i in 0..80 {
        let name = format!("m{i:03}");
        let (status, body) = cluster.put_model(leader, &name).await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    // The leader has snapshotted past what the follower holds.
    let snapshot_index = cluster
        .eventually("leader snapshot", || async {
            match cluster.metric(leader, "llmgw_raft_snapshot_index").await {
                Some(index) if index >= 40.0 => Ok(index),
                other => Err(format!("snapshot index {other:?}")),
            }
        })
        .await;
    assert!(snapshot_index >= 40.0);
    // Purging follows the snapshot: a follower back before it would catch
    // up from the log.
    cluster
        .eventually("leader purged past the follower's log", || async {
            match cluster.metric(leader, "llmgw_raft_purged_index").await {
                Some(purged) if purged > follower_holds => Ok(()),
                other => Err(format!(
                    "purged index {other:?}, follower holds {follower_holds}"
                )),
            }
        })
        .await;

    cluster.spawn(follower);
    cluster.wait_converged().await;
    let installed = cluster
        .metric(follower, "llmgw_raft_snapshots_installed_total")
        .await
        .unwrap();
    assert!(
        installed >= 1.0,
        "follower {follower} caught up without a snapshot"
    );
    // The follower reports what it installed, for an operator sizing
    // snapshots.
    for name in [
        "llmgw_raft_snapshot_bytes",
        "llmgw_raft_snapshot_install_seconds",
    ] {
        let value = cluster.metric(follower, name).await.unwrap();
        assert!(value > 0.0, "{name} is {value} after an install");
    }
    let names = cluster.model_names(follower, false).await.unwrap();
    assert_eq!(names.len(), 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill_of_all_peers() {
    let mut cluster = Cluster::start("");
    cluster.wait_leader().await;
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let cluster_ref = &cluster;
    // The kill below comes long before this deadline; it only bounds the
    // burst should the writes stall.
    let burst_until = Instant::now() + Duration::from_secs(60);
    let writers = (0..4u64).map(|writer| {
        let acknowledged = acknowledged.clone();
        async move {
            let mut i = 0u32;
            // Bounded: stops at the deadline or after 500 writes.
            while Instant::now() < burst_until && i < 500 {
                let name = format!("w{writer}-{i}");
                let via = 1 + (u64::from(i) + writer) % 3;
                if let Ok((200, _)) = cluster_ref.put_model(via, &name).await {
                    acknowledged.lock().unwrap().push(name);
                }
                i += 1;
            }
        }
    });
    let burst = futures::future::join_all(writers);
    // Kill everything while the burst is still running, once it has had
    // writes acknowledged (however slow the machine).
    let killer = async {
        while acknowledged.lock().unwrap().len() < 20 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = burst => {}
        _ = killer => {}
    }
    let acked: Vec<String> = acknowledged.lock().unwrap().clone();
    for id in 1..=3 {
        cluster.kill(id);
    }
    assert!(
        acked.len() >= 5,
        "too few writes were acknowledged: {}",
        acked.len()
    );

    for id in 1..=3 {
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    let names: BTreeSet<String> = cluster
        .eventually("catalog after restart", || async {
            cluster.model_names(leader, true).await
        })
        .await
        .into_iter()
        .collect();
    let missing: Vec<&String> = acked.iter().filter(|n| !names.contains(*n)).collect();
    assert!(missing.is_empty(), "acknowledged writes lost: {missing:?}");
    cluster.wait_converged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_damaged_store_refuses_to_start() {
    let mut cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    for i in 0..20 {
        let (status, _) = cluster.put_model(leader, &format!("m{i}")).await.unwrap();
        assert_eq!(status, 200);
    }
    cluster.wait_converged().await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for id in &followers {
        cluster.kill(*id);
    }
    // One follower's WAL is damaged in the middle (records after it were
    // synced, so this is not a torn tail); the other's WAL files are gone.
    let wal_files = |id: u64| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(cluster.raft_dir(id))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect()
    };
    let truncated = followers[0];
    let wals = wal_files(truncated);
    assert!(!wals.is_empty());
    for wal in wals {
        let mut bytes = std::fs::read(&wal).unwrap();
        let middle = bytes.len() / 2;
        for b in &mut bytes[middle..middle + 16] {
            *b ^= 0x5a;
        }
        std::fs::write(&wal, bytes).unwrap();
    }
    let deleted = followers[1];
    for wal in wal_files(deleted) {
        std::fs::remove_file(wal).unwrap();
    }

    for id in &followers {
        cluster.spawn(*id);
    }
    for id in &followers {
        let started = Instant::now();
        let status = loop {
            let child = cluster.peers[(*id - 1) as usize].child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            cluster.fail_if_past(
                started,
                &format!("peer {id} with a damaged store is still running"),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(!status.success(), "peer {id} exited successfully");
        let log = std::fs::read_to_string(cluster.log_path(*id)).unwrap();
        assert!(
            log.contains("corrupt or truncated")
                && log.contains(&cluster.raft_dir(*id).display().to_string()),
            "peer {id} must name the damaged directory:\n{log}"
        );
        cluster.peers[(*id - 1) as usize].child = None;
        // It never served: nothing listens on its admin port.
        assert!(cluster.get(*id, "/healthz").await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_completes_and_asking_again_is_done() {
    let mut cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let via = (1..=3).find(|id| *id != leader).unwrap();
    let path = format!("/api/v1/cluster/peers/{leader}");
    // The leader leaves the membership, which ends its leadership while the
    // request is in flight; the next leader finishes it.
    let (status, body) = cluster
        .send(via, Method::DELETE, &path, None)
        .await
        .unwrap();
    assert_eq!(status, 200, "removing leader {leader} via {via}: {body}");
    cluster
        .eventually("the two remaining peers lead without it", || async {
            let view = cluster.cluster_view(via).await?;
            let members: Vec<u64> = view.peers.iter().map(|p| p.id).collect();
            match view.leader_id {
                Some(new) if new != leader && !members.contains(&leader) => Ok(()),
                other => Err(format!("leader {other:?}, members {members:?}")),
            }
        })
        .await;
    let (status, body) = cluster
        .send(via, Method::DELETE, &path, None)
        .await
        .unwrap();
    assert_eq!(status, 200, "asking again: {body}");
    let (status, body) = cluster
        .send(via, Method::DELETE, "/api/v1/cluster/peers/9", None)
        .await
        .unwrap();
    assert_eq!(status, 400, "a peer that never was a member: {body}");
    cluster
        .eventually("a write after the removal", || async {
            match cluster.put_model(via, "after-removal").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    cluster.kill(leader);
}

/// A follower cut off from both other peers cannot elect anyone and goes
/// on naming the leader it last heard; its cluster view says how long ago
/// that was, so an operator reading it is not told that a dead peer leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_left_alone_says_how_long_ago_it_heard_its_leader() {
    let mut cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    for (peer, role) in [(leader, "leader"), (follower, "follower")] {
        cluster
            .eventually(&format!("the {role} in touch with the leader"), || async {
                let view = cluster.cluster_view(peer).await?;
                match (view.leader_id, view.leader_heard_ms_ago) {
                    (Some(named), Some(ms)) if named == leader && ms < 5_000 => Ok(()),
                    other => Err(format!("names and heard: {other:?}")),
                }
            })
            .await;
    }

    for id in (1..=3).filter(|id| *id != follower) {
        cluster.kill(id);
    }
    let view = cluster
        .eventually("the follower's leader shown stale", || async {
            let view = cluster.cluster_view(follower).await?;
            match view.leader_heard_ms_ago {
                Some(ms) if ms >= 3_000 => Ok(view),
                heard => Err(format!(
                    "names {:?}, heard {heard:?} ms ago",
                    view.leader_id
                )),
            }
        })
        .await;
    println!(
        "alone, peer {follower} names {:?}, heard {:?} ms ago",
        view.leader_id, view.leader_heard_ms_ago
    );
    assert_eq!(view.leader_id, Some(leader), "{view:?}");
}
