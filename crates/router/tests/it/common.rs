//! Harness: simulated engines as real processes, the router in-process on a
//! free port, and a small HTTP client; ports, waiting and metric reading
//! come from llmgw-test-kit.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use llmgw_router::{Endpoint, RoutedModel, Router, RoutingTable, RunningRouter, Settings};
use llmgw_test_kit::engine_sim_bin;
pub use llmgw_test_kit::{free_consecutive_ports, free_port, metric, wait_until};
use tokio::sync::watch;

pub const SMALL: &str = "Qwen/Qwen2.5-0.5B-Instruct";
pub const EMBED: &str = "BAAI/bge-small-en-v1.5";

pub struct Sim {
    child: Child,
    killed: bool,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Sim {
    /// A vLLM-persona engine serving `model` under the served names given.
    pub fn start(model: &str, names: &[&str], env: &[(&str, &str)]) -> Sim {
        Sim::start_on(free_port(), model, names, env)
    }

    pub fn start_on(port: u16, model: &str, names: &[&str], env: &[(&str, &str)]) -> Sim {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = std::fs::File::create(dir.path().join("log")).expect("log file");
        let mut cmd = Command::new(engine_sim_bin());
        cmd.args([
            "serve",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .arg("--served-model-name")
        .args(names)
        .env_remove("LLMGW_SIM_FAULT")
        .env_remove("LLMGW_SIM_PERSONA")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env("LLMGW_SIM_LOAD_TIME", "100ms")
        .env("LLMGW_SIM_TTFT", "2ms")
        .env("LLMGW_SIM_ITL", "2ms")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start llmgw-engine-sim");
        Sim {
            child,
            killed: false,
            port,
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn wait_ready(&self) {
        let url = format!("{}/health", self.url());
        let ok = wait_until(Duration::from_secs(60), || async {
            matches!(get(&url).await, Some((200, _)))
        })
        .await;
        let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        assert!(ok, "simulator on {} never became ready:\n{log}", self.port);
    }

    /// SIGKILL to the whole process group: the engine dies mid-request.
    pub fn kill(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn model(name: &str, aliases: &[&str], endpoints: Vec<Endpoint>) -> RoutedModel {
    RoutedModel {
        name: name.into(),
        aliases: aliases.iter().map(|a| a.to_string()).collect(),
        mapped_aliases: Vec::new(),
        endpoints,
        unavailable_reason: None,
        wakes_on_request: false,
        max_requests_per_replica: None,
    }
}

pub struct TestRouter {
    pub running: RunningRouter,
    pub table: watch::Sender<Arc<RoutingTable>>,
}

impl TestRouter {
    pub async fn start(settings: Settings, models: Vec<RoutedModel>) -> TestRouter {
        let (table, _) = watch::channel(Arc::new(RoutingTable {
            models,
            keys: Default::default(),
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let running = Router::new(settings, &table)
            .serve(listener)
            .expect("serve");
        TestRouter { running, table }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.running.local_addr())
    }
}

/// Settings for tests: fast probes, no metric scraping unless asked.
pub fn test_settings() -> Settings {
    Settings {
        probe_interval: Duration::from_millis(200),
        metrics_interval: Duration::ZERO,
        request_timeout: Duration::from_secs(60),
        stall_timeout: Duration::from_secs(20),
        ..Settings::default()
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn get(url: &str) -> Option<(u16, String)> {
    let request = Request::get(url).body(Full::new(Bytes::new())).ok()?;
    let response = tokio::time::timeout(Duration::from_secs(5), client().request(request))
        .await
        .ok()?
        .ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

pub async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut builder = Request::post(url).header("content-type", "application/json");
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let request = builder
        .body(Full::new(body.into()))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(60), client.request(request))
        .await
        .map_err(|_| "no answer within 60 s".to_string())?
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(60), response.into_body().collect())
        .await
        .map_err(|_| format!("status {status}: body did not finish within 60 s (hang)"))?
        .map_err(|e| format!("status {status}: body broke: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

pub fn chat_body(model: &str, stream: bool, max_tokens: u32) -> String {
    format!(
        r#"{{"model":"{model}","stream":{stream},"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hello"}}]}}"#
    )
}

/// A chat request whose prompt names `tag`, so that every answer differs.
pub fn tagged_chat_body(tag: &str, stream: bool, max_tokens: u32) -> String {
    let usage = if stream {
        r#","stream_options":{"include_usage":true}"#
    } else {
        ""
    };
    format!(
        r#"{{"model":"m","stream":{stream},"max_tokens":{max_tokens}{usage},"messages":[{{"role":"user","content":"{tag}"}}]}}"#
    )
}

/// What a client read from a stream.
#[derive(Debug, Default)]
pub struct StreamRead {
    pub text: String,
    pub ids: std::collections::BTreeSet<String>,
    pub usage: Option<serde_json::Value>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    pub done: bool,
}

/// Reads an SSE body as a client would: every event's content, ids,
/// usage, finish reason and error.
pub fn read_stream(body: &str) -> StreamRead {
    let mut read = StreamRead::default();
    for event in body.split("\n\n").filter(|e| !e.is_empty()) {
        let Some(data) = event.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            read.done = true;
            continue;
        }
        let v: serde_json::Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => panic!("unreadable event {data:?}: {e}"),
        };
        if let Some(error) = v.get("error") {
            read.error = Some(error.to_string());
            continue;
        }
        if let Some(id) = v["id"].as_str() {
            read.ids.insert(id.to_string());
        }
        if !v["usage"].is_null() {
            read.usage = Some(v["usage"].clone());
        }
        if let Some(choice) = v["choices"].get(0) {
            if let Some(text) = choice["delta"]["content"].as_str() {
                read.text.push_str(text);
            }
            if let Some(text) = choice["text"].as_str() {
                read.text.push_str(text);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                read.finish_reason = Some(reason.to_string());
            }
        }
    }
    read
}

/// The answer one uninterrupted, non-streamed generation gives: the text
/// and the usage.
pub async fn reference_answer(engine: &str, body_for_stream: &str) -> (String, serde_json::Value) {
    let mut request: serde_json::Value = serde_json::from_str(body_for_stream).unwrap();
    request["stream"] = false.into();
    request.as_object_mut().unwrap().remove("stream_options");
    let (status, body) = post(
        &client(),
        &format!("{engine}/v1/chat/completions"),
        request.to_string(),
        &[],
    )
    .await
    .expect("reference engine answers");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        v["usage"].clone(),
    )
}
