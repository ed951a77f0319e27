//! Config files as operators write them. The original agent example and every
//! file in deploy/examples must load; every broken file must be refused with
//! the line, column and field path of each mistake.

use std::path::{Path, PathBuf};
use std::time::Duration;

use llmgw_config::{AgentConfig, FileKind, RouterConfig, ServerConfig, check_file};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_original_agent_example_loads_unchanged() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/original-agent.yaml");
    let config = AgentConfig::load(&path).unwrap();
    assert_eq!(config.node_id, "gpu-a-01");
    assert_eq!(config.servers, ["llmgw-server.internal:7443"]);
    assert_eq!(config.mgmt_addr, "10.0.0.11");
    assert_eq!(config.heartbeat_interval, Duration::from_secs(5));
    assert_eq!(config.fabrics[0].hcas.len(), 4);
    assert_eq!(config.fabrics[0].rate_gbps, Some(200));
    assert_eq!(
        config.discovery.nvidia_smi, None,
        "an empty nvidia_smi means: search PATH"
    );
    assert_eq!(config.supervisor.stop_timeout, Duration::from_secs(60));
    assert_eq!(
        config.engines.vllm.unwrap().launch_mode,
        llmgw_catalog::LaunchMode::Ray
    );
}

/// agent.yaml's `engines.*.version` is read by the same rule as the option
/// data and a profile's `engine_version`: suffixes dropped, minor required.
#[test]
fn agent_engine_versions_read_like_the_catalog() {
    let agent = |version: &str| {
        let yaml = format!(
            "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nengines:\n  vllm:\n    bin: /opt/vllm\n    launch_mode: ray\n    ray_bin: /opt/ray\n    version: \"{version}\"\n"
        );
        AgentConfig::parse("agent.yaml", &yaml)
            .map(|config| config.engines.vllm.unwrap().version.to_string())
            .map_err(|e| e.to_string())
    };
    for (written, read) in [
        ("0.11.1", "0.11.1"),
        ("0.11", "0.11.0"),
        ("0.5.3.post1", "0.5.3"),
        ("0.11.1rc2", "0.11.1"),
        ("0.11.1+cu128", "0.11.1"),
        ("0.11.1-dev", "0.11.1"),
    ] {
        assert_eq!(agent(written).as_deref(), Ok(read), "version {written:?}");
    }
    for refused in ["latest", "1", "v0.11.1"] {
        let error = agent(refused).unwrap_err();
        assert!(
            error.contains(&format!("invalid version {refused:?}")),
            "{error}"
        );
    }
}

#[test]
fn every_deploy_example_validates() {
    let dir = repo_root().join("deploy/examples");
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let report =
                check_file(&path, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            kinds.push(report.kind);
        }
    }
    for kind in FileKind::ALL {
        assert!(kinds.contains(&kind), "deploy/examples has no {kind} file");
    }
}

#[test]
fn server_defaults_are_filled_in() {
    let config = ServerConfig::parse(
        "server.yaml",
        "id: 2\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\n  - {id: 2, grpc: \"b:7443\", admin: \"http://b:7480/\"}\n  - {id: 3, grpc: \"c:7443\", admin: \"http://c:7480\"}\ninsecure: true\n",
    )
    .unwrap();
    assert_eq!(config.grpc_advertise, "b:7443");
    assert_eq!(config.peers[1].admin, "http://b:7480");
    assert_eq!(config.router_listen.unwrap().port(), 8080);
    assert_eq!(config.raft.heartbeat_interval, Duration::from_millis(80));
    let off = ServerConfig::parse(
        "server.yaml",
        "id: 1\nrouter_listen: null\npeers: [{id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}]\n",
    )
    .unwrap();
    assert_eq!(off.router_listen, None);
}

#[test]
fn router_reads_inline_models_like_the_catalog() {
    let config = RouterConfig::parse(
        "router.yaml",
        "models:\n  - name: m\n    endpoints: [\"http://127.0.0.1:9000\"]\n",
    )
    .unwrap();
    assert_eq!(
        config.models.resolve("m").unwrap().static_endpoints(),
        ["http://127.0.0.1:9000"]
    );
}

