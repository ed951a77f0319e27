//! Starting the local cluster, waiting for it, and stopping it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use llmgw_procfs::{alive, signal_group, signal_pid, to_pid};
use tokio::process::{Child, Command};

use crate::access::AdminAccess;
use crate::args::DevArgs;
use crate::demo::demo_catalog;
use crate::layout::{DevFile, DevProcess, PeerLayout, plan_peers, server_yaml, server_yaml_tls};
use crate::nodes::{
    A100_ROCE_B, AgentLayout, H100_IB_A, L40S_PCIE, NodeKind, SimEngines, agent_yaml,
    agent_yaml_tls,
};
use crate::progress::{Progress, wait_serving};

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("{0}")]
    Usage(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{role} {id} exited during start-up ({status}); see its log {log}")]
    Exited {
        role: String,
        id: String,
        status: String,
        log: PathBuf,
    },
    #[error("cannot make the development certificates: {0}")]
    Certs(#[from] llmgw_tls::TlsError),
    #[error("{what} within {timeout:?}: {detail}; logs are in {work_dir}")]
    NotReady {
        what: &'static str,
        timeout: Duration,
        detail: String,
        work_dir: PathBuf,
    },
}

pub(crate) fn io(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> DevError + use<> {
    let path = path.to_owned();
    move |source| DevError::Io { what, path, source }
}

/// One process `llmgw dev` started.
pub(crate) struct Running {
    pub(crate) process: DevProcess,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    /// An agent's work directory: its engines' state files live there.
    pub(crate) agent_work_dir: Option<PathBuf>,
    /// Its exit was already shown.
    pub(crate) exit_reported: bool,
}

/// A work directory may hold an earlier `llmgw dev`: refuse while it still
/// runs; otherwise start over from its configs' directory, removing only
/// what `dev` itself created (peer data, agent work directories).
fn clear_earlier_run(work_dir: &Path) -> Result<(), DevError> {
    let dev_json = work_dir.join("dev.json");
    if let Ok(bytes) = std::fs::read(&dev_json)
        && let Ok(dev) = serde_json::from_slice::<DevFile>(&bytes)
        && let Some(live) = dev.processes.iter().find(|p| alive(to_pid(p.pid)))
    {
        return Err(DevError::Usage(format!(
            "another `llmgw dev` still runs from {} ({} {} is pid {}); stop it with Ctrl-C, \
             or pass --work-dir NEW_DIR",
            work_dir.display(),
            live.role,
            live.id,
            live.pid
        )));
    }
    let Ok(entries) = std::fs::read_dir(work_dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("server-") || name.starts_with("agent-");
        if ours && entry.path().is_dir() {
            std::fs::remove_dir_all(entry.path()).map_err(io("cannot clear", &entry.path()))?;
        }
    }
    Ok(())
}

/// The simulated nodes for `--nodes N`.
fn node_plan(work_dir: &Path, count: u32) -> Vec<AgentLayout> {
    const KINDS: [NodeKind; 4] = [H100_IB_A, H100_IB_A, L40S_PCIE, A100_ROCE_B];
    let mut seen = std::collections::BTreeMap::<&str, u32>::new();
    (0..count as usize)
        .map(|i| {
            let kind = KINDS[i % KINDS.len()];
            let n = seen.entry(kind.name).or_default();
            *n += 1;
            let rack = format!("r{}", i / 2 + 1);
            AgentLayout::new(work_dir, &format!("{}-{n}", kind.name), kind, &rack)
        })
        .collect()
}

/// Runs the local cluster until SIGINT or SIGTERM, then stops every process
/// it started, engines included.
pub async fn run_dev(args: DevArgs) -> Result<(), DevError> {
    if args.peers == 0 {
        return Err(DevError::Usage("--peers must be at least 1".to_owned()));
    }
    let work_dir = &args.work_dir;
    std::fs::create_dir_all(work_dir).map_err(io("cannot create the work directory", work_dir))?;
    let work_dir = work_dir
        .canonicalize()
        .map_err(io("cannot resolve the work directory", work_dir))?;
    clear_earlier_run(&work_dir)?;
    let exe = std::env::current_exe().map_err(io(
        "cannot find the llmgw binary",
        Path::new("/proc/self/exe"),
    ))?;
    let sim = exe.with_file_name("llmgw-engine-sim");
    if args.nodes > 0 && !sim.exists() {
        return Err(DevError::Usage(format!(
            "{} is missing: simulated nodes run it as their engine; build it with \
             `cargo build -p llmgw-engine-sim` (scripts/llmgw builds everything)",
            sim.display()
        )));
    }
    let router_addr = format!("127.0.0.1:{}", args.port);
    if let Err(e) = std::net::TcpListener::bind(&router_addr) {
        return Err(DevError::Usage(format!(
            "cannot use {router_addr} for the router ({e}); pass --port with a free port"
        )));
    }
    let layouts = plan_peers(&work_dir, args.peers, !args.insecure)
        .map_err(io("cannot find free ports on", Path::new("127.0.0.1")))?;
    let ca = if args.insecure {
        None
    } else {
        Some(crate::certs::ensure_ca(&work_dir)?)
    };
    let access = AdminAccess::create(&work_dir, ca)
        .map_err(io("cannot write the admin tokens in", &work_dir))?;

    let mut extra =
        String::from("liveness:\n  node_ttl: 5s\n  lost_after: 30s\n  leader_grace: 5s\n");
    extra.push_str(&access.server_yaml());
    if !args.no_demo {
        let catalog = work_dir.join("models.yaml");
        std::fs::write(&catalog, demo_catalog(args.nodes)).map_err(io("cannot write", &catalog))?;
        extra.push_str(&format!("catalog: {}\n", catalog.display()));
    }
    let mut running = Vec::new();
    let plan = StartPlan {
        args: &args,
        exe: &exe,
        sim: &sim,
        work_dir: &work_dir,
        layouts: &layouts,
        extra: &extra,
        access: &access,
    };
    let started = start_all(plan, &mut running).await;
    if let Err(error) = started {
        stop_all(&mut running).await;
        return Err(error);
    }
    print!("{}", render(&running, &work_dir, &router_addr, &access));
    let apis: Vec<String> = layouts.iter().map(PeerLayout::admin_url).collect();
    print!("{}", crate::progress::fleet_tables(&apis, &access).await);
    if args.insecure {
        println!("gRPC and the admin API: plaintext (--insecure)");
    } else {
        println!(
            "gRPC: mTLS on every link; admin API: HTTPS; CA and certificates in {}",
            crate::certs::tls_dir(&work_dir).display()
        );
    }
    println!("Press Ctrl-C to stop everything.");

    tokio::select! {
        _ = stop_signal() => {}
        _ = report_exits(&mut running) => {}
    }
    println!("stopping {} processes and their engines", running.len());
    stop_all(&mut running).await;
    Ok(())
}

/// What starting the processes needs.
#[derive(Clone, Copy)]
struct StartPlan<'a> {
    args: &'a DevArgs,
    exe: &'a Path,
    sim: &'a Path,
    work_dir: &'a Path,
    layouts: &'a [PeerLayout],
    extra: &'a str,
    access: &'a AdminAccess,
}

/// Starts the peers, then (once they have a leader) the agents and the
/// router, and waits until the demo serves.
async fn start_all(plan: StartPlan<'_>, running: &mut Vec<Running>) -> Result<(), DevError> {
    let StartPlan {
        args,
        work_dir,
        layouts,
        access,
        ..
    } = plan;
    let timeout = Duration::from_secs(args.ready_timeout_s);
    let apis: Vec<String> = layouts.iter().map(PeerLayout::admin_url).collect();
    start_servers(plan, running)?;
    let mut progress = Progress::new(apis.clone(), access);
    write_dev_json(running, work_dir, &apis, access, None)?;
    progress.wait_leader(running, timeout, work_dir).await?;

    start_agents(plan, running)?;
    let router_url = start_router(plan, &apis, running)?;
    write_dev_json(running, work_dir, &apis, access, Some(router_url.clone()))?;

    progress
        .wait_nodes(running, args.nodes as usize, timeout, work_dir)
        .await?;
    if args.no_demo {
        return Ok(());
    }
    if args.nodes == 0 {
        println!(
            "  no simulated nodes (--nodes 0): the demo models wait for agents to join; \
             `llmgw ctl explain qwen-0.5b` says why"
        );
        return Ok(());
    }
    wait_serving(&mut progress, running, &router_url, timeout, work_dir).await
}

/// Writes every peer's server.yaml and starts the peers.
fn start_servers(plan: StartPlan<'_>, running: &mut Vec<Running>) -> Result<(), DevError> {
    let StartPlan {
        args,
        exe,
        work_dir,
        layouts,
        extra,
        ..
    } = plan;
    for layout in layouts {
        let yaml = if args.insecure {
            server_yaml(layout, layouts, extra)
        } else {
            let tls = crate::certs::peer_tls(work_dir, layout.id)?;
            server_yaml_tls(layout, layouts, &tls, extra)
        };
        std::fs::write(&layout.config, yaml).map_err(io("cannot write", &layout.config))?;
        std::fs::create_dir_all(&layout.data_dir).map_err(io("cannot create", &layout.data_dir))?;
        let mut process = DevProcess {
            role: "server".to_owned(),
            id: layout.id.into(),
            pid: 0,
            argv: argv(exe, "server", &layout.config),
            api: Some(layout.admin_url()),
            grpc: Some(layout.grpc.to_string()),
            router: None,
            log: None,
        };
        running.push(spawn(&mut process, &layout.log, None)?);
    }
    Ok(())
}

/// Writes the simulated nodes' agent.yaml, each dialing a different peer
/// first, and starts their agents.
fn start_agents(plan: StartPlan<'_>, running: &mut Vec<Running>) -> Result<(), DevError> {
    let StartPlan {
        args,
        exe,
        sim,
        work_dir,
        layouts,
        ..
    } = plan;
    let servers: Vec<String> = layouts.iter().map(|l| l.grpc.to_string()).collect();
    let engines = SimEngines {
        bin: sim.to_owned(),
        env: vec![
            ("LLMGW_SIM_LOAD_TIME".into(), "3s".into()),
            ("LLMGW_SIM_TTFT".into(), "30ms".into()),
            ("LLMGW_SIM_ITL".into(), "15ms".into()),
        ],
    };
    let fixtures = fixtures_dir(exe);
    let nodes = node_plan(work_dir, args.nodes);
    for (i, agent) in nodes.iter().enumerate() {
        let mut order = servers.clone();
        let len = order.len();
        order.rotate_left(i % len);
        let yaml = if args.insecure {
            agent_yaml(agent, &order, &fixtures, &engines, "")
        } else {
            let tls = crate::certs::node_tls(work_dir, &agent.node_id)?;
            agent_yaml_tls(agent, &order, &fixtures, &engines, &tls, "")
        };
        std::fs::write(&agent.config, yaml).map_err(io("cannot write", &agent.config))?;
        let mut process = DevProcess {
            role: "agent".to_owned(),
            id: agent.node_id.clone().into(),
            pid: 0,
            argv: argv(exe, "agent", &agent.config),
            api: None,
            grpc: None,
            router: None,
            log: None,
        };
        running.push(spawn(
            &mut process,
            &agent.log,
            Some(agent.work_dir.clone()),
        )?);
    }
    Ok(())
}

/// Writes router.yaml for a standalone router that follows the control
/// plane at `apis`, and starts it; answers its base URL.
fn start_router(
    plan: StartPlan<'_>,
    apis: &[String],
    running: &mut Vec<Running>,
) -> Result<String, DevError> {
    let StartPlan {
        args,
        exe,
        work_dir,
        access,
        ..
    } = plan;
    let router_yaml = work_dir.join("router.yaml");
    let router_url = format!("http://127.0.0.1:{}", args.port);
    let text = format!(
        "# Written by `llmgw dev`: a standalone router that follows the control plane.\n\
         listen: 127.0.0.1:{}\ncontrol_plane: [{}]\n\
         # Route by what each engine holds in its KV cache (the engines publish\n\
         # their KV events; see docs/router.md).\n\
         balancing:\n  policy: cache_aware\n{}",
        args.port,
        apis.iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", "),
        access.router_yaml()
    );
    std::fs::write(&router_yaml, text).map_err(io("cannot write", &router_yaml))?;
    let mut process = DevProcess {
        role: "router".to_owned(),
        id: "router".into(),
        pid: 0,
        argv: argv(exe, "router", &router_yaml),
        api: None,
        grpc: None,
        router: Some(router_url.clone()),
        log: None,
    };
    running.push(spawn(&mut process, &work_dir.join("router.log"), None)?);
    Ok(router_url)
}

