//! No replica retired while its nodes were reachable: from the sampled
//! API and, independently, from the agents' shard state files.

use std::collections::{BTreeMap, BTreeSet};

use super::fleet::{API_LAG_US, faulted_nodes, node_fault_at};
use super::{Checked, NO_RETIREMENT_WHILE_REACHABLE, first_of};
use crate::fleet::{FleetSample, Window};

/// The replica a shard id (`<replica>-r<rank>`) belongs to.
fn replica_of_shard(shard_id: &str) -> &str {
    match shard_id.rsplit_once("-r") {
        Some((replica, rank)) if !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()) => {
            replica
        }
        _ => shard_id,
    }
}

/// What is known of one replica over the run.
#[derive(Default)]
struct ReplicaTrack {
    model: String,
    nodes: BTreeSet<String>,
    /// A shard or the replica was `failed`: its engine failed, and the
    /// reconciler may stop and remove it.
    failed: bool,
    /// The last sample that listed it.
    last_listed_us: u64,
    /// The first sample that showed it ordered away (`draining`,
    /// `stopping`, `stopped`).
    ordered_away_us: Option<u64>,
    /// The first agent sample after its last shard state file vanished.
    files_gone_us: Option<(String, u64)>,
    /// The first sample that showed a replica replacing it ready.
    replacement_ready_us: Option<u64>,
}

