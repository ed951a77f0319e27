//! Following a drain: each replica on the node, its replacement, and their
//! states, printed as they change, until the node runs nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;

use crate::client::{AdminClient, CtlError};
use crate::run::text;

pub async fn follow(client: &AdminClient, node: &str) -> Result<(), CtlError> {
    println!("draining {node}: each replica moves once its replacement is ready");
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
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
            if shown.get(&id) != Some(&line) {
                println!("  {id}: {line}");
                shown.insert(id, line);
            }
        }
        if record["draining"] != true {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
