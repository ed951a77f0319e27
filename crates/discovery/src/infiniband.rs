//! InfiniBand and RoCE ports from sysfs (`/sys/class/infiniband`), and the
//! check of agent.yaml's fabrics against them.

use std::path::Path;

use llmgw_config::FabricConfig;

use crate::inventory::{FabricStatus, HcaPort};

/// Every port of every HCA under `ib_root`. A missing root means no HCAs (a
/// node without InfiniBand); an unreadable port is reported, not dropped.
pub fn read_ports(ib_root: &Path, warnings: &mut Vec<String>) -> Vec<HcaPort> {
    let Ok(entries) = std::fs::read_dir(ib_root) else {
        return Vec::new();
    };
    let mut hcas: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    hcas.sort();
    let mut ports = Vec::new();
    for hca in hcas {
        let ports_dir = ib_root.join(&hca).join("ports");
        let Ok(port_entries) = std::fs::read_dir(&ports_dir) else {
            warnings.push(format!("{}: no ports directory", ports_dir.display()));
            continue;
        };
        let mut numbers: Vec<u32> = port_entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        numbers.sort_unstable();
        for port in numbers {
            let dir = ports_dir.join(port.to_string());
            match read_port(&hca, port, &dir) {
                Ok(p) => ports.push(p),
                Err(why) => warnings.push(format!("{}: {why}", dir.display())),
            }
        }
    }
    ports
}

fn read_port(hca: &str, port: u32, dir: &Path) -> Result<HcaPort, String> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("cannot read {name}: {e}"))
    };
    Ok(HcaPort {
        hca: hca.to_string(),
        port,
        state: parse_state(&read("state")?)?,
        rate_gbps: parse_rate(&read("rate")?)?,
        link_layer: read("link_layer")?,
    })
}

/// `4: ACTIVE` → `ACTIVE`.
pub fn parse_state(text: &str) -> Result<String, String> {
    text.split_once(':')
        .map(|(_, name)| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .ok_or_else(|| format!("unexpected port state {text:?}"))
}

/// `200 Gb/sec (4X HDR)` → 200. Fractional rates (`2.5 Gb/sec (1X SDR)`)
/// round down.
pub fn parse_rate(text: &str) -> Result<u32, String> {
    let number = text.split_whitespace().next().unwrap_or_default();
    number
        .parse::<f64>()
        .map(|r| r as u32)
        .map_err(|_| format!("unexpected port rate {text:?}"))
}

/// Checks each configured fabric against the discovered ports. A configured
/// HCA that is missing, down or slower than the fabric's rate is reported
/// on the fabric (and so in the inventory), never silently dropped.
pub fn check_fabrics(fabrics: &[FabricConfig], ports: &[HcaPort]) -> Vec<FabricStatus> {
    fabrics
        .iter()
        .map(|fabric| {
            let mut active = Vec::new();
            let mut problems = Vec::new();
            for hca in &fabric.hcas {
                let hca_ports: Vec<&HcaPort> = ports.iter().filter(|p| &p.hca == hca).collect();
                if hca_ports.is_empty() {
                    problems.push(format!("{hca}: not found on this node"));
                    continue;
                }
                match hca_ports.iter().find(|p| p.is_active()) {
                    None => {
                        let states: Vec<String> = hca_ports
                            .iter()
                            .map(|p| format!("port {} {}", p.port, p.state))
                            .collect();
                        problems.push(format!("{hca}: no active port ({})", states.join(", ")));
                    }
                    Some(port) => {
                        if let Some(want) = fabric.rate_gbps.filter(|want| port.rate_gbps < *want) {
                            problems.push(format!(
                                "{hca}: port {} runs at {} Gb/s, below the fabric's {want} Gb/s",
                                port.port, port.rate_gbps
                            ));
                        }
                        active.push(hca.clone());
                    }
                }
            }
            FabricStatus {
                name: fabric.name.clone(),
                hcas: fabric.hcas.clone(),
                rate_gbps: fabric.rate_gbps,
                active_hcas: active,
                problems,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_formats() {
        assert_eq!(parse_state("4: ACTIVE").unwrap(), "ACTIVE");
        assert_eq!(parse_state("1: DOWN").unwrap(), "DOWN");
        assert!(parse_state("ACTIVE").is_err());
        assert_eq!(parse_rate("200 Gb/sec (4X HDR)").unwrap(), 200);
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)").unwrap(), 400);
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)").unwrap(), 2);
        assert!(parse_rate("fast").is_err());
    }
}
