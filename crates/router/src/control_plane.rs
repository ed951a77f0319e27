//! Endpoints learnt from the control plane's admin API, for a standalone
//! `llmgw router`: polls `GET /api/v1/models` and `GET /api/v1/replicas` on
//! the peers (any peer answers reads), and keeps the last known table while
//! none answers, because engines keep serving while the control plane is
//! down or electing. Peers with TLS serve the admin API over HTTPS: the
//! router trusts the cluster's CA bundle and sends a read token.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use llmgw_tls::error_chain;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::RouterError;
use crate::settings::{SecretFileError, read_secret_file};
use crate::table::{
    Endpoint, EndpointSource, EndpointState, RoutedModel, RoutingTable, normalize_url,
};

/// How often the peers are asked. Replica changes are rare next to
/// requests; a second bounds how long a drained replica keeps getting work.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

pub struct ControlPlaneWatcher {
    table: watch::Receiver<Arc<RoutingTable>>,
    task: JoinHandle<()>,
}

impl EndpointSource for ControlPlaneWatcher {
    fn subscribe(&self) -> watch::Receiver<Arc<RoutingTable>> {
        self.table.clone()
    }
}

impl Drop for ControlPlaneWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How the router reaches the peers' admin API.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneAccess {
    /// CA bundle that signed the peers' certificates (https:// peers).
    pub ca: Option<PathBuf>,
    /// An admin API read token; sent as `Authorization: Bearer`.
    pub token: Option<String>,
}

impl ControlPlaneAccess {
    /// router.yaml's `control_plane_ca` and `control_plane_token_file`.
    pub fn from_config(config: &llmgw_config::RouterConfig) -> Result<Self, RouterError> {
        let token = match &config.control_plane_token_file {
            Some(file) => Some(read_secret_file(file).map_err(|e| match e {
                SecretFileError::Unreadable(source) => RouterError::ControlPlaneTokenFile {
                    file: file.clone(),
                    source,
                },
                SecretFileError::Empty => {
                    RouterError::ControlPlaneEmptyToken { file: file.clone() }
                }
            })?),
            None => None,
        };
        Ok(ControlPlaneAccess {
            ca: config.control_plane_ca.clone(),
            token,
        })
    }
}

/// The admin API as the watcher calls it.
struct AdminApi {
    http: reqwest::Client,
    token: Option<String>,
}

impl AdminApi {
    fn new(access: ControlPlaneAccess, connect_timeout: Duration) -> Result<Self, RouterError> {
        let mut builder = reqwest::Client::builder().connect_timeout(connect_timeout);
        if let Some(ca) = &access.ca {
            let tls = llmgw_tls::https_client_config(ca)
                .map_err(|e| RouterError::ControlPlaneCa(e.to_string()))?;
            builder = builder.use_preconfigured_tls(tls);
        }
        let http = builder
            .build()
            .map_err(|e| RouterError::ControlPlaneCa(format!("cannot build the client: {e}")))?;
        Ok(AdminApi {
            http,
            token: access.token,
        })
    }

    /// Status and body of `GET url`, within `limit`.
    async fn get_text(&self, url: &str, limit: Duration) -> Result<(u16, String), String> {
        let mut request = self.http.get(url).timeout(limit);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| error_chain(&e))?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(|e| error_chain(&e))?;
        Ok((status, body))
    }
}

