//! The invariants checked after every scenario, each reported by name.

use std::collections::{BTreeMap, BTreeSet};

use crate::fleet::{FleetSample, RouterOp, Subject, Window, nodes_of};
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
pub const NO_GPU_TWICE: &str = "no-gpu-assigned-twice";
pub const NO_UNREACHABLE_WHILE_HEALTHY: &str = "no-node-unreachable-while-stream-healthy";
pub const REPLICAS_READY_AFTER_HEALING: &str = "replicas-ready-after-healing";
pub const ROUTER_HEALTHY_SERVED: &str = "router-requests-to-healthy-replicas-served";
pub const NO_DEPOSED_COMMAND: &str = "no-deposed-leader-command-executed";

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

/// No GPU of any node is held by two live shards: neither in any sampled
/// `GET /api/v1/replicas` (the control plane's assignments) nor in any
/// agent's shard state files at one moment (what runs on the node).
pub fn no_gpu_twice(samples: &[FleetSample]) -> Checked {
    let mut violations = BTreeSet::new();
    let mut api = 0;
    for sample in samples {
        let at = sample.at_us as f64 / 1e6;
        if let Some(replicas) = &sample.replicas {
            api += 1;
            let mut holders: BTreeMap<(&str, u32), Vec<String>> = BTreeMap::new();
            for replica in replicas {
                for (rank, shard) in replica.shards.iter().enumerate() {
                    if !shard.live() {
                        continue;
                    }
                    for gpu in &shard.gpus {
                        holders
                            .entry((shard.node.as_str(), *gpu))
                            .or_default()
                            .push(format!("{} rank {rank} ({})", replica.id, shard.state));
                    }
                }
            }
            for ((node, gpu), who) in holders.into_iter().filter(|(_, w)| w.len() > 1) {
                violations.insert(format!(
                    "node {node} GPU {gpu} assigned to {} live shards: {} (replicas as peer {} saw them at {at:.1}s)",
                    who.len(),
                    who.join(", "),
                    sample.peer.map_or("?".to_owned(), |p| p.to_string()),
                ));
            }
        }
        for agent in &sample.agents {
            let mut holders: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
            for shard in &agent.shards {
                for gpu in &shard.gpus {
                    holders.entry(*gpu).or_default().push(&shard.shard_id);
                }
            }
            for (gpu, who) in holders.into_iter().filter(|(_, w)| w.len() > 1) {
                violations.insert(format!(
                    "node {} runs {} shards on GPU {gpu} at {at:.1}s: {}",
                    agent.node,
                    who.len(),
                    who.join(", ")
                ));
            }
        }
    }
    Checked::new(
        NO_GPU_TWICE,
        format!(
            "{api} replica samples, {} agent samples",
            samples.iter().map(|s| s.agents.len()).sum::<usize>()
        ),
        violations.into_iter().collect(),
    )
}

/// Nodes a fault touched (their stream was cut or worse).
fn faulted_nodes(windows: &[Window]) -> BTreeSet<&str> {
    windows
        .iter()
        .filter_map(|w| match &w.subject {
            Subject::Node(n) => Some(n.as_str()),
            Subject::Peer(_) => None,
        })
        .collect()
}

/// No node whose stream no fault touched was ever marked `unreachable` or
/// `lost`: not in any peer's log (`node status changed ... to=...`), not
/// in any sampled `GET /api/v1/nodes`.
pub fn no_unreachable_while_healthy(
    peer_logs: &[(String, String)],
    samples: &[FleetSample],
    windows: &[Window],
) -> Checked {
    let faulted = faulted_nodes(windows);
    let mut violations = BTreeSet::new();
    let mut transitions = 0;
    for (name, text) in peer_logs {
        for line in text.lines().filter(|l| l.contains("node status changed")) {
            transitions += 1;
            let node = field(line, "node");
            let to = field(line, "to");
            if matches!(to.as_deref(), Some("unreachable" | "lost"))
                && let Some(node) = node
                && !faulted.contains(node.as_str())
            {
                violations.insert(format!(
                    "{name}: node {node} marked {} although no fault touched its stream: {}",
                    to.unwrap_or_default(),
                    line.trim()
                ));
            }
        }
    }
    for sample in samples {
        for (node, (status, _)) in sample.nodes.iter().flatten() {
            if status != "ready" && !faulted.contains(node.as_str()) {
                violations.insert(format!(
                    "node {node} was {status} at {:.1}s (peer {}) although no fault touched its stream",
                    sample.at_us as f64 / 1e6,
                    sample.peer.map_or("?".to_owned(), |p| p.to_string()),
                ));
            }
        }
    }
    Checked::new(
        NO_UNREACHABLE_WHILE_HEALTHY,
        format!(
            "{transitions} status changes logged, {} node samples, faulted nodes {faulted:?}",
            samples.iter().filter(|s| s.nodes.is_some()).count()
        ),
        violations.into_iter().take(10).collect(),
    )
}

