//! The invariants checked after every scenario, each reported by name.

use std::collections::{BTreeMap, BTreeSet};

use llmgw_runtime::log_events::{
    AGENT_STREAMS_RELEASED, CONTROL_PLANE_STREAM_LOST, NODE_STATUS_CHANGED,
};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::fleet::{FleetSample, RouterOp, Subject, Window, nodes_of};
use crate::history::{OpRecord, Outcome};
use crate::linearizability::{self, RegOp, RegRet};
use crate::load::{LeaderSample, unique_key_prefix};

pub const LEADERSHIPS_FORWARD: &str = "leaderships-only-move-forward";
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
pub const NO_RETIREMENT_WHILE_REACHABLE: &str = "no-replica-retired-while-node-reachable";
pub const NO_TERM_CHANGE_FOLLOWER_PAUSED: &str = "no-term-change-while-follower-paused";
pub const HEALTHY_LEADER_KEPT_STREAMS: &str = "healthy-leader-kept-agent-streams";
pub const REJOINED_AFTER_HEALING: &str = "healed-peer-rejoined-promptly";

/// How long after a node's fault window closes a mark or a retirement
/// caused by it may still be logged: the agent reconnects with backoff
/// (at most 2 s in these runs), the liveness loop and the reconciler run
/// a round later.
const NODE_FAULT_SLACK_US: u64 = 15_000_000;

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
    Checked::new(
        LEADERSHIPS_FORWARD,
        format!(
            "{} samples, {} leaderships",
            samples.len(),
            leaderships.len()
        ),
        violations,
    )
}

/// A leadership as the fleet orders it: epoch, then term, then leader id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Leadership {
    epoch: u64,
    term: u64,
    leader: u64,
}

impl Leadership {
    /// Commands from before the cluster's first epoch began carry epoch 0:
    /// they belong to that first epoch (its sitting leader begins it).
    fn of(first_epoch: u64, epoch: u64, term: u64, leader: u64) -> Leadership {
        Leadership {
            epoch: if epoch == 0 { first_epoch } else { epoch },
            term,
            leader,
        }
    }

