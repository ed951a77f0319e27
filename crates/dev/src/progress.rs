//! What `llmgw dev` shows while the cluster comes up: the leader election,
//! nodes registering, and each replica moving through its states, with the
//! placement explanation while one waits.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

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

    /// GET from the first peer that answers.
    async fn get(&self, path: &str) -> Option<Value> {
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
            if let Some(cluster) = self.get("/api/v1/cluster").await
                && let Some(leader) = cluster["leader_id"].as_u64()
            {
                self.show(
                    "control plane",
                    format!("peer {leader} leads (term {})", cluster["term"]),
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
            let nodes = self.get("/api/v1/nodes").await.unwrap_or(Value::Null);
            let mut ready = 0;
            for node in nodes.as_array().into_iter().flatten() {
                let id = node["id"].as_str().unwrap_or("?").to_owned();
                let gpus = node["inventory"]["gpus"].as_array().map_or(0, Vec::len);
                let fabrics: Vec<&str> = node["fabrics"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let fabric = if fabrics.is_empty() {
                    "no fabric".to_owned()
                } else {
                    fabrics.join(",")
                };
                self.show(
                    &format!("node {id}"),
                    format!(
                        "{} ({gpus} GPUs, {fabric})",
                        node["status"].as_str().unwrap_or("?")
                    ),
                );
                if node["status"] == "ready" {
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
        let models = progress.get("/api/v1/models").await.unwrap_or(Value::Null);
        let replicas = progress
            .get("/api/v1/replicas")
            .await
            .unwrap_or(Value::Null);
        let mut missing = Vec::new();
        for model in models.as_array().into_iter().flatten() {
            let name = model["name"].as_str().unwrap_or("?").to_owned();
            let desired = model["replicas"].as_u64().unwrap_or(0);
            let mut ready = 0;
            for replica in replicas
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["model"] == name.as_str())
            {
                let nodes: Vec<String> = replica["shards"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| format!("{}{}", s["node"].as_str().unwrap_or("?"), s["gpus"]))
                    .collect();
                let state = replica["state"].as_str().unwrap_or("?");
                progress.show(
                    &format!("replica {}", replica["id"].as_str().unwrap_or("?")),
                    format!("{state} on {}", nodes.join(" + ")),
                );
                if state == "ready" {
                    ready += 1;
                }
            }
            if ready < desired {
                missing.push(name.clone());
                if ready == 0
                    && started.elapsed() > Duration::from_secs(5)
                    && let Some(why) = progress
                        .get(&format!("/api/v1/models/{name}/explain"))
                        .await
                    && let Some(text) = why["explanation"].as_str()
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
    if let Some(nodes) = progress.get("/api/v1/nodes").await {
        out.push_str(&format!(
            "\n{:<10} {:<12} {:<6} {:<10} {}\n",
            "NODE", "STATUS", "GPUS", "FABRIC", "SHARDS"
        ));
        for node in nodes.as_array().into_iter().flatten() {
            let fabrics: Vec<&str> = node["fabrics"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            out.push_str(&format!(
                "{:<10} {:<12} {:<6} {:<10} {}\n",
                node["id"].as_str().unwrap_or("?"),
                node["status"].as_str().unwrap_or("?"),
                format!(
                    "{}/{}",
                    node["gpus_used"].as_u64().unwrap_or(0),
                    node["gpus_total"].as_u64().unwrap_or(0)
                ),
                if fabrics.is_empty() {
                    "-".to_owned()
                } else {
                    fabrics.join(",")
                },
                node["shards"].as_array().map_or(0, Vec::len),
            ));
        }
    }
    if let Some(replicas) = progress.get("/api/v1/replicas").await {
        out.push_str(&format!(
            "\n{:<26} {:<10} {:<8} {:<26} {}\n",
            "REPLICA", "MODEL", "STATE", "ENDPOINT", "SHARDS"
        ));
        for replica in replicas.as_array().into_iter().flatten() {
            let shards: Vec<String> = replica["shards"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| format!("{}{}", s["node"].as_str().unwrap_or("?"), s["gpus"]))
                .collect();
            out.push_str(&format!(
                "{:<26} {:<10} {:<8} {:<26} {}\n",
                replica["id"].as_str().unwrap_or("?"),
                replica["model"].as_str().unwrap_or("?"),
                replica["state"].as_str().unwrap_or("?"),
                replica["endpoint"].as_str().unwrap_or("-"),
                shards.join(" + "),
            ));
        }
    }
    out
}
