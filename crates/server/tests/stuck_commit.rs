//! A leader cut off from both followers right after taking a write (its
//! lease still live, so it appends) never hears a majority again. The
//! write must be answered, as an unknown outcome naming why, within the
//! leader's commit deadline; it must not hang for as long as the cut lasts.
//! The same holds for a membership change.

use std::future::Future;
use std::time::{Duration, Instant};

use llmgw_api::ErrorBody;
use llmgw_test_kit::{Cluster, decode};
use serde_json::Value;

/// Far above the commit deadline (4.5 s), below the test client's own
/// timeout (20 s): a request held longer is one that waits for ever.
const ANSWERED_WITHIN: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_leader_cannot_commit_is_answered_as_unknown_in_time() {
    let started = Cluster::start("");
    let cluster = &started;
    answered_as_unknown_while_cut_off(cluster, "a write", |leader, _, attempt| {
        let name = format!("m{attempt}");
        async move { cluster.put_model(leader, &name).await }
    })
    .await;
}

/// Removing a peer through a leader cut off right after it began is not
/// held while the cut lasts (with every membership change behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_removal_the_leader_cannot_commit_is_answered_as_unknown_in_time() {
    let started = Cluster::start("");
    let cluster = &started;
    answered_as_unknown_while_cut_off(cluster, "removing a peer", |leader, follower, _| {
        let path = format!("/api/v1/cluster/peers/{follower}");
        async move {
            cluster
                .send(leader, reqwest::Method::DELETE, &path, None)
                .await
        }
    })
    .await;
}

/// Pauses both followers, sends `request(leader, a follower, attempt)` to
/// the leader, resumes them; it must be answered within
/// [`ANSWERED_WITHIN`], and once (of a few tries) as `503 outcome_unknown`
/// saying no majority acknowledged it. The pause must land inside the
/// leader's lease (450 ms) for the request to be appended at all; outside
/// it the leader refuses at once, which is a different answer. A few tries
/// make a noisy machine's odds fine.
async fn answered_as_unknown_while_cut_off<'a, F, Fut>(cluster: &'a Cluster, what: &str, request: F)
where
    F: Fn(u64, u64, usize) -> Fut,
    Fut: Future<Output = Result<(u16, Value), String>> + 'a,
{
    let mut answers = Vec::new();
    for attempt in 0..5 {
        let leader = cluster.wait_leader().await;
        let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
        for id in &followers {
            cluster.pause(*id);
        }
        let started = Instant::now();
        let answer =
            tokio::time::timeout(ANSWERED_WITHIN, request(leader, followers[0], attempt)).await;
        let took = started.elapsed();
        for id in &followers {
            cluster.resume(*id);
        }
        let (status, body) = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => panic!("attempt {attempt}: no answer after {took:?}: {error}"),
            Err(_) => panic!(
                "attempt {attempt}: {what} through leader {leader} was not answered within \
                 {ANSWERED_WITHIN:?} while both followers stood still\n{}",
                cluster.log_tails()
            ),
        };
        let error = decode::<ErrorBody>(&body).error;
        println!(
            "attempt {attempt}: {status} {} after {:.1}s: {}",
            error.kind,
            took.as_secs_f64(),
            error.message
        );
        answers.push((status, error.kind.clone()));
        if error.kind == "outcome_unknown" {
            assert_eq!(status, 503, "{body}");
            assert!(
                error.message.contains("no majority acknowledged it"),
                "the answer says why: {}",
                error.message
            );
            return;
        }
    }
    panic!("the leader never took {what} before its lease lapsed: {answers:?}");
}