#[test]
fn raft_timings_follow_the_peer_round_trip_unless_set() {
    let timing = |raft: &str| {
        let src = format!("{SERVER_BASE}raft:\n{raft}");
        ServerConfig::parse("server.yaml", &src).unwrap().raft
    };
    let lan = timing("  peer_round_trip: 1ms\n");
    assert_eq!(
        lan,
        llmgw_config::RaftTiming {
            peer_round_trip: Duration::from_millis(1),
            ..llmgw_config::RaftTiming::defaults()
        }
    );
    let region = timing("  peer_round_trip: 80ms\n");
    assert_eq!(
        (
            region.heartbeat_interval,
            region.election_timeout_min,
            region.election_timeout_max
        ),
        (
            Duration::from_millis(210),
            Duration::from_millis(790),
            Duration::from_millis(1422)
        )
    );
    let set = timing(
        "  peer_round_trip: 80ms\n  heartbeat_interval: 300ms\n  election_timeout_min: 2s\n  election_timeout_max: 3s\n",
    );
    assert_eq!(set.heartbeat_interval, Duration::from_millis(300));
}

#[test]
fn router_tokenizer_directories_are_relative_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("router.yaml");
    std::fs::write(
        &file,
        "control_plane: [\"http://a:7480\"]\nbalancing:\n  tokenizers:\n    qwen: models/qwen\n    llama: /srv/llama\n",
    )
    .unwrap();
    let config = RouterConfig::load(&file).unwrap();
    assert_eq!(
        config.balancing.tokenizers["qwen"],
        dir.path().join("models/qwen")
    );
    assert_eq!(
        config.balancing.tokenizers["llama"],
        std::path::PathBuf::from("/srv/llama")
    );
    assert_eq!(config.balancing.tokenizer_check_every, 100);
}

const AGENT_BASE: &str = "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\n";
const SERVER_BASE: &str =
    "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\n";

