//! Executing one `llmgw ctl` command and printing its result.

use std::io::IsTerminal;

use llmgw_api::{
    AddPeer, ClusterView, DrainQuery, LinkView, Model, NodeRecord, NodeView, PeerAdded,
    PeerRemoved, ReplicaView, RolloutView, ShardState, paths,
};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::args::{ClusterAction, CtlArgs, CtlCommand, ModelAction, OutputFormat, SnapshotAction};
use crate::client::{AdminClient, Answer, CtlError};
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
    let output = args.output;
    match args.command.clone() {
        CtlCommand::Cluster { action } => cluster(client, output, action).await,
        CtlCommand::Nodes { node: None, status } => {
            let path = match status {
                Some(status) => format!("{}?status={status}", paths::NODES),
                None => paths::NODES.to_owned(),
            };
            let answer = client.get_from_leader(&path).await?;
            show(output, &answer, |nodes: &Vec<NodeView>| render_nodes(nodes))
        }
        CtlCommand::Nodes {
            node: Some(node), ..
        } => {
            let answer = client.get_from_leader(&paths::node(&node)).await?;
            show(output, &answer, crate::render::node_detail)
        }
        CtlCommand::Explain { model } => {
            let answer = client
                .call(Method::GET, &paths::explain(&model), None)
                .await?;
            show(output, &answer, crate::render::explanation)
        }
        CtlCommand::Replicas => {
            let answer = client.call(Method::GET, paths::REPLICAS, None).await?;
            show(output, &answer, |replicas: &Vec<ReplicaView>| {
                render_replicas(replicas)
            })
        }
        CtlCommand::Models { action } => models(client, output, action).await,
        CtlCommand::Keys { action } => crate::keys::run(client, output, action).await,
        CtlCommand::Usage { days, by, csv } => {
            crate::usage::run(client, output, days, by, csv).await
        }
        CtlCommand::Cordon { node } => node_flag(client, output, &node, "cordon").await,
        CtlCommand::Uncordon { node } => node_flag(client, output, &node, "uncordon").await,
        CtlCommand::Snapshot {
            action: SnapshotAction::Save { file },
        } => crate::snapshot::save(client, &file).await,
        CtlCommand::Drain {
            node,
            deadline,
            no_wait,
        } => drain(client, output, &node, deadline, no_wait).await,
    }
}

/// `llmgw ctl cluster`: the peers, or a membership change.
async fn cluster(
    client: &AdminClient,
    output: OutputFormat,
    action: Option<ClusterAction>,
) -> Result<String, CtlError> {
    match action {
        None => {
            let answer = client.call(Method::GET, paths::CLUSTER, None).await?;
            show(output, &answer, render_cluster)
        }
        Some(ClusterAction::Add { id, grpc, admin }) => {
            let body = json_body(&AddPeer { id, grpc, admin })?;
            let answer = client
                .call(Method::POST, paths::CLUSTER_PEERS, Some(body))
                .await?;
            show(output, &answer, |_: &PeerAdded| "peer added\n".to_owned())
        }
        Some(ClusterAction::Remove { id }) => {
            let answer = client.call(Method::DELETE, &paths::peer(id), None).await?;
            show(output, &answer, |_: &PeerRemoved| {
                "peer removed\n".to_owned()
            })
        }
    }
}