/// A `key=value` field of a log line, quotes removed.
fn field(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[at..];
    let value = if let Some(quoted) = rest.strip_prefix('"') {
        quoted.split('"').next()?
    } else {
        rest.split_whitespace().next()?
    };
    Some(value.trim_end_matches(',').to_owned())
}

/// How long after a failed request a fault still excuses it: a restarted
/// peer's router needs its state, a re-placed replica its engine.
const EXCUSE_AFTER_US: u64 = 5_000_000;

/// Every chat completion through a router failed only where a fault
/// explains it: the router's own peer was down (or just back), or the
/// model had a replica on a node whose replicas the fault retired. At
/// least one request must have succeeded.
pub fn router_healthy(ops: &[RouterOp], samples: &[FleetSample], windows: &[Window]) -> Checked {
    let overlaps = |w: &Window, from: u64, to: u64| {
        let end = w.to_us.unwrap_or(u64::MAX).saturating_add(EXCUSE_AFTER_US);
        w.from_us <= to && from <= end
    };
    let had_shard_on = |model: &str, node: &str, from: u64, to: u64| {
        samples
            .iter()
            .filter(|s| s.at_us + 1_000_000 >= from && s.at_us <= to)
            .any(|s| nodes_of(s, model).iter().any(|n| n == node))
    };
    let mut excused = 0;
    let mut violations = Vec::new();
    for op in ops.iter().filter(|op| op.result.is_err()) {
        let excuse = windows.iter().any(|w| {
            w.data_plane
                && overlaps(w, op.invoke_us, op.complete_us)
                && match &w.subject {
                    Subject::Peer(p) => *p == op.peer,
                    Subject::Node(n) => had_shard_on(&op.model, n, w.from_us, op.complete_us),
                }
        });
        if excuse {
            excused += 1;
        } else {
            violations.push(format!(
                "{} via peer {}'s router at {:.1}s-{:.1}s: {}",
                op.model,
                op.peer,
                op.invoke_us as f64 / 1e6,
                op.complete_us as f64 / 1e6,
                op.result.as_ref().err().map_or("", |e| e.as_str())
            ));
        }
    }
    let ok = ops.iter().filter(|op| op.result.is_ok()).count();
    if !ops.is_empty() && ok == 0 {
        violations.push(format!("none of {} router requests succeeded", ops.len()));
    }
    let total = violations.len();
    let mut shown: Vec<String> = violations.into_iter().take(8).collect();
    if total > shown.len() {
        shown.push(format!("... and {} more", total - shown.len()));
    }
    Checked::new(
        ROUTER_HEALTHY_SERVED,
        format!(
            "{} requests: {ok} ok, {} failed, {excused} of them during a fault that explains it",
            ops.len(),
            ops.len() - ok
        ),
        shown,
    )
}

