//! Availability as an invariant: how long the cluster went without a
//! leader that a majority of its peers follow, read from every peer's
//! sampled answer to "who leads?".
//!
//! A leader one peer names proves nothing (an isolated old leader names
//! itself); a leader that a majority names, in one term, and that answers
//! naming itself, can commit. So at each moment the check asks whether a
//! majority of peers, by their latest fresh answers, name the same leader
//! of the same term, that leader among them. Time while a
//! majority of peers is down or paused by the schedule is excused: no
//! leader is possible then, and the clock starts again when they are back.

use std::collections::BTreeMap;

use super::{Checked, LEADER_FOLLOWED, first_of};
use crate::fleet::{Subject, Window};
use crate::load::LeaderSample;

/// An answer older than this no longer says what its peer believes: the
/// sampler asks every 150 ms, so three answers have gone missing. A peer
/// that stopped answering, killed or paused, counts neither as following
/// nor as leading; the spans measured are short of the truth by up to
/// this much, and a slow answer can add a short span that is not one.
const FRESH_US: u64 = 500_000;
/// How finely the run's time is judged.
const STEP_US: u64 = 50_000;
/// Spans shorter than this are not listed in the scope (an election).
const NOTABLE_US: u64 = 500_000;
/// A run's timeline must be judged over at least this long to say
/// anything about availability (the shortest scenarios judge about 9 s
/// once the time a majority was down is taken out).
const MIN_JUDGED_US: u64 = 5_000_000;

/// A span of run time with no leader a majority followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaderless {
    pub from_us: u64,
    pub to_us: u64,
}

impl Leaderless {
    fn len_us(&self) -> u64 {
        self.to_us - self.from_us
    }
}

/// The spans of run time in which a majority of `members` peers were down
/// or paused by the schedule (their data-plane fault windows overlap): no
/// leader is possible then, and nothing can register with one.
pub fn majority_down_spans(windows: &[Window], members: usize) -> Vec<(u64, u64)> {
    let majority = members / 2 + 1;
    let peer_windows: Vec<(u64, u64, u64)> = windows
        .iter()
        .filter(|w| w.data_plane)
        .filter_map(|w| match w.subject {
            Subject::Peer(id) => Some((id, w.from_us, w.to_us.unwrap_or(u64::MAX))),
            Subject::Node(_) => None,
        })
        .collect();
    let mut bounds: Vec<u64> = peer_windows.iter().flat_map(|&(_, a, b)| [a, b]).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for pair in bounds.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let down: std::collections::BTreeSet<u64> = peer_windows
            .iter()
            .filter(|&&(_, a, b)| a <= from && from < b)
            .map(|&(id, _, _)| id)
            .collect();
        if down.len() < majority {
            continue;
        }
        match spans.last_mut() {
            Some(last) if last.1 == from => last.1 = to,
            _ => spans.push((from, to)),
        }
    }
    spans
}

/// The spans, outside those excused, when no majority of `members` peers
/// named one leader of one term; and how much time was judged.
pub fn leaderless_spans(
    samples: &[LeaderSample],
    members: usize,
    windows: &[Window],
) -> (Vec<Leaderless>, u64) {
    let mut ordered: Vec<&LeaderSample> = samples.iter().collect();
    ordered.sort_by_key(|s| s.answered_us);
    let (Some(first), Some(last)) = (ordered.first(), ordered.last()) else {
        return (Vec::new(), 0);
    };
    let majority = members / 2 + 1;
    let majority_down = majority_down_spans(windows, members);
    let excused_at = |t: u64| majority_down.iter().any(|&(a, b)| a <= t && t < b);
    // Each peer's latest answer so far.
    let mut latest: BTreeMap<u64, &LeaderSample> = BTreeMap::new();
    let mut next = 0;
    let mut spans = Vec::new();
    let mut open: Option<u64> = None;
    let mut judged = 0;
    let mut t = first.answered_us;
    while t <= last.answered_us {
        while next < ordered.len() && ordered[next].answered_us <= t {
            latest.insert(ordered[next].peer, ordered[next]);
            next += 1;
        }
        let excused = excused_at(t);
        let mut followers: BTreeMap<(u64, u64, u64), usize> = BTreeMap::new();
        for s in latest.values() {
            if let Some(leader) = s.leader
                && t - s.answered_us <= FRESH_US
            {
                *followers.entry((s.epoch, s.term, leader)).or_default() += 1;
            }
        }
        // The leader must answer too, naming itself: followers keep naming
        // a dead leader until their election timeout runs out.
        let leads_itself = |epoch: u64, term: u64, leader: u64| {
            latest.get(&leader).is_some_and(|s| {
                t - s.answered_us <= FRESH_US
                    && (s.epoch, s.term, s.leader) == (epoch, term, Some(leader))
            })
        };
        let led = followers
            .iter()
            .any(|(&(epoch, term, leader), n)| *n >= majority && leads_itself(epoch, term, leader));
        if !excused {
            judged += STEP_US;
        }
        match (led || excused, open) {
            (false, None) => open = Some(t),
            (true, Some(from)) => {
                spans.push(Leaderless {
                    from_us: from,
                    to_us: t,
                });
                open = None;
            }
            _ => {}
        }
        t += STEP_US;
    }
    if let Some(from) = open {
        spans.push(Leaderless {
            from_us: from,
            to_us: last.answered_us,
        });
    }
    (spans, judged)
}

