//! Executing one `llmgw ctl` command and printing its result.

use std::io::IsTerminal;

use reqwest::Method;
use serde_json::Value;

use crate::args::{ClusterAction, CtlArgs, CtlCommand, ModelAction, OutputFormat, SnapshotAction};
use crate::client::{AdminClient, CtlError};
use crate::table::Table;

/// Runs the command and returns what to print; with `--watch`, prints it
/// every 2 seconds until interrupted.
pub async fn run_ctl(args: CtlArgs) -> Result<String, CtlError> {
    let client = AdminClient::new(args.api.clone(), args.token.clone(), args.ca.as_deref())?;
    crate::table::set_colour(args.output == OutputFormat::Table && std::io::stdout().is_terminal());
    if !args.watch {
        return once(&client, &args).await;
    }
    loop {
        let shown = match once(&client, &args).await {
            Ok(text) => text,
            Err(error) => format!("error: {error}\n"),
        };
        print!(
            "\x1b[2J\x1b[H{}  (every 2s; Ctrl-C to stop)\n{shown}",
            chrono_free_now()
        );
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(String::new()),
        }
    }
}

/// Seconds since the epoch, enough to see the view refresh.
fn chrono_free_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

async fn once(client: &AdminClient, args: &CtlArgs) -> Result<String, CtlError> {
    let (value, render): (Value, fn(&Value) -> String) = match args.command.clone() {
        CtlCommand::Cluster { action: None } => (
            client.call(Method::GET, "/api/v1/cluster", None).await?,
            render_cluster,
        ),
        CtlCommand::Cluster {
            action: Some(ClusterAction::Add { id, grpc, admin }),
        } => {
            let body = serde_json::json!({"id": id, "grpc": grpc, "admin": admin});
            let body = ("application/json", body.to_string().into_bytes());
            (
                client
                    .call(Method::POST, "/api/v1/cluster/peers", Some(body))
                    .await?,
                |_| "peer added\n".to_owned(),
            )
        }
        CtlCommand::Cluster {
            action: Some(ClusterAction::Remove { id }),
        } => (
            client
                .call(Method::DELETE, &format!("/api/v1/cluster/peers/{id}"), None)
                .await?,
            |_| "peer removed\n".to_owned(),
        ),
        CtlCommand::Nodes { node: None } => {
            (client.call_leader("/api/v1/nodes").await?, render_nodes)
        }
        CtlCommand::Nodes { node: Some(node) } => (
            client.call_leader(&format!("/api/v1/nodes/{node}")).await?,
            crate::render::node_detail,
        ),
        CtlCommand::Explain { model } => (
            client
                .call(
                    Method::GET,
                    &format!("/api/v1/models/{model}/explain"),
                    None,
                )
                .await?,
            crate::render::explanation,
        ),
        CtlCommand::Replicas => (
            client.call(Method::GET, "/api/v1/replicas", None).await?,
            render_replicas,
        ),
        CtlCommand::Models { action: None } => (
            client.call(Method::GET, "/api/v1/models", None).await?,
            render_models,
        ),
        CtlCommand::Models {
            action: Some(ModelAction::Get { name }),
        } => (
            client
                .call(Method::GET, &format!("/api/v1/models/{name}"), None)
                .await?,
            |v| format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default()),
        ),
        CtlCommand::Models {
            action: Some(ModelAction::Put { file, name }),
        } => {
            let file = file.clone();
            let text = std::fs::read_to_string(&file)
                .map_err(|e| CtlError::Usage(format!("cannot read {}: {e}", file.display())))?;
            let name = match name {
                Some(name) => name,
                None => name_in(&text).ok_or_else(|| {
                    CtlError::Usage(format!(
                        "{}: no `name:` found; pass --name NAME",
                        file.display()
                    ))
                })?,
            };
            let body = ("application/yaml", text.into_bytes());
            (
                client
                    .call(Method::PUT, &format!("/api/v1/models/{name}"), Some(body))
                    .await?,
                |v| format!("model {} stored\n", v["name"].as_str().unwrap_or("?")),
            )
        }
        CtlCommand::Models {
            action: Some(ModelAction::Delete { name }),
        } => (
            client
                .call(Method::DELETE, &format!("/api/v1/models/{name}"), None)
                .await?,
            |_| "model deleted\n".to_owned(),
        ),
        CtlCommand::Cordon { node } => (
            client
                .call(Method::POST, &format!("/api/v1/nodes/{node}/cordon"), None)
                .await?,
            |v| render_nodes(&Value::Array(vec![v.clone()])),
        ),
        CtlCommand::Uncordon { node } => (
            client
                .call(
                    Method::POST,
                    &format!("/api/v1/nodes/{node}/uncordon"),
                    None,
                )
                .await?,
            |v| render_nodes(&Value::Array(vec![v.clone()])),
        ),
        CtlCommand::Snapshot {
            action: SnapshotAction::Save { file },
        } => return crate::snapshot::save(client, &file).await,
        CtlCommand::Drain {
            node,
            deadline,
            no_wait,
        } => {
            let started = client
                .call(
                    Method::POST,
                    &format!(
                        "/api/v1/nodes/{node}/drain?deadline_s={}",
                        deadline.as_secs().max(1)
                    ),
                    None,
                )
                .await?;
            if no_wait || args.output != OutputFormat::Table {
                (started, |v| render_nodes(&Value::Array(vec![v.clone()])))
            } else {
                let forced = crate::drain::follow(client, &node).await?;
                return Ok(crate::drain::summary(&node, &forced));
            }
        }
    };
    Ok(match args.output {
        OutputFormat::Json => format!(
            "{}\n",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        ),
        OutputFormat::Yaml => crate::yaml::to_yaml(&value),
        OutputFormat::Table => render(&value),
    })
}

