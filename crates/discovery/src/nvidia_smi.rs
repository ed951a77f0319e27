//! `nvidia-smi` output: the GPU query CSV and the `topo -m` matrix.

use std::path::Path;
use std::process::Command;

use llmgw_topology::parse_topo_cell;

use crate::inventory::{Gpu, GpuLink, normalize_bus_id};

/// The query llmgw runs; `parse_query` expects its columns in this order.
pub const QUERY_ARGS: &[&str] = &[
    "--query-gpu=index,uuid,name,memory.total,pci.bus_id",
    "--format=csv,noheader,nounits",
];

#[derive(Debug, thiserror::Error)]
pub enum NvidiaSmiError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} {args} exited with {status}: {stderr}")]
    Failed {
        program: String,
        args: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("line {line} of the GPU query: {why}: {text:?}")]
    Query {
        line: usize,
        why: String,
        text: String,
    },
    #[error("topo -m: {0}")]
    Topology(String),
}

/// Runs `nvidia-smi` with `args` and returns its standard output.
pub fn run(program: &Path, args: &[&str]) -> Result<String, NvidiaSmiError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| NvidiaSmiError::Spawn {
            program: program.display().to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(NvidiaSmiError::Failed {
            program: program.display().to_string(),
            args: args.join(" "),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses `--query-gpu=index,uuid,name,memory.total,pci.bus_id` output. A
/// header line and ` MiB` units are tolerated, so output captured without
/// `noheader,nounits` parses too.
pub fn parse_query(text: &str) -> Result<Vec<Gpu>, NvidiaSmiError> {
    let mut gpus = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() || line.trim_start().starts_with("index") {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |why: &str| NvidiaSmiError::Query {
            line: line_no,
            why: why.to_string(),
            text: line.to_string(),
        };
        let [index, uuid, name, memory, bus_id] = fields[..] else {
            return Err(bad("expected 5 comma-separated fields"));
        };
        let index = index.parse().map_err(|_| bad("index is not a number"))?;
        let memory_total_mib = memory
            .trim_end_matches("MiB")
            .trim()
            .parse()
            .map_err(|_| bad("memory.total is not a number of MiB"))?;
        gpus.push(Gpu {
            index,
            uuid: uuid.to_string(),
            name: name.to_string(),
            memory_total_mib,
            pci_bus_id: normalize_bus_id(bus_id),
        });
    }
    Ok(gpus)
}

/// The GPU-to-GPU part of `nvidia-smi topo -m`: one link per unordered pair.
/// NIC rows and columns, the affinity columns and the legend are skipped.
pub fn parse_topology(text: &str) -> Result<Vec<GpuLink>, NvidiaSmiError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .ok_or_else(|| NvidiaSmiError::Topology("empty output".to_string()))?;
    let columns: Vec<&str> = header.split('\t').map(str::trim).collect();
    let gpu_columns: Vec<(usize, u32)> = columns
        .iter()
        .enumerate()
        .filter_map(|(i, c)| gpu_number(c).map(|n| (i, n)))
        .collect();
    if gpu_columns.is_empty() {
        return Err(NvidiaSmiError::Topology(format!(
            "no GPU columns in header {header:?}"
        )));
    }
    let mut links = Vec::new();
    for line in lines {
        let cells: Vec<&str> = line.split('\t').map(str::trim).collect();
        let Some(row_gpu) = cells.first().and_then(|c| gpu_number(c)) else {
            // NIC rows, the legend, and anything after the matrix.
            continue;
        };
        for &(col, col_gpu) in &gpu_columns {
            if col_gpu <= row_gpu {
                continue;
            }
            let cell = cells.get(col).copied().unwrap_or_default();
            let (kind, nvlinks) = parse_topo_cell(cell).ok_or_else(|| {
                NvidiaSmiError::Topology(format!(
                    "GPU{row_gpu}/GPU{col_gpu}: unknown link {cell:?}"
                ))
            })?;
            links.push(GpuLink {
                a: row_gpu,
                b: col_gpu,
                kind,
                nvlinks,
            });
        }
    }
    Ok(links)
}

fn gpu_number(cell: &str) -> Option<u32> {
    cell.strip_prefix("GPU")?.parse().ok()
}
