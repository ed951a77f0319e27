//! Real `llmgw server` peers, each in its own network namespace, started,
//! killed, paused and restarted with the kernel's signals.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use llmgw_api::{ClusterView, Membership, paths};
use llmgw_dev::{AdminAccess, PeerLayout, server_yaml_tls};
use llmgw_procfs::{alive, group_members_with_state, signal_group, to_pid};
use llmgw_tls::certs::{self, IssueRequest};
use llmgw_tls::{Identity, TlsFiles};
use serde::de::DeserializeOwned;

use crate::netns::{Net, NetError};
use crate::slow_links::SlowLinks;

/// Every peer's gRPC (Raft and agent streams) port, in its own namespace.
pub const GRPC_PORT: u16 = 7070;
const ADMIN_PORT: u16 = 7080;
/// The in-peer router's port (`router_listen`), when the run has a fleet.
pub const ROUTER_PORT: u16 = 7090;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start peer {id} ({bin}): {source}")]
    Spawn {
        id: u64,
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} within {seconds}s: {detail}")]
    Timeout {
        what: String,
        seconds: u64,
        detail: String,
    },
    /// A lazy disk (power-cut runs) could not be mounted.
    #[error("{0}")]
    Disk(String),
    /// A delaying proxy (slow-link runs) could not start.
    #[error("{0}")]
    Proxy(String),
    #[error("certificates: {0}")]
    Certs(#[from] llmgw_tls::TlsError),
}

pub struct Peer {
    pub layout: PeerLayout,
    pub child: Option<Child>,
    pub starts: u32,
    pub stopped: bool,
}

/// Admin URLs of the current members, shared with the load and sampler.
pub type Members = Arc<RwLock<BTreeMap<u64, String>>>;

/// The members (id and URL) as they are now, so no lock is held across an
/// await.
pub fn snapshot(members: &RwLock<BTreeMap<u64, String>>) -> Vec<(u64, String)> {
    members
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(id, url)| (*id, url.clone()))
        .collect()
}

pub struct Cluster {
    pub net: Net,
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub extra_yaml: String,
    /// Whether every peer serves the OpenAI routes on `ROUTER_PORT`.
    pub router: bool,
    pub peers: BTreeMap<u64, Peer>,
    pub members: Members,
    /// Every pid this run started, for the leftover check.
    pub spawned: Vec<i32>,
    /// An admin API client: trusts the run's CA, sends the write token.
    pub http: reqwest::Client,
    /// The run's CA and admin tokens: peers serve the admin API over HTTPS
    /// on their namespace addresses, which needs tokens.
    pub access: AdminAccess,
    /// Lazy disks under the peers' data directories (power-cut runs
    /// only); unmounted when the cluster is dropped.
    pub disks: BTreeMap<u64, crate::powercut::LazyDisk>,
    /// Small tmpfs disks under the peers' data directories (disk-full runs
    /// only); unmounted when the cluster is dropped.
    pub small_disks: BTreeMap<u64, llmgw_test_kit::Tmpfs>,
    /// Delaying proxies in front of every peer (slow-link runs only).
    pub(crate) slow_links: Option<SlowLinks>,
}

impl Cluster {
    /// Lays out `count` peers (config files, namespaces); starts none.
    pub fn create(
        net: Net,
        dir: &Path,
        bin: &Path,
        count: u64,
        extra_yaml: &str,
        router: bool,
    ) -> Result<Cluster, ClusterError> {
        let ca = certs::init_ca(&Self::tls_dir_of(dir))?;
        let access = AdminAccess::create(dir, Some(ca)).map_err(|source| ClusterError::File {
            path: dir.to_owned(),
            source,
        })?;
        let mut cluster = Cluster {
            net,
            dir: dir.to_owned(),
            bin: bin.to_owned(),
            extra_yaml: format!("{extra_yaml}{}", access.server_yaml()),
            router,
            peers: BTreeMap::new(),
            members: Members::default(),
            spawned: Vec::new(),
            http: admin_client(&access, Duration::from_secs(3)),
            access,
            disks: BTreeMap::new(),
            small_disks: BTreeMap::new(),
            slow_links: None,
        };
        let ids: Vec<u64> = (1..=count).collect();
        for &id in &ids {
            cluster.add_peer_layout(id)?;
        }
        cluster.write_configs(&ids)?;
        for &id in &ids {
            cluster.set_member(id, true);
        }
        Ok(cluster)
    }