    /// `term T (leader L)`, with the epoch when it differs from `other`'s.
    fn describe(&self, other: &Leadership) -> String {
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
fn first_epoch(epochs: impl Iterator<Item = u64>) -> u64 {
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
fn with_leaderships(samples: &[LeaderSample]) -> Vec<(&LeaderSample, Leadership)> {
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

/// Nodes a fault touched (their stream was cut or worse), at any time.
fn faulted_nodes(windows: &[Window]) -> BTreeSet<&str> {
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
fn node_windows<'a>(windows: &'a [Window], node: &'a str) -> impl Iterator<Item = &'a Window> {
    windows
        .iter()
        .filter(move |w| matches!(&w.subject, Subject::Node(n) if n == node))
}

/// Whether a window on `node` covers run time `at_us` (with the slack
/// after it closes).
fn node_fault_at(windows: &[Window], node: &str, at_us: u64) -> bool {
    node_windows(windows, node).any(|w| {
        w.from_us <= at_us
            && at_us
                <= w.to_us
                    .unwrap_or(u64::MAX)
                    .saturating_add(NODE_FAULT_SLACK_US)
    })
}

/// The wall-clock time of a tracing log line (`2026-12-03T07:06:07.123456Z
/// ...`) as microseconds since the Unix epoch.
pub fn log_time_us(line: &str) -> Option<u64> {
    let stamp = line.split_whitespace().next()?;
    let at = OffsetDateTime::parse(stamp, &Rfc3339).ok()?;
    u64::try_from(at.unix_timestamp_nanos() / 1000).ok()
}

/// A log line's time in run time (microseconds since the run's time
/// zero), given the wall-clock time of that zero.
fn run_time_us(line: &str, wall_zero_us: u64) -> Option<u64> {
    log_time_us(line).map(|t| t.saturating_sub(wall_zero_us))
}

/// No node was marked `unreachable` or `lost` unless a fault window on
/// that node covers the moment: not in any peer's log (`node status
/// changed ... to=...`, placed in run time by its timestamp), not in any
/// sampled `GET /api/v1/nodes`. A sampled status that is not `ready` stays
/// excused after its window until the node is seen `ready` again. A fault
/// on a peer (killed, paused, cut off) touches no node. `wall_zero_us` is
/// the wall-clock time of the run's zero; 0 places no log line in time,
/// so any window on the node excuses it.
pub fn no_unreachable_while_healthy(
    peer_logs: &[(String, String)],
    samples: &[FleetSample],
    windows: &[Window],
    wall_zero_us: u64,
) -> Checked {
    let faulted = faulted_nodes(windows);
    let mut violations = BTreeSet::new();
    let mut transitions = 0;
    for (name, text) in peer_logs {
        for line in text.lines().filter(|l| l.contains(NODE_STATUS_CHANGED)) {
            transitions += 1;
            let node = field(line, "node");
            let to = field(line, "to");
            let Some(node) = node else { continue };
            if !matches!(to.as_deref(), Some("unreachable" | "lost")) {
                continue;
            }
            let at = (wall_zero_us > 0)
                .then(|| run_time_us(line, wall_zero_us))
                .flatten();
            let excused = match at {
                Some(at) => node_fault_at(windows, &node, at),
                None => faulted.contains(node.as_str()),
            };
            if !excused {
                violations.insert(format!(
                    "{name}: node {node} marked {}{} although no fault touched it: {}",
                    to.unwrap_or_default(),
                    at.map_or(String::new(), |at| format!(" at {:.1}s", at as f64 / 1e6)),
                    line.trim()
                ));
            }
        }
    }
    // Per node: the window that excuses its non-ready samples, until the
    // node is seen ready after that window closed.
    let mut excusing: BTreeMap<&str, bool> = BTreeMap::new();
    for sample in samples {
        for (node, (status, _)) in sample.nodes.iter().flatten() {
            let at = sample.at_us;
            let covered = node_fault_at(windows, node, at);
            if status == "ready" {
                if !covered {
                    excusing.insert(node, false);
                }
                continue;
            }
            if covered {
                excusing.insert(node, true);
                continue;
            }
            let still = excusing.get(node.as_str()).copied().unwrap_or(false)
                && node_windows(windows, node).any(|w| w.from_us <= at);
            if !still {
                violations.insert(format!(
                    "node {node} was {status} at {:.1}s (peer {}) although no fault touched it",
                    at as f64 / 1e6,
                    sample.peer.map_or("?".to_owned(), |p| p.to_string()),
                ));
            }
        }
    }
    let total = violations.len();
    let mut shown: Vec<String> = violations.into_iter().take(10).collect();
    if total > shown.len() {
        shown.push(format!("... and {} more", total - shown.len()));
    }
    Checked::new(
        NO_UNREACHABLE_WHILE_HEALTHY,
        format!(
            "{transitions} status changes logged, {} node samples, faulted nodes {faulted:?}",
            samples.iter().filter(|s| s.nodes.is_some()).count()
        ),
        shown,
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

/// How far the sampled API view may trail the agents' files: the sampler
/// reads the first member that answers, and a peer just restarted answers
/// from the state it had until it has caught up (a replacement seen
/// `loading` there may already be ready, its predecessor's engine gone).
const API_LAG_US: u64 = 5_000_000;

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

/// One line of an agent's command witness (`commands.jsonl`): a command
/// the agent acted on (or refused), with the leadership that sent it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct WitnessLine {
    pub at_unix_ms: u64,
    /// 0 from agents before epochs, and before the cluster's first began.
    #[serde(default)]
    pub epoch: u64,
    pub term: u64,
    pub leader: u64,
    pub kind: String,
    #[serde(default)]
    pub shard: String,
    pub executed: bool,
}

/// Reads a witness file's text; lines that do not parse (a torn last line)
/// are skipped.
pub fn parse_witness(text: &str) -> Vec<WitnessLine> {
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// How far the run's clock and the agents' wall clocks may disagree.
const WITNESS_CLOCK_SLACK_US: u64 = 50_000;

/// No agent executed a command (start, stop, drain, or the orders of a
/// `Registered`) from a leadership (epoch, term, leader id) that had
/// already been superseded: the
/// witness each agent keeps is held against the leadership history sampled
/// from every peer, not against the agent's own view. A leadership is
/// superseded once any peer has answered naming a newer one (term, leader
/// id); a command of it executed after that answer is a violation.
pub fn no_deposed_command(
    samples: &[LeaderSample],
    witnesses: &[(String, Vec<WitnessLine>)],
    wall_zero_us: u64,
) -> Checked {
    let first = first_epoch(
        samples.iter().map(|s| s.epoch).chain(
            witnesses
                .iter()
                .flat_map(|(_, lines)| lines.iter().map(|l| l.epoch)),
        ),
    );
    // The newest leadership any peer had named by each answer time.
    let mut named: Vec<(u64, Leadership)> = with_leaderships(samples)
        .into_iter()
        .map(|(sample, leadership)| (sample.answered_us, leadership))
        .collect();
    named.sort();
    let mut newest_by: Vec<(u64, Leadership)> = Vec::with_capacity(named.len());
    for (at, leadership) in named {
        let newest = newest_by
            .last()
            .map_or(leadership, |(_, prev)| leadership.max(*prev));
        newest_by.push((at, newest));
    }
    let (mut executed, mut refused) = (0, 0);
    let mut violations = Vec::new();
    for (node, lines) in witnesses {
        for line in lines {
            if !line.executed {
                refused += 1;
                continue;
            }
            executed += 1;
            let at_us = (line.at_unix_ms * 1000).saturating_sub(wall_zero_us);
            let known = newest_by
                .partition_point(|(answered, _)| answered + WITNESS_CLOCK_SLACK_US < at_us);
            let Some((_, newest)) = known.checked_sub(1).map(|i| newest_by[i]) else {
                continue;
            };
            let from = Leadership::of(first, line.epoch, line.term, line.leader);
            if from < newest {
                violations.push(format!(
                    "node {node} executed {} {} at {:.2}s from {}, after a peer had named {}",
                    line.kind,
                    line.shard,
                    at_us as f64 / 1e6,
                    from.describe(&newest),
                    newest.describe(&from)
                ));
            }
        }
    }
    Checked::new(
        NO_DEPOSED_COMMAND,
        format!(
            "{executed} commands executed by agents, {refused} refused as stale, against {} leader samples",
            samples.len()
        ),
        violations,
    )
}

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
    let total = violations.len();
    let mut shown: Vec<String> = violations.into_iter().take(10).collect();
    if total > shown.len() {
        shown.push(format!("... and {} more", total - shown.len()));
    }
    Checked::new(
        NO_RETIREMENT_WHILE_REACHABLE,
        format!(
            "{} replicas of {models:?} seen, {retired} retired, faulted nodes {:?}",
            tracks.len(),
            faulted_nodes(windows)
        ),
        shown,
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
}

/// While the leader was healthy (run times `from_us` to `to_us`), no peer
/// closed its agent streams for losing leadership
/// ([`AGENT_STREAMS_RELEASED`], with how many) and no agent lost its
/// control-plane stream (the agents' own logs).
pub fn healthy_leader_kept_streams(
    peer_logs: &[(String, String)],
    agent_logs: &[(String, String)],
    wall_zero_us: u64,
    from_us: u64,
    to_us: u64,
) -> Checked {
    let within =
        |line: &str| run_time_us(line, wall_zero_us).filter(|at| *at >= from_us && *at <= to_us);
    let mut violations = Vec::new();
    let mut closed = 0;
    for (name, text) in peer_logs {
        for line in text.lines().filter(|l| l.contains(AGENT_STREAMS_RELEASED)) {
            if let Some(at) = within(line) {
                let n: usize = field(line, "closed")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                closed += n;
                violations.push(format!(
                    "{name}: closed {n} agent streams at {:.1}s while the leader was healthy: {}",
                    at as f64 / 1e6,
                    line.trim()
                ));
            }
        }
    }
    let mut lost = 0;
    for (node, text) in agent_logs {
        let times: Vec<u64> = text
            .lines()
            .filter(|l| l.contains(CONTROL_PLANE_STREAM_LOST))
            .filter_map(within)
            .collect();
        if let Some(first) = times.first() {
            lost += times.len();
            violations.push(format!(
                "agent {node} lost its control-plane stream {} time(s) from {:.1}s while the leader was healthy",
                times.len(),
                *first as f64 / 1e6
            ));
        }
    }
    Checked::new(
        HEALTHY_LEADER_KEPT_STREAMS,
        format!(
            "{:.1}s to {:.1}s: {closed} streams closed by peers, {lost} stream losses in agent logs",
            from_us as f64 / 1e6,
            to_us as f64 / 1e6
        ),
        violations,
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
            vec![format!(
                "no other peer named a leader within {:.0}s of healing",
                within_us as f64 / 1e6
            )],
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
    Checked::new(
        REJOINED_AFTER_HEALING,
        scope(format!("the others name leader {leader} of term {term}")),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader sample answered the moment it was asked.
    fn at(at_us: u64, peer: u64, term: u64, leader: Option<u64>) -> LeaderSample {
        LeaderSample {
            at_us,
            answered_us: at_us,
            peer,
            epoch: 0,
            term,
            leader,
        }
    }

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
            format!(
                "2026-12-03T07:06:07Z  WARN llmgw_server::agents::liveness: {NODE_STATUS_CHANGED} node=n2 from=\"ready\" to=\"unreachable\"\n\
                 2026-12-03T07:06:08Z  WARN llmgw_server::agents::liveness: {NODE_STATUS_CHANGED} node=n1 from=\"ready\" to=\"unreachable\"\n"
            ),
        )];
        let windows = vec![Window {
            subject: Subject::Node("n1".into()),
            from_us: 0,
            to_us: Some(1),
            data_plane: false,
        }];
        let checked = no_unreachable_while_healthy(&logs, &[], &windows, 0);
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
    fn a_command_executed_from_a_superseded_leadership_is_a_violation() {
        let at = |answered_us, peer, term, leader| LeaderSample {
            at_us: answered_us,
            answered_us,
            peer,
            epoch: 0,
            term,
            leader: Some(leader),
        };
        // Term 3 led by peer 1 until a peer named term 4 (leader 2) at 5 s.
        let samples = vec![at(1_000_000, 2, 3, 1), at(5_000_000, 3, 4, 2)];
        let wall_zero_us = 1_700_000_000_000_000;
        let line = |at_s: f64, term, leader, executed| WitnessLine {
            at_unix_ms: (wall_zero_us + (at_s * 1e6) as u64) / 1000,
            epoch: 0,
            term,
            leader,
            kind: "stop".into(),
            shard: "r1-r0".into(),
            executed,
        };
        let witnesses = vec![(
            "n1".to_owned(),
            vec![
                line(2.0, 3, 1, true),  // while term 3 led
                line(6.0, 4, 2, true),  // the new leader
                line(6.5, 3, 1, false), // refused: fencing worked
                line(7.0, 3, 1, true),  // executed after it was superseded
            ],
        )];
        let checked = no_deposed_command(&samples, &witnesses, wall_zero_us);
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        assert!(
            checked.violations[0].starts_with("node n1 executed stop r1-r0 at 7.00s from term 3"),
            "{}",
            checked.violations[0]
        );
        assert!(
            checked.scope.contains("3 commands executed"),
            "{}",
            checked.scope
        );
        assert!(checked.scope.contains("1 refused"), "{}", checked.scope);
    }

    /// A restore begins a later epoch whose terms start again from the
    /// backup's: its leaderships are newer than every one before it, and
    /// commands of the restored leader are not from a deposed one; a
    /// command of the old epoch after it is.
    #[test]
    fn after_a_restore_the_later_epoch_outranks_any_term_of_the_one_before() {
        let sample = |at_us, peer, epoch, term, leader| LeaderSample {
            at_us,
            answered_us: at_us,
            peer,
            epoch,
            term,
            leader: Some(leader),
        };
        // Before the first epoch began (0), in it (100), then restored
        // from a backup of term 2 (no epoch named while the new one is
        // due) into epoch 200 after elections to term 4.
        let samples = vec![
            sample(1_000_000, 1, 0, 1, 1),
            sample(2_000_000, 1, 100, 1, 1),
            sample(3_000_000, 1, 100, 4, 3),
            sample(8_000_000, 1, 0, 2, 1),
            sample(9_000_000, 1, 200, 2, 1),
        ];
        let forward = leaderships_move_forward(&samples);
        assert!(forward.violations.is_empty(), "{:?}", forward.violations);
        // A peer lagging behind the entry that began epoch 100, naming no
        // epoch in term 4, is in epoch 100, not in the restore's 200: its
        // next sample, in 100, does not go back.
        let lagging = vec![
            sample(2_000_000, 1, 100, 4, 3),
            sample(2_500_000, 2, 0, 4, 3),
            sample(3_000_000, 2, 100, 4, 3),
            sample(9_000_000, 1, 200, 2, 1),
        ];
        let lagged = leaderships_move_forward(&lagging);
        assert!(lagged.violations.is_empty(), "{:?}", lagged.violations);
        let back =
            leaderships_move_forward(&[samples[4].clone(), sample(10_000_000, 1, 100, 5, 2)]);
        assert_eq!(
            back.violations,
            [
                "peer 1 named epoch 100 term 5 (leader 2) at 10.0s after epoch 200 term 2 (leader 1) at 9.0s: its leadership went back"
            ]
        );

        let wall_zero_us = 1_700_000_000_000_000;
        let line = |at_s: f64, epoch, term, leader| WitnessLine {
            at_unix_ms: (wall_zero_us + (at_s * 1e6) as u64) / 1000,
            epoch,
            term,
            leader,
            kind: "stop".into(),
            shard: "r1-r0".into(),
            executed: true,
        };
        let witnesses = vec![(
            "n1".to_owned(),
            vec![
                line(1.5, 0, 1, 1),   // before the first epoch began
                line(2.5, 100, 1, 1), // the same leadership, in it
                line(9.5, 200, 2, 1), // the restored cluster
                line(9.8, 100, 4, 3), // the old epoch, after the restore
            ],
        )];
        let checked = no_deposed_command(&samples, &witnesses, wall_zero_us);
        assert_eq!(
            checked.violations,
            [
                "node n1 executed stop r1-r0 at 9.80s from epoch 100 term 4 (leader 3), after a peer had named epoch 200 term 2 (leader 1)"
            ]
        );
    }

    #[test]
    fn a_torn_last_witness_line_is_skipped() {
        let torn = "{\"at_unix_ms\":1,\"term\":1,\"leader\":1,\"kind\":\"start\",\"shard\":\"a\",\"executed\":true}\n{\"at_un";
        assert_eq!(parse_witness(torn).len(), 1);
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
    fn log_times_are_read_as_unix_microseconds() {
        assert_eq!(
            log_time_us("1970-01-01T00:00:01.000002Z  INFO x: y"),
            Some(1_000_002)
        );
        // 2026-12-03T07:06:07.5Z, checked against `date -d ... +%s`.
        assert_eq!(
            log_time_us("2026-12-03T07:06:07.5Z  WARN a: b"),
            Some(1_796_281_567_500_000)
        );
        assert_eq!(log_time_us("not a time"), None);
    }

    fn window(subject: Subject, from_us: u64, to_us: u64) -> Window {
        Window {
            subject,
            from_us,
            to_us: Some(to_us),
            data_plane: false,
        }
    }

    #[test]
    fn a_mark_outside_the_node_window_or_during_a_peer_fault_is_reported() {
        // Run time zero at 1970-01-01T00:00:00Z: log times are run times.
        let logs = vec![(
            "server-2.1.log".to_owned(),
            format!(
                "1970-01-01T00:00:05.000000Z  WARN l: {NODE_STATUS_CHANGED} node=n1 from=\"ready\" to=\"unreachable\"\n\
                 1970-01-01T00:01:00.000000Z  WARN l: {NODE_STATUS_CHANGED} node=n1 from=\"ready\" to=\"unreachable\"\n\
                 1970-01-01T00:00:12.000000Z  WARN l: {NODE_STATUS_CHANGED} node=n2 from=\"ready\" to=\"lost\"\n"
            ),
        )];
        let windows = vec![
            window(Subject::Node("n1".into()), 4_000_000, 8_000_000),
            // A paused leader touches no node.
            window(Subject::Peer(1), 0, 30_000_000),
        ];
        let node_sample = |at_us, status: &str| FleetSample {
            at_us,
            peer: Some(2),
            nodes: Some(BTreeMap::from([(
                "n1".to_owned(),
                (status.to_owned(), false),
            )])),
            ..FleetSample::default()
        };
        let samples = vec![
            node_sample(5_000_000, "unreachable"),
            // Still down after the window: excused until seen ready.
            node_sample(30_000_000, "lost"),
            node_sample(31_000_000, "ready"),
            node_sample(50_000_000, "unreachable"),
        ];
        let checked = no_unreachable_while_healthy(&logs, &samples, &windows, 1);
        let text = checked.violations.join("\n");
        assert_eq!(checked.violations.len(), 3, "{text}");
        assert!(
            text.contains("node n1 marked unreachable at 60.0s"),
            "{text}"
        );
        assert!(text.contains("node n2 marked lost at 12.0s"), "{text}");
        assert!(text.contains("node n1 was unreachable at 50.0s"), "{text}");
    }

    fn fleet(
        at_us: u64,
        replicas: Vec<crate::fleet::ReplicaObs>,
        agents: Vec<(&str, Vec<&str>)>,
    ) -> FleetSample {
        FleetSample {
            at_us,
            peer: Some(1),
            replicas: Some(replicas),
            nodes: Some(BTreeMap::from([
                ("n1".to_owned(), ("ready".to_owned(), false)),
                ("n2".to_owned(), ("ready".to_owned(), false)),
            ])),
            agents: agents
                .into_iter()
                .map(|(node, shards)| crate::fleet::AgentObs {
                    node: node.into(),
                    leader_term: 1,
                    shards: shards
                        .into_iter()
                        .map(|id| crate::fleet::AgentShard {
                            shard_id: id.into(),
                            term: 1,
                            gpus: vec![0],
                            pgids: vec![],
                        })
                        .collect(),
                })
                .collect(),
        }
    }

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
            no_retirement_while_reachable(&samples, &[], &["qwen"], &[])
                .violations
                .is_empty()
        );
        assert!(
            no_retirement_while_reachable(&samples, &[], &["other"], &[])
                .violations
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
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        assert!(
            checked.violations[0].starts_with("replica q-3 of qwen on {\"n1\"} retired at 2.0s"),
            "{checked:?}"
        );
        // Unless the run changed the model's spec, a replacement excuses
        // nothing: nothing else replaces a replica on a reachable node.
        let checked = no_retirement_while_reachable(&samples, &[], &["qwen"], &[]);
        assert_eq!(checked.violations.len(), 2, "{checked:?}");
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
    fn streams_closed_by_a_healthy_leader_are_counted_and_reported() {
        let peers = vec![(
            "server-1.1.log".to_owned(),
            format!(
                "1970-01-01T00:00:07.000000Z  INFO l: {AGENT_STREAMS_RELEASED} term=3 closed=4 why=\"another peer leads\"\n\
                 1970-01-01T00:00:40.000000Z  INFO l: {AGENT_STREAMS_RELEASED} term=4 closed=4 why=\"another peer leads\"\n"
            ),
        )];
        let agents = vec![
            (
                "n1".to_owned(),
                format!(
                    "1970-01-01T00:00:07.100000Z  WARN c: {CONTROL_PLANE_STREAM_LOST} peer=10.0.0.1:7070 why=x\n"
                ),
            ),
            ("n2".to_owned(), String::new()),
        ];
        let checked = healthy_leader_kept_streams(&peers, &agents, 1, 5_000_000, 20_000_000);
        assert_eq!(checked.violations.len(), 2, "{checked:?}");
        assert!(checked.violations[0].contains("closed 4 agent streams at 7.0s"));
        assert!(
            checked.violations[1]
                .starts_with("agent n1 lost its control-plane stream 1 time(s) from 7.1s")
        );
        assert!(
            checked
                .scope
                .contains("4 streams closed by peers, 1 stream losses")
        );
    }

    #[test]
    fn streams_released_as_the_server_logs_it_today_are_seen() {
        // The line as crates/server/src/agents/liveness.rs writes it: the
        // shared message, then its fields.
        let peers = vec![(
            "server-2.log".to_owned(),
            format!(
                "1970-01-01T00:00:08.000000Z  INFO llmgw_server::agents::liveness: {AGENT_STREAMS_RELEASED} term=5 closed=3 why=\"another peer leads\"\n"
            ),
        )];
        let checked = healthy_leader_kept_streams(&peers, &[], 1, 5_000_000, 20_000_000);
        assert_eq!(checked.violations.len(), 1, "{checked:?}");
        assert!(
            checked.violations[0].contains("closed 3 agent streams at 8.0s"),
            "{checked:?}"
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
}
