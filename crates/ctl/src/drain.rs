//! Following a drain: each replica on the node, its replacement, and their
//! states, printed as they change, until the node runs nothing. Replicas
//! the deadline forced off before a replacement was ready are returned, so
//! the operator is told plainly that capacity was lost.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;

use crate::client::{AdminClient, CtlError};
use crate::run::text;

/// A replica stopped by the drain deadline with no replacement ready.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ForcedStop {
    pub replica: String,
    pub model: String,
}

pub async fn follow(client: &AdminClient, node: &str) -> Result<Vec<ForcedStop>, CtlError> {
    println!("draining {node}: each replica moves once its replacement is ready");
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut forced: Vec<ForcedStop> = Vec::new();
    loop {
        let record = client
            .call(Method::GET, &format!("/api/v1/nodes/{node}"), None)
            .await?;
        let replicas = client.call(Method::GET, "/api/v1/replicas", None).await?;
        let all = replicas.as_array().cloned().unwrap_or_default();
        for replica in &all {
            let on_node = replica["shards"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["node"] == node);
            let replaces = replica["replaces"].as_str();
            let line = if on_node {
                let why = replica["stop"]["reason"]
                    .as_str()
                    .unwrap_or("waiting for a replacement");
                format!(
                    "{} [{}] {}",
                    text(&replica["model"]),
                    text(&replica["state"]),
                    why
                )
            } else if let Some(old) = replaces
                && all.iter().any(|r| r["id"] == old)
            {
                let nodes: Vec<String> = replica["shards"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| text(&s["node"]))
                    .collect();
                format!(
                    "replacement for {old} on {} [{}]",
                    nodes.join("+"),
                    text(&replica["state"])
                )
            } else {
                continue;
            };
            let id = text(&replica["id"]);
            if on_node && was_forced(replica) && !forced.iter().any(|f| f.replica == id) {
                forced.push(ForcedStop {
                    replica: id.clone(),
                    model: text(&replica["model"]),
                });
            }
            if shown.get(&id) != Some(&line) {
                println!("  {id}: {line}");
                shown.insert(id, line);
            }
        }
        if record["draining"] != true {
            return Ok(forced);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The reconciler stops a replica without a drain when the node's deadline
/// passed before its replacement was ready.
fn was_forced(replica: &serde_json::Value) -> bool {
    let stop = &replica["stop"];
    stop.is_object()
        && stop["drain_deadline_ms"].is_null()
        && stop["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("deadline passed"))
}

/// The last line of a followed drain.
pub fn summary(node: &str, forced: &[ForcedStop]) -> String {
    if forced.is_empty() {
        return format!(
            "drained: node {node} runs nothing and stays cordoned (uncordon to use it again)\n"
        );
    }
    let list: Vec<String> = forced
        .iter()
        .map(|f| format!("{} (model {})", f.replica, f.model))
        .collect();
    format!(
        "drained: node {node} runs nothing and stays cordoned, but the deadline passed first: \
         {} replica(s) were stopped with no replacement ready, and their models run with less \
         capacity until the scheduler places them again: {}\n",
        forced.len(),
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_stop_is_told_plainly() {
        let forced = serde_json::json!({
            "id": "r1", "model": "m",
            "stop": {"reason": "node n1 drains and its deadline passed before a replacement was ready",
                     "drain_deadline_ms": null}
        });
        let moved = serde_json::json!({
            "id": "r2", "model": "m",
            "stop": {"reason": "node n1 drains; replica r3 took over", "drain_deadline_ms": 99}
        });
        assert!(was_forced(&forced));
        assert!(!was_forced(&moved));
        let line = summary(
            "n1",
            &[ForcedStop {
                replica: "r1".into(),
                model: "m".into(),
            }],
        );
        assert!(line.contains("deadline passed first"), "{line}");
        assert!(line.contains("r1 (model m)"), "{line}");
        assert!(summary("n1", &[]).starts_with("drained: node n1 runs nothing"));
    }
}
