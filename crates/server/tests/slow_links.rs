//! Peers 100 ms apart (a delaying TCP proxy in front of every peer's gRPC
//! port; agents and clients reach the peers directly): told the round trip
//! (`raft.peer_round_trip`), the peers derive timings that carry it, and
//! an idle cluster keeps its leader and its term, and takes a write at any
//! moment. With the LAN timings the leader's heartbeats all time out, its
//! lease lapses and every write is refused for good; the config check now
//! refuses such timings for such a round trip.

use std::time::Duration;

use llmgw_test_kit::Cluster;

/// Cross-region: 100 ms round trip between peers.
const ONE_WAY: Duration = Duration::from_millis(50);

/// The round trip, and nothing else: the timings follow from it.
const CROSS_REGION: &str = "raft:\n  peer_round_trip: 100ms\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_over_slow_links_keeps_its_leader_and_takes_writes() {
    let (cluster, _proxies) = Cluster::start_behind_delay(CROSS_REGION, ONE_WAY);
    let leader = cluster.wait_leader().await;
    cluster
        .eventually("a first write", || async {
            match cluster.put_model(leader, "first").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let term = cluster.cluster_view(leader).await.unwrap().term;

    // Idle: only heartbeats keep the leader's lease.
    let leaders = cluster.leaders_over(Duration::from_secs(10)).await;
    assert_eq!(leaders, [leader], "leadership moved on an idle cluster");
    assert_eq!(
        cluster.cluster_view(leader).await.unwrap().term,
        term,
        "the term moved"
    );
    // A write after the idle spell is taken at once, not after a new
    // election: the lease held.
    let (status, body) = cluster.put_model(leader, "after-idle").await.unwrap();
    assert_eq!(status, 200, "{body}");
}
