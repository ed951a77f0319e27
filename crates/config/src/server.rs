//! `server.yaml`: one control-plane peer.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

use llmgw_yaml::{Cx, Decode, Node, Path};
use serde::Serialize;

use crate::admin::AdminConfig;
use crate::common::{
    ConfigError, TlsConfig, check_host_port, decode_transport, read_file, relative_to,
};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerConfig {
    /// This peer's Raft id: stable for the peer's lifetime, never reused.
    pub id: u64,
    pub data_dir: PathBuf,
    /// Agent stream and peer transport.
    pub grpc_listen: SocketAddr,
    /// The gRPC address other peers and agents dial (`host:port`).
    pub grpc_advertise: String,
    pub admin_listen: SocketAddr,
    /// The OpenAI router inside the server; `None` turns it off.
    pub router_listen: Option<SocketAddr>,
    /// Every voter of the initial cluster, this peer included.
    pub peers: Vec<PeerConfig>,
    /// Whether this peer may form a new cluster when its store is empty.
    pub initial_cluster_state: InitialClusterState,
    /// A catalog to seed the cluster with when it is first formed.
    pub catalog: Option<PathBuf>,
    pub raft: RaftTiming,
    pub liveness: LivenessConfig,
    pub tls: Option<TlsConfig>,
    pub insecure: bool,
    /// Admin API tokens; none leaves the API open.
    pub admin: AdminConfig,
    /// How long API keys' per-minute usage is kept.
    pub usage_retention: Duration,
    /// The id a cluster formed by these peers takes (otherwise one is
    /// made): set it to an old cluster's id to re-form that cluster from
    /// nothing and keep its agents, and a restore checks a backup against
    /// it.
    pub cluster_id: Option<String>,
}

/// What a peer with an empty data directory does (etcd's
/// `initial-cluster-state`). The data directory cannot answer this: wiping
/// it, or losing it with the disk, must never turn an existing cluster into
/// a new, empty one, so the answer lives in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InitialClusterState {
    /// The cluster is being formed: the lowest-id peer may initialise it
    /// once every configured peer answers and none holds a cluster.
    New,
    /// The cluster exists: an empty peer never initialises anything and
    /// waits to be replicated to (after `llmgw ctl cluster add`, or as a
    /// member whose data was lost). The default.
    Existing,
}

