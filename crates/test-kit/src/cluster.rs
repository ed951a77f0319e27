//! A cluster of three real `llmgw server` processes on 127.0.0.1, laid
//! out the way `llmgw dev` lays out its peers (`llmgw_dev::plan_peers`),
//! read through the admin API's typed contract.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use llmgw_api::{ClusterView, Model, ModelExplanation, NodeView, ReplicaView, paths};
use llmgw_dev::{PeerLayout, plan_peers, server_yaml, server_yaml_tls};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::delay_proxy::DelayProxy;
use crate::tmpfs::Tmpfs;
use crate::wait::{DEADLINE, POLL, poll_until_ok};
use crate::{admin_client, llmgw_bin};

/// Clusters in one test binary run one at a time: a two-core machine
/// running several three-peer clusters with fsync at once makes
/// elections slow.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds off every other cluster of this test binary while the guard
/// lives. [`Cluster`] takes it itself; tests that start processes some
/// other way (`llmgw dev`, the chaos runner) take it directly.
pub fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub struct Peer {
    pub layout: PeerLayout,
    /// `None` while the peer is not running.
    pub child: Option<Child>,
    /// How often it was started; each start logs to its own file.
    pub starts: u32,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub peers: Vec<Peer>,
    pub http: reqwest::Client,
    /// Bearer token sent with every admin request (clusters with admin
    /// tokens).
    pub token: Option<String>,
    /// Peers (and agents started with `agents::Agent`) use mTLS.
    pub tls: bool,
    _serial: MutexGuard<'static, ()>,
}