/// `deploy/fixtures/nodes` of the source tree this binary was built from,
/// or next to an installed binary.
fn fixtures_dir(exe: &Path) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/nodes");
    if built.is_dir() {
        return built;
    }
    exe.parent().map_or_else(
        || PathBuf::from("fixtures"),
        |dir| dir.join("fixtures/nodes"),
    )
}

fn argv(exe: &Path, command: &str, config: &Path) -> Vec<String> {
    vec![
        exe.display().to_string(),
        command.to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
    ]
}

fn spawn(
    process: &mut DevProcess,
    log_path: &Path,
    agent_work_dir: Option<PathBuf>,
) -> Result<Running, DevError> {
    let log = std::fs::File::create(log_path).map_err(io("cannot create", log_path))?;
    let log_err = log.try_clone().map_err(io("cannot open", log_path))?;
    let child = Command::new(&process.argv[0])
        .args(&process.argv[1..])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .kill_on_drop(true)
        .spawn()
        .map_err(io("cannot start", Path::new(&process.argv[0])))?;
    process.pid = child.id().unwrap_or(0);
    process.log = Some(log_path.display().to_string());
    Ok(Running {
        process: process.clone(),
        child,
        log: log_path.to_owned(),
        agent_work_dir,
        exit_reported: false,
    })
}

