//! A stand-in for the `ray` CLI as vLLM's multi-node recipe uses it:
//! `ray start --head`, `ray start --address`, `ray status`, `ray stop`, and
//! the placement a `--distributed-executor-backend ray` head waits for.
//!
//! The head daemon listens on the GCS port. Worker daemons register their
//! GPUs over a connection they keep open, so a node that dies leaves the
//! cluster at once. The CLI parses like Ray's (click): unknown options are
//! `Error: No such option: --x`, exit code 2.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::config::ServeConfig;
use crate::logs::Logger;

/// The hidden argv[1] that runs a Ray node daemon.
pub const DAEMON_MODE: &str = "__llmgw_sim_ray_daemon";

const DEFAULT_PORT: u16 = 6379;

#[derive(Debug, Default, Clone)]
struct StartArgs {
    head: bool,
    address: Option<String>,
    port: u16,
    node_ip: Option<String>,
    num_gpus: Option<u64>,
    temp_dir: Option<String>,
    block: bool,
}

fn click_error(command: &str, message: &str) -> i32 {
    eprintln!(
        "Usage: ray {command} [OPTIONS]\nTry 'ray {command} --help' for help.\n\nError: {message}"
    );
    2
}

fn temp_dir(explicit: Option<&str>) -> PathBuf {
    explicit
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var("RAY_TMPDIR")
                .ok()
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/tmp/ray"))
}

/// Splits click-style `--opt=value` / `--opt value` arguments.
fn parse_start(args: &[String]) -> Result<StartArgs, String> {
    let mut out = StartArgs {
        port: DEFAULT_PORT,
        ..Default::default()
    };
    let mut i = 0;
    while i < args.len() {
        let (key, inline) = match args[i].split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (args[i].clone(), None),
        };
        i += 1;
        let mut value = || -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            let v = args
                .get(i)
                .cloned()
                .ok_or_else(|| format!("Option '{key}' requires an argument."))?;
            i += 1;
            Ok(v)
        };
        match key.as_str() {
            "--head" => out.head = true,
            "--block" => out.block = true,
            "--disable-usage-stats" => {}
            "--address" => out.address = Some(value()?.trim_matches('\'').to_string()),
            "--port" => {
                out.port = value()?
                    .parse()
                    .map_err(|_| "Invalid value for '--port': not a valid integer.".to_string())?
            }
            "--node-ip-address" => out.node_ip = Some(value()?),
            "--num-gpus" => {
                out.num_gpus = Some(value()?.parse().map_err(|_| {
                    "Invalid value for '--num-gpus': not a valid integer.".to_string()
                })?)
            }
            "--temp-dir" => out.temp_dir = Some(value()?),
            "--num-cpus"
            | "--dashboard-host"
            | "--dashboard-port"
            | "--include-dashboard"
            | "--resources"
            | "--object-store-memory"
            | "--node-manager-port"
            | "--object-manager-port"
            | "--min-worker-port"
            | "--max-worker-port" => {
                value()?;
            }
            other => return Err(format!("No such option: {other}")),
        }
    }
    if !out.head && out.address.is_none() {
        return Err("Missing option '--address' (or pass '--head').".into());
    }
    Ok(out)
}

fn local_gpus() -> u64 {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => v.split(',').filter(|s| !s.trim().is_empty()).count() as u64,
        Err(_) => std::env::var("LLMGW_SIM_GPUS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(crate::knobs::DEFAULT_NODE_GPUS),
    }
}

