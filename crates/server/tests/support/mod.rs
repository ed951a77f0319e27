//! A cluster of real `llmgw server` processes on 127.0.0.1 for tests.
//!
//! The `llmgw` binary is found at `$LLMGW_BIN` or next to the test binary's
//! folder (`target/<profile>/llmgw`); build it first with
//! `cargo build -p llmgw-cli`. A missing binary fails the test with that
//! instruction instead of testing something stale or nothing.

#![allow(dead_code)]

pub mod agents;
pub mod dev;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use llmgw_dev::{PeerLayout, plan_peers, server_yaml, server_yaml_tls};
use serde_json::Value;

/// Clusters in one test binary run one at a time: a 2-core machine running
/// several three-peer clusters with fsync at once makes elections slow.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds off other clusters of this test binary (for tests that start
/// processes without [`Cluster`], such as `llmgw dev`).
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn llmgw_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("LLMGW_BIN") {
        return PathBuf::from(path);
    }
    let test_exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/llmgw
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join("llmgw");
    assert!(
        bin.exists(),
        "{} does not exist: build it first with `cargo build -p llmgw-cli` (same profile and \
         CARGO_TARGET_DIR as the tests), or point LLMGW_BIN at an llmgw binary",
        bin.display()
    );
    bin
}

pub struct Peer {
    pub layout: PeerLayout,
    pub child: Option<Child>,
    pub starts: u32,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub peers: Vec<Peer>,
    pub http: reqwest::Client,
    /// Bearer token sent by `get` and `send` (clusters with admin tokens).
    pub token: Option<String>,
    /// Peers (and agents started with `agents::Agent`) use mTLS.
    pub tls: bool,
    _serial: MutexGuard<'static, ()>,
}

/// An admin API client; `ca`: the CA bundle of a TLS cluster, whose peers
/// serve HTTPS.
pub fn admin_client(ca: Option<&std::path::Path>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(20));
    if let Some(ca) = ca {
        builder =
            builder.use_preconfigured_tls(llmgw_tls::https_client_config(ca).expect("the CA"));
    }
    builder.build().unwrap()
}

/// The CA bundle of the cluster whose test directory is `dir`.
fn dir_ca(dir: &std::path::Path) -> PathBuf {
    llmgw_tls::certs::ca_files(&llmgw_dev::certs::tls_dir(dir)).0
}

pub const DEADLINE: Duration = Duration::from_secs(60);

impl Cluster {
    /// Starts three plaintext (`insecure: true`) peers; `extra_yaml` is
    /// appended to every server.yaml.
    pub fn start(extra_yaml: &str) -> Cluster {
        Self::start_with(false, extra_yaml, |_| {})
    }

    /// Starts three peers with mTLS: a CA and a certificate per peer in
    /// `<dir>/tls` (see [`Cluster::tls_dir`]).
    pub fn start_tls(extra_yaml: &str) -> Cluster {
        Self::start_with(true, extra_yaml, |_| {})
    }

    /// Starts three peers after `prepare` ran on the empty test directory
    /// (for files that server.yaml refers to).
    pub fn start_with(
        tls: bool,
        extra_yaml: &str,
        prepare: impl FnOnce(&std::path::Path),
    ) -> Cluster {
        let serial = ONE_CLUSTER_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = tempfile::tempdir().expect("temp dir");
        prepare(dir.path());
        let layouts = plan_peers(dir.path(), 3, tls).expect("free ports");
        for layout in &layouts {
            let yaml = if tls {
                let mut files =
                    llmgw_dev::certs::peer_tls(dir.path(), layout.id).expect("peer cert");
                // Every TLS cluster checks revocation: an empty list until a
                // test revokes something (`llmgw_tls::certs::revoke`).
                let ca_dir = llmgw_dev::certs::tls_dir(dir.path());
                files.crl = Some(llmgw_tls::certs::publish_crl(&ca_dir).expect("a CRL"));
                server_yaml_tls(layout, &layouts, &files, extra_yaml)
            } else {
                server_yaml(layout, &layouts, extra_yaml)
            };
            std::fs::write(&layout.config, yaml).unwrap();
        }
        let http = admin_client(tls.then(|| dir_ca(dir.path())).as_deref());
        let mut cluster = Cluster {
            dir,
            peers: layouts
                .into_iter()
                .map(|layout| Peer {
                    layout,
                    child: None,
                    starts: 0,
                })
                .collect(),
            http,
            token: None,
            tls,
            _serial: serial,
        };
        for id in 1..=3 {
            cluster.spawn(id);
        }
        cluster
    }

