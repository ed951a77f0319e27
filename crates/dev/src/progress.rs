//! What `llmgw dev` shows while the cluster comes up: the leader election,
//! nodes registering, and each replica moving through its states, with the
//! placement explanation while one waits.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use llmgw_api::{
    ClusterView, Model, ModelExplanation, NodeStatus, NodeView, ReplicaState, ReplicaView, Shard,
    paths,
};
use serde::de::DeserializeOwned;

use crate::access::AdminAccess;
use crate::run::{DevError, Phase, Running, check_children};

pub(crate) struct Progress {
    apis: Vec<String>,
    /// Sends the read token.
    http: reqwest::Client,
    /// What was last printed per subject, so each change prints once.
    shown: BTreeMap<String, String>,
}

impl Progress {
    pub(crate) fn new(apis: Vec<String>, access: &AdminAccess) -> Progress {
        Progress {
            apis,
            http: access.http_client(Duration::from_secs(3), access.read_token().ok().as_deref()),
            shown: BTreeMap::new(),
        }
    }

    fn show(&mut self, subject: &str, text: String) {
        if self.shown.get(subject) != Some(&text) {
            println!("  {subject}: {text}");
            self.shown.insert(subject.to_owned(), text);
        }
    }

    /// GET from the first peer that answers, as the admin API's `T`.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> Option<T> {
        for api in &self.apis {
            if let Ok(response) = self.http.get(format!("{api}{path}")).send().await
                && response.status().is_success()
                && let Ok(value) = response.json().await
            {
                return Some(value);
            }
        }
        None
    }

    pub(crate) async fn wait_leader(
        &mut self,
        running: &mut [Running],
        timeout: Duration,
        work_dir: &Path,
    ) -> Result<(), DevError> {
        println!("starting {} control-plane peers", self.apis.len());
        let started = Instant::now();
        loop {
            check_children(running, Phase::Forming)?;
            if let Some(cluster) = self.get::<ClusterView>(paths::CLUSTER).await
                && let Some(leader) = cluster.leader_id
            {
                self.show(
                    "control plane",
                    format!("peer {leader} leads (term {})", cluster.term),
                );
                return Ok(());
            }
            self.show("control plane", "electing a leader".into());
            if started.elapsed() > timeout {
                return Err(not_ready(
                    "no leader was elected",
                    timeout,
                    "no peer names a leader",
                    work_dir,
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn wait_nodes(
        &mut self,
        running: &mut [Running],
        count: usize,
        timeout: Duration,
        work_dir: &Path,
    ) -> Result<(), DevError> {
        if count == 0 {
            return Ok(());
        }
        println!("starting {count} simulated GPU nodes");
        let started = Instant::now();
        loop {
            check_children(running, Phase::Formed)?;
            let nodes: Vec<NodeView> = self.get(paths::NODES).await.unwrap_or_default();
            let mut ready = 0;
            for node in &nodes {
                let node = &node.record;
                let gpus = node.inventory.gpus.len();
                let fabric = if node.fabrics.is_empty() {
                    "no fabric".to_owned()
                } else {
                    node.fabrics.join(",")
                };
                self.show(
                    &format!("node {}", node.id),
                    format!("{} ({gpus} GPUs, {fabric})", node.status.as_str()),
                );
                if node.status == NodeStatus::Ready {
                    ready += 1;
                }
            }
            if ready >= count {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(not_ready(
                    "not every node registered",
                    timeout,
                    &format!("{ready} of {count} ready"),
                    work_dir,
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn not_ready(what: &'static str, timeout: Duration, detail: &str, work_dir: &Path) -> DevError {
    DevError::NotReady {
        what,
        timeout,
        detail: detail.to_owned(),
        work_dir: work_dir.to_owned(),
    }
}

/// Waits until every catalog model has its desired replicas ready and the
/// router answers a chat, printing each replica's state as it changes and
/// why a model waits.
pub(crate) async fn wait_serving(
    progress: &mut Progress,
    running: &mut [Running],
    router: &str,
    timeout: Duration,
    work_dir: &Path,
) -> Result<(), DevError> {
    println!("placing and loading the demo models (simulated engines)");
    let started = Instant::now();
    loop {
        check_children(running, Phase::Formed)?;
        let models: Vec<Model> = progress.get(paths::MODELS).await.unwrap_or_default();
        let replicas: Vec<ReplicaView> = progress.get(paths::REPLICAS).await.unwrap_or_default();
        let mut missing = Vec::new();
        for model in &models {
            let name = &model.name;
            let mut ready = 0;
            for replica in replicas.iter().filter(|r| &r.replica.model == name) {
                progress.show(
                    &format!("replica {}", replica.replica.id),
                    format!(
                        "{} on {}",
                        replica.state.as_str(),
                        placement(&replica.replica.shards)
                    ),
                );
                if replica.state == ReplicaState::Ready {
                    ready += 1;
                }
            }
            if ready < model.desired_replicas() {
                missing.push(name.clone());
                if ready == 0
                    && started.elapsed() > Duration::from_secs(5)
                    && let Some(why) = progress
                        .get::<ModelExplanation>(&paths::explain(name))
                        .await
                    && let Some(text) = why.explanation
                {
                    progress.show(&format!("model {name}"), format!("waiting: {text}"));
                }
            }
        }
        if missing.is_empty() && chat_works(&progress.http, router).await {
            println!("  router {router}: serving");
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(not_ready(
                "the demo models were not ready",
                timeout,
                &format!("still waiting for {}", missing.join(", ")),
                work_dir,
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where a replica's shards run: `node[gpu,gpu] + node[gpu]`.
fn placement(shards: &[Shard]) -> String {
    shards
        .iter()
        .map(|shard| {
            let gpus: Vec<String> = shard.gpus.iter().map(u32::to_string).collect();
            format!("{}[{}]", shard.node, gpus.join(","))
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

async fn chat_works(http: &reqwest::Client, router: &str) -> bool {
    let body = serde_json::json!({
        "model": "qwen-0.5b",
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 2
    });
    matches!(
        http.post(format!("{router}/v1/chat/completions")).json(&body).send().await,
        Ok(response) if response.status().is_success()
    )
}

/// The nodes and replicas as the cluster sees them once it serves.
pub(crate) async fn fleet_tables(apis: &[String], access: &AdminAccess) -> String {
    let progress = Progress::new(apis.to_vec(), access);
    let mut out = String::new();
    if let Some(nodes) = progress.get::<Vec<NodeView>>(paths::NODES).await {
        out.push_str(&format!(
            "\n{:<10} {:<12} {:<6} {:<10} {}\n",
            "NODE", "STATUS", "GPUS", "FABRIC", "SHARDS"
        ));
        for node in &nodes {
            out.push_str(&format!(
                "{:<10} {:<12} {:<6} {:<10} {}\n",
                node.record.id,
                node.record.status.as_str(),
                format!("{}/{}", node.gpus_used, node.gpus_total),
                if node.record.fabrics.is_empty() {
                    "-".to_owned()
                } else {
                    node.record.fabrics.join(",")
                },
                node.shards.len(),
            ));
        }
    }
    if let Some(replicas) = progress.get::<Vec<ReplicaView>>(paths::REPLICAS).await {
        out.push_str(&format!(
            "\n{:<26} {:<10} {:<8} {:<26} {}\n",
            "REPLICA", "MODEL", "STATE", "ENDPOINT", "SHARDS"
        ));
        for replica in &replicas {
            out.push_str(&format!(
                "{:<26} {:<10} {:<8} {:<26} {}\n",
                replica.replica.id,
                replica.replica.model,
                replica.state.as_str(),
                replica.endpoint.as_deref().unwrap_or("-"),
                placement(&replica.replica.shards),
            ));
        }
    }
    out
}
