//! Endpoints learnt from the control plane's admin API, for a standalone
//! `llmgw router`: polls `GET /api/v1/models` and `GET /api/v1/replicas` on
//! the peers (any peer answers reads), and keeps the last known table while
//! none answers, because engines keep serving while the control plane is
//! down or electing. Peers with TLS serve the admin API over HTTPS: the
//! router trusts the cluster's CA bundle and sends a read token. A catalog
//! entry this router cannot read (a newer server's) is left out and the
//! rest are routed.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use llmgw_api::{Model, ModelExplanation, ReplicaState, ReplicaView, paths};
use llmgw_tls::error_chain;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::RouterError;
use crate::keys::KeyRing;
use crate::settings::{SecretFileError, read_secret_file};
use crate::table::{
    Endpoint, EndpointSource, EndpointState, RoutedModel, RoutingTable, normalize_url,
};
use llmgw_api::keys::KeyView;

/// How often the peers are asked. Replica changes are rare next to
/// requests; a second bounds how long a drained replica keeps getting work.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

pub struct ControlPlaneWatcher {
    table: watch::Receiver<Arc<RoutingTable>>,
    task: JoinHandle<()>,
    waker: Arc<PeersWaker>,
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
#[derive(Clone)]
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

    /// Status of a `POST url` of `body` as JSON, within `limit`.
    async fn post_json(
        &self,
        url: &str,
        body: &impl serde::Serialize,
        limit: Duration,
    ) -> Result<u16, String> {
        let mut request = self.http.post(url).json(body).timeout(limit);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| error_chain(&e))?;
        Ok(response.status().as_u16())
    }

    /// Status of an empty `POST url`, within `limit`.
    async fn post(&self, url: &str, limit: Duration) -> Result<u16, String> {
        let mut request = self.http.post(url).timeout(limit);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| error_chain(&e))?;
        Ok(response.status().as_u16())
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
        let waker = Arc::new(PeersWaker {
            peers: peers.clone(),
            api: api.clone(),
            last_asked: std::sync::Mutex::new(std::collections::HashMap::new()),
        });
        let task = tokio::spawn(poll_loop(peers, static_models, interval, api, tx));
        Ok(ControlPlaneWatcher {
            table: rx,
            task,
            waker,
        })
    }

    /// Asks the peers for a replica of a model scaled to zero
    /// (`POST /api/v1/models/{name}/wake`, which the read token may send).
    pub fn waker(&self) -> Arc<dyn crate::wake::ModelWaker> {
        Arc::clone(&self.waker) as Arc<dyn crate::wake::ModelWaker>
    }
}

impl ControlPlaneWatcher {
    /// Sends usage reports to the peers (`POST /api/v1/usage`, which the
    /// read token may send).
    pub fn usage_sink(&self) -> Arc<dyn crate::usage::UsageSink> {
        Arc::new(PeersUsageSink {
            peers: self.waker.peers.clone(),
            api: self.waker.api.clone(),
        })
    }
}

struct PeersUsageSink {
    peers: Vec<String>,
    api: AdminApi,
}

impl crate::usage::UsageSink for PeersUsageSink {
    fn send(
        &self,
        report: llmgw_api::usage::UsageReport,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let (peers, api) = (self.peers.clone(), self.api.clone());
        Box::pin(async move {
            let mut failures = Vec::new();
            for peer in &peers {
                let url = format!("{}{}", peer.trim_end_matches('/'), paths::USAGE);
                match api.post_json(&url, &report, FETCH_LIMIT).await {
                    // 409: counted already (an earlier try whose answer
                    // was lost).
                    Ok(status) if (200..300).contains(&status) || status == 409 => return Ok(()),
                    Ok(status) => failures.push(format!("{peer}: HTTP {status}")),
                    Err(error) => failures.push(format!("{peer}: {error}")),
                }
            }
            Err(failures.join("; "))
        })
    }
}

/// Held requests for one model ask at most this often.
const WAKE_COALESCE: Duration = Duration::from_secs(1);