    fn peer(&self, id: u64) -> &Peer {
        &self.peers[(id - 1) as usize]
    }

    fn peer_mut(&mut self, id: u64) -> &mut Peer {
        &mut self.peers[(id - 1) as usize]
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        let peer = self.peer(id);
        peer.layout
            .log
            .with_extension(format!("{}.log", peer.starts))
    }

    /// Starts (or restarts) peer `id` with its unchanged config and data.
    pub fn spawn(&mut self, id: u64) {
        let bin = llmgw_bin();
        let peer = self.peer_mut(id);
        assert!(peer.child.is_none(), "peer {id} is already running");
        peer.starts += 1;
        let log_path = peer
            .layout
            .log
            .with_extension(format!("{}.log", peer.starts));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(bin)
            .args(["server", "--config"])
            .arg(&peer.layout.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start llmgw server");
        peer.child = Some(child);
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self, id: u64) {
        let peer = self.peer_mut(id);
        if let Some(mut child) = peer.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the peer stands still with its sockets open, like a
    /// process in a long stall; [`Cluster::resume`] lets it go on.
    pub fn pause(&self, id: u64) {
        self.signal(id, libc::SIGSTOP);
    }

    pub fn resume(&self, id: u64) {
        self.signal(id, libc::SIGCONT);
    }

    #[allow(unsafe_code)]
    fn signal(&self, id: u64, signal: i32) {
        let child = self.peer(id).child.as_ref().expect("peer runs");
        let pid = i32::try_from(child.id()).expect("pid fits");
        // SAFETY: kill(2) on a child this cluster started and has not reaped.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "signal {signal} to peer {id}");
    }

    /// The directory with the cluster's CA and peer certificates.
    pub fn tls_dir(&self) -> PathBuf {
        llmgw_dev::certs::tls_dir(self.dir.path())
    }

    /// `host:port` of peer `id`'s gRPC listener.
    pub fn grpc(&self, id: u64) -> String {
        self.peer(id).layout.grpc.to_string()
    }

    /// Everything peer `id` has logged since its latest start.
    pub fn log_text(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    /// Waits until peer `id`'s log has a line containing every one of
    /// `needles`; returns that line.
    pub async fn wait_log(&self, id: u64, needles: &[&str]) -> String {
        let started = Instant::now();
        loop {
            if let Some(line) = self
                .log_text(id)
                .lines()
                .find(|line| needles.iter().all(|n| line.contains(n)))
            {
                return line.to_owned();
            }
            self.fail_if_past(
                started,
                &format!("peer {id} never logged a line with {needles:?}"),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn admin(&self, id: u64) -> String {
        self.peer(id).layout.admin_url()
    }

    /// The CA bundle clients trust (TLS clusters).
    pub fn ca(&self) -> PathBuf {
        dir_ca(self.dir.path())
    }

    /// `llmgw ctl` against peer `id`, trusting the cluster's CA.
    pub fn ctl(&self, id: u64) -> std::process::Command {
        let mut command = std::process::Command::new(llmgw_bin());
        command.args(["ctl", "--api", &self.admin(id)]);
        if self.tls {
            command.arg("--ca").arg(self.ca());
        }
        command
    }

    pub fn raft_dir(&self, id: u64) -> PathBuf {
        self.peer(id).layout.data_dir.join("raft")
    }

    pub fn running(&self) -> Vec<u64> {
        self.peers
            .iter()
            .filter(|p| p.child.is_some())
            .map(|p| p.layout.id)
            .collect()
    }

    pub async fn get(&self, id: u64, path: &str) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.admin(id));
        let mut request = self.http.get(&url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| e.to_string())?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    pub async fn send(
        &self,
        id: u64,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.admin(id));
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| e.to_string())?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    /// PUTs a router-only model named `name` through peer `id`.
    pub async fn put_model(&self, id: u64, name: &str) -> Result<(u16, Value), String> {
        let body = serde_json::json!({"name": name, "endpoints": ["http://10.1.2.3:8000"]});
        self.send(
            id,
            reqwest::Method::PUT,
            &format!("/api/v1/models/{name}"),
            Some(body.to_string()),
        )
        .await
    }

    /// Waits until every running peer names the same leader; returns it.
    pub async fn wait_leader(&self) -> u64 {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let mut leaders = Vec::new();
            for id in self.running() {
                match self.get(id, "/api/v1/cluster").await {
                    Ok((200, view)) => leaders.push(view["leader_id"].as_u64()),
                    other => last = format!("peer {id}: {other:?}"),
                }
            }
            if let Some(Some(leader)) = leaders.first().copied()
                && leaders.len() == self.running().len()
                && leaders.iter().all(|l| *l == Some(leader))
                && self.running().contains(&leader)
            {
                return leader;
            }
            if !leaders.is_empty() {
                last = format!("leaders seen: {leaders:?}");
            }
            self.fail_if_past(started, &format!("no agreed leader ({last})"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// This peer's own (applied index, state hash).
    pub async fn own_state(&self, id: u64) -> Option<(u64, String)> {
        let (status, view) = self.get(id, "/api/v1/cluster").await.ok()?;
        if status != 200 {
            return None;
        }
        let me = view["peers"]
            .as_array()?
            .iter()
            .find(|p| p["id"].as_u64() == Some(id))?
            .clone();
        Some((
            me["last_applied_index"].as_u64()?,
            me["state_hash"].as_str()?.to_owned(),
        ))
    }

    /// Waits until every running peer has applied the same index and
    /// reports the same state hash; returns the hash.
    pub async fn wait_converged(&self) -> String {
        let started = Instant::now();
        loop {
            let mut states = Vec::new();
            for id in self.running() {
                states.push(self.own_state(id).await);
            }
            if let Some(Some(first)) = states.first()
                && states.iter().all(|s| s.as_ref() == Some(first))
            {
                return first.1.clone();
            }
            self.fail_if_past(started, &format!("peers did not converge: {states:?}"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Model names in peer `id`'s catalog.
    pub async fn model_names(&self, id: u64, consistent: bool) -> Result<Vec<String>, String> {
        let path = if consistent {
            "/api/v1/models?consistent=true"
        } else {
            "/api/v1/models"
        };
        match self.get(id, path).await? {
            (200, Value::Array(models)) => Ok(models
                .iter()
                .filter_map(|m| m["name"].as_str().map(str::to_owned))
                .collect()),
            other => Err(format!("GET {path} on peer {id}: {other:?}")),
        }
    }

    pub async fn metric(&self, id: u64, name: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.admin(id));
        let text = self.http.get(&url).send().await.ok()?.text().await.ok()?;
        text.lines().find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    pub fn fail_if_past(&self, started: Instant, what: &str) {
        if started.elapsed() > DEADLINE {
            panic!("after {DEADLINE:?}: {what}\n{}", self.log_tails());
        }
    }

    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for peer in &self.peers {
            for start in 1..=peer.starts {
                let path = peer.layout.log.with_extension(format!("{start}.log"));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                out.push_str(&format!("--- {} ---\n{tail}\n", path.display()));
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for peer in &mut self.peers {
            if let Some(mut child) = peer.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Polls `check` until it returns `Some`, or panics after the deadline.
pub async fn eventually<T, F, Fut>(cluster: &Cluster, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(why) => cluster.fail_if_past(started, &format!("{what}: {why}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
