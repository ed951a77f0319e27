//! The control plane's own promises: leaderships only move forward, every
//! acknowledged write is kept, peers converge, registers stay
//! linearizable, a paused follower moves no term, a healed peer rejoins.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    ACKED_WRITES, Checked, LEADERSHIPS_FORWARD, LINEARIZABLE, NO_TERM_CHANGE_FOLLOWER_PAUSED,
    REJOINED_AFTER_HEALING, STATE_HASHES,
};
use crate::history::{OpRecord, Outcome};
use crate::linearizability::{self, RegOp, RegRet};
use crate::load::{LeaderSample, unique_key_prefix};

/// No peer ever follows an older leadership after a newer one. Raft here
/// runs openraft's advanced leader ids: a leadership is the pair (term,
/// leader id), ordered by term and then id, and one term may see more than
/// one leader, one after another, the higher id winning. "One leader per
/// term" is not what that mode promises; leaderships that only move
/// forward, on every peer, are.
///
/// Leaderships are ordered within the cluster's epoch first: a restore
/// begins a later epoch whose terms start again from the backup's.
pub fn leaderships_move_forward(samples: &[LeaderSample]) -> Checked {
    let mut newest: BTreeMap<u64, (Leadership, u64)> = BTreeMap::new();
    let mut violations = Vec::new();
    let mut leaderships = BTreeSet::new();
    for (sample, now) in with_leaderships(samples) {
        leaderships.insert(now);
        match newest.get(&sample.peer) {
            Some(&(seen, at_us)) if now < seen => {
                violations.push(format!(
                    "peer {} named {} at {:.1}s after {} at {:.1}s: its leadership went back",
                    sample.peer,
                    now.describe(&seen),
                    sample.at_us as f64 / 1e6,
                    seen.describe(&now),
                    at_us as f64 / 1e6
                ));
            }
            Some(&(seen, _)) if now == seen => {}
            _ => {
                newest.insert(sample.peer, (now, sample.at_us));
            }
        }
    }
    let named: BTreeSet<u64> = samples
        .iter()
        .filter(|s| s.leader.is_some())
        .map(|s| s.peer)
        .collect();
    Checked::new(
        LEADERSHIPS_FORWARD,
        format!(
            "{} samples, {} leaderships",
            samples.len(),
            leaderships.len()
        ),
        violations,
    )
    .needs(
        "peers sampled naming a leader",
        named.len(),
        MIN_PEERS_COMPARED,
    )
}

/// Peers whose views a check compares: one alone could agree with itself.
const MIN_PEERS_COMPARED: usize = 2;

/// A leadership as the fleet orders it: epoch, then term, then leader id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Leadership {
    epoch: u64,
    term: u64,
    leader: u64,
}

impl Leadership {
    /// Commands from before the cluster's first epoch began carry epoch 0:
    /// they belong to that first epoch (its sitting leader begins it).
    pub(super) fn of(first_epoch: u64, epoch: u64, term: u64, leader: u64) -> Leadership {
        Leadership {
            epoch: if epoch == 0 { first_epoch } else { epoch },
            term,
            leader,
        }
    }

    /// `term T (leader L)`, with the epoch when it differs from `other`'s.
    pub(super) fn describe(&self, other: &Leadership) -> String {
        if self.epoch == other.epoch {
            format!("term {} (leader {})", self.term, self.leader)
        } else {
            format!(
                "epoch {} term {} (leader {})",
                self.epoch, self.term, self.leader
            )
        }
    }
}

/// The first epoch a run saw (0 when none had begun).
pub(super) fn first_epoch(epochs: impl Iterator<Item = u64>) -> u64 {
    epochs.filter(|epoch| *epoch > 0).min().unwrap_or(0)
}

/// The samples that name a leader, in time order, each with its
/// leadership. A peer names no epoch (0) while one is due: before the
/// cluster's first began (or while it lags behind the entry that began
/// it), and in a restored cluster until it begins its own. Such a sample
/// belongs to the newest epoch named before it, unless no epoch was named
/// yet or its term is below the highest term named under that epoch: only
/// a restore takes terms back, so it then belongs to the epoch its cluster
/// is about to begin, the next one named (epochs only grow).
pub(super) fn with_leaderships(samples: &[LeaderSample]) -> Vec<(&LeaderSample, Leadership)> {
    let mut ordered: Vec<&LeaderSample> = samples.iter().collect();
    ordered.sort_by_key(|s| (s.at_us, s.peer));
    let named: BTreeSet<u64> = samples
        .iter()
        .map(|s| s.epoch)
        .filter(|epoch| *epoch > 0)
        .collect();
    // The newest epoch named so far and the highest term named under it.
    let mut newest: Option<(u64, u64)> = None;
    let mut out = Vec::with_capacity(ordered.len());
    for sample in ordered {
        let epoch = match (sample.epoch, newest) {
            (0, Some((epoch, term))) if sample.term >= term => epoch,
            (0, newest) => {
                let after = newest.map_or(0, |(epoch, _)| epoch);
                named.range(after + 1..).next().copied().unwrap_or(after)
            }
            (epoch, _) => epoch,
        };
        if sample.epoch > 0 {
            newest = match newest {
                Some((e, term)) if e == sample.epoch => Some((e, term.max(sample.term))),
                Some((e, _)) if e > sample.epoch => newest,
                _ => Some((sample.epoch, sample.term)),
            };
        }
        if let Some(leader) = sample.leader {
            let leadership = Leadership {
                epoch,
                term: sample.term,
                leader,
            };
            out.push((sample, leadership));
        }
    }
    out
}

