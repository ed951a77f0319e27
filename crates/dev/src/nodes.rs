//! Simulated GPU nodes: an `llmgw agent` per node whose hardware comes from
//! a fixture inventory in `deploy/fixtures/nodes` and whose engines are
//! `llmgw-engine-sim`, launched through the real vLLM and SGLang adapters.

use std::path::{Path, PathBuf};

/// A kind of simulated node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeKind {
    /// Short name used in node ids.
    pub name: &'static str,
    /// Fixture file under `deploy/fixtures/nodes`.
    pub fixture: &'static str,
    /// The fabric the node is on and the HCAs agent.yaml names for it.
    pub fabric: Option<(&'static str, &'static [&'static str])>,
}

/// Eight H100s on NVSwitch with four HDR InfiniBand HCAs on fabric `ib-a`.
pub const H100_IB_A: NodeKind = NodeKind {
    name: "h100",
    fixture: "h100-sxm-8x-ib-a.yaml",
    fabric: Some(("ib-a", &["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"])),
};

/// Four A100s with two RoCE ports on fabric `roce-b`.
pub const A100_ROCE_B: NodeKind = NodeKind {
    name: "a100",
    fixture: "a100-sxm-4x-roce.yaml",
    fabric: Some(("roce-b", &["mlx5_0", "mlx5_1"])),
};

/// Four L40S on PCIe, no NVLink, no fabric: single-node replicas only.
pub const L40S_PCIE: NodeKind = NodeKind {
    name: "l40s",
    fixture: "l40s-pcie-4x.yaml",
    fabric: None,
};

/// One simulated node's files.
#[derive(Debug, Clone)]
pub struct AgentLayout {
    pub node_id: String,
    pub kind: NodeKind,
    pub rack: String,
    pub config: PathBuf,
    pub work_dir: PathBuf,
    pub log: PathBuf,
}

impl AgentLayout {
    pub fn new(work_dir: &Path, node_id: &str, kind: NodeKind, rack: &str) -> AgentLayout {
        AgentLayout {
            node_id: node_id.to_owned(),
            kind,
            rack: rack.to_owned(),
            config: work_dir.join(format!("agent-{node_id}.yaml")),
            work_dir: work_dir.join(format!("agent-{node_id}")),
            log: work_dir.join(format!("agent-{node_id}.log")),
        }
    }
}

/// How simulated engines behave: `LLMGW_SIM_*` variables for every engine
/// the agent launches.
#[derive(Debug, Clone)]
pub struct SimEngines {
    pub bin: PathBuf,
    pub env: Vec<(String, String)>,
}

/// The agent.yaml of a simulated node, plaintext (`insecure: true`).
/// `fixtures` is the `deploy/fixtures/nodes` directory; `servers` every
/// peer's gRPC address, in the order this agent tries them.
pub fn agent_yaml(
    agent: &AgentLayout,
    servers: &[String],
    fixtures: &Path,
    engines: &SimEngines,
    extra: &str,
) -> String {
    agent_yaml_with(agent, servers, fixtures, engines, "insecure: true\n", extra)
}

/// The agent.yaml of a simulated node with mTLS from `tls` (a certificate
/// naming this node, see [`crate::certs::node_tls`]).
pub fn agent_yaml_tls(
    agent: &AgentLayout,
    servers: &[String],
    fixtures: &Path,
    engines: &SimEngines,
    tls: &llmgw_tls::TlsFiles,
    extra: &str,
) -> String {
    let transport = crate::certs::tls_yaml(tls);
    agent_yaml_with(agent, servers, fixtures, engines, &transport, extra)
}

fn agent_yaml_with(
    agent: &AgentLayout,
    servers: &[String],
    fixtures: &Path,
    engines: &SimEngines,
    transport: &str,
    extra: &str,
) -> String {
    let quoted: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    let mut out = format!(
        "# Written by llmgw: simulated node {id} ({kind}).\n\
         node_id: {id}\n\
         servers: [{servers}]\n\
         mgmt_addr: 127.0.0.1\n\
         labels:\n  rack: {rack}\n\
         heartbeat_interval: 500ms\n\
         reconnect_base: 200ms\n\
         reconnect_max: 2s\n\
         {transport}",
        id = agent.node_id,
        kind = agent.kind.name,
        servers = quoted.join(", "),
        rack = agent.rack,
    );
    match agent.kind.fabric {
        Some((name, hcas)) => out.push_str(&format!(
            "fabrics:\n  - name: {name}\n    hcas: [{}]\n",
            hcas.join(", ")
        )),
        None => out.push_str("fabrics: []\n"),
    }
    let env: String = engines
        .env
        .iter()
        .map(|(k, v)| format!("      {k}: \"{v}\"\n"))
        .collect();
    let sim = engines.bin.display();
    out.push_str(&format!(
        "discovery:\n  fixture: {fixture}\n  prefer_nvml: false\n\
         engines:\n  vllm:\n    bin: {sim}\n    version: \"0.11.1\"\n    launch_mode: mp\n    env:\n      LLMGW_SIM_PERSONA: vllm=0.11.1\n{env}\
         \x20 sglang:\n    python: {sim}\n    env:{sglang_env}\
         supervisor:\n  work_dir: {work}\n  log_lines: 60\n  stop_timeout: 5s\n  health_interval: 200ms\n  startup_timeout: 120s\n",
        sglang_env = if env.is_empty() { " {}\n".to_owned() } else { format!("\n{env}") },
        fixture = fixtures.join(agent.kind.fixture).display(),
        work = agent.work_dir.display(),
    ));
    out.push_str(extra);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_simulated_node_writes_a_valid_agent_yaml() {
        let dir = tempfile::tempdir().unwrap();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/nodes");
        let engines = SimEngines {
            bin: PathBuf::from("/usr/local/bin/llmgw-engine-sim"),
            env: vec![("LLMGW_SIM_LOAD_TIME".into(), "1s".into())],
        };
        for (i, kind) in [H100_IB_A, A100_ROCE_B, L40S_PCIE].into_iter().enumerate() {
            let agent = AgentLayout::new(dir.path(), &format!("{}-{i}", kind.name), kind, "r1");
            assert!(fixtures.join(kind.fixture).is_file(), "{}", kind.fixture);
            let yaml = agent_yaml(
                &agent,
                &["127.0.0.1:7443".into(), "127.0.0.1:7444".into()],
                &fixtures,
                &engines,
                "",
            );
            let config = llmgw_config::AgentConfig::parse("agent.yaml", &yaml)
                .unwrap_or_else(|e| panic!("{yaml}\n{e}"));
            assert_eq!(config.node_id, agent.node_id);
            assert_eq!(config.servers.len(), 2);
            assert_eq!(config.fabrics.len(), usize::from(kind.fabric.is_some()));
        }
    }
}
