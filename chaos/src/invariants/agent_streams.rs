//! How long each agent went without a stream to a leader, read from the
//! agent's own log: from the moment it lost its stream (or gave up on a
//! silent peer) to its next accepted registration.

use llmgw_runtime::log_events::{
    AGENT_REGISTERED, CONTROL_PLANE_PEER_SILENT, CONTROL_PLANE_STREAM_LOST,
};

use super::availability::majority_down_spans;
use super::fleet::node_windows;
use super::logs::{logs_read, run_time_us};
use super::{AGENTS_FOUND_THE_LEADER, Checked, first_of};
use crate::fleet::Window;

/// Where a span of `node` without a leader, from `from_us` to `to_us`,
/// starts to count: after the last fault window on the node that
/// overlaps it (a cut or killed agent cannot register) and after the last
/// span of `majority_down` that does (no leader to register with), or at
/// `from_us`. `None` when a window still open covers it all.
fn counted_from(
    windows: &[Window],
    majority_down: &[(u64, u64)],
    node: &str,
    from_us: u64,
    to_us: u64,
) -> Option<u64> {
    let mut start = from_us;
    for w in node_windows(windows, node).filter(|w| w.from_us <= to_us) {
        match w.to_us {
            None => return None,
            Some(end) if end >= from_us => start = start.max(end),
            Some(_) => {}
        }
    }
    for &(down_from, down_to) in majority_down {
        if down_from <= to_us && down_to >= from_us {
            if down_to == u64::MAX {
                return None;
            }
            start = start.max(down_to);
        }
    }
    Some(start)
}

