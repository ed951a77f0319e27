//! Starting the local cluster, waiting for it, and stopping it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::args::DevArgs;
use crate::layout::{DevFile, DevProcess, PeerLayout, plan_peers, server_yaml, server_yaml_tls};

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
    #[error("peer {id} exited during start-up ({status}); see its log {log}")]
    PeerExited {
        id: u64,
        status: String,
        log: PathBuf,
    },
    #[error("cannot make the development certificates: {0}")]
    Certs(#[from] llmgw_tls::TlsError),
    #[error("no leader was elected within {0:?}; see the server-*.log files in the work directory")]
    NotReady(Duration),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DevError + use<> {
    let path = path.to_owned();
    move |source| DevError::Io { what, path, source }
}

struct Running {
    layout: PeerLayout,
    child: Child,
    argv: Vec<String>,
}

/// Runs the local cluster until SIGINT or SIGTERM, then stops every process
/// it started.
pub async fn run_dev(args: DevArgs) -> Result<(), DevError> {
    if args.nodes > 0 {
        return Err(DevError::Usage(format!(
            "--nodes {}: simulated GPU nodes need the leader's agent service, which this \
             build does not include yet; run `llmgw dev --nodes 0` for the control plane alone",
            args.nodes
        )));
    }
    if args.peers == 0 {
        return Err(DevError::Usage("--peers must be at least 1".to_owned()));
    }
    let work_dir = &args.work_dir;
    std::fs::create_dir_all(work_dir).map_err(io("cannot create the work directory", work_dir))?;
    let work_dir = work_dir
        .canonicalize()
        .map_err(io("cannot resolve the work directory", work_dir))?;
    let exe = std::env::current_exe().map_err(io(
        "cannot find the llmgw binary",
        Path::new("/proc/self/exe"),
    ))?;
    let layouts = plan_peers(&work_dir, args.peers)
        .map_err(io("cannot find free ports on", Path::new("127.0.0.1")))?;

    let mut running = Vec::new();
    for layout in &layouts {
        let yaml = if args.insecure {
            server_yaml(layout, &layouts, "")
        } else {
            let tls = crate::certs::peer_tls(&work_dir, layout.id)?;
            server_yaml_tls(layout, &layouts, &tls, "")
        };
        std::fs::write(&layout.config, yaml).map_err(io("cannot write", &layout.config))?;
        match spawn_server(&exe, layout) {
            Ok(peer) => running.push(peer),
            Err(error) => {
                stop_all(&mut running).await;
                return Err(error);
            }
        }
    }
    let dev = dev_file(&running);
    let dev_json = work_dir.join("dev.json");
    let written = serde_json::to_vec_pretty(&dev)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&dev_json, bytes));
    if let Err(source) = written {
        stop_all(&mut running).await;
        return Err(DevError::Io {
            what: "cannot write",
            path: dev_json,
            source,
        });
    }

    let ready = tokio::select! {
        ready = wait_ready(&mut running, Duration::from_secs(args.ready_timeout_s)) => ready,
        _ = stop_signal() => Ok(()),
    };
    if let Err(error) = ready {
        stop_all(&mut running).await;
        return Err(error);
    }
    print!("{}", render(&dev, &dev_json));
    if args.insecure {
        println!("gRPC: plaintext (--insecure)");
    } else {
        println!(
            "gRPC: mTLS; CA and certificates in {} (node certificates: llmgw certs issue --dir {} --node ID)",
            crate::certs::tls_dir(&work_dir).display(),
            crate::certs::tls_dir(&work_dir).display()
        );
    }
    println!("Press Ctrl-C to stop everything.");

    stop_signal().await;
    println!("stopping {} processes", running.len());
    stop_all(&mut running).await;
    Ok(())
}

fn spawn_server(exe: &Path, layout: &PeerLayout) -> Result<Running, DevError> {
    std::fs::create_dir_all(&layout.data_dir).map_err(io("cannot create", &layout.data_dir))?;
    let log = std::fs::File::create(&layout.log).map_err(io("cannot create", &layout.log))?;
    let log_err = log.try_clone().map_err(io("cannot open", &layout.log))?;
    let argv = vec![
        exe.display().to_string(),
        "server".to_owned(),
        "--config".to_owned(),
        layout.config.display().to_string(),
    ];
    let child = Command::new(exe)
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .kill_on_drop(true)
        .spawn()
        .map_err(io("cannot start", exe))?;
    Ok(Running {
        layout: layout.clone(),
        child,
        argv,
    })
}

fn dev_file(running: &[Running]) -> DevFile {
    DevFile {
        processes: running
            .iter()
            .map(|peer| DevProcess {
                role: "server".to_owned(),
                id: peer.layout.id,
                pid: peer.child.id().unwrap_or(0),
                argv: peer.argv.clone(),
                api: Some(peer.layout.admin_url()),
                grpc: Some(peer.layout.grpc.to_string()),
            })
            .collect(),
        router: None,
        api: running.iter().map(|peer| peer.layout.admin_url()).collect(),
    }
}

fn render(dev: &DevFile, dev_json: &Path) -> String {
    let mut out = format!(
        "{:<8} {:<4} {:<8} {:<28} {}\n",
        "ROLE", "ID", "PID", "API", "GRPC"
    );
    for process in &dev.processes {
        out.push_str(&format!(
            "{:<8} {:<4} {:<8} {:<28} {}\n",
            process.role,
            process.id,
            process.pid,
            process.api.as_deref().unwrap_or("-"),
            process.grpc.as_deref().unwrap_or("-"),
        ));
    }
    out.push_str(&format!(
        "router: none (this build runs the control plane only)\nwritten: {}\ntry: llmgw ctl --api {} cluster\n",
        dev_json.display(),
        dev.api.join(",")
    ));
    out
}

/// Waits until every peer reports a leader on /readyz.
async fn wait_ready(running: &mut [Running], timeout: Duration) -> Result<(), DevError> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| DevError::Usage(format!("cannot build an HTTP client: {e}")))?;
    let started = Instant::now();
    loop {
        let mut ready = 0;
        for peer in running.iter_mut() {
            if let Ok(Some(status)) = peer.child.try_wait() {
                return Err(DevError::PeerExited {
                    id: peer.layout.id,
                    status: status.to_string(),
                    log: peer.layout.log.clone(),
                });
            }
            let url = format!("{}/readyz", peer.layout.admin_url());
            if let Ok(response) = http.get(&url).send().await
                && response.status().is_success()
            {
                ready += 1;
            }
        }
        if ready == running.len() {
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(DevError::NotReady(timeout));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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

/// SIGTERM to each child, then SIGKILL to whatever is still running after
/// a grace period; returns when every child has been reaped.
async fn stop_all(running: &mut [Running]) {
    for peer in running.iter() {
        if let Some(pid) = peer.child.id() {
            // `kill` keeps this crate free of unsafe code for one signal.
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }
    let grace = Instant::now() + Duration::from_secs(10);
    for peer in running.iter_mut() {
        let remaining = grace.saturating_duration_since(Instant::now());
        if tokio::time::timeout(remaining, peer.child.wait())
            .await
            .is_err()
        {
            let _ = peer.child.kill().await;
        }
    }
}
