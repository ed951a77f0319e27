//! When a peer that Raft calls leader may act on the fleet: a majority
//! answered it within the leader lease, and it has applied its own first
//! entry (so everything earlier leaders committed) and everything its log
//! held when the peer started (a leadership resumed after a restart).

use std::time::Duration;

use llmgw_store::TypeConfig;
use openraft::{Instant as _, RaftMetrics};

/// `None` while the leader's quorum lease is live (or it is the only
/// voter); otherwise how long ago a majority last acknowledged it, itself
/// `None` when no majority has acknowledged it yet.
fn lease_lapse(metrics: &RaftMetrics<TypeConfig>, lease: Duration) -> Option<Option<Duration>> {
    if metrics.membership_config.membership().voter_ids().count() <= 1 {
        return None;
    }
    match metrics.last_quorum_acked.as_deref() {
        Some(acked) => {
            let age = acked.elapsed();
            (age >= lease).then_some(Some(age))
        }
        None => Some(None),
    }
}

/// Why a peer that Raft calls leader does not act on the fleet yet, or
/// any more.
pub(crate) enum InactiveLeader {
    /// A majority answered it once, but not within the last lease: it may
    /// be cut off, and another peer may lead already.
    LeaseLapsed {
        peer: u64,
        term: u64,
        age: Duration,
        lease: Duration,
    },
    /// Elected, and no majority has answered its first heartbeat yet.
    NotYetAcknowledged {
        peer: u64,
        term: u64,
        lease: Duration,
    },
    /// It has not applied its own first entry, so not everything earlier
    /// leaders committed either; or, resumed after a restart, not yet
    /// everything its log held then (`up_to`).
    CatchingUp {
        peer: u64,
        term: u64,
        applied: Option<u64>,
        up_to: Option<u64>,
    },
}

impl InactiveLeader {
    /// Why `peer`, the leader these metrics describe, may not act yet;
    /// `None` when it may.
    pub(crate) fn of(
        peer: u64,
        metrics: &RaftMetrics<TypeConfig>,
        lease: Duration,
        log_at_start: Option<(u64, u64)>,
    ) -> Option<InactiveLeader> {
        let term = metrics.current_term;
        if let Some(lapse) = lease_lapse(metrics, lease) {
            return Some(match lapse {
                Some(age) => InactiveLeader::LeaseLapsed {
                    peer,
                    term,
                    age,
                    lease,
                },
                None => InactiveLeader::NotYetAcknowledged { peer, term, lease },
            });
        }
        // The first entry of a term is the new leader's own; once it is
        // applied, so is everything committed before the term. A leader
        // openraft restores in its own term after a restart appends no new
        // first entry, and restarts from a committed index a power cut may
        // have set back (it is written without sync): its applied entry is
        // its own, yet entries it had committed since are not applied
        // again until it learns they committed. What its log held at start
        // bounds them.
        // Only in that term: a later term's first entry comes after all of
        // them, and a log truncated since may never grow that long again.
        let up_to = log_at_start
            .filter(|(started_in, _)| *started_in == term)
            .map(|(_, held)| held);
        let caught_up = metrics.last_applied.as_ref().is_some_and(|applied| {
            let by = applied.committed_leader_id();
            by.term == term && by.node_id == peer && up_to.is_none_or(|held| applied.index >= held)
        });
        (!caught_up).then(|| InactiveLeader::CatchingUp {
            peer,
            term,
            applied: metrics.last_applied.as_ref().map(|l| l.index),
            up_to,
        })
    }

    /// Whether this is a leader settling into its term, which a request
    /// may wait out, rather than one that lost its majority.
    pub(crate) fn settling(&self) -> bool {
        !matches!(self, InactiveLeader::LeaseLapsed { .. })
    }
}

impl std::fmt::Display for InactiveLeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InactiveLeader::LeaseLapsed {
                peer,
                term,
                age,
                lease,
            } => write!(
                f,
                "peer {peer} leads term {term} but no majority of peers has answered it for \
                 {:.1}s (lease {lease:?}); it acts on nothing until a majority answers or \
                 another peer is elected",
                age.as_secs_f64()
            ),
            InactiveLeader::NotYetAcknowledged { peer, term, lease } => write!(
                f,
                "peer {peer} leads term {term} but no majority of peers has answered it since \
                 it was elected (lease {lease:?}); it acts on nothing until a majority answers \
                 or another peer is elected"
            ),
            InactiveLeader::CatchingUp {
                peer,
                term,
                applied,
                up_to,
            } => {
                write!(
                    f,
                    "peer {peer} leads term {term} but is still applying what earlier leaders \
                     committed (applied up to {applied:?}"
                )?;
                match up_to {
                    Some(held) => write!(f, "; its log held entry {held} when it started)"),
                    None => f.write_str(")"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmgw_store::LogId;

    fn by(term: u64, node_id: u64, index: u64) -> LogId {
        LogId::new(
            openraft::impls::leader_id_adv::LeaderId { term, node_id },
            index,
        )
    }

    /// A single-voter view (no lease to check) of peer 1 leading term 5,
    /// having applied `applied`.
    fn leading(applied: LogId) -> RaftMetrics<TypeConfig> {
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.current_term = 5;
        metrics.last_applied = Some(applied);
        metrics
    }

    #[test]
    fn a_leader_resumed_after_a_restart_waits_until_it_applied_what_its_log_held() {
        let lease = Duration::from_millis(450);
        const STARTED: Option<(u64, u64)> = Some((5, 120));
        // Its own entry applied, but the committed index it restarted from
        // was set back: entries 111..=120, committed before, not yet.
        let behind = leading(by(5, 1, 110));
        let inactive = InactiveLeader::of(1, &behind, lease, STARTED);
        assert!(
            matches!(
                inactive,
                Some(InactiveLeader::CatchingUp {
                    up_to: Some(120),
                    ..
                })
            ),
            "acts on a view missing committed entries"
        );
        assert!(
            inactive
                .unwrap()
                .to_string()
                .contains("entry 120 when it started")
        );
        assert!(InactiveLeader::of(1, &leading(by(5, 1, 120)), lease, STARTED).is_none());
        // Applied past what it held at start.
        assert!(InactiveLeader::of(1, &leading(by(5, 1, 121)), lease, STARTED).is_none());
        // Not its own entry: earlier leaders' entries may be unapplied.
        assert!(InactiveLeader::of(1, &leading(by(4, 2, 130)), lease, STARTED).is_some());
        // Leading a later term than the one it resumed: its own first
        // entry of that term is enough.
        assert!(InactiveLeader::of(1, &leading(by(5, 1, 110)), lease, Some((3, 120))).is_none());
    }
}