/// `llmgw ctl models`: the catalog, or one entry read, stored or deleted.
async fn models(
    client: &AdminClient,
    output: OutputFormat,
    action: Option<ModelAction>,
) -> Result<String, CtlError> {
    match action {
        None => {
            let answer = client.call(Method::GET, paths::MODELS, None).await?;
            show(output, &answer, |models: &Vec<Model>| render_models(models))
        }
        Some(ModelAction::Get { name }) => {
            let answer = client.call(Method::GET, &paths::model(&name), None).await?;
            // The entry as the peer stores it, in the shape of models.yaml:
            // a table would only repeat it.
            Ok(match output {
                OutputFormat::Yaml => crate::yaml::to_yaml(&answer.body),
                OutputFormat::Json | OutputFormat::Table => pretty_json(&answer.body),
            })
        }
        Some(ModelAction::Put { file, name }) => put_model(client, output, &file, name).await,
        Some(ModelAction::Delete { name }) => {
            // 204 No Content: the body is null.
            let answer = client
                .call(Method::DELETE, &paths::model(&name), None)
                .await?;
            show(output, &answer, |_: &()| "model deleted\n".to_owned())
        }
        Some(ModelAction::Status { name }) => {
            let answer = client
                .call(Method::GET, &paths::rollout(&name), None)
                .await?;
            show(output, &answer, crate::render::rollout)
        }
        Some(ModelAction::Rollback { name }) => {
            let answer = client
                .call(Method::POST, &paths::rollback(&name), None)
                .await?;
            show(output, &answer, |view: &RolloutView| {
                format!(
                    "model {name}: rolling back to its previous launch spec ({})\n{}",
                    view.fingerprint,
                    crate::render::rollout(view)
                )
            })
        }
    }
}

/// `llmgw ctl models put FILE`: stores the entry under `--name`, or under
/// the `name:` the file itself gives.
async fn put_model(
    client: &AdminClient,
    output: OutputFormat,
    file: &std::path::Path,
    name: Option<String>,
) -> Result<String, CtlError> {
    let text = std::fs::read_to_string(file)
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
    let answer = client
        .call(Method::PUT, &paths::model(&name), Some(body))
        .await?;
    show(output, &answer, |model: &Model| {
        format!("model {} stored\n", model.name)
    })
}

/// `llmgw ctl cordon` and `uncordon`: `action` is the admin API's verb.
async fn node_flag(
    client: &AdminClient,
    output: OutputFormat,
    node: &str,
    action: &str,
) -> Result<String, CtlError> {
    let answer = client
        .call(Method::POST, &paths::node_action(node, action), None)
        .await?;
    show(output, &answer, render_node_record)
}

/// `llmgw ctl drain`: starts the drain, then follows it to the end unless
/// told not to or asked for machine-readable output.
async fn drain(
    client: &AdminClient,
    output: OutputFormat,
    node: &str,
    deadline: std::time::Duration,
    no_wait: bool,
) -> Result<String, CtlError> {
    let query = DrainQuery {
        deadline_s: deadline.as_secs().max(1),
    };
    let path = format!(
        "{}?deadline_s={}",
        paths::node_action(node, "drain"),
        query.deadline_s
    );
    let started = client.call(Method::POST, &path, None).await?;
    if no_wait || output != OutputFormat::Table {
        show(output, &started, render_node_record)
    } else {
        let forced = crate::drain::follow(client, node).await?;
        Ok(crate::drain::summary(node, &forced))
    }
}

/// `-o json` and `-o yaml` print the answer as the peer sent it; a table
/// reads it through the admin API's contract first.
pub(crate) fn show<T: DeserializeOwned>(
    output: OutputFormat,
    answer: &Answer,
    table: impl FnOnce(&T) -> String,
) -> Result<String, CtlError> {
    Ok(match output {
        OutputFormat::Json => pretty_json(&answer.body),
        OutputFormat::Yaml => crate::yaml::to_yaml(&answer.body),
        OutputFormat::Table => table(&answer.decode::<T>()?),
    })
}

fn pretty_json(value: &Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(value).unwrap_or_default()
    )
}

pub(crate) fn json_body(body: &impl Serialize) -> Result<(&'static str, Vec<u8>), CtlError> {
    let bytes = serde_json::to_vec(body)
        .map_err(|e| CtlError::Usage(format!("cannot encode the request: {e}")))?;
    Ok(("application/json", bytes))
}

/// The top-level `name:` of a single YAML or JSON model entry.
fn name_in(text: &str) -> Option<String> {
    /// A model entry's name; its other fields are the server's to check.
    #[derive(Deserialize)]
    struct Named {
        name: String,
    }
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Named::deserialize(&value).ok().map(|entry| entry.name);
    }
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("name:")?;
        let name = rest.trim().trim_matches(|c| c == '"' || c == '\'');
        (!name.is_empty()).then(|| name.to_owned())
    })
}

