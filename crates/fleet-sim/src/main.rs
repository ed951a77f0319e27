//! `llmgw-fleet-sim`: runs N simulated agents against a control plane and
//! prints the fleet's state every few seconds.

use std::time::Duration;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "llmgw-fleet-sim",
    about = "Simulated GPU nodes against an llmgw control plane"
)]
struct Args {
    /// Control-plane peers' gRPC addresses (host:port), comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    servers: Vec<String>,
    /// How many nodes to simulate.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Heartbeat interval, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    heartbeat_ms: u64,
    /// Node ids are PREFIX-00000, PREFIX-00001, ...
    #[arg(long, default_value = "sim")]
    prefix: String,
    /// A `llmgw dev` work directory: every node gets a certificate from
    /// its development CA (`DIR/tls`) and dials with mTLS, as agents of
    /// that cluster do. Without it, nodes dial in plaintext (peers started
    /// with `insecure: true`).
    #[arg(long, value_name = "DIR")]
    dev_dir: Option<std::path::PathBuf>,
}

fn main() -> std::process::ExitCode {
    // Errors only unless RUST_LOG says otherwise: the fleet's own lines are
    // the stats printed to stdout.
    llmgw_runtime::init_logging("error");
    let args = Args::parse();
    match llmgw_runtime::multi_thread_runtime() {
        Ok(runtime) => match runtime.block_on(simulate(args)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("llmgw-fleet-sim: {error}");
                std::process::ExitCode::FAILURE
            }
        },
        Err(error) => {
            eprintln!("llmgw-fleet-sim: cannot start the async runtime: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the fleet and prints its stats every 5 s until Ctrl-C.
async fn simulate(args: Args) -> Result<(), String> {
    let certificates = match &args.dev_dir {
        Some(dir) => Some(
            llmgw_fleet_sim::node_certificates(dir, &args.prefix, args.nodes)
                .map_err(|e| format!("node certificates from {}: {e}", dir.display()))?,
        ),
        None => None,
    };
    let fleet = llmgw_fleet_sim::Fleet::spawn(
        &args.prefix,
        args.nodes,
        &args.servers,
        Duration::from_millis(args.heartbeat_ms),
        certificates,
    );
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let s = fleet.stats();
                println!(
                    "nodes {}  registered {}  reconnects {}  commands {}  refused {}",
                    s.nodes, s.registered, s.reconnects, s.commands, s.refused
                );
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
