//! Node liveness on the leader. Heartbeats stay in memory; only the
//! transitions ready -> unreachable -> lost (and back) are committed. A new
//! leader first gives every node a grace period to reconnect, so a
//! failover never marks a healthy fleet down.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use llmgw_raft::{ControlPlane, now_ms};
use llmgw_state::{Command, NodeRecord, NodeStatus};
use tokio::sync::watch;

use super::hub::Hub;

#[derive(Debug, Clone, Copy)]
pub struct LivenessSettings {
    /// No heartbeat for this long: unreachable.
    pub ttl: Duration,
    /// Unreachable for this long: lost.
    pub lost_after: Duration,
    /// After this peer starts leading, no node is marked down before this.
    pub grace: Duration,
    /// The heartbeat interval agents are told to use; zero: their own.
    pub agent_heartbeat: Duration,
}

/// The status a node should move to, if any. `unreachable_for` is how
/// long this leader itself has watched the node unreachable: the status's
/// wall-clock stamp may come from another leader, whose clock is not
/// this one's.
pub fn next_status(
    node: &NodeRecord,
    last_heard: Option<Instant>,
    now: Instant,
    unreachable_for: Option<Duration>,
    in_grace: bool,
    settings: &LivenessSettings,
) -> Option<NodeStatus> {
    let alive = last_heard.is_some_and(|at| now.saturating_duration_since(at) < settings.ttl);
    if alive {
        return (node.status != NodeStatus::Ready).then_some(NodeStatus::Ready);
    }
    if in_grace {
        return None;
    }
    match node.status {
        NodeStatus::Ready => Some(NodeStatus::Unreachable),
        NodeStatus::Unreachable => unreachable_for
            .is_some_and(|down_for| down_for >= settings.lost_after)
            .then_some(NodeStatus::Lost),
        NodeStatus::Lost => None,
    }
}

/// Since when this leader has seen each unreachable node so, on its own
/// monotonic clock; forgotten with the trust in its heartbeat table.
#[derive(Default)]
struct UnreachableSince(HashMap<String, Instant>);

impl UnreachableSince {
    /// How long `node` has been watched unreachable as of `now`, starting
    /// the watch at its first sight.
    fn watch(&mut self, node: &NodeRecord, now: Instant) -> Option<Duration> {
        if node.status != NodeStatus::Unreachable {
            self.0.remove(&node.id);
            return None;
        }
        let since = *self.0.entry(node.id.clone()).or_insert(now);
        Some(now.saturating_duration_since(since))
    }

    fn forget(&mut self) {
        self.0.clear();
    }
}

/// Since when this peer's heartbeat table can be trusted, and under which
/// term. Trust starts when the peer starts leading (or leads again after
/// its lease lapsed) and restarts after a stall of its own: a leader that
/// was paused or cut off received no heartbeats meanwhile, so their age
/// says nothing about the nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trust {
    pub term: u64,
    pub since: Instant,
}

/// Why trust (re)starts at this tick, if it does.
pub fn trust_restarts(
    trusted: Option<Trust>,
    term: u64,
    gap: Duration,
    max_gap: Duration,
) -> Option<&'static str> {
    match trusted {
        None => Some("leading"),
        Some(t) if t.term != term => Some("leading a new term"),
        Some(_) if gap > max_gap => Some("this peer stalled"),
        Some(_) => None,
    }
}

/// How long this peer may lack a leader's lease, with no other leader
/// known, before it gives up the agent streams.
const LAPSE_BEFORE_CLOSING: Duration = Duration::from_secs(2);

/// Runs until `stop` turns true.
pub async fn run_liveness(
    control: ControlPlane,
    hub: Arc<Hub>,
    settings: LivenessSettings,
    mut stop: watch::Receiver<bool>,
) {
    let period = (settings.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    // A tick this late means the process itself stood still.
    let max_gap = period * 2 + Duration::from_millis(500);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut trusted: Option<Trust> = None;
    let mut unreachable_since = UnreachableSince::default();
    let mut lapsed: Option<Instant> = None;
    let mut last_tick = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let now = Instant::now();
        let gap = now.duration_since(last_tick);
        last_tick = now;
        let Some(term) = control.leading_term() else {
            let since = *lapsed.get_or_insert(now);
            release_streams_unless_held(&control, &hub, &mut trusted, since, now);
            continue;
        };
        lapsed = None;
        if refresh_trust(&mut trusted, term, now, gap, max_gap, &settings) {
            unreachable_since.forget();
        }
        let Some(Trust { since, .. }) = trusted else {
            continue;
        };
        let in_grace = now.duration_since(since) < settings.grace;
        let heard = hub.heard_times();
        let changes = verdicts(
            &control,
            &heard,
            &mut unreachable_since,
            now,
            in_grace,
            &settings,
        );
        if changes.is_empty() {
            continue;
        }
        commit_verdicts(&control, term, &changes, now_ms()).await;
    }
}

