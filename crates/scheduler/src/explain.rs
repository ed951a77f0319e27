//! Why nothing fits, in the form operators know: nodes evaluated and a count
//! per reason, e.g. `0/12 nodes fit llama-70b profile tp8x2: 4 unreachable,
//! 3 draining, 2 have 4 free GPUs (need 8), no fabric has 2 nodes with 8
//! free GPUs (ib-a: 1, ib-b: 1)`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Why one node cannot host a shard. Every evaluated node gets exactly one
/// reason (the first check it fails), so the counts add up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Reason {
    Lost,
    Unreachable,
    Draining,
    Cordoned,
    /// Multi-node profiles only.
    NoFabric,
    Avoided,
    WrongGpuModel,
    GpuMemoryTooSmall {
        need_gb: u32,
    },
    NotEnoughFreeGpus {
        free: u32,
        need: u32,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Lost => f.write_str("lost"),
            Reason::Unreachable => f.write_str("unreachable"),
            Reason::Draining => f.write_str("draining"),
            Reason::Cordoned => f.write_str("cordoned"),
            Reason::NoFabric => f.write_str("on no fabric"),
            Reason::Avoided => f.write_str("avoided after repeated failures"),
            Reason::WrongGpuModel => f.write_str("have no allowed GPU model"),
            Reason::GpuMemoryTooSmall { need_gb } => write!(f, "have GPUs under {need_gb} GB"),
            Reason::NotEnoughFreeGpus { free, need } => {
                write!(f, "have {free} free GPUs (need {need})")
            }
        }
    }
}

/// One profile's evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileExplanation {
    pub model: String,
    pub profile: String,
    pub nodes_evaluated: u32,
    /// Nodes that could host one shard of this profile.
    pub nodes_fit: u32,
    pub reasons: BTreeMap<Reason, u32>,
    /// Multi-node: per fabric, how many nodes could host a shard, when no
    /// fabric had enough.
    pub fabric_shortfall: Option<FabricShortfall>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricShortfall {
    pub nodes_needed: u32,
    pub gpus_per_node: u32,
    pub fitting_nodes_by_fabric: BTreeMap<String, u32>,
}

/// Every profile tried, in order, and why each failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub profiles: Vec<ProfileExplanation>,
}

impl ProfileExplanation {
    /// The counts account for every evaluated node.
    pub fn accounted_nodes(&self) -> u32 {
        self.nodes_fit + self.reasons.values().sum::<u32>()
    }
}

impl fmt::Display for ProfileExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A multi-node profile whose nodes fit individually still placed
        // nothing, so the headline counts nodes that fit *the replica*.
        let fit = if self.fabric_shortfall.is_some() {
            0
        } else {
            self.nodes_fit
        };
        write!(
            f,
            "{fit}/{} nodes fit {} profile {}",
            self.nodes_evaluated, self.model, self.profile
        )?;
        let mut parts: Vec<String> = self
            .reasons
            .iter()
            .map(|(reason, n)| format!("{n} {reason}"))
            .collect();
        if let Some(short) = &self.fabric_shortfall {
            let per_fabric: Vec<String> = short
                .fitting_nodes_by_fabric
                .iter()
                .map(|(name, n)| format!("{name}: {n}"))
                .collect();
            let detail = if per_fabric.is_empty() {
                String::new()
            } else {
                format!(" ({})", per_fabric.join(", "))
            };
            parts.push(format!(
                "no fabric has {} nodes with {} free GPUs{detail}",
                short.nodes_needed, short.gpus_per_node
            ));
        }
        if self.nodes_evaluated == 0 {
            parts.push("no nodes registered".to_string());
        }
        if !parts.is_empty() {
            write!(f, ": {}", parts.join(", "))?;
        }
        Ok(())
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.profiles.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("; "))
    }
}