impl Decode for InitialClusterState {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let text = String::decode(node, path, cx)?;
        match text.as_str() {
            "new" => Some(InitialClusterState::New),
            "existing" => Some(InitialClusterState::Existing),
            _ => {
                cx.report(
                    node.pos,
                    path,
                    format!("unknown cluster state {text:?}; expected `new` or `existing`"),
                );
                None
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerConfig {
    pub id: u64,
    /// `host:port` of the peer's gRPC listener.
    pub grpc: String,
    /// Base URL of the peer's admin API, e.g. `http://10.0.0.1:7480`.
    pub admin: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RaftTiming {
    /// The slowest round trip between two peers: what the heartbeat and
    /// election timings below must allow for (their defaults follow it).
    pub peer_round_trip: Duration,
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Build a snapshot after this many applied entries.
    pub snapshot_after_logs: u64,
    /// Entries kept behind a snapshot for followers that lag a little.
    pub keep_logs_after_snapshot: u64,
    pub install_snapshot_timeout: Duration,
    /// Client writes are refused while the data directory has less free
    /// space than this many MiB (0: never).
    pub min_free_disk_mb: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LivenessConfig {
    /// No heartbeat for this long: the node is `unreachable`.
    pub node_ttl: Duration,
    /// Unreachable for this long: the node is `lost` and its replicas move.
    pub lost_after: Duration,
    /// After a leader change, every node gets this long to reconnect before
    /// it can be marked unreachable.
    pub leader_grace: Duration,
    /// The heartbeat interval the leader tells every agent to use (in
    /// `Registered`), over agent.yaml's own; none: each agent keeps its own.
    pub agent_heartbeat_interval: Option<Duration>,
}

impl RaftTiming {
    pub fn defaults() -> Self {
        RaftTiming {
            // Failover in about a second (docs/performance.md). Pre-vote and
            // the leader lease keep a short timeout from deposing a healthy
            // leader: a lone slow follower cannot win a pre-vote.
            peer_round_trip: Duration::from_millis(2),
            heartbeat_interval: Duration::from_millis(80),
            election_timeout_min: Duration::from_millis(250),
            election_timeout_max: Duration::from_millis(450),
            snapshot_after_logs: 10_000,
            keep_logs_after_snapshot: 1_000,
            install_snapshot_timeout: Duration::from_secs(30),
            min_free_disk_mb: 64,
        }
    }
}

impl LivenessConfig {
    pub fn defaults() -> Self {
        LivenessConfig {
            node_ttl: Duration::from_secs(15),
            lost_after: Duration::from_secs(180),
            leader_grace: Duration::from_secs(15),
            agent_heartbeat_interval: None,
        }
    }
}

impl ServerConfig {
    pub fn load(path: &FsPath) -> Result<Self, ConfigError> {
        let (name, text) = read_file(path)?;
        let mut config = Self::parse(&name, &text)?;
        config.data_dir = relative_to(path, config.data_dir);
        config.catalog = config.catalog.map(|c| relative_to(path, c));
        config.tls = config.tls.map(|t| t.resolve(path));
        config.admin.tokens = std::mem::take(&mut config.admin.tokens)
            .into_iter()
            .map(|t| t.resolve(path))
            .collect();
        Ok(config)
    }

    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        Ok(llmgw_yaml::load(file, text, |node, cx| {
            Self::decode(node, &Path::root(), cx)
        })?)
    }

    pub fn peer(&self, id: u64) -> Option<&PeerConfig> {
        self.peers.iter().find(|p| p.id == id)
    }

    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.tls.is_none() && !self.insecure {
            out.push(
                "no `tls` section and no `insecure: true`: `llmgw server` refuses to start; add \
                 `tls` (ca, cert, key) or set `insecure: true` for plaintext on a trusted network"
                    .to_string(),
            );
        }
        if self.insecure {
            out.push(
                "insecure: true — gRPC links are plaintext; use only on a trusted network"
                    .to_string(),
            );
        }
        if self.admin.tokens.is_empty() && !self.admin_listen.ip().is_loopback() && !self.insecure {
            out.push(format!(
                "no `admin.tokens` and the admin API listens on {}, not loopback: `llmgw server` \
                 refuses to start; add tokens, listen on 127.0.0.1, or set `insecure: true`",
                self.admin_listen
            ));
        } else if self.admin.tokens.is_empty() {
            out.push(format!(
                "no `admin.tokens`: the admin API on {} is open to anyone who can reach it",
                self.admin_listen
            ));
        }
        if self.peers.len().is_multiple_of(2) {
            out.push(format!(
                "{} voters tolerate no more failures than {}; use an odd number of peers",
                self.peers.len(),
                self.peers.len() - 1
            ));
        }
        out
    }
}

/// Usage is kept 90 days unless server.yaml says otherwise.
pub const DEFAULT_USAGE_RETENTION: Duration = Duration::from_secs(90 * 86_400);

const SERVER_KEYS: &[&str] = &[
    "id",
    "data_dir",
    "grpc_listen",
    "grpc_advertise",
    "admin_listen",
    "router_listen",
    "peers",
    "initial_cluster_state",
    "catalog",
    "raft",
    "liveness",
    "tls",
    "insecure",
    "admin",
    "usage_retention",
    "cluster_id",
];

impl Decode for ServerConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, SERVER_KEYS)?;
        let id: Option<u64> = f.required(cx, "id");
        if id == Some(0) {
            f.report(cx, "id", "peer ids start at 1");
        }
        let grpc_listen: SocketAddr =
            f.or(cx, "grpc_listen", SocketAddr::from(([0, 0, 0, 0], 7443)));
        let grpc_advertise: Option<String> = f.optional(cx, "grpc_advertise");
        if let Some(Err(why)) = grpc_advertise.as_deref().map(check_host_port) {
            f.report(cx, "grpc_advertise", why);
        }
        let admin_listen: SocketAddr =
            f.or(cx, "admin_listen", SocketAddr::from(([0, 0, 0, 0], 7480)));
        // Absent keeps the default; `router_listen: null` turns the router off.
        let router_listen: Option<SocketAddr> = if f.has_key("router_listen") {
            f.optional(cx, "router_listen")
        } else {
            Some(SocketAddr::from(([0, 0, 0, 0], 8080)))
        };
        let peers: Option<Vec<PeerConfig>> = f.required(cx, "peers");
        if let Some(peers) = &peers {
            check_peers(&f, cx, id, peers);
        }
        let peers = peers?;
        let raft: RaftTiming = f.optional(cx, "raft").unwrap_or_else(RaftTiming::defaults);
        let liveness: LivenessConfig = f
            .optional(cx, "liveness")
            .unwrap_or_else(LivenessConfig::defaults);
        let (tls, insecure) = decode_transport(&f, cx);
        check_admin_schemes(&f, cx, &peers, tls.is_some());

        let id = id?;
        // A peer advertises what the others know it by.
        let grpc_advertise = grpc_advertise
            .or_else(|| peers.iter().find(|p| p.id == id).map(|p| p.grpc.clone()))
            .unwrap_or_else(|| grpc_listen.to_string());
        Some(ServerConfig {
            id,
            data_dir: f.or(cx, "data_dir", PathBuf::from("/var/lib/llmgw-server")),
            grpc_listen,
            grpc_advertise,
            admin_listen,
            router_listen,
            peers,
            initial_cluster_state: f.or(cx, "initial_cluster_state", InitialClusterState::Existing),
            catalog: f.optional(cx, "catalog"),
            raft,
            liveness,
            tls,
            insecure,
            admin: f.or(cx, "admin", AdminConfig::default()),
            usage_retention: {
                let kept: Duration = f.or(cx, "usage_retention", DEFAULT_USAGE_RETENTION);
                if kept < Duration::from_secs(3600) {
                    f.report(
                        cx,
                        "usage_retention",
                        "keep usage at least an hour (e.g. 90d)",
                    );
                }
                kept
            },
            cluster_id: {
                let id: Option<String> = f.optional(cx, "cluster_id");
                if let Some(Err(why)) = id.as_deref().map(llmgw_node_id::check_cluster_id) {
                    f.report(cx, "cluster_id", why);
                }
                id
            },
        })
    }
}

