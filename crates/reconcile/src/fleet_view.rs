//! The scheduler's view of the replicated fleet.

use std::collections::{HashMap, HashSet};

use llmgw_scheduler::{GpuView, LinkView, NodeHealth, NodeView};
use llmgw_state::{FleetState, LinkKind, NodeRecord, NodeStatus};

/// `(node, gpu)` pairs held by a shard that is not stopped.
pub fn held_gpus(fleet: &FleetState) -> HashSet<(String, u32)> {
    let mut held = HashSet::new();
    for replica in fleet.replicas.values() {
        for shard in &replica.shards {
            if shard.state != llmgw_state::ShardState::Stopped {
                for gpu in &shard.gpus {
                    held.insert((shard.node.clone(), *gpu));
                }
            }
        }
    }
    held
}

pub fn node_views(fleet: &FleetState) -> Vec<NodeView> {
    let held = held_gpus(fleet);
    fleet.nodes.values().map(|n| node_view(n, &held)).collect()
}

/// Marks GPUs held by processes that outlived SIGKILL as taken.
pub fn take_survivor_gpus(views: &mut [NodeView], survivors: &HashMap<String, Vec<u32>>) {
    if survivors.is_empty() {
        return;
    }
    for view in views {
        let Some(held) = survivors.get(&view.id) else {
            continue;
        };
        for gpu in &mut view.gpus {
            if held.contains(&gpu.index) {
                gpu.free = false;
            }
        }
    }
}

fn node_view(node: &NodeRecord, held: &HashSet<(String, u32)>) -> NodeView {
    let gpus = node
        .inventory
        .gpus
        .iter()
        .map(|g| GpuView {
            index: g.index,
            name: g.model.clone(),
            memory_mib: g.memory_mb,
            free: !held.contains(&(node.id.clone(), g.index)),
        })
        .collect();
    let links = if node.inventory.links.is_empty() {
        // Older agents reported NVLink peers only; every other pair is
        // assumed to cross the system interconnect.
        node.inventory
            .gpus
            .iter()
            .flat_map(|g| {
                g.nvlink_peers
                    .iter()
                    .filter(move |peer| **peer > g.index)
                    .map(move |peer| LinkView {
                        a: g.index,
                        b: *peer,
                        kind: LinkKind::Nvlink,
                        nvlinks: 1,
                    })
            })
            .collect()
    } else {
        node.inventory
            .links
            .iter()
            .map(|l| LinkView {
                a: l.a,
                b: l.b,
                kind: l.kind,
                nvlinks: l.nvlinks,
            })
            .collect()
    };
    NodeView {
        id: node.id.clone(),
        health: match node.status {
            NodeStatus::Ready => NodeHealth::Ready,
            NodeStatus::Unreachable => NodeHealth::Unreachable,
            NodeStatus::Lost => NodeHealth::Lost,
        },
        cordoned: node.cordoned,
        draining: node.draining,
        labels: node.labels.clone(),
        gpus,
        links,
        fabrics: node.fabrics.clone(),
    }
}
