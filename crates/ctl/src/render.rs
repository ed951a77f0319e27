//! Rendering of the detailed views: one node's inventory, and a model's
//! placement explanation.

use std::fmt::Write;

use llmgw_api::{LinkView, ModelExplanation, NodeView, RolloutView};

use crate::run::list;
use crate::table::Table;

/// "1.2s ago" from the leader's view of the stream; "-" when this peer
/// holds no stream (followers), "disconnected" when the leader has none.
pub fn heartbeat(stream: Option<&LinkView>) -> String {
    let Some(stream) = stream else {
        return "-".to_owned();
    };
    if !stream.connected {
        return "disconnected".to_owned();
    }
    match stream.last_heartbeat_ms_ago {
        Some(ms) => format!("{:.1}s ago", ms as f64 / 1000.0),
        None => "-".to_owned(),
    }
}

/// A string the API leaves out when it is empty.
fn or_dash_empty(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

pub fn node_detail(node: &NodeView) -> String {
    let mut out = String::new();
    let record = &node.record;
    let inventory = &record.inventory;
    let _ = writeln!(out, "node:        {}", record.id);
    let _ = writeln!(out, "status:      {}", record.status.as_str());
    let _ = writeln!(
        out,
        "cordoned:    {}   draining: {}",
        record.cordoned, record.draining
    );
    let _ = writeln!(out, "heartbeat:   {}", heartbeat(node.stream.as_ref()));
    let _ = writeln!(out, "mgmt:        {}", record.mgmt_addr);
    let _ = writeln!(out, "hostname:    {}", inventory.hostname);
    let _ = writeln!(out, "gpu source:  {}", or_dash_empty(&inventory.gpu_source));
    let _ = writeln!(out, "engines:     {}", list(&inventory.engines));
    let _ = writeln!(
        out,
        "agent:       {}",
        or_dash_empty(&inventory.agent_version)
    );
    let labels: Vec<String> = record
        .labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    let _ = writeln!(out, "labels:      {}", labels.join(", "));

    let mut gpus = Table::new(&["GPU", "MODEL", "MEMORY", "NVLINK PEERS", "UUID"]);
    for gpu in &inventory.gpus {
        gpus.row(vec![
            gpu.index.to_string(),
            gpu.model.clone(),
            format!("{} MiB", gpu.memory_mb),
            list(&gpu.nvlink_peers),
            or_dash_empty(&gpu.uuid),
        ]);
    }
    let _ = write!(out, "\n{}", gpus.render());

    let mut fabrics = Table::new(&["FABRIC", "HCAS", "ACTIVE", "PROBLEMS"]);
    for fabric in &inventory.fabric_reports {
        fabrics.row(vec![
            fabric.name.clone(),
            list(&fabric.hcas),
            list(&fabric.active_hcas),
            list(&fabric.problems),
        ]);
    }
    let _ = write!(out, "\n{}", fabrics.render());

    let mut hcas = Table::new(&["HCA", "PORT", "STATE", "RATE", "LINK LAYER"]);
    for hca in &inventory.hcas {
        hcas.row(vec![
            hca.name.clone(),
            hca.port.to_string(),
            hca.state.clone(),
            format!("{} Gb/s", hca.rate_gbps),
            hca.link_layer.clone(),
        ]);
    }
    let _ = write!(out, "\n{}", hcas.render());

    let mut shards = Table::new(&["SHARD", "MODEL", "GPUS", "PORT", "STATE"]);
    for shard in &node.shards {
        shards.row(vec![
            shard.shard.clone(),
            shard.model.clone(),
            list(&shard.gpus),
            shard.port.to_string(),
            shard.state.as_str().to_owned(),
        ]);
    }
    let _ = write!(out, "\n{}", shards.render());

    for warning in &inventory.warnings {
        let _ = writeln!(out, "warning: {warning}");
    }
    for stream in node.stream.iter().filter(|s| !s.survivor_gpus.is_empty()) {
        let gpus: Vec<String> = stream.survivor_gpus.iter().map(u32::to_string).collect();
        let _ = writeln!(
            out,
            "GPU(s) {} held by processes that outlived SIGKILL: nothing is placed on them until they exit",
            gpus.join(", ")
        );
    }
    let refusals = node.stream.iter().flat_map(|stream| &stream.refusals);
    for refusal in refusals {
        let _ = writeln!(
            out,
            "refused command {}: {}",
            refusal.command_id, refusal.message
        );
    }
    out
}

pub fn explanation(explained: &ModelExplanation) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {}: {} desired, {} pending",
        explained.model, explained.desired, explained.pending
    );
    for replica in &explained.replicas {
        let _ = writeln!(
            out,
            "  {} [{}] {}",
            replica.id,
            replica.state.as_str(),
            replica.why
        );
    }
    if let Some(scaling) = &explained.scaling {
        let _ = writeln!(out, "scaling: {scaling}");
    }
    if let Some(why) = &explained.explanation {
        let _ = writeln!(out, "pending: {why}");
    }
    if let Some(failure) = &explained.last_failure {
        let _ = writeln!(
            out,
            "last failure: replica {} on node {}: {}",
            failure.replica, failure.node, failure.failure.message
        );
        for line in &failure.failure.output_tail {
            let _ = writeln!(out, "  | {line}");
        }
    }
    out
}