/// The admin API speaks HTTPS exactly when the peer has TLS material, so
/// the URLs clients learn from `peers` must say so.
fn check_admin_schemes(f: &llmgw_yaml::Fields<'_>, cx: &mut Cx, peers: &[PeerConfig], tls: bool) {
    let (want, why) = if tls {
        (
            "https://",
            "this file has `tls`, so every peer's admin API serves HTTPS",
        )
    } else {
        ("http://", "without `tls` the admin API serves plain HTTP")
    };
    for (i, peer) in peers.iter().enumerate() {
        if !peer.admin.starts_with(want) {
            cx.report(
                f.item_pos("peers", i),
                &f.path().field("peers").index(i).field("admin"),
                format!("{:?}: {why}; write {want}…", peer.admin),
            );
        }
    }
}

fn check_peers(f: &llmgw_yaml::Fields<'_>, cx: &mut Cx, id: Option<u64>, peers: &[PeerConfig]) {
    if peers.is_empty() {
        if f.has("peers") {
            f.report(
                cx,
                "peers",
                "list every voter of the cluster, this peer included",
            );
        }
        return;
    }
    let mut ids = BTreeSet::new();
    let mut addrs = BTreeSet::new();
    for (i, peer) in peers.iter().enumerate() {
        let at = f.item_pos("peers", i);
        let path = f.path().field("peers").index(i);
        if !ids.insert(peer.id) {
            cx.report(
                at,
                &path.field("id"),
                format!("peer id {} is listed twice", peer.id),
            );
        }
        if !addrs.insert(peer.grpc.as_str()) {
            cx.report(
                at,
                &path.field("grpc"),
                format!("address {} is listed for two peers", peer.grpc),
            );
        }
    }
    if let Some(id) = id
        && id != 0
        && !ids.contains(&id)
    {
        f.report(
            cx,
            "id",
            format!("this peer's id {id} is not among `peers` ({ids:?})"),
        );
    }
}

impl Decode for PeerConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["id", "grpc", "admin"])?;
        let id: Option<u64> = f.required(cx, "id");
        if id == Some(0) {
            f.report(cx, "id", "peer ids start at 1");
        }
        let grpc: Option<String> = f.required(cx, "grpc");
        if let Some(Err(why)) = grpc.as_deref().map(check_host_port) {
            f.report(cx, "grpc", why);
        }
        let admin: Option<String> = f.required(cx, "admin");
        if let Some(url) = admin.as_deref()
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            f.report(
                cx,
                "admin",
                format!("{url:?} is not a URL; write e.g. http://10.0.0.1:7480"),
            );
        }
        Some(PeerConfig {
            id: id?,
            grpc: grpc?,
            admin: admin?.trim_end_matches('/').to_string(),
        })
    }
}

/// Longest peer round trip the peer transport carries: AppendEntries and
/// votes have one second.
const MAX_PEER_ROUND_TRIP: Duration = Duration::from_millis(250);

impl RaftTiming {
    /// The shortest heartbeat interval a round trip allows: openraft gives
    /// each heartbeat one interval to be answered, and a follower in a
    /// synced write or on a loaded host answers some tens of milliseconds
    /// late. A leader whose heartbeats all time out loses its lease and
    /// refuses every write, while followers still hear it and elect no one.
    pub fn min_heartbeat(peer_round_trip: Duration) -> Duration {
        peer_round_trip * 2 + Duration::from_millis(50)
    }

