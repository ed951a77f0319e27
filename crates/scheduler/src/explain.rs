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
    /// JSON has string keys only: on the wire this is a list of
    /// `{reason, ..., count, text}`.
    #[serde(with = "reason_counts")]
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

mod reason_counts {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Reason;

    #[derive(Serialize, Deserialize)]
    struct Count {
        #[serde(flatten)]
        reason: Reason,
        count: u32,
        /// The reason as the one-line explanation says it.
        #[serde(default, skip_deserializing)]
        text: String,
    }

    pub fn serialize<S: Serializer>(map: &BTreeMap<Reason, u32>, s: S) -> Result<S::Ok, S::Error> {
        let list: Vec<Count> = map
            .iter()
            .map(|(reason, count)| Count {
                text: reason.to_string(),
                reason: reason.clone(),
                count: *count,
            })
            .collect();
        list.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<Reason, u32>, D::Error> {
        let list = Vec::<Count>::deserialize(d)?;
        Ok(list.into_iter().map(|c| (c.reason, c.count)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explanation_travels_as_json_with_each_reason_and_its_text() {
        let explanation = Explanation {
            profiles: vec![ProfileExplanation {
                model: "m".into(),
                profile: "p".into(),
                nodes_evaluated: 5,
                nodes_fit: 0,
                reasons: BTreeMap::from([
                    (Reason::Unreachable, 2),
                    (Reason::NotEnoughFreeGpus { free: 4, need: 8 }, 3),
                ]),
                fabric_shortfall: None,
            }],
        };
        let json = serde_json::to_value(&explanation).unwrap();
        let reasons = &json["profiles"][0]["reasons"];
        assert_eq!(reasons[0]["reason"], "unreachable");
        assert_eq!(reasons[0]["count"], 2);
        assert_eq!(reasons[1]["need"], 8);
        assert_eq!(reasons[1]["text"], "have 4 free GPUs (need 8)");
        let back: Explanation = serde_json::from_value(json).unwrap();
        assert_eq!(back, explanation);
    }
}