/// Every agent, once registered, found a leader again within `bound_us`
/// of losing its stream, outside fault windows on its own node and spans
/// with a majority of the `members` peers down: a failover costs the
/// fleet no more than an election and a reconnect backoff. A loss never
/// followed by a registration counts up to the last line of any agent log.
pub fn agents_found_the_leader(
    agent_logs: &[(String, String)],
    windows: &[Window],
    members: usize,
    wall_zero_us: u64,
    bound_us: u64,
) -> Checked {
    let majority_down = majority_down_spans(windows, members);
    let secs = |us: u64| us as f64 / 1e6;
    let logs_end = agent_logs
        .iter()
        .flat_map(|(_, text)| text.lines())
        .filter_map(|line| run_time_us(line, wall_zero_us))
        .max()
        .unwrap_or(0);
    let mut violations = Vec::new();
    let (mut registrations, mut outages, mut longest) = (0, 0, 0);
    for (node, text) in agent_logs {
        let mut registered = false;
        let mut lost_at: Option<u64> = None;
        for line in text.lines() {
            let Some(at) = run_time_us(line, wall_zero_us) else {
                continue;
            };
            if line.contains(AGENT_REGISTERED) {
                registrations += 1;
                registered = true;
                let Some(from) = lost_at.take() else { continue };
                outages += 1;
                let Some(start) = counted_from(windows, &majority_down, node, from, at) else {
                    continue;
                };
                let without = at.saturating_sub(start);
                longest = longest.max(without);
                if without > bound_us {
                    violations.push(format!(
                        "agent {node} was without a leader from {:.1}s to {:.1}s ({:.1}s, more than the {:.1}s bound)",
                        secs(start),
                        secs(at),
                        secs(without),
                        secs(bound_us)
                    ));
                }
            } else if registered
                && lost_at.is_none()
                && (line.contains(CONTROL_PLANE_STREAM_LOST)
                    || line.contains(CONTROL_PLANE_PEER_SILENT))
            {
                lost_at = Some(at);
            }
        }
        if let Some(from) = lost_at
            && let Some(start) = counted_from(windows, &majority_down, node, from, logs_end)
            && logs_end.saturating_sub(start) > bound_us
        {
            violations.push(format!(
                "agent {node} lost its stream at {:.1}s and had not registered again by {:.1}s",
                secs(start),
                secs(logs_end)
            ));
        }
    }
    Checked::new(
        AGENTS_FOUND_THE_LEADER,
        format!(
            "{registrations} registrations, {outages} outages after one, longest {:.1}s (bound {:.1}s)",
            secs(longest),
            secs(bound_us)
        ),
        first_of(violations, 8),
    )
    .needs("agent logs with timestamped lines", logs_read(agent_logs), 1)
    .needs(
        "registrations in the agents' logs",
        registrations,
        agent_logs.len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Subject;
    use crate::invariants::test_support::*;

    const ZERO: u64 = 1_800_000_000_000_000;
    const BOUND: u64 = 13_000_000;

    /// A log line at run time `at_s` with message `what`.
    fn line(at_s: f64, what: &str) -> String {
        let at = time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(ZERO) * 1000 + (at_s * 1e9) as i128,
        )
        .expect("a time");
        let stamp = at
            .format(&time::format_description::well_known::Rfc3339)
            .expect("formats");
        format!("{stamp}  INFO llmgw_agent::client: {what} peer=10.0.0.1:7070")
    }

    fn log(node: &str, lines: &[(f64, &str)]) -> (String, String) {
        let text = lines
            .iter()
            .map(|(at, what)| line(*at, what))
            .collect::<Vec<_>>()
            .join("\n");
        (node.to_owned(), text)
    }

    fn check(logs: &[(String, String)], windows: &[Window]) -> Checked {
        agents_found_the_leader(logs, windows, 3, ZERO, BOUND)
    }

    #[test]
    fn no_logs_is_not_enough_evidence() {
        assert_eq!(shortfalls(&check(&[], &[])).len(), 1);
    }

    #[test]
    fn a_reconnect_within_the_bound_passes_and_the_longest_is_reported() {
        let logs = [log(
            "n1",
            &[
                (1.0, AGENT_REGISTERED),
                (10.0, CONTROL_PLANE_STREAM_LOST),
                (10.5, CONTROL_PLANE_STREAM_LOST),
                (12.5, AGENT_REGISTERED),
            ],
        )];
        let checked = check(&logs, &[]);
        assert!(checked.violations.is_empty(), "{checked:?}");
        assert!(checked.scope.contains("longest 2.5s"), "{}", checked.scope);
    }

    #[test]
    fn an_agent_without_a_leader_past_the_bound_fails() {
        let logs = [
            log(
                "n1",
                &[
                    (1.0, AGENT_REGISTERED),
                    (10.0, CONTROL_PLANE_PEER_SILENT),
                    (30.0, AGENT_REGISTERED),
                ],
            ),
            log("n2", &[(1.0, AGENT_REGISTERED), (40.0, "heartbeat")]),
        ];
        let checked = check(&logs, &[]);
        assert_eq!(
            found(&checked),
            [
                "agent n1 was without a leader from 10.0s to 30.0s (20.0s, more than the 13.0s bound)"
            ],
            "{checked:?}"
        );
    }

    #[test]
    fn a_loss_never_followed_by_a_registration_fails() {
        let logs = [log(
            "n1",
            &[
                (1.0, AGENT_REGISTERED),
                (5.0, CONTROL_PLANE_STREAM_LOST),
                (40.0, CONTROL_PLANE_STREAM_LOST),
            ],
        )];
        let checked = check(&logs, &[]);
        assert_eq!(
            found(&checked),
            ["agent n1 lost its stream at 5.0s and had not registered again by 40.0s"],
            "{checked:?}"
        );
    }

    #[test]
    fn a_cut_on_the_node_is_excused_and_the_clock_starts_when_it_heals() {
        let logs = [log(
            "n1",
            &[
                (1.0, AGENT_REGISTERED),
                (10.0, CONTROL_PLANE_STREAM_LOST),
                (42.0, AGENT_REGISTERED),
            ],
        )];
        let cut = [window(Subject::Node("n1".into()), 9_000_000, 40_000_000)];
        let checked = check(&logs, &cut);
        assert!(checked.violations.is_empty(), "{checked:?}");
        assert!(checked.scope.contains("longest 2.0s"), "{}", checked.scope);
    }

    #[test]
    fn time_with_a_majority_of_peers_down_is_excused() {
        let logs = [log(
            "n1",
            &[
                (1.0, AGENT_REGISTERED),
                (10.0, CONTROL_PLANE_STREAM_LOST),
                (33.0, AGENT_REGISTERED),
            ],
        )];
        let down = |peer: u64| Window {
            data_plane: true,
            ..window(Subject::Peer(peer), 10_000_000, 30_000_000)
        };
        let checked = check(&logs, &[down(1), down(2)]);
        assert!(checked.violations.is_empty(), "{checked:?}");
        assert!(checked.scope.contains("longest 3.0s"), "{}", checked.scope);
        // One peer down is no excuse.
        assert_eq!(found(&check(&logs, &[down(1)])).len(), 1);
    }

    #[test]
    fn losses_before_the_first_registration_are_start_up_not_outages() {
        let logs = [log(
            "n1",
            &[(0.5, CONTROL_PLANE_STREAM_LOST), (30.0, AGENT_REGISTERED)],
        )];
        let checked = check(&logs, &[]);
        assert!(checked.violations.is_empty(), "{checked:?}");
        assert!(checked.scope.contains("0 outages"), "{}", checked.scope);
    }
}
