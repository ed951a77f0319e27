//! llmgw's chaos suite: a real three-peer cluster of the `llmgw` binary,
//! each peer in its own network namespace, faults injected with the
//! kernel (signals, nftables, netem), a recorded client load throughout,
//! and invariants checked by name after every scenario.
//!
//! `llmgw chaos list` and `llmgw chaos run` call [`main`]; the tests in
//! `chaos/tests` call [`scenario::run`] directly.

pub mod cluster;
pub mod fleet;
pub mod history;
pub mod invariants;
pub mod linearizability;
pub mod load;
pub mod netns;
pub mod powercut;
pub mod scenario;
pub mod slow_links;
pub mod small_disks;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

pub use netns::preflight;
pub use scenario::{CATALOGUE, RunOptions, RunReport, Scenario};

/// `llmgw chaos`.
#[derive(Debug, Args)]
pub struct ChaosArgs {
    #[command(subcommand)]
    pub command: ChaosCommand,
}

#[derive(Debug, Subcommand)]
pub enum ChaosCommand {
    /// Name every scenario with what it does.
    List,
    /// Run scenarios against a fresh cluster each (needs root).
    Run(RunArgs),
    /// Crash cycles on lazy disks: load, power cut or SIGKILL of a random
    /// peer, restart, check every acknowledged write (needs root, FUSE).
    Soak(powercut::soak::SoakArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A scenario to run (repeatable).
    #[arg(long = "scenario", value_name = "NAME")]
    pub scenarios: Vec<String>,
    /// Run the whole catalogue.
    #[arg(long, conflicts_with = "scenarios")]
    pub all: bool,
    /// The first seed; it fixes each run's fault schedule. Random (and
    /// printed) when left out.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seeds per scenario: seed, seed+1, ...
    #[arg(long, default_value_t = 1)]
    pub seeds: u64,
    /// The llmgw binary the peers run; this binary by default.
    #[arg(long, value_name = "PATH")]
    pub llmgw_bin: Option<PathBuf>,
    /// Where runs keep logs and data (a run with violations keeps them).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Keep logs and histories of clean runs too.
    #[arg(long)]
    pub keep: bool,
    /// Also write the whole output (what was run, on which commit and
    /// build, every invariant's scope and violations, every fault, the
    /// summary table) to this Markdown file, rewritten after every run, so
    /// a table in the docs is a file the run wrote, not a paste.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Concurrent client workers during each run.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Test-only: fabricate a sample in which a peer's leadership goes
    /// back, to see the leadership-order check fail.
    #[arg(long, hide = true)]
    pub forge_leader_sample: bool,
    /// Test-only: fabricate a second replica on a GPU a live shard holds,
    /// to see the GPU check fail.
    #[arg(long, hide = true)]
    pub forge_gpu_double: bool,
}

/// The catalogue as `llmgw chaos list` prints it.
pub fn list() -> String {
    let width = CATALOGUE.iter().map(|s| s.name.len()).max().unwrap_or(0);
    CATALOGUE
        .iter()
        .map(|s| format!("{:width$}  {}\n", s.name, s.about))
        .collect()
}

/// The summary table of a set of runs.
pub fn summary(reports: &[RunReport]) -> String {
    let mut rows = vec![[
        "scenario".to_owned(),
        "seed".to_owned(),
        "faults".to_owned(),
        "ops (ok/failed/unknown)".to_owned(),
        "router (ok/all)".to_owned(),
        "invariants".to_owned(),
        "violations".to_owned(),
        "secs".to_owned(),
    ]];
    for r in reports {
        rows.push([
            r.scenario.to_owned(),
            r.seed.to_string(),
            r.faults.len().to_string(),
            format!(
                "{} ({}/{}/{})",
                r.ops, r.ops_ok, r.ops_failed, r.ops_unknown
            ),
            if r.router_ops == 0 {
                "-".to_owned()
            } else {
                format!("{}/{}", r.router_ok, r.router_ops)
            },
            r.checked.len().to_string(),
            r.violations().to_string(),
            format!("{:.0}", r.seconds),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| rows.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:w$}"))
            .collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&format!("|-{}-|\n", rule.join("-|-")));
        }
    }
    let total_ops: usize = reports.iter().map(|r| r.ops).sum();
    let total_router: usize = reports.iter().map(|r| r.router_ops).sum();
    let total_violations: usize = reports.iter().map(RunReport::violations).sum();
    out.push_str(&format!(
        "{} runs, {total_ops} operations, {total_router} router requests, {total_violations} violations\n",
        reports.len()
    ));
    out
}

