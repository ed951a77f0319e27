//! Discovery against realistic captures: an 8-GPU NVSwitch node, a PCIe node
//! without NVLink, a PCIe node with NVLink bridge pairs and a RoCE node.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use llmgw_config::{DiscoveryConfig, FabricConfig};
use llmgw_discovery::{GpuSource, Inventory, LinkKind, discover, parse_query, parse_topology};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/nodes")
}

fn config(fixture: Option<PathBuf>) -> DiscoveryConfig {
    DiscoveryConfig {
        nvidia_smi: None,
        ib_root: PathBuf::from("/nonexistent/infiniband"),
        prefer_nvml: true,
        skip_gpus: false,
        fixture,
    }
}

fn fabric(name: &str, hcas: &[&str], rate: Option<u32>) -> FabricConfig {
    FabricConfig {
        name: name.into(),
        hcas: hcas.iter().map(|h| h.to_string()).collect(),
        rate_gbps: rate,
    }
}

fn node(fixture: &str, fabrics: &[FabricConfig]) -> Inventory {
    discover(&config(Some(fixtures().join(fixture))), fabrics)
}

#[test]
fn nvswitch_node_has_eight_gpus_all_nvlinked_and_its_fabric_up() {
    let inv = node(
        "h100-sxm-8x-ib-a.yaml",
        &[fabric(
            "ib-a",
            &["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
            Some(200),
        )],
    );
    assert_eq!(inv.gpu_source, GpuSource::Fixture);
    assert_eq!(inv.gpus.len(), 8);
    assert_eq!(inv.gpus[0].name, "NVIDIA H100 80GB HBM3");
    assert_eq!(inv.gpus[0].memory_total_mib, 81559);
    assert_eq!(inv.gpus[3].pci_bus_id, "0000:5d:00.0");
    assert_eq!(inv.links.len(), 28, "one link per unordered pair of 8 GPUs");
    assert!(
        inv.links
            .iter()
            .all(|l| l.kind == LinkKind::Nvlink && l.nvlinks == 18)
    );
    assert_eq!(inv.hcas.len(), 4);
    assert!(
        inv.hcas
            .iter()
            .all(|h| h.is_active() && h.rate_gbps == 200 && h.link_layer == "InfiniBand")
    );
    assert_eq!(inv.fabrics[0].active_hcas.len(), 4);
    assert!(inv.fabrics[0].problems.is_empty());
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
}

#[test]
fn a_configured_hca_that_is_down_or_missing_is_reported_not_dropped() {
    let inv = node(
        "h100-sxm-8x-ib-one-down.yaml",
        &[fabric(
            "ib-b",
            &["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_9"],
            Some(400),
        )],
    );
    let status = &inv.fabrics[0];
    assert_eq!(status.active_hcas, ["mlx5_0", "mlx5_1", "mlx5_2"]);
    assert!(status.is_usable());
    assert!(
        status
            .problems
            .contains(&"mlx5_3: no active port (port 1 DOWN)".to_string()),
        "{:?}",
        status.problems
    );
    assert!(
        status
            .problems
            .contains(&"mlx5_9: not found on this node".to_string())
    );
    assert!(
        status
            .problems
            .contains(&"mlx5_0: port 1 runs at 200 Gb/s, below the fabric's 400 Gb/s".to_string())
    );
    assert!(
        inv.warnings
            .iter()
            .any(|w| w == "fabric ib-b: mlx5_9: not found on this node")
    );
}

#[test]
fn pcie_node_without_nvlink() {
    let inv = node("l40s-pcie-4x.yaml", &[]);
    assert_eq!(inv.gpus.len(), 4);
    assert!(inv.links.iter().all(|l| l.kind != LinkKind::Nvlink));
    assert_eq!(inv.link(0, 1).unwrap().kind, LinkKind::Node);
    assert_eq!(inv.link(1, 2).unwrap().kind, LinkKind::Sys);
    assert!(inv.hcas.is_empty());
}

#[test]
fn pcie_node_with_nvlink_bridge_pairs() {
    let inv = node("a6000-nvbridge-4x.yaml", &[]);
    assert_eq!(inv.link(0, 1).unwrap().kind, LinkKind::Nvlink);
    assert_eq!(inv.link(0, 1).unwrap().nvlinks, 4);
    assert_eq!(inv.link(2, 3).unwrap().nvlinks, 4);
    assert_eq!(inv.link(1, 2).unwrap().kind, LinkKind::Phb);
}

#[test]
fn roce_node_reports_ethernet_link_layer() {
    let inv = node(
        "a100-sxm-4x-roce.yaml",
        &[fabric("roce-a", &["mlx5_0", "mlx5_1"], Some(100))],
    );
    assert_eq!(inv.gpus[0].name, "NVIDIA A100-SXM4-80GB");
    assert!(
        inv.hcas
            .iter()
            .all(|h| h.link_layer == "Ethernet" && h.rate_gbps == 100)
    );
    assert!(inv.fabrics[0].problems.is_empty());
}

#[test]
fn without_nvml_discovery_falls_back_to_nvidia_smi_and_says_so() {
    // A stand-in nvidia-smi that prints the captures, so the real program
    // path (spawn, query, topo -m) is exercised where no driver exists.
    let dir = tempfile::tempdir().unwrap();
    let shim = dir.path().join("nvidia-smi");
    let captures = fixtures();
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n  topo) cat {topo} ;;\n  --query-gpu=*) cat {query} ;;\n  *) echo unexpected \"$@\" >&2; exit 2 ;;\nesac\n",
            topo = captures.join("a6000-nvbridge-4x.topo.txt").display(),
            query = captures.join("a6000-nvbridge-4x.query.csv").display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg = config(None);
    cfg.nvidia_smi = Some(shim);
    let inv = discover(&cfg, &[]);
    if inv.gpu_source == GpuSource::Nvml {
        return; // a machine with a real driver: NVML rightly wins.
    }
    assert_eq!(inv.gpu_source, GpuSource::NvidiaSmi, "{:?}", inv.warnings);
    assert_eq!(inv.gpus.len(), 4);
    assert!(
        inv.warnings[0].starts_with("NVML unavailable"),
        "{:?}",
        inv.warnings
    );
}

#[test]
fn with_no_source_the_node_reports_none_and_why() {
    let mut cfg = config(None);
    cfg.prefer_nvml = false;
    cfg.nvidia_smi = Some("/nonexistent/nvidia-smi".into());
    let inv = discover(&cfg, &[]);
    assert_eq!(inv.gpu_source, GpuSource::None);
    assert!(
        inv.warnings[0].contains("/nonexistent/nvidia-smi"),
        "{:?}",
        inv.warnings
    );
    cfg.skip_gpus = true;
    assert!(discover(&cfg, &[]).warnings[0].contains("skip_gpus"));
}

#[test]
fn query_output_with_header_and_units_parses() {
    let text = "index, uuid, name, memory.total [MiB], pci.bus_id\n0, GPU-x, NVIDIA A100-SXM4-80GB, 81920 MiB, 00000000:07:00.0\n";
    let gpus = parse_query(text).unwrap();
    assert_eq!(gpus[0].memory_total_mib, 81920);
    let err = parse_query("0, GPU-x, NVIDIA A100\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("line 1 of the GPU query: expected 5 comma-separated fields")
    );
    assert!(
        parse_topology("garbage\n")
            .unwrap_err()
            .to_string()
            .contains("no GPU columns")
    );
}