    /// The timings a round trip calls for, where the file sets none: the
    /// defaults on a LAN, longer across zones and regions.
    fn derived(peer_round_trip: Duration) -> RaftTiming {
        let d = RaftTiming::defaults();
        let heartbeat = d
            .heartbeat_interval
            .max(Self::min_heartbeat(peer_round_trip));
        let election_min = d
            .election_timeout_min
            .max(heartbeat * 3 + peer_round_trip * 2);
        RaftTiming {
            peer_round_trip,
            heartbeat_interval: heartbeat,
            election_timeout_min: election_min,
            election_timeout_max: election_min.mul_f64(1.8),
            ..d
        }
    }
}

impl Decode for RaftTiming {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "peer_round_trip",
                "heartbeat_interval",
                "election_timeout_min",
                "election_timeout_max",
                "snapshot_after_logs",
                "keep_logs_after_snapshot",
                "install_snapshot_timeout",
                "min_free_disk_mb",
            ],
        )?;
        let round_trip = f.or(
            cx,
            "peer_round_trip",
            RaftTiming::defaults().peer_round_trip,
        );
        if round_trip > MAX_PEER_ROUND_TRIP {
            f.report(
                cx,
                "peer_round_trip",
                format!(
                    "at most {MAX_PEER_ROUND_TRIP:?}: the peer transport gives each append and vote one second"
                ),
            );
        }
        let d = RaftTiming::derived(round_trip);
        let t = RaftTiming {
            peer_round_trip: round_trip,
            heartbeat_interval: f.or(cx, "heartbeat_interval", d.heartbeat_interval),
            election_timeout_min: f.or(cx, "election_timeout_min", d.election_timeout_min),
            election_timeout_max: f.or(cx, "election_timeout_max", d.election_timeout_max),
            snapshot_after_logs: f.or(cx, "snapshot_after_logs", d.snapshot_after_logs),
            keep_logs_after_snapshot: f.or(
                cx,
                "keep_logs_after_snapshot",
                d.keep_logs_after_snapshot,
            ),
            install_snapshot_timeout: f.or(
                cx,
                "install_snapshot_timeout",
                d.install_snapshot_timeout,
            ),
            min_free_disk_mb: f.or(cx, "min_free_disk_mb", d.min_free_disk_mb),
        };
        let min_heartbeat = RaftTiming::min_heartbeat(round_trip);
        if t.heartbeat_interval.is_zero() {
            f.report(cx, "heartbeat_interval", "must be more than 0s");
        } else if t.heartbeat_interval < min_heartbeat {
            f.report(
                cx,
                "heartbeat_interval",
                format!(
                    "{:?} cannot carry a heartbeat over a {round_trip:?} peer round trip \
                     (each heartbeat has one interval to be answered, or the leader's lease \
                     lapses and every write is refused): at least {min_heartbeat:?} \
                     (2 x peer_round_trip + 50ms), or leave it out to have it derived",
                    t.heartbeat_interval
                ),
            );
        }
        if t.election_timeout_min < t.heartbeat_interval * 3 {
            f.report(
                cx,
                "election_timeout_min",
                "must be at least 3 x heartbeat_interval, or followers start elections between heartbeats",
            );
        }
        if t.election_timeout_max <= t.election_timeout_min {
            f.report(
                cx,
                "election_timeout_max",
                "must be above election_timeout_min; the gap spreads candidates apart",
            );
        }
        if t.snapshot_after_logs == 0 {
            f.report(cx, "snapshot_after_logs", "must be at least 1");
        }
        Some(t)
    }
}

impl Decode for LivenessConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "node_ttl",
                "lost_after",
                "leader_grace",
                "agent_heartbeat_interval",
            ],
        )?;
        let d = LivenessConfig::defaults();
        let l = LivenessConfig {
            node_ttl: f.or(cx, "node_ttl", d.node_ttl),
            lost_after: f.or(cx, "lost_after", d.lost_after),
            leader_grace: f.or(cx, "leader_grace", d.leader_grace),
            agent_heartbeat_interval: f.optional(cx, "agent_heartbeat_interval"),
        };
        if let Some(interval) = l.agent_heartbeat_interval {
            if interval < Duration::from_millis(100) || interval > Duration::from_secs(60) {
                f.report(
                    cx,
                    "agent_heartbeat_interval",
                    "must be between 100ms and 1m, as agent.yaml's heartbeat_interval",
                );
            } else if interval * 3 > l.node_ttl {
                f.report(
                    cx,
                    "agent_heartbeat_interval",
                    format!(
                        "{interval:?} lets fewer than three heartbeats into node_ttl ({:?}): one \
                         late heartbeat would mark a healthy node unreachable",
                        l.node_ttl
                    ),
                );
            }
        }
        if l.node_ttl.is_zero() {
            f.report(cx, "node_ttl", "must be more than 0s");
        }
        if l.lost_after <= l.node_ttl {
            f.report(
                cx,
                "lost_after",
                "must be longer than node_ttl: a node is unreachable before it is lost",
            );
        }
        Some(l)
    }
}