/// The CA bundle of the cluster whose test directory is `dir`.
fn dir_ca(dir: &Path) -> PathBuf {
    llmgw_tls::certs::ca_files(&llmgw_dev::certs::tls_dir(dir)).0
}

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
    pub fn start_with(tls: bool, extra_yaml: &str, prepare: impl FnOnce(&Path)) -> Cluster {
        Self::start_advertising(tls, extra_yaml, prepare, |layouts| layouts.to_vec())
    }

    /// Starts three plaintext peers that reach one another only through
    /// a [`DelayProxy`] in front of each peer's gRPC port, adding
    /// `one_way` to every byte in each direction; agents and the admin API
    /// reach the peers directly. The proxies live as long as the returned
    /// vector.
    pub fn start_behind_delay(extra_yaml: &str, one_way: Duration) -> (Cluster, Vec<DelayProxy>) {
        let mut proxies = Vec::new();
        let cluster = Self::start_advertising(
            false,
            extra_yaml,
            |_| {},
            |layouts| {
                layouts
                    .iter()
                    .map(|layout| {
                        let proxy = DelayProxy::start(layout.grpc, one_way).expect("a delay proxy");
                        let mut advertised = layout.clone();
                        advertised.grpc = proxy.addr;
                        proxies.push(proxy);
                        advertised
                    })
                    .collect()
            },
        );
        (cluster, proxies)
    }

    /// Starts three peers, each listening on its planned ports and
    /// knowing the others (and itself) by `advertise(planned)`.
    fn start_advertising(
        tls: bool,
        extra_yaml: &str,
        prepare: impl FnOnce(&Path),
        advertise: impl FnOnce(&[PeerLayout]) -> Vec<PeerLayout>,
    ) -> Cluster {
        let serial = one_cluster_at_a_time();
        let dir = tempfile::tempdir().expect("a temp dir");
        prepare(dir.path());
        let layouts = plan_peers(dir.path(), 3, tls).expect("free ports");
        let advertised = advertise(&layouts);
        for layout in &layouts {
            let yaml = if tls {
                let mut files =
                    llmgw_dev::certs::peer_tls(dir.path(), layout.id).expect("a peer certificate");
                // Every TLS cluster checks revocation: an empty list until a
                // test revokes something (`llmgw_tls::certs::revoke`).
                let ca_dir = llmgw_dev::certs::tls_dir(dir.path());
                files.crl = Some(llmgw_tls::certs::publish_crl(&ca_dir).expect("a CRL"));
                server_yaml_tls(layout, &advertised, &files, extra_yaml)
            } else {
                server_yaml(layout, &advertised, extra_yaml)
            };
            std::fs::write(&layout.config, yaml).expect("write server.yaml");
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

    /// Starts three plaintext peers, peer `id`'s data directory on a
    /// tmpfs of `size_mb` MiB that the test fills and frees. `None`, the
    /// skip noted under `test` ([`crate::skipped`]), where no tmpfs can be
    /// mounted (it needs root).
    pub fn start_with_tmpfs(
        test: &str,
        extra_yaml: &str,
        id: u64,
        size_mb: u64,
    ) -> Option<(Cluster, Tmpfs)> {
        let (cluster, mut mounts) = Self::start_with_tmpfs_on(test, extra_yaml, &[id], size_mb)?;
        Some((cluster, mounts.remove(0)))
    }

    /// As [`Cluster::start_with_tmpfs`], a tmpfs for each of `ids`, in
    /// that order.
    pub fn start_with_tmpfs_on(
        test: &str,
        extra_yaml: &str,
        ids: &[u64],
        size_mb: u64,
    ) -> Option<(Cluster, Vec<Tmpfs>)> {
        // SAFETY: geteuid has no preconditions.
        #[allow(unsafe_code)]
        if unsafe { libc::geteuid() } != 0 {
            crate::skipped(test, "mounting a tmpfs needs root");
            return None;
        }
        let mut mounted = Vec::new();
        let cluster = Cluster::start_with(false, extra_yaml, |dir| {
            for id in ids {
                mounted.push(Tmpfs::mount(&dir.join(format!("server-{id}")), size_mb));
            }
        });
        match mounted.into_iter().collect::<Result<Vec<_>, _>>() {
            Ok(mounts) => Some((cluster, mounts)),
            Err(why) => {
                crate::skipped(test, &format!("cannot mount a tmpfs: {why}"));
                None
            }
        }
    }

    pub fn peer(&self, id: u64) -> &Peer {
        &self.peers[index(id)]
    }

    pub fn peer_mut(&mut self, id: u64) -> &mut Peer {
        &mut self.peers[index(id)]
    }

    /// Where peer `id`'s latest start logs.
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
        let log = std::fs::File::create(&log_path).expect("the peer's log file");
        let child = Command::new(bin)
            .args(["server", "--config"])
            .arg(&peer.layout.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("start llmgw server");
        peer.child = Some(child);
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.peer_mut(id).child.take() {
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

    fn signal(&self, id: u64, signal: i32) {
        let child = self.peer(id).child.as_ref().expect("the peer runs");
        // A child this cluster started and has not reaped: its pid is its own.
        let sent = llmgw_procfs::signal_pid(llmgw_procfs::to_pid(child.id()), signal);
        assert!(sent, "signal {signal} to peer {id}");
    }

    /// The directory with the cluster's CA and peer certificates.
    pub fn tls_dir(&self) -> PathBuf {
        llmgw_dev::certs::tls_dir(self.dir.path())
    }

    /// The CA bundle clients trust (TLS clusters).
    pub fn ca(&self) -> PathBuf {
        dir_ca(self.dir.path())
    }

    /// `host:port` of peer `id`'s gRPC listener.
    pub fn grpc(&self, id: u64) -> String {
        self.peer(id).layout.grpc.to_string()
    }

    /// Base URL of peer `id`'s admin API.
    pub fn admin(&self, id: u64) -> String {
        self.peer(id).layout.admin_url()
    }

    pub fn raft_dir(&self, id: u64) -> PathBuf {
        self.peer(id).layout.data_dir.join("raft")
    }

    /// `llmgw ctl` against peer `id`, trusting the cluster's CA.
    pub fn ctl(&self, id: u64) -> Command {
        let mut command = Command::new(llmgw_bin());
        command.args(["ctl", "--api", &self.admin(id)]);
        if self.tls {
            command.arg("--ca").arg(self.ca());
        }
        command
    }

    /// Ids of the peers running now.
    pub fn running(&self) -> Vec<u64> {
        self.peers
            .iter()
            .filter(|p| p.child.is_some())
            .map(|p| p.layout.id)
            .collect()
    }

    /// Everything peer `id` has logged since its latest start.
    pub fn log_text(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    /// Every line of every start's log of every peer.
    pub fn all_log_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for peer in &self.peers {
            for start in 1..=peer.starts {
                let path = peer.layout.log.with_extension(format!("{start}.log"));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                lines.extend(text.lines().map(str::to_owned));
            }
        }
        lines
    }

    /// Waits until peer `id`'s log has a line containing every one of
    /// `needles`; returns that line.
    pub async fn wait_log(&self, id: u64, needles: &[&str]) -> String {
        self.eventually(
            &format!("peer {id} logs a line with {needles:?}"),
            || async {
                self.log_text(id)
                    .lines()
                    .find(|line| needles.iter().all(|n| line.contains(n)))
                    .map(str::to_owned)
                    .ok_or_else(|| "no such line yet".to_owned())
            },
        )
        .await
    }

    /// `GET path` on peer `id`: the status and the body, as JSON when it
    /// is JSON and as a JSON string otherwise. For status checks and
    /// wire-format tests; answers are read with [`Cluster::get_json`].
    pub async fn get(&self, id: u64, path: &str) -> Result<(u16, Value), String> {
        self.send(id, reqwest::Method::GET, path, None).await
    }

    /// A request to peer `id` with a JSON (or YAML) `body`: the status and
    /// the body as [`Cluster::get`] gives it.
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

    /// `GET path` on peer `id`, answered 200 with a `T`; otherwise why not.
    pub async fn get_json<T: DeserializeOwned>(&self, id: u64, path: &str) -> Result<T, String> {
        let url = format!("{}{path}", self.admin(id));
        crate::get_json(&self.http, &url, self.token.as_deref())
            .await
            .map_err(|e| format!("peer {id}: {e}"))
    }

    /// `GET /api/v1/cluster` on peer `id`.
    pub async fn cluster_view(&self, id: u64) -> Result<ClusterView, String> {
        self.get_json(id, paths::CLUSTER).await
    }

    /// `GET /api/v1/nodes` on peer `id`.
    pub async fn nodes(&self, id: u64) -> Result<Vec<NodeView>, String> {
        self.get_json(id, paths::NODES).await
    }

    /// `GET /api/v1/nodes/{node}` on peer `id`.
    pub async fn node(&self, id: u64, node: &str) -> Result<NodeView, String> {
        self.get_json(id, &paths::node(node)).await
    }

    /// `GET /api/v1/replicas` on peer `id`.
    pub async fn replicas(&self, id: u64) -> Result<Vec<ReplicaView>, String> {
        self.get_json(id, paths::REPLICAS).await
    }

    /// `GET /api/v1/models/{model}/explain` on peer `id`.
    pub async fn explain(&self, id: u64, model: &str) -> Result<ModelExplanation, String> {
        self.get_json(id, &paths::explain(model)).await
    }

    /// Model names in peer `id`'s catalog; `consistent`: a linearizable
    /// read.
    pub async fn model_names(&self, id: u64, consistent: bool) -> Result<Vec<String>, String> {
        let path = if consistent {
            format!("{}?consistent=true", paths::MODELS)
        } else {
            paths::MODELS.to_owned()
        };
        let models: Vec<Model> = self.get_json(id, &path).await?;
        Ok(models.into_iter().map(|m| m.name).collect())
    }

    /// PUTs a router-only model named `name` through peer `id`.
    pub async fn put_model(&self, id: u64, name: &str) -> Result<(u16, Value), String> {
        let body = serde_json::json!({"name": name, "endpoints": ["http://10.1.2.3:8000"]});
        self.send(
            id,
            reqwest::Method::PUT,
            &paths::model(name),
            Some(body.to_string()),
        )
        .await
    }

    /// PUTs the catalog entry `spec` (its `name` names it) through peer
    /// `id`; panics with the answer unless it is accepted.
    pub async fn put_model_spec(&self, id: u64, spec: &Value) {
        let name = spec["name"].as_str().expect("a model spec has a name");
        let (status, body) = self
            .send(
                id,
                reqwest::Method::PUT,
                &paths::model(name),
                Some(spec.to_string()),
            )
            .await
            .unwrap_or_else(|e| panic!("PUT {name}: {e}"));
        assert_eq!(status, 200, "PUT {name}: {body}");
    }

    /// Waits until every running peer names the same running leader;
    /// returns it.
    /// The leaders named over `window`, in order, asking every running peer
    /// twice a second; one entry when leadership never moved.
    pub async fn leaders_over(&self, window: Duration) -> Vec<u64> {
        let mut seen: Vec<u64> = Vec::new();
        let until = Instant::now() + window;
        while Instant::now() < until {
            for id in self.running() {
                if let Ok(view) = self.cluster_view(id).await
                    && let Some(leader) = view.leader_id
                    && seen.last() != Some(&leader)
                {
                    seen.push(leader);
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        seen
    }

    pub async fn wait_leader(&self) -> u64 {
        self.eventually("an agreed leader", || async {
            let running = self.running();
            let mut leaders = Vec::new();
            for id in &running {
                leaders.push(self.cluster_view(*id).await?.leader_id);
            }
            match leaders.first() {
                Some(Some(leader))
                    if leaders.iter().all(|l| l == &Some(*leader)) && running.contains(leader) =>
                {
                    Ok(*leader)
                }
                _ => Err(format!("leaders seen by peers {running:?}: {leaders:?}")),
            }
        })
        .await
    }

    /// Peer `id`'s own (applied index, state hash), as it reports itself.
    pub async fn own_state(&self, id: u64) -> Option<(u64, String)> {
        self.cluster_view(id).await.ok()?.own_state()
    }

    /// Waits until every running peer has applied the same index and
    /// reports the same state hash; returns the hash.
    pub async fn wait_converged(&self) -> String {
        self.eventually("every peer at one applied index and state hash", || async {
            let mut states = Vec::new();
            for id in self.running() {
                states.push(self.own_state(id).await);
            }
            match states.first() {
                Some(Some(first)) if states.iter().all(|s| s.as_ref() == Some(first)) => {
                    Ok(first.1.clone())
                }
                _ => Err(format!("{states:?}")),
            }
        })
        .await
    }

    /// The value of `series` in peer `id`'s `/metrics`.
    pub async fn metric(&self, id: u64, series: &str) -> Option<f64> {
        let url = format!("{}{}", self.admin(id), paths::METRICS);
        let text = self.http.get(&url).send().await.ok()?.text().await.ok()?;
        crate::metric(&text, series)
    }

    /// Polls `check` until it answers `Ok`; after [`DEADLINE`] fails the
    /// test with the last reason and the tail of every peer's log.
    pub async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        match poll_until_ok(DEADLINE, POLL, check).await {
            Ok(value) => value,
            Err(last) => panic!(
                "{what}: not within {DEADLINE:?}; last seen: {last}\n{}",
                self.log_tails()
            ),
        }
    }

    /// Fails the test, with the peers' log tails, once [`DEADLINE`] passed
    /// since `started`.
    pub fn fail_if_past(&self, started: Instant, what: &str) {
        if started.elapsed() > DEADLINE {
            panic!("after {DEADLINE:?}: {what}\n{}", self.log_tails());
        }
    }

    /// The last lines of every log of every peer, for failure messages.
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

fn index(id: u64) -> usize {
    usize::try_from(id - 1).expect("peer ids are 1, 2 and 3")
}
