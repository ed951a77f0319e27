//! `llmgw config check FILE...`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use llmgw_config::{FileKind, check_file};

#[derive(Args)]
pub struct CheckArgs {
    /// Treat every file as this kind instead of detecting it from content.
    #[arg(long, value_parser = parse_kind)]
    kind: Option<FileKind>,
    /// Files to check.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

fn parse_kind(text: &str) -> Result<FileKind, String> {
    text.parse()
}

/// Checks every file, even after one fails, and exits non-zero if any did.
pub fn run(args: &CheckArgs) -> ExitCode {
    let mut failed = 0;
    for file in &args.files {
        match check_file(file, args.kind) {
            Ok(report) => {
                println!(
                    "ok: {} ({}): {}",
                    file.display(),
                    report.kind,
                    report.summary
                );
                for warning in &report.warnings {
                    println!("  warning: {warning}");
                }
            }
            Err(err) => {
                failed += 1;
                eprintln!("{err}");
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} of {} file(s) have problems", args.files.len());
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