    fn tls_dir_of(dir: &Path) -> PathBuf {
        dir.join("tls")
    }

    /// The CA and certificates of this run.
    pub fn tls_dir(&self) -> PathBuf {
        Self::tls_dir_of(&self.dir)
    }

    /// Peer `id`'s certificate files (made with its layout).
    fn peer_tls(&self, id: u64) -> TlsFiles {
        let dir = self.tls_dir();
        TlsFiles {
            ca: certs::ca_files(&dir).0,
            cert: dir.join(format!("peer-{id}.pem")),
            key: dir.join(format!("peer-{id}.key")),
            crl: None,
        }
    }

    /// A certificate for the agent of `node`, for agent.yaml's `tls`.
    pub fn node_tls(&self, node: &str) -> Result<TlsFiles, ClusterError> {
        let dir = self.tls_dir();
        let request = IssueRequest::new(Identity::Node(node.to_owned()), Vec::new());
        Ok(certs::issue(&dir, &dir, &request)?)
    }

    /// An admin API client with its own timeout.
    pub fn admin_client(&self, timeout: Duration) -> reqwest::Client {
        admin_client(&self.access, timeout)
    }

    fn add_peer_layout(&mut self, id: u64) -> Result<(), ClusterError> {
        self.net.add_peer(id)?;
        let ip = self.net.peer_ip(id);
        let dir = self.tls_dir();
        let request = IssueRequest::new(Identity::Peer(id), vec![ip.to_string()]);
        certs::issue(&dir, &dir, &request)?;
        let layout = PeerLayout {
            id,
            grpc: SocketAddr::new(ip.into(), GRPC_PORT),
            admin: SocketAddr::new(ip.into(), ADMIN_PORT),
            config: self.dir.join(format!("server-{id}.yaml")),
            data_dir: self.dir.join(format!("server-{id}")),
            log: self.dir.join(format!("server-{id}.log")),
            https: true,
        };
        self.peers.insert(
            id,
            Peer {
                layout,
                child: None,
                starts: 0,
                stopped: false,
            },
        );
        Ok(())
    }

    /// server.yaml of one peer, with the router turned on when the run
    /// has a fleet.
    /// Peers behind delaying proxies are named by their proxies.
    fn yaml(&self, layout: &PeerLayout, all: &[PeerLayout]) -> String {
        let advertised: Vec<PeerLayout> = match self.slow_links {
            Some(_) => all.iter().map(SlowLinks::advertised).collect(),
            None => all.to_vec(),
        };
        let yaml = server_yaml_tls(
            layout,
            &advertised,
            &self.peer_tls(layout.id),
            &self.extra_yaml,
        );
        if self.router {
            yaml.replace(
                "router_listen: null",
                &format!(
                    "router_listen: \"{}\"",
                    SocketAddr::new(layout.admin.ip(), ROUTER_PORT)
                ),
            )
        } else {
            yaml
        }
    }

