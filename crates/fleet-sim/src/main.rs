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
}

fn main() -> std::process::ExitCode {
    // Errors only unless RUST_LOG says otherwise: the fleet's own lines are
    // the stats printed to stdout.
    llmgw_runtime::init_logging("error");
    let args = Args::parse();
    match llmgw_runtime::multi_thread_runtime() {
        Ok(runtime) => {
            runtime.block_on(simulate(args));
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("llmgw-fleet-sim: cannot start the async runtime: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the fleet and prints its stats every 5 s until Ctrl-C.
async fn simulate(args: Args) {
    let fleet = llmgw_fleet_sim::Fleet::spawn(
        &args.prefix,
        args.nodes,
        &args.servers,
        Duration::from_millis(args.heartbeat_ms),
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
            _ = tokio::signal::ctrl_c() => break,
        }
    }
}