/// `ray start|status|stop ...`; returns the exit code.
pub fn cli(args: &[String]) -> i32 {
    let Some(command) = args.first() else {
        eprintln!(
            "Usage: ray [OPTIONS] COMMAND [ARGS]...\nTry 'ray --help' for help.\n\nError: Missing command."
        );
        return 2;
    };
    let rest = &args[1..];
    match command.as_str() {
        "start" => match parse_start(rest) {
            Ok(start) => start_cmd(start),
            Err(message) => click_error("start", &message),
        },
        "status" => status_cmd(rest),
        "stop" => stop_cmd(rest),
        other => {
            eprintln!(
                "Usage: ray [OPTIONS] COMMAND [ARGS]...\nTry 'ray --help' for help.\n\nError: No such command '{other}'."
            );
            2
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn start_cmd(start: StartArgs) -> i32 {
    let ip = start.node_ip.clone().unwrap_or_else(|| "127.0.0.1".into());
    let dir = temp_dir(start.temp_dir.as_deref());
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "PermissionError: cannot create Ray temp dir {}: {e}",
            dir.display()
        );
        return 1;
    }
    let gpus = start.num_gpus.unwrap_or_else(local_gpus);
    let mut daemon_args = vec![
        DAEMON_MODE.to_string(),
        if start.head {
            "head".into()
        } else {
            "worker".into()
        },
        ip.clone(),
        start.port.to_string(),
        start.address.clone().unwrap_or_default(),
        gpus.to_string(),
        dir.display().to_string(),
    ];
    println!("Usage stats collection is disabled.\n\nLocal node IP: {ip}\n");
    if start.block {
        // Foreground: this process is the node.
        daemon_args.remove(0);
        announce(&start, &ip);
        return daemon_main(&daemon_args);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("RuntimeError: cannot find the ray executable: {e}");
            return 1;
        }
    };
    let spawned = std::process::Command::new(exe)
        .args(&daemon_args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("RuntimeError: failed to start the raylet: {e}");
            return 1;
        }
    };
    // Wait until the node is registered (head listening, or worker joined).
    let probe = if start.head {
        format!("127.0.0.1:{}", start.port)
    } else {
        start.address.clone().unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            if start.head {
                eprintln!(
                    "ValueError: Failed to bind to {ip}:{} because it's already occupied.",
                    start.port
                );
            } else {
                eprintln!(
                    "ConnectionError: Failed to connect to GCS at address {probe} within 5 seconds."
                );
            }
            return 1;
        }
        if std::net::TcpStream::connect(&probe).is_ok()
            && (start.head || registered(&dir, child.id()))
        {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "ConnectionError: Failed to connect to GCS at address {probe} within 5 seconds."
            );
            return 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    announce(&start, &ip);
    0
}

fn registered(dir: &std::path::Path, pid: u32) -> bool {
    std::fs::read_to_string(dir.join("llmgw-sim-ray-pids"))
        .is_ok_and(|s| s.lines().any(|l| l.trim() == pid.to_string()))
}

fn announce(start: &StartArgs, ip: &str) {
    println!("--------------------\nRay runtime started.\n--------------------\n");
    if start.head {
        println!(
            "Next steps\n  To add another node to this Ray cluster, run\n    ray start --address='{ip}:{}'\n\n  To connect to this Ray cluster:\n    import ray\n    ray.init()\n\n  To terminate the Ray runtime, run\n    ray stop\n\n  To view the status of the cluster, use\n    ray status",
            start.port
        );
    } else {
        println!("To terminate the Ray runtime, run\n  ray stop");
    }
}

/// The node daemon: `head|worker IP PORT HEAD_ADDR GPUS TEMP_DIR`.
pub fn daemon_main(args: &[String]) -> i32 {
    let [role, ip, port, head_addr, gpus, dir] = args else {
        eprintln!("ray daemon: bad arguments {args:?}");
        return 2;
    };
    let gpus: u64 = gpus.parse().unwrap_or(0);
    let dir = PathBuf::from(dir);
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ray daemon: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        if role == "head" {
            let listener =
                match TcpListener::bind(("0.0.0.0", port.parse::<u16>().unwrap_or(DEFAULT_PORT)))
                    .await
                {
                    Ok(l) => l,
                    Err(_) => return 1,
                };
            let _ = std::fs::write(dir.join("ray_current_cluster"), format!("{ip}:{port}\n"));
            record_pid(&dir);
            head_daemon(listener, ip.clone(), gpus).await;
            0
        } else {
            let Ok(mut stream) = TcpStream::connect(head_addr.as_str()).await else {
                return 1;
            };
            if stream
                .write_all(format!("NODE {ip} {gpus}\n").as_bytes())
                .await
                .is_err()
            {
                return 1;
            }
            record_pid(&dir);
            // Stay registered until the head goes away.
            let mut buf = [0u8; 64];
            loop {
                match tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                    Ok(0) | Err(_) => return 1,
                    Ok(_) => {}
                }
            }
        }
    })
}