impl ControlPlaneWatcher {
    /// Starts polling `peers` (admin API base URLs). `static_models` (from
    /// router.yaml) are served alongside what the control plane reports and
    /// win on a name clash, since the operator wrote them for this router.
    pub fn spawn(
        peers: Vec<String>,
        access: ControlPlaneAccess,
        static_models: RoutingTable,
        interval: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, RouterError> {
        let (tx, rx) = watch::channel(Arc::new(static_models.clone()));
        let api = AdminApi::new(access, connect_timeout)?;
        let task = tokio::spawn(poll_loop(peers, static_models, interval, api, tx));
        Ok(ControlPlaneWatcher { table: rx, task })
    }
}

async fn poll_loop(
    peers: Vec<String>,
    static_models: RoutingTable,
    interval: Duration,
    api: AdminApi,
    tx: watch::Sender<Arc<RoutingTable>>,
) {
    let peers: Vec<String> = peers
        .iter()
        .map(|p| p.trim_end_matches('/').to_string())
        .collect();
    let mut preferred = 0;
    let mut reachable = true;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut fetched = None;
        let mut failures = Vec::new();
        for i in 0..peers.len() {
            let peer = &peers[(preferred + i) % peers.len()];
            match fetch(&api, peer).await {
                Ok(table) => {
                    preferred = (preferred + i) % peers.len();
                    fetched = Some(table);
                    break;
                }
                Err(e) => failures.push(format!("{peer}: {e}")),
            }
        }
        match fetched {
            Some(mut table) => {
                if !reachable {
                    tracing::info!(peer = %peers[preferred], "control plane answers again");
                    reachable = true;
                }
                merge_static(&mut table, &static_models);
                tx.send_if_modified(|current| {
                    let changed = **current != table;
                    if changed {
                        *current = Arc::new(table);
                    }
                    changed
                });
            }
            None if reachable => {
                reachable = false;
                tracing::warn!(
                    "no control-plane peer answered; keeping the last known endpoints: {}",
                    failures.join("; ")
                );
            }
            None => {}
        }
    }
}

fn merge_static(table: &mut RoutingTable, static_models: &RoutingTable) {
    for model in &static_models.models {
        table.models.retain(|m| m.name != model.name);
        table.models.push(model.clone());
    }
}

const FETCH_LIMIT: Duration = Duration::from_secs(3);

async fn get_json(api: &AdminApi, url: &str) -> Result<Value, String> {
    let (status, body) = api.get_text(url, FETCH_LIMIT).await?;
    if status != 200 {
        return Err(format!("GET {url} answered {status}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
}

async fn fetch(api: &AdminApi, peer: &str) -> Result<RoutingTable, String> {
    let models = get_json(api, &format!("{peer}/api/v1/models")).await?;
    let replicas = get_json(api, &format!("{peer}/api/v1/replicas")).await?;
    let needs_nodes = list(&replicas, "replicas")
        .iter()
        .any(|r| replica_endpoint(r, None).is_none());
    let nodes = if needs_nodes {
        get_json(api, &format!("{peer}/api/v1/nodes")).await.ok()
    } else {
        None
    };
    let mut table = build_table(&models, &replicas, nodes.as_ref());
    for model in &mut table.models {
        if model.ready_endpoints().next().is_none() && model.unavailable_reason.is_none() {
            let url = format!("{peer}/api/v1/models/{}/explain", model.name);
            if let Ok((200, text)) = api.get_text(&url, FETCH_LIMIT).await {
                model.unavailable_reason = Some(explanation_text(&text));
            }
        }
    }
    Ok(table)
}

/// Accepts a bare list or an object holding the list under `key`.
fn list<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    match value {
        Value::Array(items) => items,
        Value::Object(map) => map
            .get(key)
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice),
        _ => &[],
    }
}

fn string<'a>(value: &'a Value, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|k| value.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
}

/// The table the admin API describes: every catalog model, with the
/// endpoints of its `ready` and `draining` replicas.
pub fn build_table(models: &Value, replicas: &Value, nodes: Option<&Value>) -> RoutingTable {
    let mut table = RoutingTable {
        models: list(models, "models")
            .iter()
            .filter_map(|m| {
                let name = string(m, &["name"])?.to_string();
                let aliases = m
                    .get("aliases")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                let endpoints = m
                    .get("endpoints")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(Endpoint::ready)
                            .collect()
                    })
                    .unwrap_or_default();
                Some(RoutedModel {
                    name,
                    aliases,
                    endpoints,
                    unavailable_reason: string(m, &["unavailable_reason", "explanation"])
                        .map(String::from),
                })
            })
            .collect(),
    };
    for replica in list(replicas, "replicas") {
        let Some(model_name) = string(replica, &["model"]) else {
            continue;
        };
        let state = match string(replica, &["state"]) {
            Some("ready") => EndpointState::Ready,
            Some("draining") => EndpointState::Draining,
            _ => continue,
        };
        let Some(url) = replica_endpoint(replica, nodes) else {
            tracing::warn!(replica = ?string(replica, &["id"]), "replica has no endpoint address the router can use");
            continue;
        };
        let Some(model) = table.models.iter_mut().find(|m| m.name == model_name) else {
            continue;
        };
        model.endpoints.push(Endpoint { url, state });
    }
    table
}