/// One run's invariants and violations, for the log.
pub fn details(report: &RunReport) -> String {
    let mut out = format!(
        "{} seed {} (run {}): {} faults, {} operations\n",
        report.scenario,
        report.seed,
        report.run_id,
        report.faults.len(),
        report.ops
    );
    for checked in &report.checked {
        let verdict = if checked.violations.is_empty() {
            "ok".to_owned()
        } else {
            format!("{} VIOLATION(S)", checked.violations.len())
        };
        out.push_str(&format!(
            "  {:36} {verdict} ({})\n",
            checked.name, checked.scope
        ));
        for violation in &checked.violations {
            out.push_str(&format!("    - {violation}\n"));
        }
    }
    if let Some(dir) = &report.kept {
        out.push_str(&format!("  logs and history kept in {}\n", dir.display()));
    }
    out
}

/// The head of a `--report` file: what was run, where and on what.
fn report_head(
    args: &[String],
    first_seed: u64,
    seeds: u64,
    bin: &std::path::Path,
    report: &std::path::Path,
) -> String {
    let git = |what: &[&str]| {
        std::process::Command::new("git")
            .args(what)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => {
            let commit = commit.trim().to_owned();
            // The report itself may be a tracked file being rewritten: not
            // a change to the code that ran.
            let root = git(&["rev-parse", "--show-toplevel"]).map(|r| PathBuf::from(r.trim()));
            let is_report = |path: &str| {
                root.as_ref()
                    .is_some_and(|root| same_file(&root.join(path), report))
            };
            let changed = git(&["status", "--porcelain", "--untracked-files=no"])
                .unwrap_or_default()
                .lines()
                .any(|line| line.get(3..).is_some_and(|path| !is_report(path)));
            if changed {
                format!("{commit} with uncommitted changes")
            } else {
                commit
            }
        }
        None => "unknown (not run from a git checkout)".to_owned(),
    };
    let started = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!(
        "# llmgw chaos run\n\n\
         * command: `{}`\n\
         * started: {started}\n\
         * commit: {commit}\n\
         * peers run: `{}` (llmgw {}, {} build of this chaos binary)\n\
         * links: mTLS between peers and agents, HTTPS admin API with a token\n\
         * machine: {cores} CPU(s)\n\
         * seeds: {first_seed} to {}\n\n",
        args.join(" "),
        bin.display(),
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        first_seed + seeds.max(1) - 1,
    )
}

/// Whether two paths name one file, whether or not it exists yet.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    let canonical = |p: &std::path::Path| {
        let parent = p.parent().and_then(|d| d.canonicalize().ok());
        parent.zip(p.file_name()).map(|(d, name)| d.join(name))
    };
    canonical(a).is_some_and(|a| Some(a) == canonical(b))
}

/// Rewrites the `--report` file with everything so far; a failure to
/// write is said once per run, never fatal.
fn write_report(path: &std::path::Path, head: &str, runs: &str, reports: &[RunReport]) {
    let text = format!(
        "{head}## Runs\n\n```\n{runs}```\n\n## Summary\n\n{}",
        summary(reports)
    );
    if let Err(error) = std::fs::write(path, text) {
        eprintln!("chaos: cannot write the report {}: {error}", path.display());
    }
}