/// No replica of `models` was retired (removed, stopped, drained away, or
/// its engine stopped on its node) while every node it ran on was
/// reachable from a majority of peers. A node is unreachable from the
/// majority only inside a fault window on that node (its stream cut from
/// every peer); a failed engine, an operator's drain and, for the models
/// in `rolled_out` (whose launch spec the run changed), a replacement
/// that is ready (make-before-break) are the other reasons a replica may
/// go. Evidence: the sampled `GET /api/v1/replicas`
/// (the replica disappears for good, or is ordered away) and, from outside
/// the control plane, every agent's shard state files (the file of a
/// shard vanishes for good).
pub fn no_retirement_while_reachable(
    samples: &[FleetSample],
    windows: &[Window],
    models: &[&str],
    rolled_out: &[&str],
) -> Checked {
    let mut tracks = replicas_listed(samples, models);
    add_vanished_state_files(&mut tracks, samples);
    let draining_since = nodes_draining_since(samples);
    let api_samples: Vec<u64> = samples
        .iter()
        .filter(|s| s.replicas.is_some())
        .map(|s| s.at_us)
        .collect();
    let mut violations = Vec::new();
    let mut retired = 0;
    for (id, track) in &tracks {
        let how = retirement_evidence(track, &api_samples);
        let Some(at) = how.iter().map(|(at, _)| *at).min() else {
            continue;
        };
        retired += 1;
        if track.failed {
            continue;
        }
        let replaced = rolled_out.contains(&track.model.as_str())
            && track
                .replacement_ready_us
                .is_some_and(|ready| ready <= at.saturating_add(API_LAG_US));
        let excused = replaced
            || track.nodes.iter().any(|node| {
                node_fault_at(windows, node, at)
                    || draining_since.get(node).is_some_and(|since| *since <= at)
            });
        if !excused {
            violations.push(format!(
                "replica {id} of {} on {:?} retired at {:.1}s while every one of its nodes was reachable from a majority of peers (no fault on them, no drain, no engine failure, no ready replacement): {}",
                track.model,
                track.nodes,
                at as f64 / 1e6,
                how.iter()
                    .map(|(at, what)| format!("{what} at {:.1}s", *at as f64 / 1e6))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let shown = first_of(violations, 10);
    Checked::new(
        NO_RETIREMENT_WHILE_REACHABLE,
        format!(
            "{} replicas of {models:?} seen, {retired} retired, faulted nodes {:?}",
            tracks.len(),
            faulted_nodes(windows)
        ),
        shown,
    )
    .needs("replicas of the models seen", tracks.len(), 1)
    .needs("replica samples", api_samples.len(), 1)
    .needs(
        "agent samples with shard state files",
        samples
            .iter()
            .flat_map(|s| &s.agents)
            .filter(|a| !a.shards.is_empty())
            .count(),
        1,
    )
}

/// The first sample in which each node was seen draining.
fn nodes_draining_since(samples: &[FleetSample]) -> BTreeMap<String, u64> {
    let mut draining_since = BTreeMap::new();
    for sample in samples {
        for (node, (_, draining)) in sample.nodes.iter().flatten() {
            if *draining {
                draining_since.entry(node.clone()).or_insert(sample.at_us);
            }
        }
    }
    draining_since
}

/// Every replica of `models` the sampled `GET /api/v1/replicas` listed.
fn replicas_listed(samples: &[FleetSample], models: &[&str]) -> BTreeMap<String, ReplicaTrack> {
    let mut tracks: BTreeMap<String, ReplicaTrack> = BTreeMap::new();
    for sample in samples {
        let Some(replicas) = &sample.replicas else {
            continue;
        };
        for r in replicas
            .iter()
            .filter(|r| models.contains(&r.model.as_str()))
        {
            let track = tracks.entry(r.id.clone()).or_default();
            track.model.clone_from(&r.model);
            track.last_listed_us = sample.at_us;
            track.nodes.extend(r.shards.iter().map(|s| s.node.clone()));
            track.failed |= r.state == "failed" || r.shards.iter().any(|s| s.state == "failed");
            if matches!(r.state.as_str(), "draining" | "stopping" | "stopped") {
                track.ordered_away_us.get_or_insert(sample.at_us);
            }
        }
        for old in replicas
            .iter()
            .filter(|r| r.state == "ready")
            .filter_map(|r| r.replaces.as_ref())
        {
            if let Some(track) = tracks.get_mut(old) {
                track.replacement_ready_us.get_or_insert(sample.at_us);
            }
        }
    }
    tracks
}

/// The agents' shard state files, seen from outside the control plane:
/// per (node, replica), the last sample holding a file of it and the first
/// agent sample after that; a replica whose files vanished for good gets
/// the earliest such moment, and the node is counted as one of its own.
fn add_vanished_state_files(tracks: &mut BTreeMap<String, ReplicaTrack>, samples: &[FleetSample]) {
    let mut files: BTreeMap<(String, String), (u64, Option<u64>)> = BTreeMap::new();
    for sample in samples {
        for agent in &sample.agents {
            let held: BTreeSet<&str> = agent
                .shards
                .iter()
                .map(|s| replica_of_shard(&s.shard_id))
                .collect();
            for replica in &held {
                files.insert(
                    (agent.node.clone(), (*replica).to_owned()),
                    (sample.at_us, None),
                );
            }
            for ((node, replica), (_, gone)) in files.iter_mut() {
                if node == &agent.node && !held.contains(replica.as_str()) && gone.is_none() {
                    *gone = Some(sample.at_us);
                }
            }
        }
    }
    for ((node, replica), (_, gone)) in &files {
        if let (Some(gone), Some(track)) = (gone, tracks.get_mut(replica)) {
            track.nodes.insert(node.clone());
            if track.files_gone_us.as_ref().is_none_or(|(_, at)| gone < at) {
                track.files_gone_us = Some((node.clone(), *gone));
            }
        }
    }
}

/// Each sign that a replica was retired, with when it showed: ordered
/// away, no longer listed by a later `GET /api/v1/replicas` sample
/// (`api_samples`: their times), its state file gone.
fn retirement_evidence(track: &ReplicaTrack, api_samples: &[u64]) -> Vec<(u64, String)> {
    let removed_us = api_samples
        .last()
        .filter(|last| **last > track.last_listed_us)
        .and_then(|_| {
            api_samples
                .iter()
                .copied()
                .find(|at| *at > track.last_listed_us)
        });
    let mut how: Vec<(u64, String)> = Vec::new();
    if let Some(at) = track.ordered_away_us {
        how.push((at, "ordered away (draining/stopping/stopped)".into()));
    }
    if let Some(at) = removed_us {
        how.push((at, "removed from GET /api/v1/replicas".into()));
    }
    if let Some((node, at)) = &track.files_gone_us {
        how.push((*at, format!("its shard state file vanished from {node}")));
    }
    how
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Subject;
    use crate::invariants::test_support::*;

    #[test]
    fn a_replica_retired_while_its_node_was_reachable_is_reported() {
        let samples = vec![
            fleet(
                1_000_000,
                vec![
                    replica("q-1", "n1", &[0], "ready"),
                    replica("q-2", "n2", &[0], "ready"),
                ],
                vec![("n1", vec!["q-1-r0"]), ("n2", vec!["q-2-r0"])],
            ),
            // A majority's leader that cannot hear the agents retires
            // both; only n2 had a fault.
            fleet(9_000_000, vec![], vec![("n1", vec![]), ("n2", vec![])]),
            fleet(
                10_000_000,
                vec![replica("q-3", "n1", &[1], "ready")],
                vec![("n1", vec!["q-3-r0"])],
            ),
        ];
        let windows = vec![window(Subject::Node("n2".into()), 2_000_000, 6_000_000)];
        let checked = no_retirement_while_reachable(&samples, &windows, &["qwen"], &[]);
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        let v = &checked.violations[0];
        assert!(
            v.starts_with("replica q-1 of qwen on {\"n1\"} retired at 9.0s"),
            "{v}"
        );
        assert!(
            v.contains("removed from GET /api/v1/replicas at 9.0s"),
            "{v}"
        );
        assert!(
            v.contains("its shard state file vanished from n1 at 9.0s"),
            "{v}"
        );
        // Only the agents saw it: the engine stopped, the API still lists it.
        let samples = vec![
            fleet(
                1_000_000,
                vec![replica("q-1", "n1", &[0], "ready")],
                vec![("n1", vec!["q-1-r0"])],
            ),
            fleet(
                2_000_000,
                vec![replica("q-1", "n1", &[0], "ready")],
                vec![("n1", vec![])],
            ),
        ];
        let checked = no_retirement_while_reachable(&samples, &[], &["qwen"], &[]);
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        // A failed engine or another model is not a retirement to report.
        let samples = vec![
            fleet(
                1_000_000,
                vec![replica("q-1", "n1", &[0], "failed")],
                vec![],
            ),
            fleet(2_000_000, vec![], vec![]),
        ];
        assert!(
            found(&no_retirement_while_reachable(
                &samples,
                &[],
                &["qwen"],
                &[]
            ))
            .is_empty()
        );
        assert!(
            found(&no_retirement_while_reachable(
                &samples,
                &[],
                &["other"],
                &[]
            ))
            .is_empty()
        );
    }

    #[test]
    fn a_replica_may_go_once_its_replacement_is_ready_and_not_before() {
        let replacing = |id: &str, old: &str, gpu: u32, state: &str| {
            let mut r = replica(id, "n1", &[gpu], state);
            r.replaces = Some(old.into());
            r
        };
        // q-1 drains only once q-2, its replacement, is ready; q-3 drains
        // while q-4, its replacement, is loading, and q-4 is only ready
        // well past the lag the API's view may have.
        let samples = vec![
            fleet(
                1_000_000,
                vec![
                    replica("q-1", "n1", &[0], "ready"),
                    replica("q-3", "n1", &[2], "ready"),
                    replacing("q-2", "q-1", 1, "loading"),
                    replacing("q-4", "q-3", 3, "loading"),
                ],
                vec![],
            ),
            fleet(
                2_000_000,
                vec![
                    replica("q-1", "n1", &[0], "draining"),
                    replica("q-3", "n1", &[2], "draining"),
                    replacing("q-2", "q-1", 1, "ready"),
                    replacing("q-4", "q-3", 3, "loading"),
                ],
                vec![],
            ),
            fleet(
                3_000_000,
                vec![
                    replacing("q-2", "q-1", 1, "ready"),
                    replacing("q-4", "q-3", 3, "loading"),
                ],
                vec![],
            ),
            fleet(
                2_000_000 + API_LAG_US + 1,
                vec![
                    replacing("q-2", "q-1", 1, "ready"),
                    replacing("q-4", "q-3", 3, "ready"),
                ],
                vec![],
            ),
        ];
        let checked = no_retirement_while_reachable(&samples, &[], &["qwen"], &["qwen"]);
        assert_eq!(found(&checked).len(), 1, "{checked:?}");
        assert!(
            found(&checked)[0].starts_with("replica q-3 of qwen on {\"n1\"} retired at 2.0s"),
            "{checked:?}"
        );
        // Unless the run changed the model's spec, a replacement excuses
        // nothing: nothing else replaces a replica on a reachable node.
        let checked = no_retirement_while_reachable(&samples, &[], &["qwen"], &[]);
        assert_eq!(found(&checked).len(), 2, "{checked:?}");
    }

    #[test]
    fn it_fails_on_no_evidence() {
        let checked = no_retirement_while_reachable(&[], &[], &["qwen"], &[]);
        assert_eq!(shortfalls(&checked).len(), 3, "{checked:?}");
        // Replicas of other models only: nothing of the models checked.
        let other = fleet(
            1,
            vec![replica("x1", "n1", &[0], "ready")],
            vec![("n1", vec!["x1-r0"])],
        );
        let checked = no_retirement_while_reachable(&[other], &[], &["llama"], &[]);
        assert_eq!(
            shortfalls(&checked),
            vec!["not enough evidence: 0 replicas of the models seen, at least 1 needed"]
        );
    }
}