    /// Writes server.yaml for `ids`, each listing `ids` as the peers.
    pub(crate) fn write_configs(&self, ids: &[u64]) -> Result<(), ClusterError> {
        let all: Vec<PeerLayout> = ids.iter().map(|id| self.peers[id].layout.clone()).collect();
        for layout in &all {
            let yaml = self.yaml(layout, &all);
            std::fs::write(&layout.config, yaml).map_err(|source| ClusterError::File {
                path: layout.config.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Adds a fresh peer (namespace, config listing `listed` and itself)
    /// that is not a member yet; start it with `spawn`.
    pub fn prepare_new_peer(&mut self, id: u64, listed: &[u64]) -> Result<(), ClusterError> {
        self.add_peer_layout(id)?;
        self.start_proxy(id)?;
        let mut all: Vec<PeerLayout> = listed
            .iter()
            .map(|id| self.peers[id].layout.clone())
            .collect();
        all.push(self.peers[&id].layout.clone());
        let layout = &self.peers[&id].layout;
        let yaml = self.yaml(layout, &all);
        std::fs::write(&layout.config, yaml).map_err(|source| ClusterError::File {
            path: layout.config.clone(),
            source,
        })
    }

    pub fn set_member(&self, id: u64, member: bool) {
        let mut members = self.members.write().unwrap_or_else(|p| p.into_inner());
        if member {
            members.insert(id, self.admin(id));
        } else {
            members.remove(&id);
        }
    }

    pub fn member_ids(&self) -> Vec<u64> {
        self.members
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    pub fn admin(&self, id: u64) -> String {
        self.peers[&id].layout.admin_url()
    }

    /// The base URL of peer `id`'s in-peer router.
    pub fn router_url(&self, id: u64) -> String {
        format!("http://{}:{ROUTER_PORT}", self.net.peer_ip(id))
    }

    pub fn grpc(&self, id: u64) -> String {
        self.peers[&id].layout.grpc.to_string()
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.peers[&id].child.is_some()
    }

    /// Members whose process runs and is not paused.
    pub fn live_members(&self) -> Vec<u64> {
        self.member_ids()
            .into_iter()
            .filter(|id| self.peers[id].child.is_some() && !self.peers[id].stopped)
            .collect()
    }

    /// The longest election timeout the peers were configured with (the
    /// first member's file, as the server read it): what the run's
    /// availability bounds are derived from.
    pub fn election_timeout_max(&self) -> Result<Duration, String> {
        let id = *self
            .member_ids()
            .first()
            .ok_or("the cluster has no members")?;
        let path = &self.peers[&id].layout.config;
        llmgw_config::ServerConfig::load(path)
            .map(|config| config.raft.election_timeout_max)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn log_path(&self, id: u64, start: u32) -> PathBuf {
        self.peers[&id]
            .layout
            .log
            .with_extension(format!("{start}.log"))
    }

    /// Starts (or restarts) peer `id` inside its namespace, in a process
    /// group of its own.
    pub fn spawn(&mut self, id: u64) -> Result<(), ClusterError> {
        let ns = self.net.namespace(id).to_owned();
        let peer = self.peers.get_mut(&id).expect("known peer");
        assert!(peer.child.is_none(), "peer {id} is already running");
        peer.starts += 1;
        let start = peer.starts;
        let config = peer.layout.config.clone();
        let log_path = self.log_path(id, start);
        let log = std::fs::File::create(&log_path).map_err(|source| ClusterError::File {
            path: log_path.clone(),
            source,
        })?;
        let log_err = log.try_clone().map_err(|source| ClusterError::File {
            path: log_path.clone(),
            source,
        })?;
        // `ip netns exec` enters the namespace and execs the peer, so the
        // pid is the peer's own.
        let child = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(&self.bin)
            .args(["server", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(|source| ClusterError::Spawn {
                id,
                bin: self.bin.clone(),
                source,
            })?;
        self.spawned.push(to_pid(child.id()));
        let peer = self.peers.get_mut(&id).expect("known peer");
        peer.child = Some(child);
        peer.stopped = false;
        Ok(())
    }

    /// SIGKILL to the peer's whole group; no shutdown path runs.
    pub fn kill(&mut self, id: u64) {
        let peer = self.peers.get_mut(&id).expect("known peer");
        if let Some(mut child) = peer.child.take() {
            signal_group(to_pid(child.id()), libc::SIGKILL);
            let _ = child.wait();
        }
        peer.stopped = false;
    }

    /// SIGTERM to the peer's group (a clean shutdown, as an operator's
    /// restart does), then SIGKILL if it has not exited within `within`.
    /// Returns whether it exited by itself, and how long that took.
    pub fn terminate(&mut self, id: u64, within: Duration) -> (bool, Duration) {
        let started = Instant::now();
        let peer = self.peers.get_mut(&id).expect("known peer");
        let Some(mut child) = peer.child.take() else {
            return (true, Duration::ZERO);
        };
        signal_group(to_pid(child.id()), libc::SIGCONT);
        signal_group(to_pid(child.id()), libc::SIGTERM);
        let mut clean = false;
        while started.elapsed() < within {
            if matches!(child.try_wait(), Ok(Some(_))) {
                clean = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !clean {
            signal_group(to_pid(child.id()), libc::SIGKILL);
            let _ = child.wait();
        }
        peer.stopped = false;
        (clean, started.elapsed())
    }

    /// SIGSTOP to peer `id`'s process group, and the proof that it took
    /// effect: every process of the group read as stopped in /proc (or
    /// why not).
    pub fn pause(&mut self, id: u64) -> Result<String, String> {
        let peer = self.peers.get_mut(&id).expect("known peer");
        let Some(child) = &peer.child else {
            return Err(format!("peer {id} is not running"));
        };
        let group = to_pid(child.id());
        signal_group(group, libc::SIGSTOP);
        peer.stopped = true;
        confirm_group_state(group, "stopped", |state| matches!(state, 'T' | 't'))
    }

    /// SIGCONT to peer `id`'s process group, and the proof that it runs
    /// again: no process of the group read as stopped.
    pub fn resume(&mut self, id: u64) -> Result<String, String> {
        let peer = self.peers.get_mut(&id).expect("known peer");
        peer.stopped = false;
        let Some(child) = &peer.child else {
            return Err(format!("peer {id} is not running"));
        };
        let group = to_pid(child.id());
        signal_group(group, libc::SIGCONT);
        confirm_group_state(group, "running again", |state| !matches!(state, 'T' | 't'))
    }

    /// `GET path` on peer `id`, decoded as the admin API's answer `T`.
    pub async fn get<T: DeserializeOwned>(&self, id: u64, path: &str) -> Result<T, String> {
        get_view(&self.http, &self.admin(id), path).await
    }

    /// This peer's view: (term, leader_id).
    pub async fn leader_view(&self, id: u64) -> Option<(u64, Option<u64>)> {
        let view: ClusterView = self.get(id, paths::CLUSTER).await.ok()?;
        Some((view.term, view.leader_id))
    }

    /// Waits until every live member names the same live leader.
    pub async fn wait_leader(&self, within: Duration) -> Result<u64, ClusterError> {
        let started = Instant::now();
        loop {
            let live = self.live_members();
            let mut leaders = Vec::new();
            for &id in &live {
                leaders.push(self.leader_view(id).await.and_then(|(_, l)| l));
            }
            if let Some(Some(leader)) = leaders.first().copied()
                && leaders.iter().all(|l| *l == Some(leader))
                && live.contains(&leader)
            {
                return Ok(leader);
            }
            let last = format!("peers {live:?} name leaders {leaders:?}");
            if started.elapsed() > within {
                return Err(ClusterError::Timeout {
                    what: "an agreed leader".into(),
                    seconds: within.as_secs(),
                    detail: format!("{last}\n{}", self.log_tails()),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The leader that one of `among` names right now, if any answers.
    pub async fn wait_leader_among(&self, among: &[u64]) -> Option<u64> {
        for &id in among {
            if let Some((_, Some(leader))) = self.leader_view(id).await {
                return Some(leader);
            }
        }
        None
    }

    /// Peer `id`'s membership (`None` when it is not a member) as the
    /// first live member that answers sees it; `Err` when none answers.
    pub async fn membership_of(&self, id: u64) -> Result<Option<Membership>, String> {
        for member in self.live_members() {
            if let Ok(view) = self.get::<ClusterView>(member, paths::CLUSTER).await {
                return Ok(view
                    .peers
                    .iter()
                    .find(|peer| peer.id == id)
                    .map(|peer| peer.membership));
            }
        }
        Err("no live member answered GET /api/v1/cluster".into())
    }

    /// (last_applied_index, state_hash) as peer `id` reports itself.
    pub async fn own_state(&self, id: u64) -> Option<(u64, String)> {
        let view: ClusterView = self.get(id, paths::CLUSTER).await.ok()?;
        view.own_state()
    }

    /// A Prometheus gauge or counter from peer `id`.
    pub async fn metric(&self, id: u64, name: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.admin(id));
        let text = self.http.get(&url).send().await.ok()?.text().await.ok()?;
        llmgw_test_kit::metric(&text, name)
    }

    /// The last lines of every peer log, for error messages.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for (&id, peer) in &self.peers {
            for start in 1..=peer.starts {
                let path = self.log_path(id, start);
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(8)..].join("\n");
                out.push_str(&format!("--- {} ---\n{tail}\n", path.display()));
            }
        }
        out
    }

    /// Stops every peer (SIGCONT first, so a paused one can die) and
    /// returns what is still alive afterwards: pids this run started and
    /// any process left in its namespaces.
    pub fn shutdown(&mut self) -> Vec<String> {
        let ids: Vec<u64> = self.peers.keys().copied().collect();
        for id in ids {
            if self.peers[&id].stopped {
                // Whether it woke matters not: it is killed next.
                let _ = self.resume(id);
            }
            self.kill(id);
        }
        self.stop_proxies();
        let mut left = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            left.clear();
            for &pid in &self.spawned {
                if alive(pid) {
                    left.push(format!("pid {pid} started by this run is still alive"));
                }
            }
            for (ns, pid) in self.net.pids() {
                left.push(format!("pid {pid} still runs in namespace {ns}"));
            }
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for peer in self.peers.values_mut() {
            if let Some(mut child) = peer.child.take() {
                signal_group(to_pid(child.id()), libc::SIGCONT);
                signal_group(to_pid(child.id()), libc::SIGKILL);
                let _ = child.wait();
            }
        }
    }
}

/// A client for the peers' admin API: HTTPS trusting the run's CA, with the
/// write token on every request (the peers listen on namespace addresses,
/// not loopback, so they require tokens).
fn admin_client(access: &AdminAccess, timeout: Duration) -> reqwest::Client {
    access.http_client(timeout, access.write_token().ok().as_deref())
}

/// `GET base+path`, decoded as the admin API's answer `T`; `Err` says what
/// came instead: no answer, another status than 200 (with its body), or a
/// body that is not a `T`.
pub async fn get_view<T: DeserializeOwned>(
    http: &reqwest::Client,
    base: &str,
    path: &str,
) -> Result<T, String> {
    let url = format!("{base}{path}");
    let response = http.get(&url).send().await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("HTTP {status}: {text}"));
    }
    serde_json::from_str(&text)
        .map_err(|e| format!("HTTP 200, not the admin API's answer ({e}): {text}"))
}

/// How long a signalled process group may take to show the signal's
/// effect in /proc: delivery takes microseconds, a loaded machine more.
const SIGNAL_EFFECT_WITHIN: Duration = Duration::from_secs(2);

/// Reads the states of process group `group` until every member is in a
/// state `wanted` accepts: what was seen, and how soon, or what was seen
/// instead when `SIGNAL_EFFECT_WITHIN` passed.
fn confirm_group_state(
    group: i32,
    what: &str,
    wanted: impl Fn(char) -> bool,
) -> Result<String, String> {
    let started = Instant::now();
    loop {
        let members = group_members_with_state(group);
        if !members.is_empty() && members.iter().all(|(_, state)| wanted(*state)) {
            return Ok(format!(
                "/proc shows its {} process(es) {what} after {} ms",
                members.len(),
                started.elapsed().as_millis()
            ));
        }
        if started.elapsed() > SIGNAL_EFFECT_WITHIN {
            let states: Vec<String> = members
                .iter()
                .map(|(pid, state)| format!("pid {pid} state {state}"))
                .collect();
            return Err(format!(
                "process group {group} not {what} {} ms after the signal: {}",
                started.elapsed().as_millis(),
                if states.is_empty() {
                    "no live member".to_owned()
                } else {
                    states.join(", ")
                }
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    use super::*;

    /// A pause is confirmed only by what /proc shows: a group never sent
    /// SIGSTOP is not taken as paused, one that was is, and SIGCONT is
    /// read back too.
    #[test]
    fn a_pause_counts_only_once_proc_shows_the_group_stopped() {
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep runs");
        let group = to_pid(child.id());
        let stopped = |state: char| matches!(state, 'T' | 't');

        let not_sent = confirm_group_state(group, "stopped", stopped);
        assert!(
            not_sent
                .as_ref()
                .is_err_and(|why| why.contains("not stopped") && why.contains("state S")),
            "{not_sent:?}"
        );

        signal_group(group, libc::SIGSTOP);
        let paused = confirm_group_state(group, "stopped", stopped);
        assert!(
            paused
                .as_ref()
                .is_ok_and(|proof| proof.contains("1 process(es) stopped")),
            "{paused:?}"
        );

        signal_group(group, libc::SIGCONT);
        let running = confirm_group_state(group, "running again", |s| !stopped(s));
        assert!(running.is_ok(), "{running:?}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
