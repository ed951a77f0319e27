//! What the fleet's samples must never show: a GPU held twice, a router
//! request to a healthy replica failed; and the fault windows that excuse
//! what a fault explains.

use std::collections::{BTreeMap, BTreeSet};

use super::{Checked, NO_GPU_TWICE, ROUTER_HEALTHY_SERVED, first_of};
use crate::fleet::{FleetSample, RouterOp, Subject, Window, nodes_of};

/// How long after a node's fault window closes a mark or a retirement
/// caused by it may still be logged: the agent reconnects with backoff
/// (at most 2 s in these runs), the liveness loop and the reconciler run
/// a round later.
const NODE_FAULT_SLACK_US: u64 = 15_000_000;

/// No GPU of any node is held by two live shards: neither in any sampled
/// `GET /api/v1/replicas` (the control plane's assignments) nor in any
/// agent's shard state files at one moment (what runs on the node).
pub fn no_gpu_twice(samples: &[FleetSample]) -> Checked {
    let mut violations = BTreeSet::new();
    let mut api = 0;
    let mut holding = 0;
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
                    holding += usize::from(!shard.gpus.is_empty());
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
    .needs("live shards on a GPU in the replica samples", holding, 1)
    .needs(
        "agent samples",
        samples.iter().map(|s| s.agents.len()).sum(),
        1,
    )
}

/// Nodes a fault touched (their stream was cut or worse), at any time.
pub(super) fn faulted_nodes(windows: &[Window]) -> BTreeSet<&str> {
    windows
        .iter()
        .filter_map(|w| match &w.subject {
            Subject::Node(n) => Some(n.as_str()),
            Subject::Peer(_) => None,
        })
        .collect()
}

/// The fault windows on node `node`. A fault on a control-plane peer
/// never touches a node: the node's own stream and engines are fine, and
/// a peer that stops answering must not make the fleet look down.
pub(super) fn node_windows<'a>(
    windows: &'a [Window],
    node: &'a str,
) -> impl Iterator<Item = &'a Window> {
    windows
        .iter()
        .filter(move |w| matches!(&w.subject, Subject::Node(n) if n == node))
}

/// Whether a window on `node` covers run time `at_us` (with the slack
/// after it closes).
pub(super) fn node_fault_at(windows: &[Window], node: &str, at_us: u64) -> bool {
    node_windows(windows, node).any(|w| {
        w.from_us <= at_us
            && at_us
                <= w.to_us
                    .unwrap_or(u64::MAX)
                    .saturating_add(NODE_FAULT_SLACK_US)
    })
}

/// How far the sampled API view may trail the agents' files: the sampler
/// reads the first member that answers, and a peer just restarted answers
/// from the state it had until it has caught up (a replacement seen
/// `loading` there may already be ready, its predecessor's engine gone).
pub(super) const API_LAG_US: u64 = 5_000_000;

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
    let shown = first_of(violations, 8);
    Checked::new(
        ROUTER_HEALTHY_SERVED,
        format!(
            "{} requests: {ok} ok, {} failed, {excused} of them during a fault that explains it",
            ops.len(),
            ops.len() - ok
        ),
        shown,
    )
    .needs("router requests that succeeded", ok, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::test_support::*;

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
            found(&checked),
            vec![
                "node n1 GPU 1 assigned to 2 live shards: a rank 0 (ready), b rank 0 (starting) (replicas as peer 1 saw them at 2.0s)"
            ]
        );
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
    fn each_check_fails_on_no_evidence() {
        for checked in [no_gpu_twice(&[]), router_healthy(&[], &[], &[])] {
            assert!(!shortfalls(&checked).is_empty(), "{checked:?}");
        }
    }
}