/// The head shard's HTTP address: the replica's own `endpoint`/`url` if the
/// server gives one, else the head shard's host and port, else the head
/// shard's node address from `/api/v1/nodes`.
fn replica_endpoint(replica: &Value, nodes: Option<&Value>) -> Option<String> {
    if let Some(url) = string(replica, &["endpoint", "url"]) {
        return Some(normalize_url(url));
    }
    let shards = replica.get("shards").and_then(Value::as_array)?;
    let head = shards
        .iter()
        .find(|s| s.get("rank").and_then(Value::as_u64) == Some(0))
        .or_else(|| shards.first())?;
    if let Some(url) = string(head, &["endpoint", "url"]) {
        return Some(normalize_url(url));
    }
    let port = head.get("port").and_then(Value::as_u64)?;
    let host = match string(head, &["host", "addr", "address"]) {
        Some(host) => host.to_string(),
        None => {
            let node_id = string(head, &["node"])?;
            let node = list(nodes?, "nodes")
                .iter()
                .find(|n| string(n, &["id"]) == Some(node_id))?;
            let addr = string(node, &["http_host", "mgmt_addr", "addr", "address", "host"])?;
            host_of(addr).to_string()
        }
    };
    Some(format!("http://{host}:{port}"))
}

/// `10.0.0.5:7443` → `10.0.0.5`; `[::1]:7443` → `[::1]`; a bare host as is.
fn host_of(addr: &str) -> &str {
    let addr = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .unwrap_or(addr);
    if addr.starts_with('[') {
        return addr.split_inclusive(']').next().unwrap_or(addr);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => addr,
    }
}

/// The explain route's answer as one line for a 503 message.
fn explanation_text(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| match v {
            Value::String(s) => Some(s),
            v => string(&v, &["explanation", "message", "summary"]).map(String::from),
        });
    let text = from_json.unwrap_or_else(|| body.trim().to_string());
    text.chars().take(2000).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ready_and_draining_replicas_become_endpoints() {
        let models = json!([{"name": "llama", "aliases": ["l3"], "source": "x", "replicas": 2, "profiles": []},
                            {"name": "partner", "endpoints": ["http://10.1.2.3:8000/v1"]}]);
        let replicas = json!([
            {"id": "r1", "model": "llama", "state": "ready", "endpoint": "http://10.0.0.1:8000"},
            {"id": "r2", "model": "llama", "state": "draining",
             "shards": [{"node": "n2", "gpus": [0], "port": 8001, "state": "ready", "pid": 4, "rank": 0}]},
            {"id": "r3", "model": "llama", "state": "starting", "endpoint": "http://10.0.0.3:8000"},
            {"id": "r4", "model": "llama", "state": "ready",
             "shards": [{"node": "n9", "port": 8002}]}
        ]);
        let nodes = json!([{"id": "n2", "status": "ready", "addr": "10.0.0.2:7443"}]);
        let table = build_table(&models, &replicas, Some(&nodes));
        let llama = table.resolve("l3").unwrap();
        assert_eq!(
            llama.endpoints,
            vec![
                Endpoint::ready("http://10.0.0.1:8000"),
                Endpoint::draining("http://10.0.0.2:8001")
            ]
        );
        assert_eq!(
            table.resolve("partner").unwrap().endpoints,
            vec![Endpoint::ready("http://10.1.2.3:8000")]
        );
    }

    #[test]
    fn wrapped_lists_and_explanations() {
        let models = json!({"models": [{"name": "m"}]});
        let replicas = json!({"replicas": []});
        let table = build_table(&models, &replicas, None);
        assert_eq!(table.models.len(), 1);
        assert_eq!(
            explanation_text("{\"explanation\": \"0/3 nodes fit\"}"),
            "0/3 nodes fit"
        );
        assert_eq!(explanation_text("0/3 nodes fit\n"), "0/3 nodes fit");
        assert_eq!(host_of("10.0.0.5:7443"), "10.0.0.5");
        assert_eq!(host_of("[::1]:7443"), "[::1]");
        assert_eq!(host_of("gpu-1.internal"), "gpu-1.internal");
    }
}
