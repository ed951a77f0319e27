//! A fleet of simulated agents in one process. Each node has its own
//! connection and stream, registers an 8-GPU inventory on a fabric, follows
//! redirects, heartbeats, fences on the leader's term, and answers start,
//! stop and drain at once (engines are not run), so the control plane can
//! be measured and shaken at thousands of nodes on one machine.

mod node;

pub use node::{NodeSpec, NodeStats, run_node};

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

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

impl Fleet {
    /// Starts `count` nodes named `{prefix}-{i}`; node `i` dials the
    /// servers starting at `i % servers.len()`.
    pub fn spawn(prefix: &str, count: usize, servers: &[String], heartbeat: Duration) -> Fleet {
        let mut tasks = tokio::task::JoinSet::new();
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let mut order = servers.to_vec();
            order.rotate_left(i % servers.len().max(1));
            let stats = Arc::new(NodeStats::default());
            let spec = NodeSpec {
                id: format!("{prefix}-{i:05}"),
                servers: order,
                heartbeat,
                fabric: format!("ib-{}", i % 4),
                rack: format!("r{}", i % 50),
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