/// `ctl models status NAME`: the rollout's phase and counts, then each
/// replica with the spec it runs.
pub fn rollout(view: &RolloutView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "model:       {}", view.model);
    let _ = writeln!(out, "spec:        {}", view.fingerprint);
    let _ = writeln!(out, "rollout:     {}", view.phase.as_str());
    let _ = writeln!(
        out,
        "replicas:    {} desired, {} on this spec ({} ready), {} on an earlier spec",
        view.desired, view.updated, view.updated_ready, view.outdated
    );
    let _ = writeln!(
        out,
        "policy:      max_surge {}, max_unavailable {}, rollback_after_failures {}",
        view.policy.max_surge, view.policy.max_unavailable, view.policy.rollback_after_failures
    );
    if let Some(rollout) = &view.rollout {
        let _ = writeln!(
            out,
            "last change: {} -> {}{}",
            rollout.from,
            rollout.to,
            match rollout.completed_at_ms {
                Some(_) => ", complete",
                None => "",
            }
        );
        if let Some(why) = &rollout.rollback {
            let _ = writeln!(out, "rollback:    {why}");
        }
        if rollout.failures > 0 {
            let _ = writeln!(
                out,
                "failures:    {} new replica(s); last: {}",
                rollout.failures,
                rollout.last_failure.as_deref().unwrap_or("-")
            );
        }
    }
    if let Some(blocked) = &view.blocked {
        let _ = writeln!(out, "blocked:     {blocked}");
    }
    let _ = writeln!(
        out,
        "roll back:   {}",
        if view.can_roll_back {
            "possible (llmgw ctl models rollback NAME)"
        } else {
            "no earlier launch spec"
        }
    );
    let mut table = Table::new(&["REPLICA", "STATE", "SPEC", "REPLACES", "GOING AWAY"]);
    for replica in &view.replicas {
        let spec = match (&replica.fingerprint, replica.current) {
            (Some(fp), true) => format!("{fp} (current)"),
            (Some(fp), false) => format!("{fp} (earlier)"),
            (None, _) => "- (current)".to_owned(),
        };
        table.row(vec![
            replica.id.clone(),
            replica.state.as_str().to_owned(),
            spec,
            replica.replaces.clone().unwrap_or_else(|| "-".to_owned()),
            replica.stopping.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    out.push('\n');
    out.push_str(&table.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_status_names_each_replica_spec_and_why_it_rolled_back() {
        let view: RolloutView = serde_json::from_value(serde_json::json!({
            "model": "llama", "fingerprint": "9f2c4e1ab0d37765", "desired": 1,
            "phase": "complete", "updated": 1, "updated_ready": 1, "outdated": 1,
            "policy": {"max_surge": 1, "max_unavailable": 0, "rollback_after_failures": 3},
            "rollout": {"to": "9f2c4e1ab0d37765", "from": "41d07a3c2be90f18",
                        "started_at_ms": 1, "failures": 0,
                        "rollback": "3 new replica(s) of the rollout to 41d07a3c2be90f18 failed"},
            "can_roll_back": true, "blocked": null,
            "replicas": [
                {"id": "llama-a", "state": "ready", "fingerprint": "9f2c4e1ab0d37765",
                 "current": true, "replaces": null, "stopping": null},
                {"id": "llama-b", "state": "draining", "fingerprint": "41d07a3c2be90f18",
                 "current": false, "replaces": null, "stopping": "rolling update"}
            ]
        }))
        .unwrap();
        let text = rollout(&view);
        assert!(text.contains("rollout:     complete"), "{text}");
        assert!(text.contains("rollback:    3 new replica(s)"), "{text}");
        assert!(
            text.contains("1 on this spec (1 ready), 1 on an earlier spec"),
            "{text}"
        );
        let b = text
            .lines()
            .find(|l| l.starts_with("llama-b"))
            .expect("a row");
        assert!(
            b.contains("41d07a3c2be90f18 (earlier)") && b.contains("rolling update"),
            "{b}"
        );
    }
}
