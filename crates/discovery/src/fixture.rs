//! A simulated node's hardware for tests and `llmgw dev`: captured
//! `nvidia-smi` output and a sysfs-shaped InfiniBand tree, read by the same
//! parsers as on a real node. Real nodes never set `discovery.fixture`.
//!
//! ```yaml
//! nvidia_smi_query: h100-sxm-8x.query.csv   # --query-gpu=index,uuid,name,memory.total,pci.bus_id
//! nvidia_smi_topo: h100-sxm-8x.topo.txt     # nvidia-smi topo -m
//! ib_root: ib-hdr-4x                        # like /sys/class/infiniband (optional)
//! ```
//! Paths are relative to the fixture file.

use std::path::{Path as FsPath, PathBuf};

use llmgw_yaml::{Cx, Decode, Node, Path};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixture {
    pub nvidia_smi_query: PathBuf,
    pub nvidia_smi_topo: Option<PathBuf>,
    pub ib_root: Option<PathBuf>,
}

impl Decode for Fixture {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &["nvidia_smi_query", "nvidia_smi_topo", "ib_root"],
        )?;
        Some(Fixture {
            nvidia_smi_query: f.required(cx, "nvidia_smi_query")?,
            nvidia_smi_topo: f.optional(cx, "nvidia_smi_topo"),
            ib_root: f.optional(cx, "ib_root"),
        })
    }
}

impl Fixture {
    pub fn load(file: &FsPath) -> Result<Fixture, String> {
        let name = file.display().to_string();
        let text =
            std::fs::read_to_string(file).map_err(|e| format!("{name}: cannot read: {e}"))?;
        let fixture = llmgw_yaml::load(&name, &text, |node, cx| {
            Fixture::decode(node, &Path::root(), cx)
        })
        .map_err(|e| e.to_string())?;
        let dir = file.parent().unwrap_or(FsPath::new("."));
        Ok(Fixture {
            nvidia_smi_query: dir.join(fixture.nvidia_smi_query),
            nvidia_smi_topo: fixture.nvidia_smi_topo.map(|p| dir.join(p)),
            ib_root: fixture.ib_root.map(|p| dir.join(p)),
        })
    }
}