fn record_pid(dir: &std::path::Path) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("llmgw-sim-ray-pids"))
    {
        let _ = writeln!(f, "{}", std::process::id());
    }
}

type NodeTable = Arc<Mutex<HashMap<u64, (String, u64)>>>;

async fn head_daemon(listener: TcpListener, ip: String, gpus: u64) {
    let nodes: NodeTable = Arc::new(Mutex::new(HashMap::new()));
    if let Ok(mut table) = nodes.lock() {
        table.insert(0, (ip, gpus));
    }
    let mut next_id = 1u64;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let nodes = nodes.clone();
        let id = next_id;
        next_id += 1;
        tokio::spawn(async move {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["NODE", ip, gpus] => {
                    if let Ok(mut table) = nodes.lock() {
                        table.insert(id, (ip.to_string(), gpus.parse().unwrap_or(0)));
                    }
                    let mut sink = String::new();
                    while reader.read_line(&mut sink).await.unwrap_or(0) > 0 {
                        sink.clear();
                    }
                    if let Ok(mut table) = nodes.lock() {
                        table.remove(&id);
                    }
                }
                ["STATUS"] => {
                    let listing: Vec<String> = match nodes.lock() {
                        Ok(table) => {
                            let mut rows: Vec<_> = table.iter().collect();
                            rows.sort_by_key(|(id, _)| **id);
                            rows.into_iter()
                                .map(|(id, (ip, g))| format!("{id} {ip} {g}"))
                                .collect()
                        }
                        Err(_) => Vec::new(),
                    };
                    let _ = reader
                        .get_mut()
                        .write_all(format!("{}\nEND\n", listing.join("\n")).as_bytes())
                        .await;
                }
                _ => {}
            }
        });
    }
}

/// Nodes of the cluster at `addr`: (node id, ip, gpus).
async fn query(addr: &str) -> Option<Vec<(u64, String, u64)>> {
    let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let mut reader = BufReader::new(stream);
    reader.get_mut().write_all(b"STATUS\n").await.ok()?;
    let mut nodes = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim();
        if line == "END" {
            return Some(nodes);
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if let [id, ip, gpus] = parts.as_slice() {
            nodes.push((id.parse().ok()?, ip.to_string(), gpus.parse().ok()?));
        }
    }
}

fn cluster_address(explicit: Option<&str>, dir: Option<&str>) -> Option<String> {
    explicit
        .map(str::to_string)
        .or_else(|| {
            std::env::var("RAY_ADDRESS")
                .ok()
                .filter(|s| !s.is_empty() && s != "auto")
        })
        .map(|a| a.trim_start_matches("ray://").to_string())
        .or_else(|| {
            std::fs::read_to_string(temp_dir(dir).join("ray_current_cluster"))
                .ok()
                .map(|s| s.trim().to_string())
        })
}

