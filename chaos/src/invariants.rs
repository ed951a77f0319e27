//! The invariants checked after every scenario, each reported by name.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{OpRecord, Outcome};
use crate::linearizability::{self, RegOp, RegRet};
use crate::load::{LeaderSample, unique_key_prefix};

pub const SINGLE_LEADER: &str = "single-leader-per-term";
pub const LEADER_AFTER_HEALING: &str = "leader-after-healing";
pub const ACKED_WRITES: &str = "acknowledged-writes-on-every-peer";
pub const STATE_HASHES: &str = "state-hashes-equal";
pub const LINEARIZABLE: &str = "linearizable-registers";
pub const NO_LEFTOVERS: &str = "no-process-left-behind";
pub const SNAPSHOT_INSTALLED: &str = "lagging-follower-took-a-snapshot";

/// One invariant's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub name: &'static str,
    /// What was looked at, for the report.
    pub scope: String,
    pub violations: Vec<String>,
}

impl Checked {
    pub fn new(name: &'static str, scope: impl Into<String>, violations: Vec<String>) -> Self {
        Self {
            name,
            scope: scope.into(),
            violations,
        }
    }
}

/// No term has two different leaders, as any peer reported them.
pub fn single_leader(samples: &[LeaderSample]) -> Checked {
    let mut by_term: BTreeMap<u64, BTreeMap<u64, BTreeSet<u64>>> = BTreeMap::new();
    for sample in samples {
        if let Some(leader) = sample.leader {
            by_term
                .entry(sample.term)
                .or_default()
                .entry(leader)
                .or_default()
                .insert(sample.peer);
        }
    }
    let violations = by_term
        .iter()
        .filter(|(_, leaders)| leaders.len() > 1)
        .map(|(term, leaders)| {
            let named: Vec<String> = leaders
                .iter()
                .map(|(leader, reporters)| {
                    format!("leader {leader} (reported by peers {reporters:?})")
                })
                .collect();
            format!(
                "term {term} had {} leaders: {}",
                leaders.len(),
                named.join(", ")
            )
        })
        .collect();
    Checked::new(
        SINGLE_LEADER,
        format!("{} samples over {} terms", samples.len(), by_term.len()),
        violations,
    )
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
    Checked::new(STATE_HASHES, format!("{} peers", states.len()), violations)
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
    Checked::new(
        LINEARIZABLE,
        format!(
            "{} operations on {} keys",
            verdict.ops_checked, verdict.keys_checked
        ),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(peer: u64, term: u64, leader: Option<u64>) -> LeaderSample {
        LeaderSample {
            at_us: 0,
            peer,
            term,
            leader,
        }
    }

    #[test]
    fn two_leaders_in_one_term_are_reported_with_the_term() {
        let samples = vec![
            sample(1, 3, Some(1)),
            sample(2, 3, Some(1)),
            sample(3, 4, None),
            sample(3, 4, Some(3)),
            sample(2, 3, Some(2)),
        ];
        let checked = single_leader(&samples);
        assert_eq!(
            checked.violations,
            vec![
                "term 3 had 2 leaders: leader 1 (reported by peers {1, 2}), leader 2 (reported by peers {2})"
            ]
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
}
