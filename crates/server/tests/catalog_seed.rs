//! A cluster formed with a configured catalog (server.yaml `catalog`,
//! `initial_cluster_state: new`) always has that catalog, however its
//! first moments go: the first leader refuses writes until a majority has
//! answered it and it has applied its own first entry, and the peer that
//! formed the cluster may stall or die right after forming it. And the
//! seed is written once: a peer restarted with the same configuration never
//! writes it over what an operator changed since.

use std::time::{Duration, Instant};

use llmgw_test_kit::{Cluster, poll_until_ok};

/// Two router-only models: seeding needs no fleet.
const MODELS: &str = r#"models:
  - name: alpha
    endpoints: ["http://127.0.0.1:9"]
  - name: beta
    endpoints: ["http://127.0.0.1:9"]
"#;

/// Formations in a row: a race that a warm machine wins most of the time
/// still shows in a run this long.
const FORMATIONS: usize = 20;

/// How long a formation may take to show its catalog: a stall of the
/// forming peer, an election and the seed's retries fit well inside.
const CATALOG_WITHIN: Duration = Duration::from_secs(60);

/// How long the forming peer stands still in [`FirstMoments::FormerStalls`]
/// at most: several election timeouts.
const STALL: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy)]
enum FirstMoments {
    /// Nothing happens to the peer that formed the cluster.
    Undisturbed,
    /// Mutual TLS between the peers, as in production.
    Tls,
    /// The forming peer stops (SIGSTOP) right after forming the cluster,
    /// until the others elect a leader (when they already know the
    /// cluster) or for a few seconds, then goes on: its first write comes
    /// late, and it may no longer lead.
    FormerStalls,
    /// The forming peer is killed right after forming the cluster and
    /// started again.
    FormerDies,
}

fn first_moments(formation: usize) -> FirstMoments {
    match formation % 4 {
        0 => FirstMoments::Undisturbed,
        1 => FirstMoments::FormerStalls,
        2 => FirstMoments::Tls,
        _ => FirstMoments::FormerDies,
    }
}

/// Three peers whose server.yaml names a catalog file; the directory
/// holding it lives as long as the cluster.
fn start(tls: bool) -> (Cluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("models.yaml");
    std::fs::write(&path, MODELS).expect("write models.yaml");
    let extra = format!("catalog: {}\n", path.display());
    (Cluster::start_with(tls, &extra, |_| {}), dir)
}

/// The models every running peer's catalog holds, once they agree and
/// hold `wanted`; otherwise what was seen last.
async fn catalog_everywhere(cluster: &Cluster, wanted: &[&str]) -> Result<(), String> {
    poll_until_ok(CATALOG_WITHIN, Duration::from_millis(100), || async {
        let mut seen = Vec::new();
        for id in cluster.running() {
            let names = cluster.model_names(id, true).await?;
            seen.push((id, names));
        }
        if seen.iter().all(|(_, names)| names == wanted) {
            Ok(())
        } else {
            Err(format!("catalogs by peer: {seen:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_formed_with_a_catalog_has_it() {
    let mut lost = Vec::new();
    let started = Instant::now();
    for formation in 0..FORMATIONS {
        let moments = first_moments(formation);
        let (mut cluster, _catalog) = start(matches!(moments, FirstMoments::Tls));
        match moments {
            FirstMoments::Undisturbed | FirstMoments::Tls => {}
            FirstMoments::FormerStalls => {
                cluster.wait_log(1, &["cluster initialised"]).await;
                cluster.pause(1);
                // Stopped after replicating the membership, the others
                // elect one of themselves within this; stopped before, they
                // cannot (they know no cluster yet), and peer 1 resumes as
                // the only possible leader with its first write late.
                let moved = poll_until_ok(STALL, Duration::from_millis(50), || async {
                    for id in [2, 3] {
                        let view = cluster.cluster_view(id).await?;
                        if view.leader_id.is_some_and(|leader| leader != 1) {
                            return Ok(id);
                        }
                    }
                    Err("no other leader".to_owned())
                })
                .await;
                cluster.resume(1);
                println!(
                    "formation {formation}: peer 1 stood still for up to {STALL:?}; {}",
                    match moved {
                        Ok(id) => format!("peer {id} saw another leader meanwhile"),
                        Err(_) => "no other leader was elected meanwhile".to_owned(),
                    }
                );
            }
            FirstMoments::FormerDies => {
                cluster.wait_log(1, &["cluster initialised"]).await;
                cluster.kill(1);
                cluster.spawn(1);
            }
        }
        let outcome = catalog_everywhere(&cluster, &["alpha", "beta"]).await;
        println!(
            "formation {formation} ({moments:?}): {} at {:.1}s",
            if outcome.is_ok() {
                "catalog there"
            } else {
                "catalog LOST"
            },
            started.elapsed().as_secs_f64()
        );
        if let Err(why) = outcome {
            let seed_lines: Vec<String> = cluster
                .all_log_lines()
                .into_iter()
                .filter(|line| line.contains("seed") || line.contains("catalog"))
                .collect();
            lost.push(format!(
                "formation {formation} ({moments:?}): {why}; peers logged: {seed_lines:#?}"
            ));
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {FORMATIONS} clusters came up without their configured catalog:\n{}",
        lost.len(),
        lost.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_catalog_is_never_written_over_an_operators_change() {
    let (mut cluster, _catalog) = start(false);
    catalog_everywhere(&cluster, &["alpha", "beta"])
        .await
        .unwrap_or_else(|why| panic!("{why}\n{}", cluster.log_tails()));
    let leader = cluster.wait_leader().await;
    let (status, body) = cluster
        .send(leader, reqwest::Method::DELETE, "/api/v1/models/beta", None)
        .await
        .unwrap();
    assert_eq!(status, 204, "DELETE beta: {body}");

    // Every peer restarts with the same server.yaml: `new`, and the
    // catalog that still lists beta.
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    for id in 1..=3 {
        cluster
            .wait_log(id, &["the cluster's catalog is there already"])
            .await;
    }
    catalog_everywhere(&cluster, &["alpha"])
        .await
        .unwrap_or_else(|why| panic!("{why}\n{}", cluster.log_tails()));
}
