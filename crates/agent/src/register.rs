//! The registration message: the node's whole inventory, its fabrics and
//! labels, the engines it can run, and the shards it runs now.

use llmgw_config::AgentConfig;
use llmgw_discovery::{Inventory, LinkKind};
use llmgw_proto::agent as pb;

pub fn inventory(inv: &Inventory, hostname: &str) -> pb::Inventory {
    pb::Inventory {
        gpu_source: inv.gpu_source.as_str().to_string(),
        gpus: inv
            .gpus
            .iter()
            .map(|g| pb::Gpu {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                memory_total_mib: g.memory_total_mib,
                pci_bus_id: g.pci_bus_id.clone(),
                // Discovery does not read NUMA affinity yet.
                numa_node: -1,
            })
            .collect(),
        links: inv
            .links
            .iter()
            .map(|l| pb::GpuLink {
                a: l.a,
                b: l.b,
                kind: link_kind(l.kind) as i32,
                nvlinks: l.nvlinks,
            })
            .collect(),
        hcas: inv
            .hcas
            .iter()
            .map(|h| pb::Hca {
                name: h.hca.clone(),
                port: h.port,
                state: h.state.clone(),
                rate_gbps: h.rate_gbps,
                link_layer: h.link_layer.clone(),
                netdev: String::new(),
            })
            .collect(),
        hostname: hostname.to_string(),
        warnings: inv.warnings.clone(),
    }
}

fn link_kind(kind: LinkKind) -> pb::LinkKind {
    match kind {
        LinkKind::Nvlink => pb::LinkKind::Nvlink,
        LinkKind::Pix => pb::LinkKind::Pix,
        LinkKind::Pxb => pb::LinkKind::Pxb,
        LinkKind::Phb => pb::LinkKind::Phb,
        LinkKind::Node => pb::LinkKind::Node,
        LinkKind::Sys => pb::LinkKind::Sys,
    }
}

pub fn fabrics(inv: &Inventory) -> Vec<pb::FabricStatus> {
    inv.fabrics
        .iter()
        .map(|f| pb::FabricStatus {
            name: f.name.clone(),
            hcas: f.hcas.clone(),
            rate_gbps: f.rate_gbps.unwrap_or(0),
            active_hcas: f.active_hcas.clone(),
            problems: f.problems.clone(),
        })
        .collect()
}

pub fn engines(config: &AgentConfig) -> Vec<pb::EngineAvailable> {
    let mut out = Vec::new();
    if let Some(v) = &config.engines.vllm {
        out.push(pb::EngineAvailable {
            engine: "vllm".into(),
            version: v.version.to_string(),
            launch_mode: v.launch_mode.as_str().into(),
        });
    }
    if let Some(s) = &config.engines.sglang {
        out.push(pb::EngineAvailable {
            engine: "sglang".into(),
            version: s.version.to_string(),
            launch_mode: String::new(),
        });
    }
    out
}

/// The whole `Register` message.
pub fn register(
    config: &AgentConfig,
    inv: &Inventory,
    running: Vec<pb::RunningShard>,
    fencing: &crate::fencing::TermStore,
    instance_id: &str,
) -> pb::Register {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    pb::Register {
        node_id: config.node_id.clone(),
        inventory: Some(inventory(inv, &hostname)),
        fabrics: fabrics(inv),
        labels: config.labels.clone().into_iter().collect(),
        engines: engines(config),
        mgmt_addr: config.mgmt_addr.clone(),
        mgmt_interface: config.mgmt_interface.clone().unwrap_or_default(),
        running,
        highest_term: fencing.highest().term,
        highest_epoch: fencing.highest().epoch,
        cluster_id: fencing.cluster().unwrap_or_default().to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        instance_id: instance_id.to_owned(),
    }
}