/// (what is wrong, kind, file, expected `line:col: path: message` fragment)
const BROKEN: &[(&str, FileKind, &str, &str)] = &[
    (
        "rate is not a number",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nfabrics:\n  - name: ib-a\n    hcas: [mlx5_0]\n    rate_gbps: fast\n",
        "agent.yaml:7:16: fabrics[0].rate_gbps: expected a number, found \"fast\"",
    ),
    (
        "misspelt agent key",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nheartbeat_intervall: 5s\n",
        "agent.yaml:4:1: heartbeat_intervall: unknown key `heartbeat_intervall` (did you mean `heartbeat_interval`?)",
    ),
    (
        "duration without unit",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nheartbeat_interval: 5\n",
        "agent.yaml:4:21: heartbeat_interval: invalid duration \"5\": add a unit",
    ),
    (
        "server and servers both",
        FileKind::Agent,
        "server: \"a:7443\"\nservers: [\"b:7443\"]\nmgmt_addr: 10.0.0.1\n",
        "agent.yaml:1:9: server: give either `server` (one peer) or `servers`",
    ),
    (
        "no peers",
        FileKind::Agent,
        "node_id: n1\nmgmt_addr: 10.0.0.1\n",
        "agent.yaml:1:1: servers: required field is missing",
    ),
    (
        "peer without port",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a\", \"b:7443\"]\nmgmt_addr: 10.0.0.1\n",
        "agent.yaml:2:11: servers[0]: \"a\" has no port",
    ),
    (
        "missing mgmt_addr",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\n",
        "agent.yaml:1:1: mgmt_addr: required field is missing",
    ),
    (
        "reconnect_max below base",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nreconnect_base: 10s\nreconnect_max: 1s\n",
        "agent.yaml:5:16: reconnect_max: must be at least reconnect_base",
    ),
    (
        "duplicate fabric",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nfabrics:\n  - {name: ib-a, hcas: [mlx5_0]}\n  - {name: ib-a, hcas: [mlx5_1]}\n",
        "fabrics[1].name: fabric `ib-a` is listed twice",
    ),
    (
        "HCA on two fabrics",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nfabrics:\n  - {name: ib-a, hcas: [mlx5_0]}\n  - {name: ib-b, hcas: [mlx5_0]}\n",
        "fabrics[1].hcas: HCA `mlx5_0` is already in fabric `ib-a`",
    ),
    (
        "fabric without HCAs",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nfabrics:\n  - {name: ib-a, hcas: []}\n",
        "fabrics[0].hcas: list the HCAs",
    ),
    (
        "ray without ray_bin",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nengines:\n  vllm:\n    bin: /opt/vllm\n    launch_mode: ray\n",
        "agent.yaml:6:5: engines.vllm.ray_bin: launch_mode `ray` needs `ray_bin`",
    ),
    (
        "mp on an old vLLM",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nengines:\n  vllm:\n    bin: /opt/vllm\n    launch_mode: mp\n    version: 0.11.0\n",
        "agent.yaml:7:18: engines.vllm.launch_mode: launch_mode `mp` needs vLLM 0.11.1 or newer",
    ),
    (
        "bad engine version",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nengines:\n  sglang:\n    python: /opt/py\n    version: latest\n",
        "agent.yaml:7:14: engines.sglang.version: invalid version \"latest\"",
    ),
    (
        "unknown engine section",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nengines:\n  vlm:\n    bin: /opt/vllm\n",
        "agent.yaml:5:3: engines.vlm: unknown key `vlm` (did you mean `vllm`?)",
    ),
    (
        "log_lines zero",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nsupervisor:\n  log_lines: 0\n",
        "agent.yaml:5:14: supervisor.log_lines: must be between 1 and 100000",
    ),
    (
        "skip_gpus not a bool",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\ndiscovery:\n  skip_gpus: maybe\n",
        "agent.yaml:5:14: discovery.skip_gpus: expected true or false, found \"maybe\"",
    ),
    (
        "tls and insecure both",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\ninsecure: true\ntls: {ca: a, cert: b, key: c}\n",
        "agent.yaml:4:11: insecure: `insecure: true` turns TLS off",
    ),
    (
        "tls without key",
        FileKind::Agent,
        "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\ntls:\n  ca: a\n  cert: b\n",
        "agent.yaml:5:3: tls.key: required field is missing",
    ),
    (
        "server id missing from peers",
        FileKind::Server,
        "id: 4\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\n",
        "server.yaml:1:5: id: this peer's id 4 is not among `peers`",
    ),
    (
        "server id zero",
        FileKind::Server,
        "id: 0\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\n",
        "server.yaml:1:5: id: peer ids start at 1",
    ),
    (
        "duplicate peer id",
        FileKind::Server,
        "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\n  - {id: 1, grpc: \"b:7443\", admin: \"http://b:7480\"}\n",
        "peers[1].id: peer id 1 is listed twice",
    ),
    (
        "peer admin not a URL",
        FileKind::Server,
        "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"a:7480\"}\n",
        "server.yaml:3:36: peers[0].admin: \"a:7480\" is not a URL",
    ),
    (
        "plain http admin URL on a TLS peer",
        FileKind::Server,
        "id: 1\ntls: {ca: a, cert: b, key: c}\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\n",
        "server.yaml:4:6: peers[0].admin: \"http://a:7480\": this file has `tls`, so every peer's admin API serves HTTPS; write https://",
    ),
    (
        "https admin URL on a plaintext peer",
        FileKind::Server,
        "id: 1\ninsecure: true\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"https://a:7480\"}\n",
        "peers[0].admin: \"https://a:7480\": without `tls` the admin API serves plain HTTP; write http://",
    ),
    (
        "https control plane without its CA",
        FileKind::Router,
        "control_plane: [\"https://a:7480\"]\n",
        "router.yaml:1:17: control_plane[0]: an https:// peer needs `control_plane_ca`",
    ),
    (
        "listen address not an address",
        FileKind::Server,
        "id: 1\nadmin_listen: localhost\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\n",
        "server.yaml:2:15: admin_listen: expected an IP address and port such as `0.0.0.0:7443`, found \"localhost\"",
    ),
    (
        "election timeout too short",
        FileKind::Server,
        "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\nraft:\n  heartbeat_interval: 500ms\n  election_timeout_min: 1s\n",
        "server.yaml:6:25: raft.election_timeout_min: must be at least 3 x heartbeat_interval",
    ),
    (
        "lost before unreachable",
        FileKind::Server,
        "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\nliveness:\n  node_ttl: 1m\n  lost_after: 30s\n",
        "server.yaml:6:15: liveness.lost_after: must be longer than node_ttl",
    ),
    (
        "agent heartbeats that would not fit node_ttl",
        FileKind::Server,
        "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\nliveness:\n  node_ttl: 6s\n  agent_heartbeat_interval: 3s\n",
        "liveness.agent_heartbeat_interval: 3s lets fewer than three heartbeats into node_ttl (6s)",
    ),
    (
        "router with nothing to route",
        FileKind::Router,
        "listen: 0.0.0.0:8080\n",
        "router.yaml:1:1: the router has nothing to route",
    ),
    (
        "router threads out of range",
        FileKind::Router,
        "control_plane: [\"http://a:7480\"]\nthreads: 0\n",
        "router.yaml:2:10: threads: between 1 and 1024",
    ),
    (
        "unknown balancing policy",
        FileKind::Router,
        "control_plane: [\"http://a:7480\"]\nbalancing:\n  policy: random\n",
        "router.yaml:3:11: balancing.policy: unknown policy \"random\"",
    ),
    (
        "router inline model broken",
        FileKind::Router,
        "models:\n  - name: m\n    endpoints: [\"m:9000\"]\n",
        "router.yaml:3:17: models[0].endpoints[0]: \"m:9000\" is not an http:// or https:// URL",
    ),
    (
        "stall beyond the request deadline",
        FileKind::Router,
        "control_plane: [\"http://a:7480\"]\ntimeouts:\n  request: 10s\n  stall: 1m\n",
        "router.yaml:4:10: timeouts.stall: must not exceed the request deadline",
    ),
    (
        "no time for a client to send its request",
        FileKind::Router,
        "control_plane: [\"http://a:7480\"]\ntimeouts:\n  client_read: 0s\n",
        "router.yaml:3:16: timeouts.client_read: must be longer than zero",
    ),
    (
        "a hold no replica can start within",
        FileKind::Router,
        "control_plane: [\"http://a:7480\"]\nscale_from_zero:\n  hold: 0s\n",
        "router.yaml:3:9: scale_from_zero.hold: between 1s and 1h",
    ),
    (
        "keep-alive comments too often",
        FileKind::Router,
        "control_plane: [\"http://a:7480\"]\nscale_from_zero:\n  keep_alive: 10ms\n",
        "router.yaml:3:15: scale_from_zero.keep_alive: at least 100ms, or 0s",
    ),
    (
        "a heartbeat the peer round trip cannot carry",
        FileKind::Server,
        "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\nraft:\n  peer_round_trip: 100ms\n  heartbeat_interval: 80ms\n",
        "server.yaml:6:23: raft.heartbeat_interval: 80ms cannot carry a heartbeat over a 100ms peer round trip",
    ),
    (
        "a round trip the peer transport cannot carry",
        FileKind::Server,
        "id: 1\npeers:\n  - {id: 1, grpc: \"a:7443\", admin: \"http://a:7480\"}\nraft:\n  peer_round_trip: 300ms\n",
        "server.yaml:5:20: raft.peer_round_trip: at most 250ms",
    ),
    (
        "a tokenizer never checked against the engines",
        FileKind::Router,
        "control_plane: [\"http://a:7480\"]\nbalancing:\n  tokenizer_check_every: 0\n",
        "router.yaml:3:26: balancing.tokenizer_check_every: must be at least 1",
    ),
];

