//! The agent stream's messages as the control plane reads them: a
//! `Register` becomes the node's facts in the replicated shape (and the
//! `RegisterNode` command when they changed), a `ShardStatus` a shard state
//! and its failure. Pure, so the fuzz targets reach it without a peer.

use std::collections::BTreeMap;

use llmgw_proto::agent as pb;
use llmgw_state::{
    Command, FabricReport, Gpu, GpuLink, HcaPort, LinkKind, NodeInventory, NodeRecord, NodeStatus,
    ShardFailure, ShardState,
};

/// What a `Register` says about the node, in the replicated shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub id: String,
    pub mgmt_addr: String,
    pub inventory: NodeInventory,
    /// Fabrics with at least one active HCA: only those can carry a
    /// multi-node replica. The rest stay visible in `fabric_reports`.
    pub fabrics: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

pub use llmgw_node_id::check_node_id;

/// The most of each thing one node may report. Far above any machine
/// (eight or sixteen GPUs, a few HCAs), and low enough that a registration
/// costs the leader nothing whatever an agent sends.
const MAX_GPUS: usize = 64;
const MAX_LINKS: usize = MAX_GPUS * (MAX_GPUS - 1) / 2;
const MAX_HCAS: usize = 128;
const MAX_FABRICS: usize = 64;
const MAX_ENGINES: usize = 16;
const MAX_LABELS: usize = 64;
const MAX_WARNINGS: usize = 64;
/// The most bytes one registration may take: a full inventory of sixteen
/// GPUs with their links, HCAs, labels and running engines is tens of kilobytes. It bounds
/// the strings (labels, names, warnings) no count does, so that a group of
/// registrations stays a modest log entry.
const MAX_REGISTER_BYTES: usize = 256 << 10;

fn check_counts(register: &pb::Register, inventory: &pb::Inventory) -> Result<(), String> {
    for (what, count, most) in [
        ("GPUs", inventory.gpus.len(), MAX_GPUS),
        ("GPU links", inventory.links.len(), MAX_LINKS),
        ("HCAs", inventory.hcas.len(), MAX_HCAS),
        ("inventory warnings", inventory.warnings.len(), MAX_WARNINGS),
        ("fabrics", register.fabrics.len(), MAX_FABRICS),
        ("engines", register.engines.len(), MAX_ENGINES),
        ("labels", register.labels.len(), MAX_LABELS),
    ] {
        if count > most {
            return Err(format!(
                "node {}: Register lists {count} {what}; a node may report at most {most}",
                register.node_id
            ));
        }
    }
    Ok(())
}