/// Called on each tick this peer holds no leader's lease (`lapsed_since`
/// is when that began). Forgets the trust in its heartbeat table and closes
/// the agent streams, unless the lapse is short and no other leader is known.
fn release_streams_unless_held(
    control: &ControlPlane,
    hub: &Hub,
    trusted: &mut Option<Trust>,
    lapsed_since: Instant,
    now: Instant,
) {
    let another_leads = control.leader().is_some_and(|(id, _)| id != control.id());
    // A lease that lapses for a moment (a busy machine) keeps the
    // streams: closing ten thousand of them would bring them all
    // back at once. Another leader, or a long lapse, closes them.
    let held_on = !another_leads && now.duration_since(lapsed_since) < LAPSE_BEFORE_CLOSING;
    if !held_on && let Some(t) = trusted.take() {
        let closed = hub.close_all();
        let why = control
            .inactive_leader_reason()
            .unwrap_or_else(|| "another peer leads".to_owned());
        tracing::info!(
            term = t.term,
            closed,
            why,
            "{}",
            llmgw_runtime::log_events::AGENT_STREAMS_RELEASED
        );
    }
}

/// Restarts trust at `now` when [`trust_restarts`] says so, says why, and
/// tells whether it did.
fn refresh_trust(
    trusted: &mut Option<Trust>,
    term: u64,
    now: Instant,
    gap: Duration,
    max_gap: Duration,
    settings: &LivenessSettings,
) -> bool {
    let Some(why) = trust_restarts(*trusted, term, gap, max_gap) else {
        return false;
    };
    tracing::info!(
        term,
        gap_ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX),
        "{why}: every node gets {:?} to be heard before it can be marked unreachable",
        settings.grace
    );
    *trusted = Some(Trust { term, since: now });
    true
}

/// A status change judged for one node.
struct Verdict {
    node: String,
    from: NodeStatus,
    to: NodeStatus,
    /// The status version it was judged from: a node that re-registered in
    /// the meantime keeps its newer status.
    based_on: u64,
}

fn verdicts(
    control: &ControlPlane,
    heard: &HashMap<String, Instant>,
    unreachable_since: &mut UnreachableSince,
    now: Instant,
    in_grace: bool,
    settings: &LivenessSettings,
) -> Vec<Verdict> {
    control.read(|fleet| {
        unreachable_since
            .0
            .retain(|id, _| fleet.nodes.contains_key(id));
        fleet
            .nodes
            .values()
            .filter_map(|node| {
                let last = heard.get(&node.id).copied();
                let unreachable_for = unreachable_since.watch(node, now);
                next_status(node, last, now, unreachable_for, in_grace, settings).map(|status| {
                    Verdict {
                        node: node.id.clone(),
                        from: node.status,
                        to: status,
                        based_on: node.status_version,
                    }
                })
            })
            .collect()
    })
}

/// Proposes the verdicts as the leader of `term`, then logs what each
/// became once applied.
async fn commit_verdicts(control: &ControlPlane, term: u64, changes: &[Verdict], at_ms: u64) {
    // One batch: a rack going dark is one log entry, not hundreds.
    let commands = changes
        .iter()
        .map(|verdict| Command::SetNodeStatus {
            id: verdict.node.clone(),
            status: verdict.to,
            based_on: Some(verdict.based_on),
            at_ms,
        })
        .collect();
    let author = crate::propose::Author::Leader(term);
    if crate::propose::propose_all(control, author, commands).await {
        for verdict in changes {
            log_verdict_outcome(control, verdict);
        }
    }
}

