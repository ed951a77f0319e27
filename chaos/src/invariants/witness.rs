//! The agents' command witnesses held against the leadership history: no
//! command of a superseded leader was executed.

use super::raft::{Leadership, first_epoch, with_leaderships};
use super::{Checked, NO_DEPOSED_COMMAND};
use crate::load::LeaderSample;

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
    .needs("commands executed by agents", executed, 1)
    .needs("leader samples", samples.len(), 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::leaderships_move_forward;
    use crate::invariants::test_support::*;

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
        assert!(found(&forward).is_empty(), "{:?}", forward.violations);
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
        assert!(found(&lagged).is_empty(), "{:?}", lagged.violations);
        let back =
            leaderships_move_forward(&[samples[4].clone(), sample(10_000_000, 1, 100, 5, 2)]);
        assert_eq!(
            found(&back),
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
    fn it_fails_on_no_evidence() {
        let checked = no_deposed_command(&[], &[], 0);
        assert_eq!(shortfalls(&checked).len(), 2, "{checked:?}");
        // Witnesses that show only refusals: nothing executed to judge.
        let refused = WitnessLine {
            at_unix_ms: 1,
            epoch: 0,
            term: 1,
            leader: 1,
            kind: "start".into(),
            shard: "r1-r0".into(),
            executed: false,
        };
        let checked = no_deposed_command(
            &[at(0, 1, 1, Some(1))],
            &[("n1".to_owned(), vec![refused])],
            0,
        );
        assert_eq!(
            shortfalls(&checked),
            vec!["not enough evidence: 0 commands executed by agents, at least 1 needed"]
        );
    }
}
