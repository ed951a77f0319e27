//! GPUs and their links through NVML. nvml-wrapper loads `libnvidia-ml.so.1`
//! at run time, so on a machine without the driver `discover` returns an
//! error and the caller falls back to `nvidia-smi`.

use llmgw_topology::LinkKind;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::error::NvmlError;

use crate::inventory::{Gpu, GpuLink, normalize_bus_id};

/// NVML's upper bound on NVLinks per GPU.
const MAX_NVLINKS: u32 = 18;

pub fn discover() -> Result<(Vec<Gpu>, Vec<GpuLink>), NvmlError> {
    let nvml = Nvml::init()?;
    let count = nvml.device_count()?;
    let mut gpus = Vec::new();
    // Remote PCI bus ids of each GPU's active NVLinks.
    let mut remotes: Vec<Vec<String>> = Vec::new();
    for index in 0..count {
        let device = nvml.device_by_index(index)?;
        let pci = device.pci_info()?;
        gpus.push(Gpu {
            index,
            uuid: device.uuid()?,
            name: device.name()?,
            memory_total_mib: device.memory_info()?.total / (1024 * 1024),
            pci_bus_id: normalize_bus_id(&pci.bus_id),
        });
        let mut links = Vec::new();
        for link in 0..MAX_NVLINKS {
            let wrapper = device.link_wrapper_for(link);
            // GPUs without a given link answer InvalidArg or NotSupported.
            if wrapper.is_active().unwrap_or(false)
                && let Ok(remote) = wrapper.remote_pci_info()
            {
                links.push(normalize_bus_id(&remote.bus_id));
            }
        }
        remotes.push(links);
    }
    let mut links = Vec::new();
    for (a, a_remotes) in remotes.iter().enumerate() {
        for (b, gpu_b) in gpus.iter().enumerate().skip(a + 1) {
            let direct = a_remotes.iter().filter(|r| **r == gpu_b.pci_bus_id).count() as u32;
            let (kind, nvlinks) = if direct > 0 {
                (LinkKind::Nvlink, direct)
            } else {
                let da = nvml.device_by_index(a as u32)?;
                let db = nvml.device_by_index(b as u32)?;
                // Through NVSwitch the links end at the switch, not at the
                // peer GPU; NVML's P2P status then says whether NVLink is
                // the path, and every active link carries the traffic.
                let via_switch = !a_remotes.is_empty()
                    && matches!(
                        da.p2p_status(&db, P2pCapabilitiesIndex::NvLink),
                        Ok(P2pStatus::Ok)
                    );
                if via_switch {
                    (LinkKind::Nvlink, a_remotes.len() as u32)
                } else {
                    (pcie_kind(nvml.topology_common_ancestor(&da, &db)?), 0)
                }
            };
            links.push(GpuLink {
                a: a as u32,
                b: b as u32,
                kind,
                nvlinks,
            });
        }
    }
    Ok((gpus, links))
}

/// NVML's common-ancestor levels in `nvidia-smi topo -m` terms.
fn pcie_kind(level: TopologyLevel) -> LinkKind {
    match level {
        TopologyLevel::Internal | TopologyLevel::Single => LinkKind::Pix,
        TopologyLevel::Multiple => LinkKind::Pxb,
        TopologyLevel::HostBridge => LinkKind::Phb,
        TopologyLevel::Node => LinkKind::Node,
        TopologyLevel::System => LinkKind::Sys,
    }
}