fn log_verdict_outcome(control: &ControlPlane, verdict: &Verdict) {
    let Verdict {
        node: id,
        from,
        to,
        based_on: version,
    } = verdict;
    let now = control.read(|fleet| fleet.nodes.get(id).map(|n| (n.status, n.status_version)));
    match now {
        Some((status, _)) if status == *to => {
            tracing::warn!(
                node = %id,
                from = from.as_str(),
                to = to.as_str(),
                "{}",
                llmgw_runtime::log_events::NODE_STATUS_CHANGED
            );
        }
        Some((status, current)) => tracing::info!(
            node = %id,
            verdict = to.as_str(),
            status = status.as_str(),
            "liveness verdict dropped: judged from status version {version}, the node is at {current}"
        ),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(status: NodeStatus, changed_at_ms: u64) -> NodeRecord {
        NodeRecord {
            id: "n1".into(),
            mgmt_addr: "10.0.0.1".into(),
            inventory: Default::default(),
            fabrics: vec![],
            labels: BTreeMap::new(),
            status,
            cordoned: false,
            draining: false,
            registered_at_ms: 0,
            status_changed_at_ms: changed_at_ms,
            status_version: 1,
        }
    }

    const SETTINGS: LivenessSettings = LivenessSettings {
        ttl: Duration::from_secs(3),
        lost_after: Duration::from_secs(10),
        grace: Duration::from_secs(5),
        agent_heartbeat: Duration::ZERO,
    };

    #[test]
    fn ready_goes_unreachable_after_the_ttl_then_lost_after_lost_after() {
        let now = Instant::now();
        let stale = now - Duration::from_secs(4);
        let ready = node(NodeStatus::Ready, 0);
        assert_eq!(
            next_status(&ready, Some(now), now, None, false, &SETTINGS),
            None
        );
        assert_eq!(
            next_status(&ready, Some(stale), now, None, false, &SETTINGS),
            Some(NodeStatus::Unreachable)
        );
        let unreachable = node(NodeStatus::Unreachable, 1_000);
        let watched = |secs| Some(Duration::from_secs(secs));
        assert_eq!(
            next_status(&unreachable, None, now, watched(4), false, &SETTINGS),
            None
        );
        assert_eq!(
            next_status(&unreachable, None, now, watched(10), false, &SETTINGS),
            Some(NodeStatus::Lost)
        );
    }

    #[test]
    fn a_node_marked_unreachable_under_another_leaders_clock_waits_out_lost_after_here() {
        // The previous leader stamped the change with its wall clock; this
        // leader's may run far ahead of it. Only this leader's own watch
        // counts, from the moment it first sees the node unreachable.
        let now = Instant::now();
        let mut unreachable = node(NodeStatus::Unreachable, 0);
        let mut since = UnreachableSince::default();
        let watched = since.watch(&unreachable, now);
        assert_eq!(watched, Some(Duration::ZERO));
        assert_eq!(
            next_status(&unreachable, None, now, watched, false, &SETTINGS),
            None
        );
        let later = now + SETTINGS.lost_after;
        let watched = since.watch(&unreachable, later);
        assert_eq!(
            next_status(&unreachable, None, later, watched, false, &SETTINGS),
            Some(NodeStatus::Lost)
        );
        // Back and down again: the watch starts over.
        unreachable.status = NodeStatus::Ready;
        assert_eq!(since.watch(&unreachable, later), None);
        unreachable.status = NodeStatus::Unreachable;
        assert_eq!(since.watch(&unreachable, later), Some(Duration::ZERO));
    }

    #[test]
    fn nothing_goes_down_during_the_grace_period_but_nodes_come_back() {
        let now = Instant::now();
        let ready = node(NodeStatus::Ready, 0);
        assert_eq!(next_status(&ready, None, now, None, true, &SETTINGS), None);
        let unreachable = node(NodeStatus::Unreachable, 0);
        assert_eq!(
            next_status(
                &unreachable,
                None,
                now,
                Some(Duration::from_secs(60)),
                true,
                &SETTINGS
            ),
            None
        );
        let lost = node(NodeStatus::Lost, 0);
        assert_eq!(
            next_status(&lost, Some(now), now, None, true, &SETTINGS),
            Some(NodeStatus::Ready)
        );
    }

    #[test]
    fn trust_restarts_on_leading_a_new_term_and_after_a_stall_of_this_peer() {
        let max_gap = Duration::from_millis(1500);
        let tick = Duration::from_millis(500);
        assert_eq!(trust_restarts(None, 3, tick, max_gap), Some("leading"));
        let t = Trust {
            term: 3,
            since: Instant::now(),
        };
        assert_eq!(trust_restarts(Some(t), 3, tick, max_gap), None);
        assert_eq!(
            trust_restarts(Some(t), 4, tick, max_gap),
            Some("leading a new term")
        );
        assert_eq!(
            trust_restarts(Some(t), 3, Duration::from_secs(10), max_gap),
            Some("this peer stalled")
        );
    }
}