/// No agent started a shard on a command whose leader term is below a
/// term it had already seen: every shard state file that appears carries a
/// term at least the agent's `leader-term` in the samples before it.
/// Refusals in the agents' logs are counted (they are the fencing working).
pub fn no_deposed_command(samples: &[FleetSample], agent_logs: &[(String, String)]) -> Checked {
    let mut seen_term: BTreeMap<&str, u64> = BTreeMap::new();
    let mut seen_shards: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut started = 0;
    let mut violations = Vec::new();
    for sample in samples {
        for agent in &sample.agents {
            let highest = seen_term.get(agent.node.as_str()).copied().unwrap_or(0);
            for shard in &agent.shards {
                if seen_shards.insert((agent.node.as_str(), shard.shard_id.as_str())) {
                    started += 1;
                    if shard.term < highest {
                        violations.push(format!(
                            "node {} started shard {} on a command of leader term {} at {:.1}s, after it had seen term {highest}",
                            agent.node,
                            shard.shard_id,
                            shard.term,
                            sample.at_us as f64 / 1e6
                        ));
                    }
                }
            }
            let entry = seen_term.entry(agent.node.as_str()).or_default();
            *entry = (*entry).max(agent.leader_term);
        }
    }
    let refusals: usize = agent_logs
        .iter()
        .map(|(_, text)| text.matches("refused: command").count())
        .sum();
    Checked::new(
        NO_DEPOSED_COMMAND,
        format!("{started} shard starts observed, {refusals} stale commands refused by agents"),
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

    fn replica(id: &str, node: &str, gpus: &[u32], state: &str) -> crate::fleet::ReplicaObs {
        crate::fleet::ReplicaObs {
            id: id.into(),
            model: "qwen".into(),
            state: state.into(),
            replaces: None,
            shards: vec![crate::fleet::ShardObs {
                node: node.into(),
                gpus: gpus.to_vec(),
                state: state.into(),
            }],
        }
    }

    #[test]
    fn a_gpu_held_by_two_live_shards_is_named_once() {
        let sample = FleetSample {
            at_us: 2_000_000,
            peer: Some(1),
            replicas: Some(vec![
                replica("a", "n1", &[0, 1], "ready"),
                replica("b", "n1", &[1], "starting"),
                replica("c", "n1", &[0], "stopped"),
            ]),
            nodes: None,
            agents: vec![],
        };
        let checked = no_gpu_twice(&[sample.clone(), sample]);
        assert_eq!(
            checked.violations,
            vec![
                "node n1 GPU 1 assigned to 2 live shards: a rank 0 (ready), b rank 0 (starting) (replicas as peer 1 saw them at 2.0s)"
            ]
        );
    }

    #[test]
    fn a_healthy_node_marked_unreachable_in_a_log_is_reported() {
        let logs = vec![(
            "server-1.1.log".to_owned(),
            "2026-12-03T07:06:07Z  WARN llmgw_server::agents::liveness: node status changed node=n2 from=\"ready\" to=\"unreachable\"\n\
             2026-12-03T07:06:08Z  WARN llmgw_server::agents::liveness: node status changed node=n1 from=\"ready\" to=\"unreachable\"\n"
                .to_owned(),
        )];
        let windows = vec![Window {
            subject: Subject::Node("n1".into()),
            from_us: 0,
            to_us: Some(1),
            data_plane: false,
        }];
        let checked = no_unreachable_while_healthy(&logs, &[], &windows);
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        assert!(checked.violations[0].contains("node n2 marked unreachable"));
    }

    #[test]
    fn a_router_failure_outside_any_fault_is_a_violation() {
        let op = |peer, at, result: Result<(), String>| RouterOp {
            peer,
            model: "qwen".into(),
            invoke_us: at,
            complete_us: at + 10,
            result,
        };
        let windows = vec![Window {
            subject: Subject::Peer(2),
            from_us: 1_000,
            to_us: Some(2_000),
            data_plane: true,
        }];
        let ops = vec![
            op(1, 0, Ok(())),
            op(2, 1_500, Err("transport: refused".into())),
            op(1, 1_500, Err("HTTP 503".into())),
        ];
        let checked = router_healthy(&ops, &[], &windows);
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        assert!(checked.violations[0].starts_with("qwen via peer 1's router"));
    }

    #[test]
    fn a_shard_started_on_a_stale_term_is_a_violation() {
        let agent = |term, shards: Vec<(&str, u64)>| crate::fleet::AgentObs {
            node: "n1".into(),
            leader_term: term,
            shards: shards
                .into_iter()
                .map(|(id, t)| crate::fleet::AgentShard {
                    shard_id: id.into(),
                    term: t,
                    gpus: vec![0],
                    pgids: vec![],
                })
                .collect(),
        };
        let sample = |at_us, a| FleetSample {
            at_us,
            agents: vec![a],
            ..FleetSample::default()
        };
        let samples = vec![
            sample(1, agent(3, vec![("s1", 3)])),
            sample(2, agent(4, vec![("s1", 3)])),
            sample(3, agent(4, vec![("s1", 3), ("s2", 3)])),
        ];
        let checked = no_deposed_command(&samples, &[]);
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        assert!(checked.violations[0].contains("shard s2 on a command of leader term 3"));
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
