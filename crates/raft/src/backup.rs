//! A consistent backup of the replicated state (`llmgw ctl snapshot save`).

use llmgw_store::{BACKUP_FORMAT, Backup};

use crate::control::{ControlPlane, now_ms};
use crate::error::ControlError;

impl ControlPlane {
    /// The applied state after a read-index barrier: it holds every write
    /// acknowledged before the call, and is copied under the state lock, so
    /// index, membership and fleet belong together.
    pub async fn backup(&self) -> Result<Backup, ControlError> {
        self.linearizable_barrier().await?;
        let applied = self.applied_state();
        let applied = applied.read().expect("state lock poisoned");
        let last_log_id = applied.last_applied.ok_or_else(|| {
            ControlError::NoLeader("nothing has been applied yet; there is nothing to save".into())
        })?;
        Ok(Backup {
            format: BACKUP_FORMAT.to_owned(),
            last_log_id,
            state_hash: applied.fleet.hash().to_string(),
            saved_at_ms: now_ms(),
            saved_on_peer: self.id(),
            membership: applied.membership.clone(),
            fleet: applied.fleet.clone(),
        })
    }
}
