//! The `ray start|status|stop` command lines, parsed as click parses them.

use std::time::Duration;

use super::{
    DAEMON_MODE, DEFAULT_PORT, cluster_address, daemon_main, local_gpus, query, runtime, temp_dir,
};

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
