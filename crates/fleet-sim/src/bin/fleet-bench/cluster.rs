//! The three peers as real `llmgw server` processes, started with the
//! production transport unless told otherwise, and what the bench asks
//! them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use llmgw_api::{NodeStatus, Readiness, paths};
use llmgw_dev::{AdminAccess, PeerLayout};
use llmgw_fleet_sim::metric;
use llmgw_test_kit::{llmgw_bin, poll_until_ok};

/// How the peers are reached: mTLS between peers and from every agent,
/// HTTPS and tokens on the admin API (production), or plaintext.
pub struct Transport {
    /// `None`: plaintext everywhere (`insecure: true`).
    pub access: Option<AdminAccess>,
    /// Where the development CA lives (`<dir>/tls`).
    pub dir: PathBuf,
}

impl Transport {
    pub fn production(dir: &Path) -> Result<Transport> {
        let ca = llmgw_dev::certs::ensure_ca(dir)?;
        let access = AdminAccess::create(dir, Some(ca))?;
        Ok(Transport {
            access: Some(access),
            dir: dir.to_owned(),
        })
    }

    pub fn plaintext(dir: &Path) -> Transport {
        Transport {
            access: None,
            dir: dir.to_owned(),
        }
    }

    pub fn describe(&self) -> &'static str {
        if self.access.is_some() {
            "mTLS, HTTPS admin API with tokens"
        } else {
            "plaintext"
        }
    }
}

pub struct Peer {
    pub id: u64,
    pub admin: String,
    pub child: Option<Child>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The three peers as processes, and how to reach them.
pub struct Cluster {
    bin: PathBuf,
    layouts: Vec<PeerLayout>,
    pub peers: Vec<Peer>,
    pub http: reqwest::Client,
}

impl Cluster {
    /// Writes the peers' configs under `run_dir` and starts them.
    pub fn start(transport: &Transport, run_dir: &Path, raft_yaml: &str) -> Result<Cluster> {
        let bin = llmgw_bin();
        let layouts = llmgw_dev::plan_peers(run_dir, 3, transport.access.is_some())?;
        let mut peers = Vec::new();
        for layout in &layouts {
            let yaml = match &transport.access {
                Some(access) => {
                    let tls = llmgw_dev::certs::peer_tls(&transport.dir, layout.id)?;
                    let extra = format!("{}{raft_yaml}", access.server_yaml());
                    llmgw_dev::server_yaml_tls(layout, &layouts, &tls, &extra)
                }
                None => llmgw_dev::server_yaml(layout, &layouts, raft_yaml),
            };
            std::fs::write(&layout.config, yaml)?;
            peers.push(Peer {
                id: layout.id,
                admin: layout.admin_url(),
                child: Some(start_peer(&bin, layout)?),
            });
        }
        let timeout = Duration::from_secs(30);
        let http = match &transport.access {
            Some(access) => access.http_client(timeout, Some(&access.write_token()?)),
            None => reqwest::Client::builder().timeout(timeout).build()?,
        };
        Ok(Cluster {
            bin,
            layouts,
            peers,
            http,
        })
    }

    pub fn grpc_addrs(&self) -> Vec<String> {
        self.layouts.iter().map(|l| l.grpc.to_string()).collect()
    }

    pub fn peer(&self, id: u64) -> &Peer {
        &self.peers[(id - 1) as usize]
    }

    pub fn admin(&self, id: u64) -> String {
        self.peer(id).admin.clone()
    }

