//! Runs discovery in the documented order and records what was used.

use std::path::Path;

use llmgw_config::{DiscoveryConfig, FabricConfig};

use crate::fixture::Fixture;
use crate::infiniband::{check_fabrics, read_ports};
use crate::inventory::{Gpu, GpuLink, GpuSource, Inventory};
use crate::{nvidia_smi, nvml};

/// Discovers this node: GPUs from the fixture (simulated nodes), else NVML
/// (when preferred), else `nvidia-smi`, else none; then HCAs from sysfs, and
/// the configured fabrics checked against them. Never fails: what could not
/// be read is a warning in the inventory, so the node still registers and
/// the operator sees why it has no GPUs.
pub fn discover(config: &DiscoveryConfig, fabrics: &[FabricConfig]) -> Inventory {
    let mut warnings = Vec::new();
    let fixture = match &config.fixture {
        Some(path) => match Fixture::load(path) {
            Ok(f) => Some(f),
            Err(why) => {
                warnings.push(format!("discovery fixture: {why}"));
                None
            }
        },
        None => None,
    };
    let (gpu_source, gpus, links) = if config.skip_gpus {
        warnings.push("skip_gpus is set: GPUs are not reported".to_string());
        (GpuSource::None, Vec::new(), Vec::new())
    } else if config.fixture.is_some() {
        match fixture.as_ref().map(read_fixture_gpus) {
            Some(Ok((gpus, links))) => (GpuSource::Fixture, gpus, links),
            Some(Err(why)) => {
                warnings.push(format!("discovery fixture: {why}"));
                (GpuSource::None, Vec::new(), Vec::new())
            }
            None => (GpuSource::None, Vec::new(), Vec::new()),
        }
    } else {
        discover_gpus(config, &mut warnings)
    };
    let ib_root = fixture
        .as_ref()
        .and_then(|f| f.ib_root.clone())
        .unwrap_or_else(|| config.ib_root.clone());
    let hcas = read_ports(&ib_root, &mut warnings);
    let fabric_status = check_fabrics(fabrics, &hcas);
    for fabric in &fabric_status {
        for problem in &fabric.problems {
            warnings.push(format!("fabric {}: {problem}", fabric.name));
        }
    }
    Inventory {
        gpu_source,
        gpus,
        links,
        hcas,
        fabrics: fabric_status,
        warnings,
    }
}

fn discover_gpus(
    config: &DiscoveryConfig,
    warnings: &mut Vec<String>,
) -> (GpuSource, Vec<Gpu>, Vec<GpuLink>) {
    if config.prefer_nvml {
        match nvml::discover() {
            Ok((gpus, links)) => return (GpuSource::Nvml, gpus, links),
            Err(err) => warnings.push(format!("NVML unavailable ({err}); trying nvidia-smi")),
        }
    }
    let program = config
        .nvidia_smi
        .clone()
        .unwrap_or_else(|| "nvidia-smi".into());
    match read_nvidia_smi(&program) {
        Ok((gpus, links)) => (GpuSource::NvidiaSmi, gpus, links),
        Err(why) => {
            warnings.push(format!("nvidia-smi unavailable ({why}); reporting no GPUs"));
            (GpuSource::None, Vec::new(), Vec::new())
        }
    }
}

fn read_nvidia_smi(program: &Path) -> Result<(Vec<Gpu>, Vec<GpuLink>), String> {
    let query = nvidia_smi::run(program, nvidia_smi::QUERY_ARGS).map_err(|e| e.to_string())?;
    let gpus = nvidia_smi::parse_query(&query).map_err(|e| e.to_string())?;
    let topo = nvidia_smi::run(program, &["topo", "-m"]).map_err(|e| e.to_string())?;
    let links = nvidia_smi::parse_topology(&topo).map_err(|e| e.to_string())?;
    Ok((gpus, links))
}

fn read_fixture_gpus(fixture: &Fixture) -> Result<(Vec<Gpu>, Vec<GpuLink>), String> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let gpus = nvidia_smi::parse_query(&read(&fixture.nvidia_smi_query)?)
        .map_err(|e| format!("{}: {e}", fixture.nvidia_smi_query.display()))?;
    let links = match &fixture.nvidia_smi_topo {
        Some(p) => {
            nvidia_smi::parse_topology(&read(p)?).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => Vec::new(),
    };
    Ok((gpus, links))
}