fn write_dev_json(
    running: &[Running],
    work_dir: &Path,
    apis: &[String],
    access: &AdminAccess,
    router: Option<String>,
) -> Result<(), DevError> {
    let text = |path: &Path| Some(path.display().to_string());
    let dev = DevFile {
        processes: running.iter().map(|r| r.process.clone()).collect(),
        router,
        api: apis.to_vec(),
        ca: access.ca.as_deref().and_then(text),
        read_token_file: text(&access.read_token_file),
        write_token_file: text(&access.write_token_file),
    };
    let path = work_dir.join("dev.json");
    serde_json::to_vec_pretty(&dev)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&path, bytes))
        .map_err(io("cannot write", &path))
}

/// Whether a peer's exit is a fault the cluster rides out, or a failed
/// start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// No leader yet: every process is needed to get one.
    Forming,
    /// A leader was elected: a peer dying is what the cluster is for (the
    /// README invites a `kill -9` of the leader), so it is shown and
    /// start-up goes on while a majority of peers runs.
    Formed,
}

/// Fails when a child exited and start-up cannot go on without it; shows
/// a peer's exit once the control plane has formed.
pub(crate) fn check_children(running: &mut [Running], phase: Phase) -> Result<(), DevError> {
    let servers = running
        .iter()
        .filter(|r| r.process.role == "server")
        .count();
    let mut servers_down = 0;
    for r in running.iter_mut() {
        let Ok(Some(status)) = r.child.try_wait() else {
            continue;
        };
        let is_server = r.process.role == "server";
        if is_server {
            servers_down += 1;
        }
        if phase == Phase::Formed && is_server && 2 * servers_down < servers {
            if !r.exit_reported {
                r.exit_reported = true;
                println!(
                    "  server {} exited ({status}); the other peers carry on (its command line is in dev.json)",
                    r.process.id
                );
            }
            continue;
        }
        return Err(DevError::Exited {
            role: r.process.role.clone(),
            id: r.process.id.to_string(),
            status: status.to_string(),
            log: r.log.clone(),
        });
    }
    Ok(())
}