pub fn node_facts(register: &pb::Register) -> Result<NodeFacts, String> {
    check_node_id(&register.node_id)?;
    if register.mgmt_addr.trim().is_empty() {
        return Err(format!(
            "node {}: Register has no mgmt_addr, so engines on it cannot be reached",
            register.node_id
        ));
    }
    let id = &register.instance_id;
    if !(id.is_empty() || (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))) {
        return Err(format!(
            "node {}: Register's instance_id must be 32 hex digits",
            register.node_id
        ));
    }
    let inventory = register.inventory.clone().unwrap_or_default();
    check_counts(register, &inventory)?;
    let bytes = prost::Message::encoded_len(register);
    if bytes > MAX_REGISTER_BYTES {
        return Err(format!(
            "node {}: Register is {bytes} bytes; a registration may be at most 256 KiB \
             (its labels, names and warnings included)",
            register.node_id
        ));
    }
    let mut nvlink_peers: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for link in inventory
        .links
        .iter()
        .filter(|l| l.kind == pb::LinkKind::Nvlink as i32 && l.a != l.b)
    {
        nvlink_peers.entry(link.a).or_default().push(link.b);
        nvlink_peers.entry(link.b).or_default().push(link.a);
    }
    for peers in nvlink_peers.values_mut() {
        peers.sort_unstable();
        peers.dedup();
    }
    let gpus = inventory
        .gpus
        .iter()
        .map(|g| Gpu {
            index: g.index,
            model: g.name.clone(),
            memory_mb: g.memory_total_mib,
            nvlink_peers: nvlink_peers.get(&g.index).cloned().unwrap_or_default(),
            uuid: g.uuid.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
        })
        .collect();
    let links = inventory
        .links
        .iter()
        .map(|l| GpuLink {
            a: l.a,
            b: l.b,
            kind: link_kind(l.kind),
            nvlinks: l.nvlinks,
        })
        .collect();
    let hcas = inventory
        .hcas
        .iter()
        .map(|h| HcaPort {
            name: h.name.clone(),
            port: h.port,
            state: h.state.clone(),
            rate_gbps: h.rate_gbps,
            link_layer: h.link_layer.clone(),
        })
        .collect();
    let fabric_reports: Vec<FabricReport> = register
        .fabrics
        .iter()
        .map(|f| FabricReport {
            name: f.name.clone(),
            hcas: f.hcas.clone(),
            active_hcas: f.active_hcas.clone(),
            problems: f.problems.clone(),
        })
        .collect();
    let mut fabrics: Vec<String> = fabric_reports
        .iter()
        .filter(|f| !f.active_hcas.is_empty())
        .map(|f| f.name.clone())
        .collect();
    fabrics.sort();
    fabrics.dedup();
    let mut engines: Vec<String> = register.engines.iter().map(|e| e.engine.clone()).collect();
    engines.sort();
    engines.dedup();
    Ok(NodeFacts {
        id: register.node_id.clone(),
        mgmt_addr: register.mgmt_addr.trim().to_owned(),
        inventory: NodeInventory {
            hostname: inventory.hostname.clone(),
            gpus,
            engines,
            gpu_source: inventory.gpu_source.clone(),
            links,
            hcas,
            fabric_reports,
            warnings: inventory.warnings.clone(),
            agent_version: register.agent_version.clone(),
        },
        fabrics,
        labels: register
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

impl NodeFacts {
    /// Whether registering would change the replicated record; a node
    /// that reconnects unchanged costs no Raft write.
    pub fn differs_from(&self, record: Option<&NodeRecord>) -> bool {
        match record {
            None => true,
            Some(r) => {
                r.status != NodeStatus::Ready
                    || r.mgmt_addr != self.mgmt_addr
                    || r.inventory != self.inventory
                    || r.fabrics != self.fabrics
                    || r.labels != self.labels
            }
        }
    }

    pub fn into_command(self, at_ms: u64) -> Command {
        Command::RegisterNode {
            id: self.id,
            mgmt_addr: self.mgmt_addr,
            inventory: self.inventory,
            fabrics: self.fabrics,
            labels: self.labels,
            at_ms,
        }
    }
}

/// An unknown kind (a newer agent's) counts as the slowest path.
pub fn link_kind(kind: i32) -> LinkKind {
    match pb::LinkKind::try_from(kind).unwrap_or(pb::LinkKind::Unspecified) {
        pb::LinkKind::Nvlink => LinkKind::Nvlink,
        pb::LinkKind::Pix => LinkKind::Pix,
        pb::LinkKind::Pxb => LinkKind::Pxb,
        pb::LinkKind::Phb => LinkKind::Phb,
        pb::LinkKind::Node => LinkKind::Node,
        pb::LinkKind::Sys | pb::LinkKind::Unspecified => LinkKind::Sys,
    }
}

/// The replicated state an agent's shard status maps to; `None` for a
/// status that carries no state.
pub fn shard_state(state: i32) -> Option<ShardState> {
    match pb::ShardState::try_from(state).ok()? {
        pb::ShardState::Unspecified => None,
        pb::ShardState::Starting => Some(ShardState::Starting),
        pb::ShardState::Loading => Some(ShardState::Loading),
        pb::ShardState::Ready => Some(ShardState::Ready),
        pb::ShardState::Draining => Some(ShardState::Draining),
        pb::ShardState::Stopped => Some(ShardState::Stopped),
        pb::ShardState::Failed => Some(ShardState::Failed),
        pb::ShardState::Sleeping => Some(ShardState::Sleeping),
    }
}

/// What a failure keeps of the engine's output: it is replicated to every
/// peer and kept with the replica's history, so a progress bar written
/// without newlines, or an agent sending megabytes, must not put them in
/// the log. The last lines are the ones that explain a crash.
const TAIL_BYTES: usize = 64 * 1024;
const TAIL_LINE_BYTES: usize = 2048;
const MESSAGE_BYTES: usize = 4096;

/// The last lines of `tail` that fit in [`TAIL_BYTES`], each cut to
/// [`TAIL_LINE_BYTES`].
fn bounded_tail(tail: &[String]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut left = TAIL_BYTES;
    for line in tail.iter().rev() {
        let line = clip(line, TAIL_LINE_BYTES);
        if line.len() > left {
            break;
        }
        left -= line.len();
        kept.push(line);
    }
    kept.reverse();
    kept
}

/// `text` cut to about `limit` bytes on a character boundary, saying how
/// much was left out.
fn clip(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes)", &text[..end], text.len() - end)
}

/// The failure a status carries: its message with the exit code or signal,
/// and the engine's output tail, both bounded.
pub fn failure(status: &pb::ShardStatus, at_ms: u64) -> Option<ShardFailure> {
    if status.state != pb::ShardState::Failed as i32 {
        return None;
    }
    let mut message = clip(&status.message, MESSAGE_BYTES);
    if let Some(code) = status.exit_code {
        message.push_str(&format!(" (exit code {code})"));
    }
    if let Some(signal) = status.signal {
        message.push_str(&format!(" (signal {signal})"));
    }
    Some(ShardFailure {
        message,
        output_tail: bounded_tail(&status.output_tail),
        at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register() -> pb::Register {
        pb::Register {
            node_id: "gpu-a-01".into(),
            mgmt_addr: "10.0.0.11".into(),
            inventory: Some(pb::Inventory {
                gpu_source: "fixture".into(),
                gpus: (0..2)
                    .map(|index| pb::Gpu {
                        index,
                        name: "NVIDIA H100 80GB HBM3".into(),
                        memory_total_mib: 81_559,
                        ..pb::Gpu::default()
                    })
                    .collect(),
                links: vec![pb::GpuLink {
                    a: 0,
                    b: 1,
                    kind: pb::LinkKind::Nvlink as i32,
                    nvlinks: 18,
                }],
                ..pb::Inventory::default()
            }),
            fabrics: vec![
                pb::FabricStatus {
                    name: "ib-a".into(),
                    hcas: vec!["mlx5_0".into()],
                    active_hcas: vec!["mlx5_0".into()],
                    ..pb::FabricStatus::default()
                },
                pb::FabricStatus {
                    name: "ib-b".into(),
                    hcas: vec!["mlx5_1".into()],
                    problems: vec!["mlx5_1 port 1 is DOWN".into()],
                    ..pb::FabricStatus::default()
                },
            ],
            ..pb::Register::default()
        }
    }

    #[test]
    fn only_fabrics_with_an_active_hca_can_carry_replicas_but_all_are_reported() {
        let facts = node_facts(&register()).unwrap();
        assert_eq!(facts.fabrics, vec!["ib-a".to_string()]);
        assert_eq!(facts.inventory.fabric_reports.len(), 2);
        assert_eq!(
            facts.inventory.fabric_reports[1].problems,
            vec!["mlx5_1 port 1 is DOWN".to_string()]
        );
        assert_eq!(facts.inventory.gpus[0].nvlink_peers, vec![1]);
        assert_eq!(facts.inventory.links[0].kind, LinkKind::Nvlink);
    }

    #[test]
    fn an_unchanged_ready_node_needs_no_write() {
        let facts = node_facts(&register()).unwrap();
        let mut state = llmgw_state::FleetState::default();
        state.apply(&facts.clone().into_command(5));
        assert!(!facts.differs_from(state.nodes.get("gpu-a-01")));
        let mut changed = facts.clone();
        changed.labels.insert("rack".into(), "r2".into());
        assert!(changed.differs_from(state.nodes.get("gpu-a-01")));
        state.apply(&Command::SetNodeStatus {
            id: "gpu-a-01".into(),
            status: NodeStatus::Unreachable,
            based_on: None,
            at_ms: 6,
        });
        assert!(facts.differs_from(state.nodes.get("gpu-a-01")));
    }

    #[test]
    fn bad_node_ids_and_missing_addresses_are_refused_with_the_reason() {
        let mut bad = register();
        bad.node_id = "../etc".into();
        assert!(node_facts(&bad).unwrap_err().contains("not valid"));
        let mut no_addr = register();
        no_addr.mgmt_addr.clear();
        assert!(node_facts(&no_addr).unwrap_err().contains("mgmt_addr"));
        let mut long_instance = register();
        long_instance.instance_id = "x".repeat(1 << 20);
        assert!(
            node_facts(&long_instance)
                .unwrap_err()
                .contains("instance_id must be 32 hex digits")
        );
    }

    #[test]
    fn a_register_listing_more_than_any_machine_has_is_refused() {
        let mut huge = register();
        let inventory = huge.inventory.as_mut().unwrap();
        inventory.gpus = (0..100_000)
            .map(|index| pb::Gpu {
                index,
                ..pb::Gpu::default()
            })
            .collect();
        assert_eq!(
            node_facts(&huge).unwrap_err(),
            "node gpu-a-01: Register lists 100000 GPUs; a node may report at most 64"
        );
        let mut links = register();
        links.inventory.as_mut().unwrap().links = vec![pb::GpuLink::default(); 500_000];
        assert!(node_facts(&links).unwrap_err().contains("500000 GPU links"));
        // Within every count, but with labels no machine needs.
        let mut labelled = register();
        labelled.labels = (0..64)
            .map(|l| (format!("l{l}"), "x".repeat(8 << 10)))
            .collect();
        let refusal = node_facts(&labelled).unwrap_err();
        assert!(
            refusal.contains("a registration may be at most 256 KiB"),
            "{refusal}"
        );
    }

    #[test]
    fn nvlink_peers_come_from_both_ends_of_each_link() {
        let mut three = register();
        let inventory = three.inventory.as_mut().unwrap();
        inventory.gpus.push(pb::Gpu {
            index: 2,
            ..pb::Gpu::default()
        });
        inventory.links.push(pb::GpuLink {
            a: 2,
            b: 0,
            kind: pb::LinkKind::Nvlink as i32,
            nvlinks: 18,
        });
        inventory.links.push(pb::GpuLink {
            a: 1,
            b: 2,
            kind: pb::LinkKind::Pix as i32,
            nvlinks: 0,
        });
        let facts = node_facts(&three).unwrap();
        let peers: Vec<Vec<u32>> = facts
            .inventory
            .gpus
            .iter()
            .map(|g| g.nvlink_peers.clone())
            .collect();
        assert_eq!(peers, [vec![1, 2], vec![0], vec![0]]);
    }

    #[test]
    fn a_failure_keeps_the_last_lines_of_the_output_within_a_budget() {
        let status = |tail: Vec<String>, message: String| pb::ShardStatus {
            state: pb::ShardState::Failed as i32,
            message,
            output_tail: tail,
            exit_code: Some(1),
            ..pb::ShardStatus::default()
        };
        let short: Vec<String> = (0..5).map(|i| format!("line {i}")).collect();
        let kept = failure(&status(short.clone(), "crashed".into()), 1).unwrap();
        assert_eq!(kept.output_tail, short);
        assert_eq!(kept.message, "crashed (exit code 1)");

        // A progress bar without newlines, then the traceback that matters.
        let mut spew = vec!["#".repeat(1 << 20)];
        spew.extend((0..1000).map(|i| format!("Traceback line {i:04} {}", "x".repeat(100))));
        let kept = failure(&status(spew, "é".repeat(1 << 20)), 1).unwrap();
        let bytes: usize = kept.output_tail.iter().map(String::len).sum();
        assert!(bytes <= TAIL_BYTES, "{bytes}");
        assert!(
            kept.output_tail
                .last()
                .unwrap()
                .starts_with("Traceback line 0999")
        );
        assert!(
            kept.message.len() < MESSAGE_BYTES + 64,
            "{}",
            kept.message.len()
        );
        assert!(
            kept.message.ends_with("more bytes) (exit code 1)"),
            "{}",
            &kept.message[kept.message.len() - 40..]
        );
    }
}