    pub fn kill(&mut self, id: u64) -> Result<()> {
        if let Some(mut child) = self.peers[(id - 1) as usize].child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    pub fn restart(&mut self, id: u64) -> Result<()> {
        let index = (id - 1) as usize;
        self.peers[index].child = Some(start_peer(&self.bin, &self.layouts[index])?);
        Ok(())
    }

    /// The leader a live peer names.
    pub async fn leader(&self) -> Result<u64, String> {
        leader(&self.http, &self.peers).await
    }
}

fn start_peer(bin: &Path, layout: &PeerLayout) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&layout.log)?;
    Command::new(bin)
        .args(["server", "--config"])
        .arg(&layout.config)
        .env(
            "RUST_LOG",
            std::env::var("FLEET_BENCH_LOG").unwrap_or_else(|_| "warn".to_owned()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("start llmgw server")
}

/// `/readyz` answers its `Readiness` with 200 and with 503 alike.
async fn readiness(http: &reqwest::Client, admin: &str) -> Result<Readiness> {
    let url = format!("{admin}{}", paths::READYZ);
    Ok(http.get(url).send().await?.json().await?)
}

/// The leader a live peer names. `/readyz` is asked rather than the cluster
/// view: it is cheap, and the bench asks many times a second.
async fn leader(http: &reqwest::Client, peers: &[Peer]) -> Result<u64, String> {
    for peer in peers.iter().filter(|p| p.child.is_some()) {
        if let Ok(readiness) = readiness(http, &peer.admin).await
            && let Some(id) = readiness.leader_id
            && peers.iter().any(|p| p.id == id && p.child.is_some())
        {
            return Ok(id);
        }
    }
    Err("no running peer names a running leader".to_owned())
}

/// `Ok` once `seen` reached `wanted`; otherwise how far it is.
pub fn at_least(seen: f64, wanted: f64, what: &str) -> Result<(), String> {
    if seen >= wanted {
        Ok(())
    } else {
        Err(format!("{seen} of {wanted} {what}"))
    }
}

/// A metric the bench cannot go on without: its value, or why not.
pub async fn required_metric(
    http: &reqwest::Client,
    admin: &str,
    name: &str,
) -> Result<f64, String> {
    metric(http, admin, name)
        .await
        .ok_or_else(|| format!("{admin}{} has no {name}", paths::METRICS))
}

/// How often a phase is asked whether it is done; placement is asked more
/// often (see `measure_placement`).
pub const POLL: Duration = Duration::from_millis(100);

/// Polls `check` every `every` until it answers `Ok`; after `within`, an
/// error with `what` and the last reason `check` gave.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    poll_until_ok(within, every, check)
        .await
        .map_err(|last| anyhow!("{what}: not within {within:?}; last seen: {last}"))
}

async fn unhealthy_nodes(http: &reqwest::Client, admin: &str) -> usize {
    let mut down = 0.0;
    for status in [NodeStatus::Unreachable, NodeStatus::Lost] {
        let name = format!("llmgw_nodes{{status=\"{}\"}}", status.as_str());
        down += metric(http, admin, &name).await.unwrap_or(0.0);
    }
    down as usize
}

/// The most nodes seen not ready at once over `period`.
pub async fn watch_unhealthy(http: &reqwest::Client, admin: &str, period: Duration) -> usize {
    let mut worst = 0;
    let until = Instant::now() + period;
    while Instant::now() < until {
        worst = worst.max(unhealthy_nodes(http, admin).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    worst
}

/// Waits until the leader holds a stream of every node and sees all of
/// them ready; answers the leader's id.
pub async fn fleet_back(
    cluster: &Cluster,
    nodes: usize,
    within: Duration,
    what: &str,
) -> Result<u64> {
    let want = nodes as f64;
    let http = &cluster.http;
    wait_for(what, within, POLL, || async {
        // The leader may change under a registration storm: follow it.
        let now = cluster.leader().await?;
        let admin = &cluster.admin(now);
        let streams = required_metric(http, admin, "llmgw_agent_streams").await?;
        let ready = required_metric(http, admin, "llmgw_nodes{status=\"ready\"}").await?;
        at_least(streams, want, &format!("streams on leader {now}"))?;
        at_least(ready, want, &format!("nodes ready on leader {now}"))?;
        Ok(now)
    })
    .await
}
