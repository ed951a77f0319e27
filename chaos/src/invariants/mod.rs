//! The invariants checked after every scenario, each reported by name.
//!
//! An invariant that says "never" passes on no evidence at all, so each
//! states the evidence it needs ([`Checked::needs`]): with less, it fails
//! with a violation of its own instead of passing silently.

mod agent_streams;
mod availability;
mod fleet;
mod logs;
mod raft;
mod retirement;
#[cfg(test)]
mod test_support;
mod witness;

pub use agent_streams::agents_found_the_leader;
pub use availability::{Leaderless, leader_followed, leaderless_spans, majority_down_spans};
pub use fleet::{no_gpu_twice, router_healthy};
pub use logs::{healthy_leader_kept_streams, log_time_us, no_unreachable_while_healthy};
pub use raft::{
    acknowledged_writes, leaderships_move_forward, linearizable,
    no_term_change_while_follower_paused, rejoined_after_healing, state_hashes,
};
pub use retirement::no_retirement_while_reachable;
pub use witness::{WitnessLine, no_deposed_command, parse_witness};

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
pub const FAULTS_TOOK_EFFECT: &str = "faults-took-effect";
pub const MAJORITY_FAILED_OVER: &str = "majority-failed-over";
pub const LEADER_FOLLOWED: &str = "leader-followed-by-a-majority";
pub const AGENTS_FOUND_THE_LEADER: &str = "agents-found-the-leader";

/// How every shortfall of evidence begins, whichever invariant reports it.
pub const NOT_ENOUGH_EVIDENCE: &str = "not enough evidence";

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

    /// States that the check means something only over at least `needed`
    /// of `what` and that it saw `seen`: with fewer, a violation of its
    /// own, since a "never" over nothing proves nothing.
    pub fn needs(mut self, what: &str, seen: usize, needed: usize) -> Self {
        if seen < needed {
            self.violations.push(format!(
                "{NOT_ENOUGH_EVIDENCE}: {seen} {what}, at least {needed} needed"
            ));
        }
        self
    }
}

/// The first `most` violations, and how many more there were: a fault
/// that breaks one rule many times must not bury the report.
fn first_of(violations: impl IntoIterator<Item = String>, most: usize) -> Vec<String> {
    let mut all = violations.into_iter();
    let mut shown: Vec<String> = all.by_ref().take(most).collect();
    let more = all.count();
    if more > 0 {
        shown.push(format!("... and {more} more"));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_list_of_violations_is_cut_with_a_count() {
        let many = (1..=12).map(|n| format!("v{n}"));
        let shown = first_of(many, 10);
        assert_eq!(shown.len(), 11);
        assert_eq!(shown[9], "v10");
        assert_eq!(shown[10], "... and 2 more");
        assert_eq!(first_of(vec!["one".to_owned()], 10), vec!["one"]);
    }
}
