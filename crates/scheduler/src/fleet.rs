//! The scheduler's view of the fleet and of a request. The server builds
//! these from its replicated state; the scheduler sees nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use llmgw_topology::LinkKind;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeHealth {
    Ready,
    Unreachable,
    Lost,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub name: String,
    pub memory_mib: u64,
    /// Not assigned to any shard.
    pub free: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkView {
    pub a: u32,
    pub b: u32,
    pub kind: LinkKind,
    pub nvlinks: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub id: String,
    pub health: NodeHealth,
    pub cordoned: bool,
    pub draining: bool,
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<GpuView>,
    pub links: Vec<LinkView>,
    /// Fabrics this node is on with at least one HCA up. A node with none is
    /// its own island: it never hosts a multi-node shard.
    pub fabrics: Vec<String>,
}

impl NodeView {
    pub fn rack(&self) -> Option<&str> {
        self.labels.get("rack").map(String::as_str)
    }

    /// How GPUs `a` and `b` reach each other and over how many NVLinks; an
    /// unreported pair is assumed to cross the system interconnect.
    pub(crate) fn link(&self, a: u32, b: u32) -> (LinkKind, u32) {
        self.links
            .iter()
            .find(|l| (l.a == a && l.b == b) || (l.a == b && l.b == a))
            .map_or((LinkKind::Sys, 0), |l| (l.kind, l.nvlinks))
    }
}

/// Binpack fills nodes before starting new ones (keeps whole nodes free for
/// large models); spread balances load and failure domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    #[default]
    Spread,
    Binpack,
}

/// Where the other replicas of the same model already are, so a new one
/// spreads across nodes and racks.
///
/// Looked up for every candidate node of every placement, so these are hash
/// maps; nothing iterates them, so their order cannot leak into a decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Siblings {
    pub nodes: HashMap<String, u32>,
    pub racks: HashMap<String, u32>,
}

impl Siblings {
    pub fn add(&mut self, node: &NodeView) {
        self.add_on(&node.id, node.rack());
    }

    /// One more replica on node `id`, in `rack` if it has one.
    pub fn add_on(&mut self, id: &str, rack: Option<&str>) {
        *self.nodes.entry(id.to_owned()).or_default() += 1;
        if let Some(rack) = rack {
            *self.racks.entry(rack.to_owned()).or_default() += 1;
        }
    }
}

#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub model: &'a str,
    /// Tried in order; the first that fits wins.
    pub profiles: &'a [llmgw_catalog::Profile],
    pub siblings: Siblings,
    /// Nodes this replica failed on repeatedly; placed elsewhere if possible.
    pub avoid: BTreeSet<String>,
    pub strategy: Strategy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPlacement {
    pub node: String,
    pub rank: u32,
    pub gpus: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub profile: String,
    pub fabric: Option<String>,
    /// Rank 0 first.
    pub shards: Vec<ShardPlacement>,
}
