//! The run's network: one namespace per peer, joined by veth pairs to a
//! bridge that lives in a namespace of its own (the hub), so the host's
//! firewall never sees the cluster's traffic. The harness reaches the
//! peers from the host through one more veth pair into the hub.
//!
//! Every name carries the run id, so parallel runs do not clash, and
//! everything is removed when the `Net` is dropped.
//!
//! Faults are the kernel's: nftables rules inside a peer's namespace drop
//! traffic from chosen peers (partitions, one-way or full), and `tc netem`
//! adds loss and delay. Kernels built without netem get loss from an
//! nftables `numgen random` rule instead, and no delay; the fault log says
//! which was used.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("no free 10.77.x.0/24 subnet on this host (every candidate is in use)")]
    NoSubnet,
}

/// Runs a command to completion; its stderr is the error.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, NetError> {
    let command = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| NetError::Command {
            command: command.clone(),
            detail: format!("cannot start {program}: {e}"),
        })?;
    if !output.status.success() {
        return Err(NetError::Command {
            command,
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whether a TCP connection from namespace `ns` to `ip:port` opens
/// within 1 s (a dropped SYN on the bridge never gets an answer).
pub(crate) fn connects(ns: &str, ip: Ipv4Addr, port: u16) -> bool {
    run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "timeout",
            "1",
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{ip}/{port}"),
        ],
    )
    .is_ok()
}

/// Whether this process can build the run's network: root, `ip netns`,
/// `nft`. `Err` says what is missing.
pub fn preflight() -> Result<(), String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        })
        .unwrap_or_default();
    if uid != "0" {
        return Err(format!(
            "network namespaces need root (running as uid {uid}); run as root or with sudo"
        ));
    }
    for tool in [["ip", "-V"], ["nft", "--version"], ["tc", "-V"]] {
        run(tool[0], &tool[1..])
            .map_err(|e| format!("{e} (install iproute2 and nftables: scripts/setup does it)"))?;
    }
    // Unique per call: tests in one process probe from several threads.
    let probe = format!(
        "llmgw-chaos-probe-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    run("ip", &["netns", "add", &probe])
        .map_err(|e| format!("cannot create a network namespace: {e}"))?;
    let nft = run(
        "ip",
        &[
            "netns", "exec", &probe, "nft", "add", "table", "inet", "probe",
        ],
    );
    let _ = run("ip", &["netns", "del", &probe]);
    nft.map_err(|e| format!("nftables does not work inside a namespace: {e}"))?;
    Ok(())
}

pub struct Net {
    pub run_id: String,
    pub subnet: u8,
    hub: String,
    host_if: String,
    peers: BTreeMap<u64, String>,
    /// Ids in `peers` that are simulated nodes (agents), not control-plane
    /// peers: `isolate` leaves them alone.
    nodes: std::collections::BTreeSet<u64>,
    netem: bool,
    destroyed: bool,
}

const TABLE: &str = "llmgw_chaos";

impl Net {
    /// Creates the hub, the bridge and the host's link into it, on the
    /// first free `10.77.x.0/24`.
    pub fn create(run_id: &str) -> Result<Net, NetError> {
        let subnet = free_subnet(run_id)?;
        let net = Net {
            run_id: run_id.to_owned(),
            subnet,
            hub: format!("llmgw-chaos-{run_id}-hub"),
            host_if: format!("lgc{run_id}"),
            peers: BTreeMap::new(),
            nodes: std::collections::BTreeSet::new(),
            netem: false,
            destroyed: false,
        };
        let hub = net.hub.clone();
        run("ip", &["netns", "add", &hub])?;
        run("ip", &["-n", &hub, "link", "set", "lo", "up"])?;
        run("ip", &["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &hub, "link", "set", "br0", "up"])?;
        let host_if = net.host_if.clone();
        run(
            "ip",
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", "host", "netns", &hub,
            ],
        )?;
        run("ip", &["-n", &hub, "link", "set", "host", "master", "br0"])?;
        run("ip", &["-n", &hub, "link", "set", "host", "up"])?;
        let cidr = format!("{}/24", net.host_ip());
        run("ip", &["addr", "add", &cidr, "dev", &host_if])?;
        run("ip", &["link", "set", &host_if, "up"])?;
        Ok(net)
    }

    /// The harness's own address on the bridge.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, 254)
    }

