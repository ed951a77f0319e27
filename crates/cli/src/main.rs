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
    Server(llmgw_server::ServerArgs),
    /// Run the agent of one GPU node.
    Agent(llmgw_agent::AgentArgs),
    /// Run a standalone OpenAI-compatible router.
    Router(llmgw_router::RouterArgs),
    /// Operate a cluster through its admin API.
    Ctl(llmgw_ctl::CtlArgs),
    /// Start a whole local cluster with simulated GPUs and engines.
    Dev(llmgw_dev::DevArgs),
    /// Create a development CA and certificates.
    Certs(llmgw_tls::CertsArgs),
    /// Run the fault-injection suite against a real cluster.
    Chaos(llmgw_chaos::ChaosArgs),
    /// Work with llmgw's config files.
    Config(ConfigArgs),
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

/// Runs an async subcommand on a fresh runtime; `logs` turns on tracing
/// output to stderr (`RUST_LOG`, default info with openraft at warn).
fn run_async(logs: bool, job: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    if logs {
        llmgw_runtime::init_logging("info,openraft=warn");
    }
    let runtime = match llmgw_runtime::multi_thread_runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(job) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Config(ConfigArgs {
            command: ConfigCommand::Check(args),
        }) => config_check::run(&args),
        Command::Server(args) => {
            run_async(true, async { Ok(llmgw_server::run_server(args).await?) })
        }
        Command::Agent(args) => llmgw_agent::main(args),
        Command::Router(args) => match llmgw_router::run_cli(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("llmgw router: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Ctl(args) => run_async(false, async {
            print!("{}", llmgw_ctl::run_ctl(args).await?);
            Ok(())
        }),
        Command::Dev(args) => run_async(true, async { Ok(llmgw_dev::run_dev(args).await?) }),
        Command::Certs(args) => match llmgw_tls::run_certs(args) {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("llmgw certs: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Chaos(args) => llmgw_chaos::main(args),
    }
}
