//! Nodes: registration, liveness verdicts, cordons and drains.

use std::collections::BTreeMap;

use crate::command::{Outcome, Rejection};
use crate::types::{Drain, FleetState, NodeInventory, NodeRecord, NodeStatus};

use super::unknown_node;

impl FleetState {
    /// A new node, or new facts about a known one.
    pub(super) fn register_node(
        &mut self,
        id: &str,
        mgmt_addr: &str,
        inventory: &NodeInventory,
        fabrics: &[String],
        labels: &BTreeMap<String, String>,
        at_ms: u64,
    ) -> Outcome {
        if id.is_empty() {
            return Rejection::invalid("node id must not be empty");
        }
        match self.nodes.get_mut(id) {
            Some(node) => {
                mgmt_addr.clone_into(&mut node.mgmt_addr);
                node.inventory.clone_from(inventory);
                node.fabrics = fabrics.to_vec();
                node.labels.clone_from(labels);
                // A registration is news even when the node was
                // already ready: it outdates verdicts judged before it.
                if node.status != NodeStatus::Ready {
                    node.status = NodeStatus::Ready;
                    node.status_changed_at_ms = at_ms;
                }
                node.status_version += 1;
            }
            None => {
                self.nodes.insert(
                    id.to_owned(),
                    NodeRecord {
                        id: id.to_owned(),
                        mgmt_addr: mgmt_addr.to_owned(),
                        inventory: inventory.clone(),
                        fabrics: fabrics.to_vec(),
                        labels: labels.clone(),
                        status: NodeStatus::Ready,
                        cordoned: false,
                        draining: false,
                        registered_at_ms: at_ms,
                        status_changed_at_ms: at_ms,
                        status_version: 1,
                    },
                );
            }
        }
        Outcome::Applied
    }

    /// A liveness transition, refused when judged from an old view.
    pub(super) fn set_node_status(
        &mut self,
        id: &str,
        status: NodeStatus,
        based_on: Option<u64>,
        at_ms: u64,
    ) -> Outcome {
        let Some(node) = self.nodes.get_mut(id) else {
            return unknown_node(id);
        };
        if let Some(version) = based_on
            && version != node.status_version
        {
            return Rejection::conflict(format!(
                "node {id}: {} was judged from status version {version}, \
                 but the node is at version {} ({}) now",
                status.as_str(),
                node.status_version,
                node.status.as_str()
            ));
        }
        set_status(node, status, at_ms);
        Outcome::Applied
    }

    pub(super) fn cordon(&mut self, id: &str) -> Outcome {
        let Some(node) = self.nodes.get_mut(id) else {
            return unknown_node(id);
        };
        node.cordoned = true;
        Outcome::Applied
    }

    /// Refused while the node drains.
    pub(super) fn uncordon(&mut self, id: &str) -> Outcome {
        let Some(node) = self.nodes.get_mut(id) else {
            return unknown_node(id);
        };
        if node.draining {
            return Rejection::conflict(format!(
                "node {id} is draining; it stays cordoned until the drain finishes"
            ));
        }
        node.cordoned = false;
        Outcome::Applied
    }

    pub(super) fn start_drain(&mut self, id: &str, deadline_ms: u64, at_ms: u64) -> Outcome {
        let Some(node) = self.nodes.get_mut(id) else {
            return unknown_node(id);
        };
        if let Some(drain) = self.drains.get(id) {
            return Rejection::conflict(format!(
                "node {id} is already draining (since {} ms)",
                drain.started_at_ms
            ));
        }
        node.cordoned = true;
        node.draining = true;
        self.drains.insert(
            id.to_owned(),
            Drain {
                node: id.to_owned(),
                started_at_ms: at_ms,
                deadline_ms,
            },
        );
        Outcome::Applied
    }

    pub(super) fn finish_drain(&mut self, id: &str) -> Outcome {
        if self.drains.remove(id).is_none() {
            return Rejection::not_found(format!("node {id} has no drain in progress"));
        }
        if let Some(node) = self.nodes.get_mut(id) {
            node.draining = false;
        }
        Outcome::Applied
    }
}

fn set_status(node: &mut NodeRecord, status: NodeStatus, at_ms: u64) {
    if node.status != status {
        node.status = status;
        node.status_changed_at_ms = at_ms;
        node.status_version += 1;
    }
}
