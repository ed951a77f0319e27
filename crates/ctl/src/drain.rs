//! Following a drain: each replica on the node, its replacement, and their
//! states, printed as they change, until the node runs nothing. Replicas
//! the deadline forced off before a replacement was ready are returned, so
//! the operator is told plainly that capacity was lost.

use std::collections::BTreeMap;
use std::time::Duration;

use llmgw_api::{NodeView, Replica, ReplicaView, paths};

use crate::client::{AdminClient, CtlError};

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
        let node_view: NodeView = client.get(&paths::node(node)).await?;
        let all: Vec<ReplicaView> = client.get(paths::REPLICAS).await?;
        for view in &all {
            let replica = &view.replica;
            let state = view.state.as_str();
            let on_node = replica.shards.iter().any(|shard| shard.node == node);
            let line = if on_node {
                let why = replica
                    .stop
                    .as_ref()
                    .map_or("waiting for a replacement", |stop| stop.reason.as_str());
                format!("{} [{state}] {why}", replica.model)
            } else if let Some(old) = &replica.replaces
                && all.iter().any(|other| other.replica.id == *old)
            {
                let nodes: Vec<&str> = replica
                    .shards
                    .iter()
                    .map(|shard| shard.node.as_str())
                    .collect();
                format!("replacement for {old} on {} [{state}]", nodes.join("+"))
            } else {
                continue;
            };
            let id = &replica.id;
            if on_node && was_forced(replica) && !forced.iter().any(|f| f.replica == *id) {
                forced.push(ForcedStop {
                    replica: id.clone(),
                    model: replica.model.clone(),
                });
            }
            if shown.get(id) != Some(&line) {
                println!("  {id}: {line}");
                shown.insert(id.clone(), line);
            }
        }
        if !node_view.record.draining {
            return Ok(forced);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The reconciler stops a replica without a drain when the node's deadline
/// passed before its replacement was ready.
fn was_forced(replica: &Replica) -> bool {
    replica.stop.as_ref().is_some_and(|stop| {
        stop.drain_deadline_ms.is_none() && stop.reason.contains("deadline passed")
    })
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

    /// A replica of model `m` with this stop order, as the API sends it.
    fn replica(id: &str, stop: serde_json::Value) -> Replica {
        serde_json::from_value(serde_json::json!({
            "id": id, "model": "m", "profile": "p", "shards": [], "created_at_ms": 1,
            "stop": stop
        }))
        .expect("a replica")
    }

    #[test]
    fn a_forced_stop_is_told_plainly() {
        let forced = replica(
            "r1",
            serde_json::json!({
                "reason": "node n1 drains and its deadline passed before a replacement was ready",
                "drain_deadline_ms": null, "at_ms": 5
            }),
        );
        let moved = replica(
            "r2",
            serde_json::json!({
                "reason": "node n1 drains; replica r3 took over",
                "drain_deadline_ms": 99, "at_ms": 5
            }),
        );
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