/// One run's fault log, indented under its details in a report.
fn faults(report: &RunReport) -> String {
    let mut out = String::from("  faults:\n");
    for fault in &report.faults {
        out.push_str(&format!("    {fault}\n"));
    }
    out
}

/// `llmgw chaos ...`.
pub fn main(args: ChaosArgs) -> ExitCode {
    match args.command {
        ChaosCommand::List => {
            print!("{}", list());
            ExitCode::SUCCESS
        }
        ChaosCommand::Run(run) => run_cli(run),
        ChaosCommand::Soak(soak) => powercut::soak::main(soak),
    }
}

fn run_cli(args: RunArgs) -> ExitCode {
    let scenarios: Vec<&'static Scenario> = if args.all {
        CATALOGUE.iter().collect()
    } else if args.scenarios.is_empty() {
        eprintln!("llmgw chaos run: name a scenario with --scenario NAME, or use --all");
        return ExitCode::from(2);
    } else {
        let mut chosen = Vec::new();
        for name in &args.scenarios {
            match scenario::find(name) {
                Some(s) => chosen.push(s),
                None => {
                    eprintln!(
                        "llmgw chaos run: no scenario named {name:?}; `llmgw chaos list` names them"
                    );
                    return ExitCode::from(2);
                }
            }
        }
        chosen
    };
    if let Err(why) = preflight() {
        eprintln!("llmgw chaos run: cannot run: {why}");
        return ExitCode::FAILURE;
    }
    let bin = match args
        .llmgw_bin
        .clone()
        .or_else(|| std::env::current_exe().ok())
    {
        Some(bin) => bin,
        None => {
            eprintln!("llmgw chaos run: cannot tell where the llmgw binary is; pass --llmgw-bin");
            return ExitCode::FAILURE;
        }
    };
    let first_seed = args.seed.unwrap_or_else(|| rand::random::<u32>() as u64);
    let options = RunOptions {
        bin,
        work_dir: args
            .work_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("llmgw-chaos")),
        keep: args.keep,
        workers: args.workers.max(1),
        verbose: true,
        forge_leader_sample: args.forge_leader_sample,
        forge_gpu_double: args.forge_gpu_double,
    };
    println!(
        "chaos: {} scenario(s) x {} seed(s) from seed {first_seed}",
        scenarios.len(),
        args.seeds
    );
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("llmgw chaos run: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let head = args.report.as_deref().map_or_else(String::new, |report| {
        report_head(
            &std::env::args().collect::<Vec<_>>(),
            first_seed,
            args.seeds,
            &options.bin,
            report,
        )
    });
    let mut runs = String::new();
    let mut reports = Vec::new();
    let mut errors = 0;
    for scenario in scenarios {
        for seed in first_seed..first_seed + args.seeds.max(1) {
            match runtime.block_on(scenario::run(scenario, seed, &options)) {
                Ok(report) => {
                    let text = details(&report);
                    print!("{text}");
                    runs.push_str(&text);
                    runs.push_str(&faults(&report));
                    reports.push(report);
                }
                Err(error) => {
                    errors += 1;
                    let text = format!(
                        "chaos: {} seed {seed} could not run: {error}\n  replay: llmgw chaos run --scenario {} --seed {seed}\n",
                        scenario.name, scenario.name
                    );
                    eprint!("{text}");
                    runs.push_str(&text);
                }
            }
            if let Some(path) = &args.report {
                write_report(path, &head, &runs, &reports);
            }
        }
    }
    println!();
    print!("{}", summary(&reports));
    let violations: usize = reports.iter().map(RunReport::violations).sum();
    for report in reports.iter().filter(|r| r.violations() > 0) {
        println!(
            "replay: llmgw chaos run --scenario {} --seed {}",
            report.scenario, report.seed
        );
    }
    if violations > 0 || errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