/// Says when a process exits on its own (a killed peer, say) and keeps
/// the rest running: that is what the cluster is for. Never resolves.
async fn report_exits(running: &mut [Running]) {
    loop {
        for r in running.iter_mut() {
            if !r.exit_reported
                && let Ok(Some(status)) = r.child.try_wait()
            {
                r.exit_reported = true;
                println!(
                    "{} {} exited ({status}); the rest keeps running. Its command line is in dev.json",
                    r.process.role, r.process.id
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn render(running: &[Running], work_dir: &Path, router_addr: &str, access: &AdminAccess) -> String {
    let mut out = format!(
        "\n{:<8} {:<10} {:<8} {:<28} {}\n",
        "ROLE", "ID", "PID", "API", "GRPC / ROUTER"
    );
    for r in running {
        let p = &r.process;
        let id = match &p.id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out.push_str(&format!(
            "{:<8} {:<10} {:<8} {:<28} {}\n",
            p.role,
            id,
            p.pid,
            p.api.as_deref().unwrap_or("-"),
            p.grpc.as_deref().or(p.router.as_deref()).unwrap_or("-"),
        ));
    }
    let apis: Vec<String> = running
        .iter()
        .filter_map(|r| r.process.api.clone())
        .collect();
    out.push_str(&format!(
        "\nOpenAI base URL: http://{router_addr}/v1\n\
         try:\n  curl -N http://{router_addr}/v1/chat/completions -H 'content-type: application/json' \\\n\
         \x20   -d '{{\"model\": \"qwen-0.5b\", \"stream\": true, \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'\n\
         console: {console}/ui/ (enter the read or write token)\n\
         admin API (llmgw ctl reads these variables):\n\
         {env}         \x20 llmgw ctl nodes; llmgw ctl replicas; llmgw ctl explain llama-70b\n\
         configs, logs and dev.json: {dir}\n",
        env = access.ctl_env(&apis),
        console = apis.first().map_or("-", String::as_str),
        dir = work_dir.display(),
    ));
    out
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Engine process groups an agent recorded in its state files
/// (`work_dir/shards/*.json`). Engines outlive their agent by design, so
/// `dev` (and tests) stop them through these.
pub fn engine_groups(agent_work_dir: &Path) -> Vec<i32> {
    llmgw_agent::read_state_files(agent_work_dir)
        .into_iter()
        .filter_map(|(_, record)| record.ok())
        .flat_map(|record| record.processes.into_iter().map(|p| p.pgid))
        .filter(|pgid| *pgid > 1)
        .collect()
}

/// Router and agents first, then the engines they leave behind, then the
/// peers: SIGTERM, and SIGKILL to whatever still runs after a grace period.
async fn stop_all(running: &mut [Running]) {
    let mut engines = Vec::new();
    for order in [["router", "agent"], ["server", "server"]] {
        for r in running
            .iter()
            .filter(|r| order.contains(&r.process.role.as_str()))
        {
            if let Some(pid) = r.child.id() {
                signal_pid(to_pid(pid), libc::SIGTERM);
            }
        }
        let grace = Instant::now() + Duration::from_secs(10);
        for r in running
            .iter_mut()
            .filter(|r| order.contains(&r.process.role.as_str()))
        {
            let remaining = grace.saturating_duration_since(Instant::now());
            if tokio::time::timeout(remaining, r.child.wait())
                .await
                .is_err()
            {
                let _ = r.child.kill().await;
            }
            if let Some(dir) = &r.agent_work_dir {
                engines.extend(engine_groups(dir));
            }
        }
        if order[0] == "router" {
            for &pgid in &engines {
                signal_group(pgid, libc::SIGTERM);
            }
            let grace = Instant::now() + Duration::from_secs(10);
            while Instant::now() < grace && engines.iter().any(|&pgid| alive(pgid)) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for &pgid in &engines {
                signal_group(pgid, libc::SIGKILL);
            }
        }
    }
}
