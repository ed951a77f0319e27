//! How two GPUs of a node reach each other.
//!
//! One [`LinkKind`] serves the whole path of the fact: discovery reads it
//! from NVML or `nvidia-smi topo -m`, the replicated state stores it, and
//! placement ranks GPU sets by it. Its serialized names (`nvlink`, `pix`,
//! `pxb`, `phb`, `node`, `sys`) are stored in Raft logs, snapshots and
//! backups, so they never change.

use serde::{Deserialize, Serialize};

/// How two GPUs reach each other, best first: the derived order is the
/// order placement prefers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// Bonded NVLinks, directly or through NVSwitch.
    Nvlink,
    /// At most one PCIe bridge.
    Pix,
    /// Several PCIe bridges, no host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges within one NUMA node.
    Node,
    /// Across the inter-socket link (QPI/UPI), or unknown: a pair nobody
    /// reported is assumed to be this far apart.
    Sys,
}

/// One GPU-pair cell of `nvidia-smi topo -m`: its link kind and, for
/// `NV#`, the number of bonded NVLinks (0 for the PCIe kinds). `None` for
/// a token that names no link (`X`, an unknown word).
pub fn parse_topo_cell(cell: &str) -> Option<(LinkKind, u32)> {
    if let Some(count) = cell.strip_prefix("NV") {
        return count.parse().ok().map(|count| (LinkKind::Nvlink, count));
    }
    let kind = match cell {
        "PIX" => LinkKind::Pix,
        "PXB" => LinkKind::Pxb,
        "PHB" => LinkKind::Phb,
        "NODE" => LinkKind::Node,
        // Older drivers say SOC for what is now SYS.
        "SYS" | "SOC" => LinkKind::Sys,
        _ => return None,
    };
    Some((kind, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORED_NAMES: [(LinkKind, &str); 6] = [
        (LinkKind::Nvlink, "\"nvlink\""),
        (LinkKind::Pix, "\"pix\""),
        (LinkKind::Pxb, "\"pxb\""),
        (LinkKind::Phb, "\"phb\""),
        (LinkKind::Node, "\"node\""),
        (LinkKind::Sys, "\"sys\""),
    ];

    #[test]
    fn serialized_names_are_the_stored_ones() {
        for (kind, name) in STORED_NAMES {
            assert_eq!(serde_json::to_string(&kind).unwrap(), name);
            assert_eq!(serde_json::from_str::<LinkKind>(name).unwrap(), kind);
        }
    }

    #[test]
    fn order_is_best_first() {
        let kinds: Vec<LinkKind> = STORED_NAMES.iter().map(|(kind, _)| *kind).collect();
        let mut sorted = kinds.clone();
        sorted.sort();
        assert_eq!(sorted, kinds);
        assert_eq!(LinkKind::Nvlink.max(LinkKind::Phb), LinkKind::Phb);
    }

    #[test]
    fn topo_cells_parse_to_kind_and_nvlink_count() {
        assert_eq!(parse_topo_cell("NV18"), Some((LinkKind::Nvlink, 18)));
        assert_eq!(parse_topo_cell("NV4"), Some((LinkKind::Nvlink, 4)));
        assert_eq!(parse_topo_cell("PIX"), Some((LinkKind::Pix, 0)));
        assert_eq!(parse_topo_cell("PXB"), Some((LinkKind::Pxb, 0)));
        assert_eq!(parse_topo_cell("PHB"), Some((LinkKind::Phb, 0)));
        assert_eq!(parse_topo_cell("NODE"), Some((LinkKind::Node, 0)));
        assert_eq!(parse_topo_cell("SYS"), Some((LinkKind::Sys, 0)));
        assert_eq!(parse_topo_cell("SOC"), Some((LinkKind::Sys, 0)));
    }

    #[test]
    fn tokens_that_name_no_link_are_refused() {
        for token in ["X", "NV", "NVx", "pix", "", "QPI"] {
            assert_eq!(parse_topo_cell(token), None, "{token:?}");
        }
    }
}
