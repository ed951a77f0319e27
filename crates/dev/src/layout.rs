//! Ports, config files and dev.json for a local cluster.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One local peer's addresses and files.
#[derive(Debug, Clone)]
pub struct PeerLayout {
    pub id: u64,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub config: PathBuf,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// The admin API serves HTTPS (the peer has TLS material).
    pub https: bool,
}

impl PeerLayout {
    pub fn admin_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.admin)
    }
}

/// `dev.json`: every process started, and how to start it again by hand.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DevFile {
    pub processes: Vec<DevProcess>,
    pub router: Option<String>,
    pub api: Vec<String>,
    /// The CA bundle that signed the peers' certificates (`LLMGW_CA`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// Files holding the admin API's read and write tokens (`LLMGW_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_token_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_token_file: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DevProcess {
    /// `server`, `agent` or `router`.
    pub role: String,
    /// The peer id (a number) for servers, the node id for agents.
    pub id: serde_json::Value,
    pub pid: u32,
    pub argv: Vec<String>,
    pub api: Option<String>,
    pub grpc: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<String>,
    /// Where the process writes its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
}

/// A port free right now on 127.0.0.1. Another process could take it
/// before the peer binds it; the peer then fails to start with an error
/// naming the address, and `llmgw dev` reports it.
/// Listening ports are chosen below the kernel's ephemeral range (32768
/// and up by default): a port the kernel handed out as free could become
/// the source port of another process's outgoing connection before the
/// peer binds it, and the peer would then fail with "address in use".
const PORTS: std::ops::Range<u16> = 20_000..32_000;

/// `n` distinct ports free now, held until all are chosen.
fn free_ports(n: usize) -> std::io::Result<Vec<SocketAddr>> {
    let mut held: Vec<TcpListener> = Vec::new();
    // A different start per process and call, so concurrent runs spread out.
    let span = u64::from(PORTS.end - PORTS.start);
    let mut next = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0u64, |d| u64::from(d.subsec_nanos()))
        .wrapping_add(u64::from(std::process::id()) * 7919);
    for _ in 0..span {
        if held.len() == n {
            break;
        }
        next = next
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let port = PORTS.start + u16::try_from((next >> 33) % span).unwrap_or(0);
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    if held.len() < n {
        return Err(std::io::Error::other(format!(
            "fewer than {n} free ports in {PORTS:?} on 127.0.0.1"
        )));
    }
    held.iter().map(TcpListener::local_addr).collect()
}

/// Chooses ports and paths for `count` peers under `work_dir`; `https`:
/// the peers will have TLS material, so their admin API is HTTPS.
pub fn plan_peers(work_dir: &Path, count: u64, https: bool) -> std::io::Result<Vec<PeerLayout>> {
    let ports = free_ports(2 * usize::try_from(count).unwrap_or(0))?;
    (1..=count)
        .map(|id| {
            let i = 2 * usize::try_from(id - 1).unwrap_or(0);
            Ok(PeerLayout {
                id,
                grpc: ports[i],
                admin: ports[i + 1],
                config: work_dir.join(format!("server-{id}.yaml")),
                data_dir: work_dir.join(format!("server-{id}")),
                log: work_dir.join(format!("server-{id}.log")),
                https,
            })
        })
        .collect()
}

/// The server.yaml of one local peer, plaintext (`insecure: true`). `extra`
/// is appended verbatim (`llmgw dev` adds the admin tokens and the demo
/// catalog; fleet-bench and tests add Raft and liveness settings).
pub fn server_yaml(peer: &PeerLayout, all: &[PeerLayout], extra: &str) -> String {
    server_yaml_with(peer, all, "insecure: true\n", extra)
}

/// The server.yaml of one local peer with mTLS from `tls` (and HTTPS on
/// its admin API: the layouts must be planned with `https`).
pub fn server_yaml_tls(
    peer: &PeerLayout,
    all: &[PeerLayout],
    tls: &llmgw_tls::TlsFiles,
    extra: &str,
) -> String {
    debug_assert!(all.iter().all(|p| p.https), "TLS peers serve HTTPS");
    server_yaml_with(peer, all, &crate::certs::tls_yaml(tls), extra)
}

fn server_yaml_with(peer: &PeerLayout, all: &[PeerLayout], transport: &str, extra: &str) -> String {
    let mut out = format!(
        "# Written by `llmgw dev`: peer {id} of a local cluster on 127.0.0.1.\n\
         id: {id}\n\
         data_dir: {data}\n\
         grpc_listen: {grpc}\n\
         admin_listen: {admin}\n\
         router_listen: null\n\
         initial_cluster_state: new\n\
         {transport}\
         peers:\n",
        id = peer.id,
        data = peer.data_dir.display(),
        grpc = peer.grpc,
        admin = peer.admin,
    );
    for other in all {
        out.push_str(&format!(
            "  - {{ id: {}, grpc: \"{}\", admin: \"{}\" }}\n",
            other.id,
            other.grpc,
            other.admin_url()
        ));
    }
    out.push_str(extra);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_peer_gets_distinct_ports_and_lists_all_peers() {
        let dir = tempfile::tempdir().unwrap();
        let peers = plan_peers(dir.path(), 3, false).unwrap();
        let mut ports: Vec<u16> = peers
            .iter()
            .flat_map(|p| [p.grpc.port(), p.admin.port()])
            .collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 6);
        let yaml = server_yaml(&peers[1], &peers, "");
        let config =
            llmgw_config::ServerConfig::parse("server-2.yaml", &yaml).expect("valid server.yaml");
        assert_eq!(config.id, 2);
        assert_eq!(config.peers.len(), 3);
        assert_eq!(config.grpc_listen, peers[1].grpc);
        for peer in &peers {
            assert!(yaml.contains(&peer.admin_url()));
        }
        assert!(config.insecure && config.tls.is_none());

        let files = crate::certs::peer_tls(dir.path(), 2).unwrap();
        let peers = plan_peers(dir.path(), 3, true).unwrap();
        let yaml = server_yaml_tls(&peers[1], &peers, &files, "");
        let config = llmgw_config::ServerConfig::parse("server-2.yaml", &yaml)
            .expect("valid server.yaml with tls");
        assert!(!config.insecure);
        assert!(config.peers.iter().all(|p| p.admin.starts_with("https://")));
        let tls = config.tls.expect("a tls section");
        assert_eq!(
            (tls.ca, tls.cert, tls.key),
            (files.ca, files.cert, files.key)
        );
    }
}
