//! `llmgw`: every llmgw program behind one binary. This file only parses the
//! command line and calls the crate that owns each job.

mod config_check;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "llmgw",
    version,
    about = "LLM serving gateway for a GPU fleet you own"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one control-plane peer (Raft, agent stream, admin API, router).
    Server(NotBuilt),
    /// Run the agent of one GPU node.
    Agent(llmgw_agent::AgentArgs),
    /// Run a standalone OpenAI-compatible router.
    Router(llmgw_router::RouterArgs),
    /// Operate a cluster through its admin API.
    Ctl(NotBuilt),
    /// Start a whole local cluster with simulated GPUs and engines.
    Dev(NotBuilt),
    /// Create a development CA and certificates.
    Certs(NotBuilt),
    /// Run the fault-injection suite against a real cluster.
    Chaos(NotBuilt),
    /// Work with llmgw's config files.
    Config(ConfigArgs),
}

/// Arguments of a subcommand that is not built yet; accepted so the message
/// below is what the user sees, not a parse error.
#[derive(Args)]
struct NotBuilt {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<String>,
}

#[derive(Args)]
struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate agent, server, router and models files; print every problem.
    Check(config_check::CheckArgs),
}

fn not_built(name: &str) -> ExitCode {
    eprintln!(
        "llmgw {name}: not built yet in this version of llmgw; nothing was started. \
         See README.md for what works today."
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Config(ConfigArgs {
            command: ConfigCommand::Check(args),
        }) => config_check::run(&args),
        Command::Server(_) => not_built("server"),
        Command::Agent(args) => llmgw_agent::main(args),
        Command::Router(args) => match llmgw_router::run_cli(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("llmgw router: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Ctl(_) => not_built("ctl"),
        Command::Dev(_) => not_built("dev"),
        Command::Certs(_) => not_built("certs"),
        Command::Chaos(_) => not_built("chaos"),
    }
}
