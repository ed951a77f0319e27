//! Rendering of the detailed views: one node's inventory, and a model's
//! placement explanation.

use std::fmt::Write;

use serde_json::Value;

use crate::run::text;
use crate::table::Table;

/// "1.2s ago" from the leader's view of the stream; "-" when this peer
/// holds no stream (followers), "disconnected" when the leader has none.
pub fn heartbeat(stream: &Value) -> String {
    if stream.is_null() {
        return "-".to_owned();
    }
    if stream["connected"].as_bool() != Some(true) {
        return "disconnected".to_owned();
    }
    match stream["last_heartbeat_ms_ago"].as_u64() {
        Some(ms) => format!("{:.1}s ago", ms as f64 / 1000.0),
        None => "-".to_owned(),
    }
}

pub fn node_detail(node: &Value) -> String {
    let mut out = String::new();
    let inventory = &node["inventory"];
    let _ = writeln!(out, "node:        {}", text(&node["id"]));
    let _ = writeln!(out, "status:      {}", text(&node["status"]));
    let _ = writeln!(
        out,
        "cordoned:    {}   draining: {}",
        text(&node["cordoned"]),
        text(&node["draining"])
    );
    let _ = writeln!(out, "heartbeat:   {}", heartbeat(&node["stream"]));
    let _ = writeln!(out, "mgmt:        {}", text(&node["mgmt_addr"]));
    let _ = writeln!(out, "hostname:    {}", text(&inventory["hostname"]));
    let _ = writeln!(out, "gpu source:  {}", text(&inventory["gpu_source"]));
    let _ = writeln!(out, "engines:     {}", list(&inventory["engines"]));
    let _ = writeln!(out, "agent:       {}", text(&inventory["agent_version"]));
    let labels: Vec<String> = node["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", text(v)))
        .collect();
    let _ = writeln!(out, "labels:      {}", labels.join(", "));

    let mut gpus = Table::new(&["GPU", "MODEL", "MEMORY", "NVLINK PEERS", "UUID"]);
    for gpu in inventory["gpus"].as_array().into_iter().flatten() {
        gpus.row(vec![
            text(&gpu["index"]),
            text(&gpu["model"]),
            format!("{} MiB", text(&gpu["memory_mb"])),
            list(&gpu["nvlink_peers"]),
            text(&gpu["uuid"]),
        ]);
    }
    let _ = write!(out, "\n{}", gpus.render());

    let mut fabrics = Table::new(&["FABRIC", "HCAS", "ACTIVE", "PROBLEMS"]);
    for fabric in inventory["fabric_reports"].as_array().into_iter().flatten() {
        fabrics.row(vec![
            text(&fabric["name"]),
            list(&fabric["hcas"]),
            list(&fabric["active_hcas"]),
            list(&fabric["problems"]),
        ]);
    }
    let _ = write!(out, "\n{}", fabrics.render());

    let mut hcas = Table::new(&["HCA", "PORT", "STATE", "RATE", "LINK LAYER"]);
    for hca in inventory["hcas"].as_array().into_iter().flatten() {
        hcas.row(vec![
            text(&hca["name"]),
            text(&hca["port"]),
            text(&hca["state"]),
            format!("{} Gb/s", text(&hca["rate_gbps"])),
            text(&hca["link_layer"]),
        ]);
    }
    let _ = write!(out, "\n{}", hcas.render());

    let mut shards = Table::new(&["SHARD", "MODEL", "GPUS", "PORT", "STATE"]);
    for shard in node["shards"].as_array().into_iter().flatten() {
        shards.row(vec![
            text(&shard["shard"]),
            text(&shard["model"]),
            list(&shard["gpus"]),
            text(&shard["port"]),
            text(&shard["state"]),
        ]);
    }
    let _ = write!(out, "\n{}", shards.render());

    for warning in inventory["warnings"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "warning: {}", text(warning));
    }
    for refusal in node["stream"]["refusals"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "refused command {}: {}",
            text(&refusal["command_id"]),
            text(&refusal["message"])
        );
    }
    out
}

pub fn explanation(value: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {}: {} desired, {} pending",
        text(&value["model"]),
        text(&value["desired"]),
        text(&value["pending"])
    );
    for replica in value["replicas"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  {} [{}] {}",
            text(&replica["id"]),
            text(&replica["state"]),
            text(&replica["why"])
        );
    }
    if let Some(why) = value["explanation"].as_str() {
        let _ = writeln!(out, "pending: {why}");
    }
    if let Some(failure) = value["last_failure"].as_object() {
        let _ = writeln!(
            out,
            "last failure: replica {} on node {}: {}",
            text(&failure["replica"]),
            text(&failure["node"]),
            text(&failure["failure"]["message"])
        );
        for line in failure["failure"]["output_tail"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let _ = writeln!(out, "  | {}", text(line));
        }
    }
    out
}

fn list(value: &Value) -> String {
    let items: Vec<String> = value.as_array().into_iter().flatten().map(text).collect();
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(",")
    }
}