/// Every acknowledged write of a key written once is in every peer's
/// catalog with its value. `catalogs` maps peer to (model name -> value).
pub fn acknowledged_writes(
    ops: &[OpRecord],
    catalogs: &BTreeMap<u64, Result<BTreeMap<String, Option<String>>, String>>,
) -> Checked {
    let acked: Vec<(&str, &str)> = ops
        .iter()
        .filter(|op| op.key.starts_with(unique_key_prefix()))
        .filter_map(|op| match (&op.op, &op.outcome) {
            (RegOp::Write(value), Outcome::Ok(RegRet::Ok)) => {
                Some((op.key.as_str(), value.as_str()))
            }
            _ => None,
        })
        .collect();
    let mut violations = Vec::new();
    for (peer, catalog) in catalogs {
        match catalog {
            Err(why) => violations.push(format!("peer {peer}: catalog unreadable: {why}")),
            Ok(catalog) => {
                let missing: Vec<&str> = acked
                    .iter()
                    .filter(|(key, value)| {
                        catalog.get(*key).map(|v| v.as_deref()) != Some(Some(*value))
                    })
                    .map(|(key, _)| *key)
                    .collect();
                if !missing.is_empty() {
                    violations.push(format!(
                        "peer {peer} lacks {} of {} acknowledged writes: {}",
                        missing.len(),
                        acked.len(),
                        missing
                            .iter()
                            .take(5)
                            .copied()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
    }
    Checked::new(
        ACKED_WRITES,
        format!(
            "{} acknowledged writes x {} peers",
            acked.len(),
            catalogs.len()
        ),
        violations,
    )
    .needs("acknowledged writes", acked.len(), 1)
    .needs("peers' catalogs", catalogs.len(), MIN_PEERS_COMPARED)
}

/// All peers report the same applied index and state hash.
pub fn state_hashes(states: &BTreeMap<u64, Option<(u64, String)>>) -> Checked {
    let distinct: BTreeSet<&Option<(u64, String)>> = states.values().collect();
    let violations = if distinct.len() == 1 && !distinct.contains(&None) {
        Vec::new()
    } else {
        vec![format!(
            "peers did not converge: {}",
            states
                .iter()
                .map(|(id, s)| match s {
                    Some((applied, hash)) => format!("peer {id} applied {applied} hash {hash}"),
                    None => format!("peer {id} unreadable"),
                })
                .collect::<Vec<_>>()
                .join("; ")
        )]
    };
    let hashed = states.values().filter(|s| s.is_some()).count();
    Checked::new(STATE_HASHES, format!("{} peers", states.len()), violations).needs(
        "peers' state hashes",
        hashed,
        MIN_PEERS_COMPARED,
    )
}

/// The register histories are linearizable.
pub fn linearizable(ops: &[OpRecord]) -> Checked {
    let events: Vec<_> = ops.iter().filter_map(OpRecord::event).collect();
    let verdict = linearizability::check(&events);
    let mut violations: Vec<String> = verdict
        .violations
        .iter()
        .map(|v| format!("key {}: {}", v.key, v.message))
        .collect();
    violations.extend(verdict.inconclusive.iter().map(|key| {
        format!(
            "key {key}: no verdict within {} search states",
            linearizability::STATE_BUDGET
        )
    }));
    let completed = ops
        .iter()
        .filter(|op| matches!(op.outcome, Outcome::Ok(_)))
        .count();
    Checked::new(
        LINEARIZABLE,
        format!(
            "{} operations on {} keys",
            verdict.ops_checked, verdict.keys_checked
        ),
        violations,
    )
    .needs("register operations that completed", completed, 1)
}

/// While only follower `paused` was paused (`from_us` to `to_us`, which
/// includes a while after it woke), and leader `leader` of term `term`
/// was healthy, no peer reported another term or another leader: every
/// peer's sampled `GET /api/v1/cluster`, the woken follower's included.
pub fn no_term_change_while_follower_paused(
    samples: &[LeaderSample],
    paused: u64,
    leader: u64,
    term: u64,
    from_us: u64,
    to_us: u64,
) -> Checked {
    let inside: Vec<&LeaderSample> = samples
        .iter()
        .filter(|s| s.at_us >= from_us && s.at_us <= to_us)
        .collect();
    let mut changed: BTreeMap<(u64, u64, Option<u64>), (u64, usize)> = BTreeMap::new();
    for s in &inside {
        let other_leader = s.leader.is_some_and(|l| l != leader);
        if s.term != term || other_leader {
            let entry = changed
                .entry((s.peer, s.term, s.leader))
                .or_insert((s.at_us, 0));
            entry.1 += 1;
        }
    }
    let violations = changed
        .iter()
        .map(|((peer, t, l), (first, n))| {
            format!(
                "peer {peer} reported term {t} leader {l:?} ({n} samples from {:.1}s) while follower {paused} was paused and leader {leader} of term {term} was healthy",
                *first as f64 / 1e6
            )
        })
        .collect();
    let healthy_sampled: BTreeSet<u64> = inside
        .iter()
        .map(|s| s.peer)
        .filter(|p| *p != paused)
        .collect();
    Checked::new(
        NO_TERM_CHANGE_FOLLOWER_PAUSED,
        format!(
            "{} samples from {:.1}s to {:.1}s: follower {paused} paused, leader {leader}, term {term}",
            inside.len(),
            from_us as f64 / 1e6,
            to_us as f64 / 1e6
        ),
        violations,
    )
    .needs(
        "healthy peers sampled during the pause",
        healthy_sampled.len(),
        MIN_PEERS_COMPARED,
    )
}

/// Once peer `peer`'s fault healed (run time `healed_us`), it names the
/// leader and term the other peers name within `within_us`: a deposed or
/// cut-off leader learns of its successor, so it stops serving stale
/// reads and routes. The target is what the other peers report most in
/// that span.
pub fn rejoined_after_healing(
    samples: &[LeaderSample],
    peer: u64,
    healed_us: u64,
    within_us: u64,
) -> Checked {
    let until = healed_us.saturating_add(within_us);
    let mut votes: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.peer != peer && s.at_us >= healed_us && s.at_us <= until)
    {
        if let Some(leader) = s.leader {
            *votes.entry((s.term, leader)).or_default() += 1;
        }
    }
    let scope = |what: String| {
        format!(
            "peer {peer}, healed at {:.1}s, within {:.0}s: {what}",
            healed_us as f64 / 1e6,
            within_us as f64 / 1e6
        )
    };
    let Some(((term, leader), _)) = votes.into_iter().max_by_key(|(_, n)| *n) else {
        return Checked::new(
            REJOINED_AFTER_HEALING,
            scope("the other peers named no leader".into()),
            Vec::new(),
        )
        .needs(
            "samples of the other peers naming a leader after healing",
            0,
            1,
        );
    };
    let agrees = |s: &&LeaderSample| s.peer == peer && s.term == term && s.leader == Some(leader);
    let first = samples
        .iter()
        .filter(|s| s.at_us >= healed_us)
        .filter(agrees)
        .map(|s| s.at_us)
        .min();
    let violations = match first {
        Some(at) if at <= until => Vec::new(),
        Some(at) => vec![format!(
            "peer {peer} first named leader {leader} of term {term} {:.1}s after healing (the others did within {:.0}s)",
            (at - healed_us) as f64 / 1e6,
            within_us as f64 / 1e6
        )],
        None => vec![format!(
            "peer {peer} never named leader {leader} of term {term} after healing"
        )],
    };
    let sampled = samples
        .iter()
        .filter(|s| s.peer == peer && s.at_us >= healed_us)
        .count();
    Checked::new(
        REJOINED_AFTER_HEALING,
        scope(format!("the others name leader {leader} of term {term}")),
        violations,
    )
    .needs("samples of the healed peer", sampled, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::test_support::*;

    #[test]
    fn a_leadership_that_goes_back_is_reported_but_two_leaders_of_a_term_in_order_are_not() {
        let samples = vec![
            at(1, 1, 3, Some(1)),
            at(2, 2, 3, Some(1)),
            // A second leader of term 3, with a higher id: allowed.
            at(3, 2, 3, Some(2)),
            at(4, 3, 4, None),
            at(5, 3, 4, Some(3)),
            // Peer 2 back to term 3's first leader.
            at(6, 2, 3, Some(1)),
        ];
        let checked = leaderships_move_forward(&samples);
        assert_eq!(checked.violations.len(), 1, "{:?}", checked.violations);
        assert!(
            checked.violations[0].starts_with("peer 2 named term 3 (leader 1)")
                && checked.violations[0].contains("went back"),
            "{}",
            checked.violations[0]
        );
    }

    #[test]
    fn a_missing_acknowledged_write_is_named() {
        let op = OpRecord {
            id: 1,
            worker: 0,
            peer: 1,
            key: format!("{}a", unique_key_prefix()),
            op: RegOp::Write("v1".into()),
            invoke_us: 0,
            complete_us: 1,
            outcome: Outcome::Ok(RegRet::Ok),
        };
        let mut catalogs = BTreeMap::new();
        catalogs.insert(1, Ok(BTreeMap::from([(op.key.clone(), Some("v1".into()))])));
        catalogs.insert(2, Ok(BTreeMap::new()));
        let checked = acknowledged_writes(&[op], &catalogs);
        assert_eq!(checked.violations.len(), 1);
        assert!(checked.violations[0].starts_with("peer 2 lacks 1 of 1"));
    }
    #[test]
    fn unequal_hashes_are_a_violation() {
        let mut states = BTreeMap::new();
        states.insert(1, Some((10, "aa".to_owned())));
        states.insert(2, Some((10, "aa".to_owned())));
        assert!(state_hashes(&states).violations.is_empty());
        states.insert(3, Some((10, "bb".to_owned())));
        assert_eq!(state_hashes(&states).violations.len(), 1);
    }

    #[test]
    fn a_term_change_while_only_a_follower_was_paused_is_reported() {
        let samples = vec![
            at(1, 1, 5, Some(1)),
            at(2, 2, 5, Some(1)),
            // The woken follower campaigns, the leader steps down.
            at(3, 3, 6, None),
            at(4, 3, 6, None),
            at(5, 1, 6, Some(2)),
            // Outside the window.
            at(50, 1, 9, Some(3)),
        ];
        let checked = no_term_change_while_follower_paused(&samples, 3, 1, 5, 1, 10);
        assert_eq!(checked.violations.len(), 2, "{checked:?}");
        assert!(checked.violations[0].starts_with("peer 1 reported term 6 leader Some(2)"));
        assert!(checked.violations[1].starts_with("peer 3 reported term 6 leader None (2 samples"));
        assert!(
            no_term_change_while_follower_paused(&samples[..2], 3, 1, 5, 1, 10)
                .violations
                .is_empty()
        );
    }

    #[test]
    fn a_healed_peer_that_names_the_new_leader_late_is_reported() {
        let samples = vec![
            at(100, 2, 2, Some(2)),
            at(100, 3, 2, Some(2)),
            at(100, 1, 1, Some(1)),
            at(5_000_000, 1, 1, Some(1)),
            at(43_000_100, 1, 2, Some(2)),
        ];
        let checked = rejoined_after_healing(&samples, 1, 100, 10_000_000);
        assert_eq!(
            checked.violations,
            vec![
                "peer 1 first named leader 2 of term 2 43.0s after healing (the others did within 10s)"
            ]
        );
        let prompt = vec![at(100, 2, 2, Some(2)), at(2_000_000, 1, 2, Some(2))];
        assert!(
            rejoined_after_healing(&prompt, 1, 100, 10_000_000)
                .violations
                .is_empty()
        );
    }

    #[test]
    fn each_check_fails_on_no_evidence() {
        for checked in [
            leaderships_move_forward(&[]),
            acknowledged_writes(&[], &BTreeMap::new()),
            state_hashes(&BTreeMap::new()),
            linearizable(&[]),
            no_term_change_while_follower_paused(&[], 2, 1, 3, 0, 10_000_000),
            rejoined_after_healing(&[], 2, 0, 10_000_000),
        ] {
            assert!(!shortfalls(&checked).is_empty(), "{checked:?}");
        }
    }

    #[test]
    fn one_peer_alone_is_not_enough_to_compare() {
        let one_peer = [at(1, 1, 3, Some(1)), at(2, 1, 3, Some(1))];
        let checked = leaderships_move_forward(&one_peer);
        assert_eq!(
            shortfalls(&checked),
            vec!["not enough evidence: 1 peers sampled naming a leader, at least 2 needed"]
        );
        let paused = no_term_change_while_follower_paused(&one_peer, 2, 1, 3, 0, 10);
        assert_eq!(shortfalls(&paused).len(), 1, "{paused:?}");
        let hashes = state_hashes(&BTreeMap::from([(1, Some((7, "abc".to_owned())))]));
        assert_eq!(shortfalls(&hashes).len(), 1, "{hashes:?}");
    }
}