fn parse_as(kind: FileKind, src: &str) -> Result<(), String> {
    let file = format!("{kind}.yaml");
    let result = match kind {
        FileKind::Agent => AgentConfig::parse(&file, src).map(drop),
        FileKind::Server => ServerConfig::parse(&file, src).map(drop),
        FileKind::Router => RouterConfig::parse(&file, src).map(drop),
        FileKind::Models => unreachable!("catalog cases live in llmgw-catalog"),
    };
    result.map_err(|e| e.to_string())
}

#[test]
fn every_broken_config_names_line_and_field() {
    assert!(parse_as(FileKind::Agent, AGENT_BASE).is_ok());
    assert!(parse_as(FileKind::Server, SERVER_BASE).is_ok());
    let mut failures = Vec::new();
    for (what, kind, src, expected) in BROKEN {
        match parse_as(*kind, src) {
            Ok(()) => failures.push(format!("{what}: accepted, expected `{expected}`")),
            Err(shown) if !shown.contains(expected) => failures.push(format!(
                "{what}:\n  expected: {expected}\n  got:      {shown}"
            )),
            Err(_) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        BROKEN.len(),
        failures.join("\n")
    );
}

#[test]
fn three_independent_mistakes_in_an_agent_file_are_all_reported() {
    let src = "node_id: n1\nservers: [\"a:7443\"]\nmgmt_addr: 10.0.0.1\nheartbeat_interval: soon\nfabrics:\n  - name: ib-a\n    hcas: [mlx5_0]\n    rate_gbps: fast\nsupervisor:\n  wrk_dir: /tmp\n";
    let err = AgentConfig::parse("agent.yaml", src)
        .unwrap_err()
        .to_string();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[0].starts_with("agent.yaml:4:21: heartbeat_interval: invalid duration \"soon\""),
        "{err}"
    );
    assert!(
        lines[1].starts_with("agent.yaml:8:16: fabrics[0].rate_gbps: expected a number"),
        "{err}"
    );
    assert!(
        lines[2].starts_with(
            "agent.yaml:10:3: supervisor.wrk_dir: unknown key `wrk_dir` (did you mean `work_dir`?)"
        ),
        "{err}"
    );
}