    pub fn peer_ip(&self, id: u64) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, id as u8)
    }

    pub fn namespace(&self, id: u64) -> &str {
        &self.peers[&id]
    }

    pub fn namespaces(&self) -> Vec<String> {
        let mut all: Vec<String> = self.peers.values().cloned().collect();
        all.push(self.hub.clone());
        all
    }

    /// Whether `tc netem` works here (decided by the first peer).
    pub fn has_netem(&self) -> bool {
        self.netem
    }

    /// A namespace for peer `id`, on the bridge at `10.77.<subnet>.<id>`,
    /// with an empty nftables table ready for faults.
    pub fn add_peer(&mut self, id: u64) -> Result<(), NetError> {
        assert!((1..=250).contains(&id), "peer ids 1..=250 fit an address");
        let ns = format!("llmgw-chaos-{}-p{id}", self.run_id);
        run("ip", &["netns", "add", &ns])?;
        self.peers.insert(id, ns.clone());
        let hub = self.hub.clone();
        let port = format!("p{id}");
        run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        run(
            "ip",
            &[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ],
        )?;
        run("ip", &["-n", &hub, "link", "set", &port, "master", "br0"])?;
        run("ip", &["-n", &hub, "link", "set", &port, "up"])?;
        let cidr = format!("{}/24", self.peer_ip(id));
        run("ip", &["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
        run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
        self.nft(
            id,
            &format!(
                "add table inet {TABLE}\n\
                 add chain inet {TABLE} input {{ type filter hook input priority 0; policy accept; }}\n"
            ),
        )?;
        if self.peers.len() == 1 {
            self.netem = run(
                "tc",
                &[
                    "-n", &ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms",
                ],
            )
            .is_ok();
            if self.netem {
                run("tc", &["-n", &ns, "qdisc", "del", "dev", "eth0", "root"])?;
            }
        }
        Ok(())
    }

    fn nft(&self, id: u64, script: &str) -> Result<(), NetError> {
        let ns = self.namespace(id).to_owned();
        let path = std::env::temp_dir().join(format!(
            "llmgw-chaos-{}-nft-{id}-{}.nft",
            self.run_id,
            std::process::id()
        ));
        std::fs::write(&path, script).map_err(|e| NetError::Command {
            command: format!("write {}", path.display()),
            detail: e.to_string(),
        })?;
        let path_str = path.display().to_string();
        let result = run("ip", &["netns", "exec", &ns, "nft", "-f", &path_str]);
        let _ = std::fs::remove_file(&path);
        result.map(|_| ())
    }

    /// Drops every packet `from` sends to `to` (a one-way cut; call it
    /// both ways for a full one).
    pub fn block(&self, from: u64, to: u64) -> Result<(), NetError> {
        self.nft(
            to,
            &format!(
                "add rule inet {TABLE} input ip saddr {} drop\n",
                self.peer_ip(from)
            ),
        )
    }

    /// A namespace for a simulated node (an agent and its engines), on the
    /// bridge like a peer; `isolate` never touches it.
    pub fn add_node(&mut self, id: u64) -> Result<(), NetError> {
        self.add_peer(id)?;
        self.nodes.insert(id);
        Ok(())
    }

    /// Cuts the control stream between node `node` and peers `peers`, both
    /// ways: every TCP packet to or from the peers' gRPC port `port`. The
    /// node's engines stay reachable (the data plane is untouched).
    pub fn cut_stream(&self, node: u64, peers: &[u64], port: u16) -> Result<(), NetError> {
        for &peer in peers {
            self.nft(
                node,
                &format!(
                    "add rule inet {TABLE} input ip saddr {} tcp sport {port} drop\n",
                    self.peer_ip(peer)
                ),
            )?;
            self.nft(
                peer,
                &format!(
                    "add rule inet {TABLE} input ip saddr {} tcp dport {port} drop\n",
                    self.peer_ip(node)
                ),
            )?;
        }
        Ok(())
    }

    /// Cuts `side` off from every other peer, both ways. Clients on the
    /// host still reach every peer; simulated nodes are not involved.
    pub fn isolate(&self, side: &[u64]) -> Result<(), NetError> {
        let ids: Vec<u64> = self
            .peers
            .keys()
            .copied()
            .filter(|id| !self.nodes.contains(id))
            .collect();
        for &a in side {
            for &b in &ids {
                if !side.contains(&b) {
                    self.block(a, b)?;
                    self.block(b, a)?;
                }
            }
        }
        Ok(())
    }

    /// Loss (percent) and delay on everything peer `id` receives. Returns
    /// how it was done.
    pub fn degrade(&self, id: u64, loss_percent: u32, delay_ms: u32) -> Result<String, NetError> {
        let ns = self.namespace(id).to_owned();
        if self.netem {
            let loss = format!("{loss_percent}%");
            let delay = format!("{delay_ms}ms");
            let jitter = format!("{}ms", delay_ms / 2);
            run(
                "tc",
                &[
                    "-n", &ns, "qdisc", "replace", "dev", "eth0", "root", "netem", "loss", &loss,
                    "delay", &delay, &jitter,
                ],
            )?;
            Ok(format!("netem loss {loss} delay {delay}±{jitter}"))
        } else {
            self.nft(
                id,
                &format!(
                    "add rule inet {TABLE} input ip saddr 10.77.{}.0/24 numgen random mod 100 < {loss_percent} drop\n",
                    self.subnet
                ),
            )?;
            Ok(format!(
                "nftables random loss {loss_percent}% (this kernel has no netem: no delay)"
            ))
        }
    }

    /// Whether a TCP connection from `from`'s namespace to `to`'s address
    /// and `port` opens within 1 s: the harness's probe of its own cuts.
    pub fn reaches(&self, from: u64, to: u64, port: u16) -> bool {
        connects(self.namespace(from), self.peer_ip(to), port)
    }

    /// How peer `id`'s incoming traffic is degraded, read back from the
    /// kernel (the netem qdisc, or the nftables rule where there is no
    /// netem); `None` when nothing degrades it.
    pub fn degradation(&self, id: u64) -> Result<Option<String>, NetError> {
        let ns = self.namespace(id).to_owned();
        let shown = if self.netem {
            run("tc", &["-n", &ns, "qdisc", "show", "dev", "eth0"])?
        } else {
            run(
                "ip",
                &["netns", "exec", &ns, "nft", "list", "table", "inet", TABLE],
            )?
        };
        let marker = if self.netem { "loss" } else { "numgen" };
        Ok(shown
            .lines()
            .find(|line| line.contains(marker))
            .map(|line| line.trim().to_owned()))
    }

    /// Removes every fault from every peer.
    pub fn heal(&self) -> Result<(), NetError> {
        for (&id, ns) in &self.peers {
            self.nft(id, &format!("flush chain inet {TABLE} input\n"))?;
            if self.netem {
                // No qdisc to delete is fine.
                let _ = run("tc", &["-n", ns, "qdisc", "del", "dev", "eth0", "root"]);
            }
        }
        Ok(())
    }

    /// Processes running inside any of the run's namespaces.
    pub fn pids(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for ns in self.namespaces() {
            if let Ok(text) = run("ip", &["netns", "pids", &ns]) {
                out.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .map(|pid| (ns.clone(), pid)),
                );
            }
        }
        out
    }

    /// Deletes everything the run created; errors are collected, not
    /// fatal, so one leftover does not keep the rest.
    pub fn destroy(&mut self) -> Vec<String> {
        if self.destroyed {
            return Vec::new();
        }
        self.destroyed = true;
        let mut problems = Vec::new();
        if let Err(e) = run("ip", &["link", "del", &self.host_if]) {
            problems.push(e.to_string());
        }
        for ns in self.namespaces() {
            if let Err(e) = run("ip", &["netns", "del", &ns]) {
                problems.push(e.to_string());
            }
        }
        problems
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for problem in self.destroy() {
            eprintln!("chaos: cleaning up the run's network: {problem}");
        }
    }
}

/// A third octet no interface on the host uses, starting from one derived
/// from the run id so parallel runs start apart.
fn free_subnet(run_id: &str) -> Result<u8, NetError> {
    let used = run("ip", &["-o", "-4", "addr", "show"])?;
    let start = u32::from_str_radix(run_id, 16).unwrap_or(0) % 240;
    for offset in 0..240 {
        let candidate = 10 + ((start + offset) % 240) as u8;
        if !used.contains(&format!("10.77.{candidate}.")) {
            return Ok(candidate);
        }
    }
    Err(NetError::NoSubnet)
}