/// No span without a leader a majority follows lasts longer than `bound`
/// (derived from the configured election timeout): a fault that leaves a
/// majority up must cost no more than an election, during the fault and
/// again after it heals.
pub fn leader_followed(
    samples: &[LeaderSample],
    members: usize,
    windows: &[Window],
    bound_us: u64,
) -> Checked {
    let (spans, judged) = leaderless_spans(samples, members, windows);
    let longest = spans.iter().map(Leaderless::len_us).max().unwrap_or(0);
    let secs = |us: u64| us as f64 / 1e6;
    let violations = spans
        .iter()
        .filter(|s| s.len_us() > bound_us)
        .map(|s| {
            format!(
                "no leader followed by a majority from {:.1}s to {:.1}s ({:.1}s, more than the {:.1}s bound)",
                secs(s.from_us),
                secs(s.to_us),
                secs(s.len_us()),
                secs(bound_us)
            )
        });
    let notable: Vec<String> = spans
        .iter()
        .filter(|s| s.len_us() >= NOTABLE_US)
        .map(|s| format!("{:.1}s at {:.1}s", secs(s.len_us()), secs(s.from_us)))
        .collect();
    Checked::new(
        LEADER_FOLLOWED,
        format!(
            "{:.0}s judged, longest without a followed leader {:.1}s (bound {:.1}s){}",
            secs(judged),
            secs(longest),
            secs(bound_us),
            if notable.is_empty() {
                String::new()
            } else {
                format!(": {}", notable.join(", "))
            }
        ),
        first_of(violations, 8),
    )
    .needs(
        "ms of run time judged",
        usize::try_from(judged / 1000).unwrap_or(usize::MAX),
        usize::try_from(MIN_JUDGED_US / 1000).unwrap_or(usize::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::test_support::*;

    const S: u64 = 1_000_000;
    const BOUND: u64 = 9 * S;

    /// Every peer in `peers` answers every 150 ms from `from_s` to `to_s`
    /// naming `leader` of `term`.
    fn answers(
        peers: &[u64],
        from_s: u64,
        to_s: u64,
        term: u64,
        leader: Option<u64>,
    ) -> Vec<LeaderSample> {
        let mut out = Vec::new();
        let mut t = from_s * S;
        while t < to_s * S {
            for p in peers {
                out.push(at(t, *p, term, leader));
            }
            t += 150_000;
        }
        out
    }

    fn violations_naming(checked: &Checked, text: &str) -> usize {
        found(checked).iter().filter(|v| v.contains(text)).count()
    }

    fn down(peer: u64, from_s: u64, to_s: u64) -> Window {
        Window {
            data_plane: true,
            ..window(Subject::Peer(peer), from_s * S, to_s * S)
        }
    }

    #[test]
    fn no_samples_is_not_enough_evidence() {
        let checked = leader_followed(&[], 3, &[], BOUND);
        assert_eq!(shortfalls(&checked).len(), 1, "{checked:?}");
    }

    #[test]
    fn a_failover_within_the_bound_passes_and_is_reported() {
        // Leader 1 paused at 10 s; 2 and 3 keep naming it for a second,
        // then name nobody until 2 wins at 12 s.
        let mut samples = answers(&[1, 2, 3], 0, 10, 1, Some(1));
        samples.extend(answers(&[2, 3], 10, 11, 1, Some(1)));
        samples.extend(answers(&[2, 3], 11, 12, 2, None));
        samples.extend(answers(&[2, 3], 12, 30, 2, Some(2)));
        let checked = leader_followed(&samples, 3, &[down(1, 10, 30)], BOUND);
        assert!(checked.violations.is_empty(), "{checked:?}");
        // From half a second after leader 1's last answer to 2's victory.
        let (spans, _) = leaderless_spans(&samples, 3, &[]);
        assert_eq!(spans.len(), 1, "{spans:?}");
        assert!(
            (10_350_000..=10_500_000).contains(&spans[0].from_us),
            "{spans:?}"
        );
        assert_eq!(spans[0].to_us, 12 * S, "{spans:?}");
        assert!(checked.scope.contains("s at 10."), "{}", checked.scope);
    }

    #[test]
    fn a_majority_without_a_leader_past_the_bound_fails() {
        let mut samples = answers(&[1, 2, 3], 0, 10, 1, Some(1));
        samples.extend(answers(&[2, 3], 10, 25, 2, None));
        samples.extend(answers(&[2, 3], 25, 30, 3, Some(2)));
        let checked = leader_followed(&samples, 3, &[down(1, 10, 30)], BOUND);
        assert_eq!(
            violations_naming(
                &checked,
                "no leader followed by a majority from 10.0s to 25.0s"
            ),
            1,
            "{checked:?}"
        );
    }

    #[test]
    fn an_isolated_leader_naming_itself_is_not_followed() {
        // Peer 1 keeps naming itself; 2 and 3 elect no one for 15 s.
        let mut samples = answers(&[1], 0, 30, 1, Some(1));
        samples.extend(answers(&[2, 3], 0, 10, 1, Some(1)));
        samples.extend(answers(&[2, 3], 10, 25, 2, None));
        samples.extend(answers(&[2, 3], 25, 30, 2, Some(3)));
        let checked = leader_followed(&samples, 3, &[], BOUND);
        assert_eq!(
            violations_naming(&checked, "from 10.0s to 25.0s"),
            1,
            "{checked:?}"
        );
    }

    #[test]
    fn followers_naming_a_leader_that_no_longer_answers_are_not_led() {
        // Leader 1 killed at 10 s; 2 and 3 never notice.
        let mut samples = answers(&[1, 2, 3], 0, 10, 1, Some(1));
        samples.extend(answers(&[2, 3], 10, 30, 1, Some(1)));
        let checked = leader_followed(&samples, 3, &[], BOUND);
        assert_eq!(
            violations_naming(&checked, "no leader followed by a majority from 10."),
            1,
            "{checked:?}"
        );
    }

    #[test]
    fn followers_of_different_terms_are_no_majority() {
        let mut samples = answers(&[1, 2, 3], 0, 10, 1, Some(1));
        samples.extend(answers(&[1], 10, 30, 1, Some(1)));
        samples.extend(answers(&[2], 10, 30, 2, Some(1)));
        samples.extend(answers(&[3], 10, 30, 3, None));
        let checked = leader_followed(&samples, 3, &[], BOUND);
        assert_eq!(
            violations_naming(&checked, "from 10.0s to"),
            1,
            "{checked:?}"
        );
    }

    #[test]
    fn time_with_a_majority_down_is_excused_and_the_clock_restarts_after() {
        // Two peers killed from 10 s to 40 s; a leader 3 s after they are
        // back.
        let mut samples = answers(&[1, 2, 3], 0, 10, 1, Some(1));
        samples.extend(answers(&[3], 10, 43, 1, None));
        samples.extend(answers(&[1, 2, 3], 43, 60, 2, Some(2)));
        let windows = [down(1, 10, 40), down(2, 10, 40)];
        let checked = leader_followed(&samples, 3, &windows, BOUND);
        assert!(checked.violations.is_empty(), "{checked:?}");
        let (spans, _) = leaderless_spans(&samples, 3, &windows);
        assert_eq!(spans.len(), 1, "{spans:?}");
        assert_eq!(spans[0].from_us, 40 * S, "{spans:?}");
    }

    #[test]
    fn a_peer_that_stopped_answering_does_not_count_as_following() {
        // 2 answers last at 10 s (paused, not declared); 1 and 3 disagree.
        let mut samples = answers(&[1, 2, 3], 0, 10, 1, Some(1));
        samples.extend(answers(&[1], 10, 30, 1, Some(1)));
        samples.extend(answers(&[3], 10, 30, 2, None));
        let checked = leader_followed(&samples, 3, &[], BOUND);
        assert_eq!(
            violations_naming(&checked, "no leader followed"),
            1,
            "{checked:?}"
        );
    }
}
