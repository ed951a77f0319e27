//! Forming the cluster exactly once.
//!
//! The rule: only a peer configured with `initial_cluster_state: new`, only
//! the one with the lowest configured id, only when its own store was empty
//! at start, and only after every other configured peer has answered that
//! it holds no cluster either. A restart finds a non-empty store and never
//! initialises again; a peer whose data was wiped finds peers that report a
//! cluster and waits to be replicated to; and with `existing` (the default)
//! a peer never initialises at all, so even wiping every peer's data cannot
//! turn an existing cluster into a new, empty one.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::control::ControlPlane;

impl ControlPlane {
    /// Runs the bootstrap rule; returns once this peer has either
    /// initialised the cluster or knows it must not. Call it after the gRPC
    /// listener is up, because the other peers ask this one the same
    /// question. Returns whether this peer formed the cluster.
    pub async fn bootstrap(&self) -> bool {
        let configured = self.configured_peers().clone();
        let lowest = configured.keys().next().copied();
        if !self.store_was_pristine() {
            tracing::info!("store holds Raft state; rejoining the cluster without bootstrap");
            return false;
        }
        if !self.settings().form_new_cluster {
            tracing::warn!(
                "the store is empty and initial_cluster_state is `existing`: this peer never \
                 forms a cluster; it waits for a leader to replicate to it (a member whose \
                 data was lost, or one added with `llmgw ctl cluster add`). To form a new \
                 cluster, set `initial_cluster_state: new` on every peer for the first start; \
                 to bring back a lost cluster, use `llmgw server restore`"
            );
            return false;
        }
        if lowest != Some(self.id()) {
            tracing::info!(
                initialiser = ?lowest,
                "empty store; waiting for the lowest-id peer to form the cluster"
            );
            return false;
        }
        let mut waiting_logged = BTreeSet::new();
        loop {
            if self.metrics().current_leader.is_some() {
                tracing::info!("a leader exists already; not bootstrapping");
                return false;
            }
            let mut missing = Vec::new();
            let mut initialised_elsewhere = None;
            for (id, node) in &configured {
                if *id == self.id() {
                    continue;
                }
                match self.remote_status(node).await {
                    Ok(status) if status.initialized => initialised_elsewhere = Some(*id),
                    Ok(_) => {}
                    Err(why) => missing.push(format!("{id} ({why})")),
                }
            }
            if let Some(id) = initialised_elsewhere {
                tracing::info!(
                    peer = id,
                    "peer reports an existing cluster; not bootstrapping"
                );
                return false;
            }
            if missing.is_empty() {
                let members = configured.clone();
                return match self.raft().initialize(members).await {
                    Ok(()) => {
                        tracing::info!(peers = ?configured.keys().collect::<Vec<_>>(), "cluster initialised");
                        true
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cluster initialisation refused");
                        false
                    }
                };
            }
            let key = missing.join(", ");
            if waiting_logged.insert(key.clone()) {
                tracing::info!(
                    missing = %key,
                    "bootstrap waits until every configured peer answers"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
