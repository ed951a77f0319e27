//! Which cluster this is, and which epoch of it.
//!
//! A cluster id is made once, when the cluster is formed. An epoch starts
//! when a cluster is formed and again each time one is restored from a
//! backup: a restored cluster's Raft terms restart from the backup's, so
//! agents, which refuse commands from any leadership below the highest
//! they obeyed, compare (epoch, term, leader) and take a new epoch as newer
//! than anything of the old one.
//!
//! An epoch is a leader's wall clock in milliseconds when it began, and at
//! least one past the epoch before: it needs no memory of earlier epochs
//! (a cluster re-formed from nothing under the same id still starts one
//! above the old), and it is decided once, by a leader, in the log, so
//! every peer holds the same.

use serde::{Deserialize, Serialize};

use llmgw_node_id::check_cluster_id;

use crate::command::{Outcome, Rejection};
use crate::types::FleetState;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIdentity {
    /// Made when the cluster was formed (or configured as `cluster_id`).
    pub id: String,
    /// The epoch the cluster is in; 0 while a restored cluster has not
    /// begun its own yet.
    pub epoch: u64,
    /// Set by a restore: the next leader begins a new epoch before it
    /// talks to any agent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_epoch_due: bool,
}

impl ClusterIdentity {
    /// Whether agents may be commanded under this identity.
    pub fn settled(&self) -> bool {
        self.epoch > 0 && !self.new_epoch_due
    }
}

impl FleetState {
    /// Whether the leader must begin an epoch before commanding agents: a
    /// cluster that has none yet (new, or formed before epochs) or one just
    /// restored.
    pub fn epoch_due(&self) -> bool {
        self.cluster.as_ref().is_none_or(|c| !c.settled())
    }

    /// The epoch agents are commanded under, once begun.
    pub fn settled_epoch(&self) -> Option<(&str, u64)> {
        self.cluster
            .as_ref()
            .filter(|c| c.settled())
            .map(|c| (c.id.as_str(), c.epoch))
    }

    /// The epoch a leader whose clock reads `now_ms` begins: its clock, and
    /// at least one past the current.
    pub fn next_epoch(&self, now_ms: u64) -> u64 {
        let current = self.cluster.as_ref().map_or(0, |c| c.epoch);
        now_ms.max(current + 1)
    }

    pub(crate) fn begin_epoch(&mut self, cluster_id: &str, epoch: u64) -> Outcome {
        if let Err(why) = check_cluster_id(cluster_id) {
            return Rejection::invalid(why);
        }
        match &mut self.cluster {
            None => {
                self.cluster = Some(ClusterIdentity {
                    id: cluster_id.to_owned(),
                    epoch,
                    new_epoch_due: false,
                });
                Outcome::Applied
            }
            Some(current) if current.id != cluster_id => {
                Rejection::conflict(format!("this is cluster {}, not {cluster_id}", current.id))
            }
            Some(current) if !current.new_epoch_due => Rejection::conflict(format!(
                "cluster {} is in epoch {} already, and no restore asked for another",
                current.id, current.epoch
            )),
            Some(current) if epoch <= current.epoch => Rejection::invalid(format!(
                "epoch {epoch} is not past epoch {} of cluster {}",
                current.epoch, current.id
            )),
            Some(current) => {
                current.epoch = epoch;
                current.new_epoch_due = false;
                Outcome::Applied
            }
        }
    }

    /// What a restore writes: the backup's identity (or `fallback_id` for a
    /// backup from before identities), its epoch kept until the restored
    /// cluster's first leader begins the next.
    pub fn restored(mut self, fallback_id: &str) -> FleetState {
        let identity = self.cluster.take().unwrap_or(ClusterIdentity {
            id: fallback_id.to_owned(),
            epoch: 0,
            new_epoch_due: false,
        });
        self.cluster = Some(ClusterIdentity {
            new_epoch_due: true,
            ..identity
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;

    fn begin(state: &mut FleetState, id: &str, epoch: u64) -> Outcome {
        state.apply(&Command::BeginEpoch {
            cluster_id: id.to_owned(),
            epoch,
            at_ms: epoch,
        })
    }

    #[test]
    fn a_new_cluster_begins_one_epoch_and_a_second_is_refused() {
        let mut state = FleetState::default();
        assert!(state.epoch_due());
        assert_eq!(begin(&mut state, "prod-a", 1_000), Outcome::Applied);
        assert_eq!(state.settled_epoch(), Some(("prod-a", 1_000)));
        assert!(!state.epoch_due());
        assert!(matches!(
            begin(&mut state, "prod-a", 2_000),
            Outcome::Rejected(_)
        ));
        assert!(matches!(
            begin(&mut state, "prod-b", 3_000),
            Outcome::Rejected(_)
        ));
        assert_eq!(state.settled_epoch(), Some(("prod-a", 1_000)));
    }

    #[test]
    fn a_restored_state_waits_for_a_later_epoch_of_its_own_cluster() {
        let mut state = FleetState::default();
        begin(&mut state, "prod-a", 5_000);
        let mut restored = state.clone().restored("unused");
        assert!(restored.epoch_due());
        assert_eq!(restored.settled_epoch(), None);
        assert_eq!(
            restored.next_epoch(4_000),
            5_001,
            "a clock behind the epoch"
        );
        assert_eq!(restored.next_epoch(9_000), 9_000);
        assert!(matches!(
            begin(&mut restored, "prod-a", 5_000),
            Outcome::Rejected(_)
        ));
        assert!(matches!(
            begin(&mut restored, "prod-b", 9_000),
            Outcome::Rejected(_)
        ));
        assert_eq!(begin(&mut restored, "prod-a", 9_000), Outcome::Applied);
        assert_eq!(restored.settled_epoch(), Some(("prod-a", 9_000)));
    }

    #[test]
    fn a_backup_from_before_identities_is_restored_under_the_fallback_id() {
        let restored = FleetState::default().restored("b4c0ffee");
        let identity = restored.cluster.as_ref().unwrap();
        assert_eq!(identity.id, "b4c0ffee");
        assert!(restored.epoch_due());
    }
}
