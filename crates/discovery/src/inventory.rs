//! What discovery finds on a node.

use llmgw_topology::LinkKind;
use serde::{Deserialize, Serialize};

/// Where the GPU list came from, so an operator can tell a node without
/// NVML (and so without NVLink detail) from one with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuSource {
    Nvml,
    NvidiaSmi,
    Fixture,
    /// No GPU source worked, or `skip_gpus` is set.
    None,
}

impl GpuSource {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuSource::Nvml => "nvml",
            GpuSource::NvidiaSmi => "nvidia-smi",
            GpuSource::Fixture => "fixture",
            GpuSource::None => "none",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_mib: u64,
    /// Normalised to sysfs form: `0000:18:00.0`, lowercase.
    pub pci_bus_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLink {
    pub a: u32,
    pub b: u32,
    pub kind: LinkKind,
    /// NV# for NVLink pairs, 0 otherwise.
    pub nvlinks: u32,
}

/// One port of an InfiniBand or RoCE HCA, as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HcaPort {
    pub hca: String,
    pub port: u32,
    /// `ACTIVE`, `DOWN`, `INIT`, `ARMED`, `ACTIVE_DEFER`.
    pub state: String,
    pub rate_gbps: u32,
    /// `InfiniBand`, or `Ethernet` for RoCE.
    pub link_layer: String,
}

impl HcaPort {
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// A fabric from agent.yaml, checked against the HCAs actually found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricStatus {
    pub name: String,
    pub hcas: Vec<String>,
    pub rate_gbps: Option<u32>,
    pub active_hcas: Vec<String>,
    /// One line per configured HCA that is missing, down or slow.
    pub problems: Vec<String>,
}

impl FabricStatus {
    /// A fabric is usable when at least one of its HCAs is up.
    pub fn is_usable(&self) -> bool {
        !self.active_hcas.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpu_source: GpuSource,
    pub gpus: Vec<Gpu>,
    /// One entry per unordered GPU pair.
    pub links: Vec<GpuLink>,
    pub hcas: Vec<HcaPort>,
    pub fabrics: Vec<FabricStatus>,
    /// Why a source was skipped, what is missing; shown to operators.
    pub warnings: Vec<String>,
}

impl Inventory {
    pub fn link(&self, a: u32, b: u32) -> Option<&GpuLink> {
        self.links
            .iter()
            .find(|l| (l.a == a && l.b == b) || (l.a == b && l.b == a))
    }
}

/// `00000000:18:00.0` (NVML, nvidia-smi) and `0000:18:00.0` (sysfs) name the
/// same device; compare them in one form.
pub fn normalize_bus_id(raw: &str) -> String {
    let raw = raw.trim().to_ascii_lowercase();
    match raw.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            let domain = u32::from_str_radix(domain, 16).unwrap_or(0);
            format!("{domain:04x}:{rest}")
        }
        _ => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_compare_in_sysfs_form() {
        assert_eq!(normalize_bus_id("00000000:18:00.0"), "0000:18:00.0");
        assert_eq!(normalize_bus_id("0000:AB:00.0"), "0000:ab:00.0");
    }
}
