//! When a peer that Raft calls leader may act on the fleet: a majority
//! answered it within the leader lease, and it has applied its own first
//! entry (so everything earlier leaders committed).

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
    /// leaders committed either.
    CatchingUp {
        peer: u64,
        term: u64,
        applied: Option<u64>,
    },
}

impl InactiveLeader {
    /// Why `peer`, the leader these metrics describe, may not act yet;
    /// `None` when it may.
    pub(crate) fn of(
        peer: u64,
        metrics: &RaftMetrics<TypeConfig>,
        lease: Duration,
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
        // applied, so is everything committed before the term.
        let caught_up = metrics.last_applied.as_ref().is_some_and(|applied| {
            let by = applied.committed_leader_id();
            by.term == term && by.node_id == peer
        });
        (!caught_up).then(|| InactiveLeader::CatchingUp {
            peer,
            term,
            applied: metrics.last_applied.as_ref().map(|l| l.index),
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
            } => write!(
                f,
                "peer {peer} leads term {term} but is still applying what earlier leaders \
                 committed (applied up to {applied:?})"
            ),
        }
    }
}