/// A table cell for a value the API may leave out.
pub(crate) fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

/// A table cell listing values, "-" when there are none.
pub(crate) fn list<T: ToString>(items: &[T]) -> String {
    if items.is_empty() {
        return "-".to_owned();
    }
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn render_cluster(cluster: &ClusterView) -> String {
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
    for peer in &cluster.peers {
        table.row(vec![
            peer.id.to_string(),
            peer.addr.clone(),
            peer.role.to_string(),
            peer.membership.to_string(),
            or_dash(peer.term),
            or_dash(peer.last_log_index),
            or_dash(peer.last_applied_index),
            or_dash(peer.state_hash.as_deref()),
        ]);
    }
    let transport = if cluster.insecure {
        "  transport: INSECURE (plaintext gRPC)"
    } else {
        "  transport: mTLS"
    };
    let identity = match (&cluster.cluster_id, cluster.epoch) {
        (Some(id), Some(epoch)) => format!("cluster: {id}  epoch: {epoch}\n"),
        _ => "cluster: no epoch yet (a cluster just formed or restored, one from before \
              epochs, or an older server)\n"
            .to_owned(),
    };
    format!(
        "{identity}leader: {}  term: {}{transport}\n{}",
        leader_line(cluster),
        cluster.term,
        table.render()
    )
}

/// The leader the answering peer names and how recently it heard it: a
/// peer cut off from the others goes on naming the last leader it knew.
fn leader_line(cluster: &ClusterView) -> String {
    let Some(leader) = cluster.leader_id else {
        return "-".to_owned();
    };
    match cluster.leader_heard_ms_ago {
        Some(ms) if ms < 1000 => format!("{leader} (heard {ms} ms ago)"),
        Some(ms) => format!("{leader} (heard {:.1} s ago)", ms as f64 / 1000.0),
        None => format!("{leader} (not heard yet)"),
    }
}

const NODE_COLUMNS: [&str; 8] = [
    "ID",
    "STATUS",
    "FLAGS",
    "HEARTBEAT",
    "GPUS",
    "FABRICS",
    "SHARDS",
    "MGMT",
];

fn render_nodes(nodes: &[NodeView]) -> String {
    let mut table = Table::new(&NODE_COLUMNS);
    for node in nodes {
        let running = node
            .shards
            .iter()
            .filter(|shard| shard.state != ShardState::Stopped)
            .count();
        table.row(node_row(
            &node.record,
            node.gpus_used,
            running,
            node.stream.as_ref(),
        ));
    }
    table.render()
}

/// The node a cordon, uncordon or drain answers with: its record alone,
/// without the GPUs in use, shards or stream of the node listing.
fn render_node_record(record: &NodeRecord) -> String {
    let mut table = Table::new(&NODE_COLUMNS);
    table.row(node_row(record, 0, 0, None));
    table.render()
}

fn node_row(
    record: &NodeRecord,
    gpus_used: usize,
    running_shards: usize,
    stream: Option<&LinkView>,
) -> Vec<String> {
    let mut flags = Vec::new();
    if record.cordoned {
        flags.push("cordoned");
    }
    if record.draining {
        flags.push("draining");
    }
    vec![
        record.id.clone(),
        record.status.as_str().to_owned(),
        list(&flags),
        crate::render::heartbeat(stream),
        format!("{gpus_used}/{}", record.inventory.gpus.len()),
        list(&record.fabrics),
        running_shards.to_string(),
        record.mgmt_addr.clone(),
    ]
}

fn render_replicas(replicas: &[ReplicaView]) -> String {
    let mut table = Table::new(&["ID", "MODEL", "PROFILE", "STATE", "SHARDS"]);
    for view in replicas {
        let replica = &view.replica;
        let shards: Vec<String> = replica
            .shards
            .iter()
            .map(|shard| {
                let gpus: Vec<String> = shard.gpus.iter().map(u32::to_string).collect();
                format!(
                    "{}[{}]:{} {}",
                    shard.node,
                    gpus.join(","),
                    shard.port,
                    shard.state.as_str()
                )
            })
            .collect();
        table.row(vec![
            replica.id.clone(),
            replica.model.clone(),
            replica.profile.clone(),
            view.state.as_str().to_owned(),
            shards.join("; "),
        ]);
    }
    table.render()
}

fn render_models(models: &[Model]) -> String {
    let mut table = Table::new(&["NAME", "REPLICAS", "PROFILES", "SOURCE / ENDPOINTS"]);
    for model in models {
        let (replicas, profiles, source) = match model.managed() {
            Some(managed) => {
                let profiles: Vec<&str> =
                    managed.profiles.iter().map(|p| p.name.as_str()).collect();
                (
                    managed.replicas.to_string(),
                    list(&profiles),
                    managed.source.clone(),
                )
            }
            None => (
                "-".to_owned(),
                "-".to_owned(),
                model.static_endpoints().join(","),
            ),
        };
        table.row(vec![model.name.clone(), replicas, profiles, source]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use llmgw_api::{Membership, PeerRole, PeerView};

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

    fn cluster(insecure: bool, peers: Vec<PeerView>) -> ClusterView {
        ClusterView {
            id: 1,
            leader_id: Some(1),
            leader_heard_ms_ago: Some(12),
            term: 3,
            peers,
            insecure,
            leader_changes_last_hour: 0,
            cluster_id: Some("prod-a".to_owned()),
            epoch: Some(1_700),
        }
    }

    #[test]
    fn cluster_table_shows_each_peer() {
        let leader = PeerView {
            id: 1,
            addr: "127.0.0.1:7443".to_owned(),
            admin: "https://127.0.0.1:7480".to_owned(),
            membership: Membership::Voter,
            role: PeerRole::Leader,
            term: Some(3),
            last_log_index: Some(9),
            last_applied_index: Some(9),
            state_hash: Some("00ff".to_owned()),
            error: None,
        };
        let out = render_cluster(&cluster(false, vec![leader]));
        assert!(
            out.starts_with(
                "cluster: prod-a  epoch: 1700\nleader: 1 (heard 12 ms ago)  term: 3  transport: mTLS\n"
            ),
            "{out}"
        );
        assert!(out.contains("127.0.0.1:7443  leader"));
        let insecure = render_cluster(&cluster(true, Vec::new()));
        assert!(insecure.contains("transport: INSECURE"), "{insecure}");
    }

    #[test]
    fn the_leader_line_says_how_stale_the_named_leader_is() {
        let with = |leader_id, heard| ClusterView {
            leader_id,
            leader_heard_ms_ago: heard,
            ..cluster(false, Vec::new())
        };
        let line = |view: &ClusterView| leader_line(view);
        assert_eq!(line(&with(Some(2), Some(4260))), "2 (heard 4.3 s ago)");
        assert_eq!(line(&with(Some(2), None)), "2 (not heard yet)");
        assert_eq!(line(&with(None, None)), "-");
    }

    #[test]
    fn an_unreachable_peer_shows_dashes_for_what_it_did_not_say() {
        let silent = PeerView {
            id: 2,
            addr: "10.0.0.2:7443".to_owned(),
            admin: String::new(),
            membership: Membership::Learner,
            role: PeerRole::Unreachable,
            term: None,
            last_log_index: None,
            last_applied_index: None,
            state_hash: None,
            error: Some("timed out".to_owned()),
        };
        let out = render_cluster(&cluster(false, vec![silent]));
        let row = out.lines().nth(3).expect("a row");
        assert_eq!(
            row,
            "2   10.0.0.2:7443  unreachable  learner  -     -         -        -"
        );
    }

    #[tokio::test]
    async fn unreachable_peers_are_named_with_what_to_do_next() {
        // Port 9 (discard) on loopback is closed on test machines.
        let client = AdminClient::new(vec!["http://127.0.0.1:9".into()], None, None).unwrap();
        let error = client
            .call(Method::GET, paths::CLUSTER, None)
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