fn status_cmd(args: &[String]) -> i32 {
    let mut address = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].split_once('=') {
            Some(("--address", v)) => address = Some(v.to_string()),
            None if args[i] == "--address" => {
                i += 1;
                address = args.get(i).cloned();
            }
            _ => return click_error("status", &format!("No such option: {}", args[i])),
        }
        i += 1;
    }
    let not_found = || {
        eprintln!(
            "ConnectionError: Could not find any running Ray instance. Please specify the one to connect to by setting `--address` flag or `RAY_ADDRESS` environment variable."
        );
        1
    };
    let Some(addr) = cluster_address(address.as_deref(), None) else {
        return not_found();
    };
    let Ok(rt) = runtime() else { return 1 };
    let Some(nodes) = rt.block_on(query(&addr)) else {
        return not_found();
    };
    let (y, mo, d, h, mi, s) = crate::logs::utc_parts(std::time::SystemTime::now());
    let gpus = nodes.iter().map(|n| n.2).sum::<u64>() as f64;
    println!(
        "======== Autoscaler status: {y}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.000000 ========"
    );
    println!(
        "Node status\n---------------------------------------------------------------\nActive:"
    );
    for (id, ip, _) in &nodes {
        println!(" 1 node_{id:056x} ({ip})");
    }
    println!("Pending:\n (no pending nodes)\nRecent failures:\n (no failures)\n");
    println!("Resources\n---------------------------------------------------------------\nUsage:");
    println!(
        " 0.0/{:.1} CPU\n 0.0/{gpus:.1} GPU\n 0B/1.00TiB memory\n 0B/186.26GiB object_store_memory\n",
        nodes.len() as f64 * 32.0
    );
    println!("Demands:\n (no resource demands)");
    0
}

fn stop_cmd(args: &[String]) -> i32 {
    if let Some(bad) = args
        .iter()
        .find(|a| !matches!(a.as_str(), "--force" | "-f" | "-v" | "--verbose"))
    {
        return click_error("stop", &format!("No such option: {bad}"));
    }
    let dir = temp_dir(None);
    let pids = std::fs::read_to_string(dir.join("llmgw-sim-ray-pids")).unwrap_or_default();
    let mut stopped = 0;
    for pid in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        if crate::sys::terminate(pid) {
            stopped += 1;
        }
    }
    let _ = std::fs::remove_file(dir.join("llmgw-sim-ray-pids"));
    let _ = std::fs::remove_file(dir.join("ray_current_cluster"));
    println!("Stopped all {stopped} Ray processes.");
    0
}

/// A vLLM head with the Ray backend: waits until the cluster holds enough
/// GPUs for TP x PP, warning every 10 s as vLLM's placement does.
pub async fn wait_for_placement(cfg: &ServeConfig, log: &Logger) {
    let world = cfg.world_size();
    let addr = cluster_address(None, None);
    let mut waited = 0u64;
    loop {
        let available = match &addr {
            Some(addr) => query(addr)
                .await
                .map(|nodes| nodes.iter().map(|n| n.2).sum::<u64>()),
            None => None,
        }
        // No cluster: ray.init() starts a local one with this node's GPUs.
        .unwrap_or(cfg.visible_gpus);
        if available >= world {
            log.api(
                "INFO",
                "ray_utils.py:345",
                &format!("Using the existing placement group with {world} bundles, {available} GPUs in the cluster."),
            );
            return;
        }
        if waited.is_multiple_of(10) {
            let specs: Vec<String> = (0..world).map(|_| "{'GPU': 1.0}".to_string()).collect();
            log.api(
                "WARNING",
                "ray_utils.py:270",
                &format!(
                    "Waiting for creating a placement group of specs for {waited} seconds. specs=[{}]. Check `ray status` and `ray list nodes` to see if you have enough resources, and make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are running on a multi-node.",
                    specs.join(", ")
                ),
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        waited += 1;
    }
}

/// After placement: reports a lost node when the cluster's GPUs fall below
/// what the replica uses.
pub fn watch_cluster(cfg: &ServeConfig) -> Option<crate::rendezvous::Membership> {
    let addr = cluster_address(None, None)?;
    let world = cfg.world_size();
    let (tx, rx) = tokio::sync::watch::channel(None);
    let keep = tx.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let gpus = query(&addr)
                .await
                .map(|n| n.iter().map(|n| n.2).sum::<u64>())
                .unwrap_or(0);
            if gpus < world {
                let _ = tx.send(Some(format!("a Ray node of {addr}")));
                return;
            }
        }
    });
    Some(crate::rendezvous::Membership::from_channel(rx, keep))
}
