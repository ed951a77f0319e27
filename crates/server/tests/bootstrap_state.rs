//! Wiping every peer's data must never form a new, empty cluster: with
//! `initial_cluster_state: existing` (the default) empty peers wait to be
//! replicated to (or restored) instead of bootstrapping.

use std::time::{Duration, Instant};

use llmgw_api::Readiness;
use llmgw_test_kit::{Cluster, decode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_peers_with_existing_state_never_form_a_new_cluster() {
    let mut cluster = Cluster::start("");
    let leader = cluster.wait_leader().await;
    let (status, _) = cluster.put_model(leader, "precious").await.unwrap();
    assert_eq!(status, 200);
    for id in 1..=3 {
        cluster.kill(id);
        let peer = &cluster.peers[(id - 1) as usize];
        std::fs::remove_dir_all(&peer.layout.data_dir).unwrap();
        // What an operator runs after the first start: the default.
        let yaml = std::fs::read_to_string(&peer.layout.config).unwrap();
        assert!(yaml.contains("initial_cluster_state: new"), "{yaml}");
        let yaml = yaml.replace("initial_cluster_state: new\n", "");
        std::fs::write(&peer.layout.config, yaml).unwrap();
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    // The lowest-id peer, the one that would bootstrap, says why it does not.
    cluster
        .wait_log(1, &["initial_cluster_state is `existing`"])
        .await;
    // Every peer comes up (peers 2 and 3 may still be starting when peer 1
    // has logged)...
    for id in 1..=3 {
        cluster
            .eventually(&format!("peer {id} answers"), || async {
                cluster.get(id, "/api/v1/cluster").await.map(|_| ())
            })
            .await;
    }
    // ...and answers, empty and without a leader, and keeps it so for
    // longer than a bootstrap and an election take (both well under 2 s).
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for id in 1..=3 {
            let view = cluster.cluster_view(id).await.unwrap();
            assert_eq!(view.leader_id, None, "peer {id} found a leader: {view:?}");
            let (status, ready) = cluster.get(id, "/readyz").await.unwrap();
            assert_eq!(status, 503, "peer {id} is ready without a cluster: {ready}");
            assert!(!decode::<Readiness>(&ready).ready, "{ready}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let names = cluster.model_names(1, false).await.unwrap();
    assert!(names.is_empty(), "{names:?}");
}
