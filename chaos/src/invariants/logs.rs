//! Invariants read from the peers' and agents' logs: the events of
//! `llmgw_runtime::log_events`, placed in run time by their timestamps.

use std::collections::{BTreeMap, BTreeSet};

use llmgw_runtime::log_events::{
    AGENT_STREAMS_RELEASED, CONTROL_PLANE_STREAM_LOST, NODE_STATUS_CHANGED,
};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::fleet::{faulted_nodes, node_fault_at, node_windows};
use super::{Checked, HEALTHY_LEADER_KEPT_STREAMS, NO_UNREACHABLE_WHILE_HEALTHY, first_of};
use crate::fleet::{FleetSample, Window};

/// The wall-clock time of a tracing log line (`2026-12-03T07:06:07.123456Z
/// ...`) as microseconds since the Unix epoch.
pub fn log_time_us(line: &str) -> Option<u64> {
    let stamp = line.split_whitespace().next()?;
    let at = OffsetDateTime::parse(stamp, &Rfc3339).ok()?;
    u64::try_from(at.unix_timestamp_nanos() / 1000).ok()
}

/// A log line's time in run time (microseconds since the run's time
/// zero), given the wall-clock time of that zero.
pub(super) fn run_time_us(line: &str, wall_zero_us: u64) -> Option<u64> {
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
    let node_samples = samples.iter().filter(|s| s.nodes.is_some()).count();
    let shown = first_of(violations, 10);
    Checked::new(
        NO_UNREACHABLE_WHILE_HEALTHY,
        format!(
            "{transitions} status changes logged, {node_samples} node samples, faulted nodes \
             {faulted:?}"
        ),
        shown,
    )
    .needs("node status samples", node_samples, 1)
    .needs("peer logs with timestamped lines", logs_read(peer_logs), 1)
}

/// Logs with at least one line whose time reads: a log this check cannot
/// place in time, or that is empty, shows nothing.
pub(super) fn logs_read(logs: &[(String, String)]) -> usize {
    logs.iter()
        .filter(|(_, text)| text.lines().any(|l| log_time_us(l).is_some()))
        .count()
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
    .needs("peer logs with timestamped lines", logs_read(peer_logs), 1)
    .needs("agent logs with timestamped lines", logs_read(agent_logs), 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Subject;
    use crate::invariants::test_support::*;

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
        assert_eq!(found(&checked).len(), 1, "{checked:?}");
        assert!(found(&checked)[0].contains("node n2 marked unreachable"));
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
        assert_eq!(found(&checked).len(), 1, "{checked:?}");
        assert!(
            found(&checked)[0].contains("closed 3 agent streams at 8.0s"),
            "{checked:?}"
        );
    }

    #[test]
    fn each_check_fails_on_no_evidence() {
        let untimed = vec![("peer-1".to_owned(), "a line with no time\n".to_owned())];
        for checked in [
            no_unreachable_while_healthy(&[], &[], &[], 0),
            no_unreachable_while_healthy(&untimed, &[], &[], 0),
            healthy_leader_kept_streams(&[], &[], 0, 0, 10_000_000),
            healthy_leader_kept_streams(&untimed, &untimed, 0, 0, 10_000_000),
        ] {
            assert!(!shortfalls(&checked).is_empty(), "{checked:?}");
        }
    }
}