#[test]
fn kind_is_detected_from_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.yaml");
    std::fs::write(&path, "surprise: 1\n").unwrap();
    let err = check_file(&path, None).unwrap_err().to_string();
    assert!(
        err.contains("cannot tell which llmgw file this is"),
        "{err}"
    );
    std::fs::write(&path, SERVER_BASE).unwrap();
    assert_eq!(check_file(&path, None).unwrap().kind, FileKind::Server);
}

#[test]
fn relative_paths_resolve_against_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server.yaml");
    std::fs::write(
        &path,
        format!("{SERVER_BASE}data_dir: data\ncatalog: models.yaml\n"),
    )
    .unwrap();
    let config = ServerConfig::load(&path).unwrap();
    assert_eq!(config.data_dir, dir.path().join("data"));
    assert_eq!(config.catalog.unwrap(), dir.path().join("models.yaml"));
}

#[test]
fn agent_node_id_and_mgmt_addr_can_come_from_the_command_line() {
    // One file for every node of a DaemonSet: no node_id, no mgmt_addr.
    let shared = "servers: [\"a:7443\"]\ninsecure: true\n";
    assert!(AgentConfig::parse("agent.yaml", shared).is_err());
    let config = AgentConfig::parse_with(
        "agent.yaml",
        shared,
        &[
            ("node_id", "gpu-7".into()),
            ("mgmt_addr", "10.0.0.7".into()),
        ],
    )
    .unwrap();
    assert_eq!(
        (config.node_id.as_str(), config.mgmt_addr.as_str()),
        ("gpu-7", "10.0.0.7")
    );
    // An override wins over the file and is checked like the file's value.
    let with_file = format!("node_id: from-file\nmgmt_addr: 10.0.0.1\n{shared}");
    let config =
        AgentConfig::parse_with("agent.yaml", &with_file, &[("node_id", "gpu-8".into())]).unwrap();
    assert_eq!(
        (config.node_id.as_str(), config.mgmt_addr.as_str()),
        ("gpu-8", "10.0.0.1")
    );
    let error = AgentConfig::parse_with("agent.yaml", &with_file, &[("node_id", "bad id".into())])
        .unwrap_err()
        .to_string();
    assert!(error.contains("node id \"bad id\" is not valid"), "{error}");
    // The rule registration applies: an id it would refuse fails here.
    let error = AgentConfig::parse_with("agent.yaml", &with_file, &[("node_id", "gpu:1".into())])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("node id \"gpu:1\" is not valid: it has ':'"),
        "{error}"
    );
}
