//! Real `llmgw agent` processes with fixture inventories and simulated
//! engines, attached to a [`Cluster`]. The guard kills each agent and
//! every engine process group it launched, even when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use llmgw_dev::{AgentLayout, NodeKind, SimEngines, agent_yaml, agent_yaml_tls};

use crate::{Cluster, engine_sim_bin, llmgw_bin};

/// The captured node inventories (`deploy/fixtures/nodes`).
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/nodes")
}

/// Where a TLS cluster's agent for `node_id` finds its certificate.
pub fn node_tls_files(cluster: &Cluster, node_id: &str) -> llmgw_tls::TlsFiles {
    let dir = cluster.tls_dir();
    llmgw_tls::TlsFiles {
        ca: llmgw_tls::certs::ca_files(&dir).0,
        cert: dir.join(format!("node-{node_id}.pem")),
        key: dir.join(format!("node-{node_id}.key")),
        crl: None,
    }
}

pub struct Agent {
    pub layout: AgentLayout,
    child: Option<Child>,
    starts: u32,
}

impl Agent {
    /// Writes the agent's config (peers listed from `first_peer` on, so
    /// agents dial different peers first) and starts it.
    pub fn start(cluster: &Cluster, node_id: &str, kind: NodeKind, first_peer: u64) -> Agent {
        let layout = AgentLayout::new(cluster.dir.path(), node_id, kind, "r1");
        let mut agent = Agent {
            layout,
            child: None,
            starts: 0,
        };
        agent.write_config(cluster, first_peer, "r1");
        agent.spawn();
        agent
    }

    /// (Re)writes agent.yaml: the peers from `first_peer` on, in `rack`.
    pub fn write_config(&self, cluster: &Cluster, first_peer: u64, rack: &str) {
        let mut servers: Vec<String> = cluster
            .peers
            .iter()
            .map(|p| p.layout.grpc.to_string())
            .collect();
        let first = usize::try_from(first_peer - 1).expect("a peer id");
        let count = servers.len();
        servers.rotate_left(first % count);
        let engines = SimEngines {
            bin: engine_sim_bin(),
            env: vec![
                ("LLMGW_SIM_LOAD_TIME".into(), "500ms".into()),
                ("LLMGW_SIM_TTFT".into(), "5ms".into()),
                ("LLMGW_SIM_ITL".into(), "1ms".into()),
            ],
        };
        let mut layout = self.layout.clone();
        layout.rack = rack.to_owned();
        let yaml = if cluster.tls {
            // A certificate the test put in place first is kept.
            let tls = node_tls_files(cluster, &self.layout.node_id);
            if !tls.cert.exists() {
                llmgw_dev::certs::node_tls(cluster.dir.path(), &self.layout.node_id)
                    .expect("issue the node certificate");
            }
            agent_yaml_tls(&layout, &servers, &fixtures_dir(), &engines, &tls, "")
        } else {
            agent_yaml(&layout, &servers, &fixtures_dir(), &engines, "")
        };
        std::fs::write(&self.layout.config, yaml).expect("write agent.yaml");
    }

    /// Starts the agent again with its config and work directory.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "agent {} runs", self.layout.node_id);
        self.starts += 1;
        let log = std::fs::File::create(
            self.layout
                .log
                .with_extension(format!("{}.log", self.starts)),
        )
        .expect("the agent's log file");
        let child = Command::new(llmgw_bin())
            .args(["agent", "--config"])
            .arg(&self.layout.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("start llmgw agent");
        self.child = Some(child);
    }

    /// SIGKILL the agent only; its engines keep running, as on a real node.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Engine process groups the agent recorded in its state files.
    pub fn engine_pids(&self) -> Vec<i32> {
        llmgw_dev::engine_groups(&self.layout.work_dir)
    }

    /// Everything the agent logged, every start.
    pub fn log_text(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                std::fs::read_to_string(self.layout.log.with_extension(format!("{n}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        for pid in self.engine_pids() {
            // Engines run in their own session: the pid is the group id.
            crate::process::signal_group(pid, libc::SIGKILL);
        }
    }
}