/// The top-level `name:` of a single YAML or JSON model entry.
fn name_in(text: &str) -> Option<String> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return value["name"].as_str().map(str::to_owned);
    }
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("name:")?;
        let name = rest.trim().trim_matches(|c| c == '"' || c == '\'');
        (!name.is_empty()).then(|| name.to_owned())
    })
}

pub(crate) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn render_cluster(value: &Value) -> String {
    let mut table = Table::new(&[
        "ID",
        "ADDR",
        "ROLE",
        "MEMBER",
        "TERM",
        "LAST LOG",
        "APPLIED",
        "STATE HASH",
    ]);
    for peer in value["peers"].as_array().into_iter().flatten() {
        table.row(vec![
            text(&peer["id"]),
            text(&peer["addr"]),
            text(&peer["role"]),
            text(&peer["membership"]),
            text(&peer["term"]),
            text(&peer["last_log_index"]),
            text(&peer["last_applied_index"]),
            text(&peer["state_hash"]),
        ]);
    }
    let transport = match value["insecure"].as_bool() {
        Some(true) => "  transport: INSECURE (plaintext gRPC)",
        Some(false) => "  transport: mTLS",
        None => "",
    };
    format!(
        "leader: {}  term: {}{transport}\n{}",
        text(&value["leader_id"]),
        text(&value["term"]),
        table.render()
    )
}

fn render_nodes(value: &Value) -> String {
    let mut table = Table::new(&[
        "ID",
        "STATUS",
        "FLAGS",
        "HEARTBEAT",
        "GPUS",
        "FABRICS",
        "SHARDS",
        "MGMT",
    ]);
    for node in value.as_array().into_iter().flatten() {
        let mut flags = Vec::new();
        if node["cordoned"].as_bool() == Some(true) {
            flags.push("cordoned");
        }
        if node["draining"].as_bool() == Some(true) {
            flags.push("draining");
        }
        let gpus = node["inventory"]["gpus"].as_array().map_or(0, Vec::len);
        let used = node["gpus_used"].as_u64().unwrap_or(0);
        let fabrics: Vec<String> = node["fabrics"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let shards = node["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["state"].as_str() != Some("stopped"))
            .count();
        table.row(vec![
            text(&node["id"]),
            text(&node["status"]),
            if flags.is_empty() {
                "-".to_owned()
            } else {
                flags.join(",")
            },
            crate::render::heartbeat(&node["stream"]),
            format!("{used}/{gpus}"),
            if fabrics.is_empty() {
                "-".to_owned()
            } else {
                fabrics.join(",")
            },
            shards.to_string(),
            text(&node["mgmt_addr"]),
        ]);
    }
    table.render()
}

fn render_replicas(value: &Value) -> String {
    let mut table = Table::new(&["ID", "MODEL", "PROFILE", "STATE", "SHARDS"]);
    for replica in value.as_array().into_iter().flatten() {
        let shards: Vec<String> = replica["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                let gpus: Vec<String> = s["gpus"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect();
                format!(
                    "{}[{}]:{} {}",
                    text(&s["node"]),
                    gpus.join(","),
                    text(&s["port"]),
                    text(&s["state"])
                )
            })
            .collect();
        table.row(vec![
            text(&replica["id"]),
            text(&replica["model"]),
            text(&replica["profile"]),
            text(&replica["state"]),
            shards.join("; "),
        ]);
    }
    table.render()
}

fn render_models(value: &Value) -> String {
    let mut table = Table::new(&["NAME", "REPLICAS", "PROFILES", "SOURCE / ENDPOINTS"]);
    for model in value.as_array().into_iter().flatten() {
        let profiles: Vec<String> = model["profiles"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| text(&p["name"]))
            .collect();
        let source = if model["source"].is_string() {
            text(&model["source"])
        } else {
            model["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect::<Vec<_>>()
                .join(",")
        };
        table.row(vec![
            text(&model["name"]),
            text(&model["replicas"]),
            if profiles.is_empty() {
                "-".to_owned()
            } else {
                profiles.join(",")
            },
            source,
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_model_name_in_yaml_and_json() {
        assert_eq!(
            name_in("name: llama\nreplicas: 1\n").as_deref(),
            Some("llama")
        );
        assert_eq!(name_in("{\"name\": \"qwen\"}").as_deref(), Some("qwen"));
        assert_eq!(name_in("replicas: 1\n"), None);
    }

    #[test]
    fn cluster_table_shows_each_peer() {
        let value = serde_json::json!({
            "leader_id": 1, "insecure": false, "term": 3,
            "peers": [{"id": 1, "addr": "127.0.0.1:7443", "role": "leader", "membership": "voter",
                       "term": 3, "last_log_index": 9, "last_applied_index": 9, "state_hash": "00ff"}]
        });
        let out = render_cluster(&value);
        assert!(
            out.starts_with("leader: 1  term: 3  transport: mTLS\n"),
            "{out}"
        );
        assert!(out.contains("127.0.0.1:7443  leader"));
        let insecure = render_cluster(
            &serde_json::json!({"leader_id": 1, "term": 3, "insecure": true, "peers": []}),
        );
        assert!(insecure.contains("transport: INSECURE"), "{insecure}");
    }

    #[tokio::test]
    async fn unreachable_peers_are_named_with_what_to_do_next() {
        // Port 9 (discard) on loopback is closed on test machines.
        let client = AdminClient::new(vec!["http://127.0.0.1:9".into()], None, None).unwrap();
        let error = client
            .call(Method::GET, "/api/v1/cluster", None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("no peer reachable at http://127.0.0.1:9"),
            "{error}"
        );
        assert!(error.contains("is `llmgw server` running?"), "{error}");
    }
}
