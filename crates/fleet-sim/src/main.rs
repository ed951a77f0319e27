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

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
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
