//! A fleet of simulated agents in one process. Each node has its own
//! connection and stream, registers an 8-GPU inventory on a fabric, follows
//! redirects, heartbeats, fences on the leader's term, and answers start,
//! stop and drain at once (engines are not run), so the control plane can
//! be measured and shaken at thousands of nodes on one machine.

mod node;

pub use node::{NodeSpec, NodeStats, run_node};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use llmgw_tls::{Identity, Tls, TlsError};

/// One sample of a peer's Prometheus text at `admin`: the value of the
/// series `name`, a metric name with or without its label set, read as
/// every llmgw test reads one ([`llmgw_test_kit::metric`]).
pub async fn metric(http: &reqwest::Client, admin: &str, name: &str) -> Option<f64> {
    let text = http
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    llmgw_test_kit::metric(&text, name)
}

/// A running fleet.
pub struct Fleet {
    pub nodes: Vec<Arc<NodeStats>>,
    tasks: tokio::task::JoinSet<()>,
}

/// A snapshot of the whole fleet.
#[derive(Debug, Clone, Copy, Default)]
pub struct FleetStats {
    pub nodes: usize,
    /// Holding a registered stream with the leader.
    pub registered: usize,
    pub reconnects: u64,
    pub commands: u64,
    pub refused: u64,
}

/// The id of node `index` of a fleet named `prefix`.
pub fn node_id(prefix: &str, index: usize) -> String {
    format!("{prefix}-{index:05}")
}

/// A certificate of its own for each of `count` nodes named as
/// [`Fleet::spawn`] names them, issued by the development CA of `work_dir`
/// (made there unless it exists, as `llmgw dev` does), so that every node
/// dials with mTLS and proves its node id as a real agent does. Issued on
/// every core: a fleet of ten thousand is ten thousand keys.
pub fn node_certificates(
    work_dir: &Path,
    prefix: &str,
    count: usize,
) -> Result<Vec<Tls>, TlsError> {
    llmgw_dev::certs::ensure_ca(work_dir)?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_worker = count.div_ceil(workers).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .step_by(per_worker)
            .map(|first| {
                scope.spawn(move || {
                    (first..count.min(first + per_worker))
                        .map(|i| {
                            let id = node_id(prefix, i);
                            let files = llmgw_dev::certs::node_tls(work_dir, &id)?;
                            Tls::load(files, Identity::Node(id))
                        })
                        .collect::<Result<Vec<Tls>, TlsError>>()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(count);
        for handle in handles {
            out.extend(handle.join().expect("a certificate worker panicked")?);
        }
        Ok(out)
    })
}

impl Fleet {
    /// Starts `count` nodes named `{prefix}-{i}`; node `i` dials the
    /// servers starting at `i % servers.len()`, with mTLS when
    /// `certificates` holds one per node (see [`node_certificates`]).
    pub fn spawn(
        prefix: &str,
        count: usize,
        servers: &[String],
        heartbeat: Duration,
        certificates: Option<Vec<Tls>>,
    ) -> Fleet {
        let mut tasks = tokio::task::JoinSet::new();
        let mut nodes = Vec::with_capacity(count);
        let mut certificates = certificates.map(Vec::into_iter);
        for i in 0..count {
            let mut order = servers.to_vec();
            order.rotate_left(i % servers.len().max(1));
            let stats = Arc::new(NodeStats::default());
            let spec = NodeSpec {
                id: node_id(prefix, i),
                servers: order,
                heartbeat,
                fabric: format!("ib-{}", i % 4),
                rack: format!("r{}", i % 50),
                tls: certificates.as_mut().and_then(Iterator::next),
            };
            tasks.spawn(run_node(spec, stats.clone()));
            nodes.push(stats);
        }
        Fleet { nodes, tasks }
    }

    pub fn stats(&self) -> FleetStats {
        let mut out = FleetStats {
            nodes: self.nodes.len(),
            ..FleetStats::default()
        };
        for node in &self.nodes {
            if node.registered.load(Ordering::Relaxed) {
                out.registered += 1;
            }
            out.reconnects += node.reconnects.load(Ordering::Relaxed);
            out.commands += node.commands.load(Ordering::Relaxed);
            out.refused += node.refused.load(Ordering::Relaxed);
        }
        out
    }

    pub fn stop(mut self) {
        self.tasks.abort_all();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}