struct PeersWaker {
    peers: Vec<String>,
    api: AdminApi,
    last_asked: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl crate::wake::ModelWaker for PeersWaker {
    fn wake(&self, model: &str) {
        {
            let mut asked = self.last_asked.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            if asked
                .get(model)
                .is_some_and(|at| now.duration_since(*at) < WAKE_COALESCE)
            {
                return;
            }
            asked.insert(model.to_owned(), now);
        }
        let (peers, api, model) = (self.peers.clone(), self.api.clone(), model.to_owned());
        tokio::spawn(async move {
            let mut failures = Vec::new();
            for peer in &peers {
                let url = format!(
                    "{}{}",
                    peer.trim_end_matches('/'),
                    llmgw_api::paths::wake(&model)
                );
                match api.post(&url, FETCH_LIMIT).await {
                    Ok(status) if (200..300).contains(&status) => return,
                    Ok(status) => failures.push(format!("{peer}: HTTP {status}")),
                    Err(error) => failures.push(format!("{peer}: {error}")),
                }
            }
            // The next held request asks again.
            tracing::warn!(model = %model, "no peer took the request for a replica of a model scaled to zero: {}", failures.join("; "));
        });
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
    let mut unreadable = UnreadableEntries::default();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut fetched = None;
        let mut failures = Vec::new();
        for i in 0..peers.len() {
            let peer = &peers[(preferred + i) % peers.len()];
            match fetch(&api, peer, &mut unreadable).await {
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

/// `GET url`, decoded as the admin API's answer `T`.
async fn get_view<T: DeserializeOwned>(api: &AdminApi, url: &str) -> Result<T, String> {
    let (status, body) = api.get_text(url, FETCH_LIMIT).await?;
    if status != 200 {
        return Err(format!("GET {url} answered {status}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("GET {url}: not the admin API's answer: {e}"))
}

async fn fetch(
    api: &AdminApi,
    peer: &str,
    unreadable: &mut UnreadableEntries,
) -> Result<RoutingTable, String> {
    let entries: Vec<serde_json::Value> =
        get_view(api, &format!("{peer}{}", paths::MODELS)).await?;
    let (models, newly_unreadable) = unreadable.sort_out(entries);
    for entry in newly_unreadable {
        tracing::warn!(
            model = %entry.name,
            "catalog entry not routed: this router cannot read it: {}",
            entry.why
        );
    }
    let replicas: Vec<ReplicaView> = get_view(api, &format!("{peer}{}", paths::REPLICAS)).await?;
    let mut table = build_table(&models, &replicas);
    table.keys = fetch_keys(api, peer).await?;
    for model in &mut table.models {
        if model.ready_endpoints().next().is_none() && model.unavailable_reason.is_none() {
            let url = format!("{peer}{}", paths::explain(&model.name));
            if let Ok(explained) = get_view::<ModelExplanation>(api, &url).await {
                model.unavailable_reason = Some(unavailable_reason(&explained));
            }
        }
    }
    Ok(table)
}

/// The control plane's API keys. A peer from before keys answers 404 and
/// has none; any other failure keeps the last table whole, keys included.
async fn fetch_keys(api: &AdminApi, peer: &str) -> Result<KeyRing, String> {
    let url = format!("{peer}{}", paths::KEYS);
    let (status, body) = api.get_text(&url, FETCH_LIMIT).await?;
    match status {
        200 => serde_json::from_str::<Vec<KeyView>>(&body)
            .map(|keys| KeyRing::from_views(&keys))
            .map_err(|e| format!("GET {url}: not the admin API's answer: {e}")),
        404 => Ok(KeyRing::default()),
        _ => Err(format!("GET {url} answered {status}")),
    }
}

/// Catalog entries this router cannot decode, remembered so that each is
/// warned about once rather than on every poll.
#[derive(Debug, Default)]
struct UnreadableEntries {
    /// Each entry's JSON text: an entry rewritten is a new one.
    seen: HashSet<String>,
}

/// A catalog entry left out of the table, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unreadable {
    name: String,
    why: String,
}

impl UnreadableEntries {
    /// The entries this router can route, and those it cannot that it had
    /// not met before. An entry it cannot decode (a newer server's, with a
    /// field or engine this build does not know) is left out, as replicated
    /// state leaves it alone, instead of failing the whole list and with it
    /// every other model's updates.
    fn sort_out(&mut self, entries: Vec<serde_json::Value>) -> (Vec<Model>, Vec<Unreadable>) {
        let mut models = Vec::with_capacity(entries.len());
        let mut unreadable_now = HashSet::new();
        let mut new = Vec::new();
        for entry in entries {
            match Model::deserialize(&entry) {
                Ok(model) => models.push(model),
                Err(why) => {
                    let text = entry.to_string();
                    if !self.seen.contains(&text) {
                        new.push(Unreadable {
                            name: entry_name(&entry).to_owned(),
                            why: why.to_string(),
                        });
                    }
                    unreadable_now.insert(text);
                }
            }
        }
        // Forgetting entries that left the catalog keeps the set bounded.
        self.seen = unreadable_now;
        (models, new)
    }
}

/// The `name` an entry gives itself, for the warning.
fn entry_name(entry: &serde_json::Value) -> &str {
    entry
        .get("name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("(unnamed)")
}

/// The table the admin API describes: every catalog model, with its static
/// endpoints and the endpoints of its `ready` and `draining` replicas.
pub fn build_table(models: &[Model], replicas: &[ReplicaView]) -> RoutingTable {
    let mut table = RoutingTable {
        keys: Default::default(),
        models: models
            .iter()
            .map(|model| RoutedModel {
                name: model.name.clone(),
                aliases: model.aliases.clone(),
                mapped_aliases: Vec::new(),
                endpoints: model
                    .static_endpoints()
                    .iter()
                    .map(Endpoint::ready)
                    .collect(),
                unavailable_reason: None,
                wakes_on_request: model
                    .managed()
                    .and_then(|m| m.autoscale)
                    .is_some_and(|a| a.wakes_on_request()),
                max_requests_per_replica: model
                    .managed()
                    .and_then(|m| m.autoscale)
                    .and_then(|a| a.max_requests_per_replica),
            })
            .collect(),
    };
    for view in replicas {
        let state = match view.state {
            // Going to sleep: nothing new is sent to it.
            _ if view.wanted_asleep => continue,
            ReplicaState::Ready => EndpointState::Ready,
            ReplicaState::Draining => EndpointState::Draining,
            _ => continue,
        };
        // The server names no endpoint when the head shard's node is not
        // registered: there is nowhere to send requests.
        let Some(url) = &view.endpoint else {
            tracing::warn!(replica = %view.replica.id, "replica has no endpoint address the router can use");
            continue;
        };
        let Some(model) = table
            .models
            .iter_mut()
            .find(|m| m.name == view.replica.model)
        else {
            continue;
        };
        model.note_served_names(view.replica.served_names.as_deref());
        model.endpoints.push(Endpoint {
            url: normalize_url(url),
            state,
            kv_events: view
                .kv_events
                .as_ref()
                .map(|kv| {
                    llmgw_kv_events::Endpoints {
                        stream: kv.stream.clone(),
                        replay: Some(kv.replay.clone()),
                        topic: String::new(),
                    }
                    .ranks(kv.ranks)
                })
                .unwrap_or_default(),
        });
    }
    table
}

/// Why a model has no ready replica, as one line for a 503 message: the
/// scheduler's explanation when replicas are pending, else the states of
/// the replicas it has and the last failure.
fn unavailable_reason(explained: &ModelExplanation) -> String {
    let text = match &explained.explanation {
        Some(explanation) => explanation.clone(),
        None => replica_summary(explained),
    };
    text.chars().take(2000).collect()
}

/// `no replica of m is ready (2 desired, 1 loading, 1 failed); last failure
/// on node n: ...`, the in-peer router's words.
fn replica_summary(explained: &ModelExplanation) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for replica in &explained.replicas {
        *counts.entry(replica.state.as_str()).or_default() += 1;
    }
    let mut why = format!(
        "no replica of {} is ready ({} desired",
        explained.model, explained.desired
    );
    for (state, n) in &counts {
        why.push_str(&format!(", {n} {state}"));
    }
    why.push(')');
    if let Some(failure) = &explained.last_failure {
        why.push_str(&format!(
            "; last failure on node {}: {}",
            failure.node, failure.failure.message
        ));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmgw_api::{Replica, ReplicaWhy, Shard, ShardState};

    fn model(json: &str) -> Model {
        llmgw_catalog::parse_model("a test entry", json).expect("a valid catalog entry")
    }

    fn replica_view(id: &str, state: ReplicaState, endpoint: Option<&str>) -> ReplicaView {
        let shard_state = match state {
            ReplicaState::Ready => ShardState::Ready,
            ReplicaState::Draining => ShardState::Draining,
            _ => ShardState::Starting,
        };
        ReplicaView {
            state,
            endpoint: endpoint.map(String::from),
            kv_events: None,
            wanted_asleep: false,
            replica: Replica {
                id: id.into(),
                model: "llama".into(),
                profile: "tp1".into(),
                shards: vec![Shard {
                    node: "n1".into(),
                    gpus: vec![0],
                    port: 8000,
                    rank: 0,
                    state: shard_state,
                    pid: Some(4),
                    last_failure: None,
                    state_changed_at_ms: 1,
                    report_seq: 1,
                }],
                created_at_ms: 1,
                fabric: None,
                rendezvous_port: None,
                kv_event_ports: None,
                replaces: None,
                stop: None,
                spec_fingerprint: None,
                served_names: None,
            },
        }
    }

    #[test]
    fn ready_and_draining_replicas_become_endpoints() {
        let models = vec![
            model(LLAMA),
            model(r#"{"name": "partner", "endpoints": ["http://10.1.2.3:8000"]}"#),
        ];
        let replicas = vec![
            replica_view("r1", ReplicaState::Ready, Some("http://10.0.0.1:8000")),
            replica_view("r2", ReplicaState::Draining, Some("http://10.0.0.2:8001/")),
            replica_view("r3", ReplicaState::Starting, Some("http://10.0.0.3:8000")),
            replica_view("r4", ReplicaState::Ready, None),
            // Still ready, but the leader wants it asleep: nothing new.
            ReplicaView {
                wanted_asleep: true,
                ..replica_view("r5", ReplicaState::Ready, Some("http://10.0.0.5:8000"))
            },
        ];
        // What the server sends, read back as the router reads it.
        let replicas: Vec<ReplicaView> =
            serde_json::from_str(&serde_json::to_string(&replicas).unwrap()).unwrap();
        let table = build_table(&models, &replicas);
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
    fn an_entry_the_router_cannot_read_leaves_the_others_routed_and_is_warned_once() {
        let future = serde_json::json!({"name": "future", "source": "x", "replicas": 1,
            "profiles": [{"name": "p", "engine": "an-engine-from-a-newer-server", "nodes": 1,
                          "gpus_per_node": 1, "tensor_parallel": 1, "pipeline_parallel": 1,
                          "min_gpu_memory_gb": 0}]});
        let entries = vec![
            serde_json::from_str(LLAMA).unwrap(),
            future.clone(),
            serde_json::json!({"name": "partner", "endpoints": ["http://10.1.2.3:8000"]}),
        ];
        let mut unreadable = UnreadableEntries::default();

        let (models, new) = unreadable.sort_out(entries.clone());
        let table = build_table(&models, &[]);
        let names: Vec<&str> = table.models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["llama", "partner"]);
        assert!(table.resolve("l3").is_some());
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].name, "future");

        let (models, new) = unreadable.sort_out(entries);
        assert_eq!(models.len(), 2);
        assert!(new.is_empty(), "warned again on the next poll: {new:?}");

        let mut rewritten = future;
        rewritten["replicas"] = 2.into();
        let (_, new) = unreadable.sort_out(vec![rewritten]);
        assert_eq!(new.len(), 1, "a rewritten entry is a new one");
    }

    const LLAMA: &str = r#"{"name": "llama", "aliases": ["l3"], "source": "x", "replicas": 2,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16}]}"#;

    fn explanation(text: Option<&str>, replicas: Vec<ReplicaWhy>) -> ModelExplanation {
        ModelExplanation {
            model: "m".into(),
            desired: 2,
            replicas,
            pending: 1,
            explanation: text.map(String::from),
            detail: None,
            last_failure: None,
            scaling: None,
            last_scale: None,
        }
    }

    #[test]
    fn a_model_with_no_ready_replica_says_why() {
        let table = build_table(&[model(LLAMA)], &[]);
        assert_eq!(table.models.len(), 1);
        assert!(table.models[0].endpoints.is_empty());
        assert_eq!(
            unavailable_reason(&explanation(Some("0/3 nodes fit"), Vec::new())),
            "0/3 nodes fit"
        );
        let loading = ReplicaWhy {
            id: "r1".into(),
            state: ReplicaState::Loading,
            why: "profile tp1".into(),
        };
        assert_eq!(
            unavailable_reason(&explanation(None, vec![loading])),
            "no replica of m is ready (2 desired, 1 loading)"
        );
    }
}
