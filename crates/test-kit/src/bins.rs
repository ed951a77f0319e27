//! The binaries tests run as processes. Cargo builds a package's own
//! binaries for its integration tests (`CARGO_BIN_EXE_*`), but not other
//! packages' binaries: those are found next to the test executable, in
//! `target/<profile>/`, or where an environment variable points.

use std::path::PathBuf;

/// `llmgw`: `$LLMGW_BIN`, or `target/<profile>/llmgw`.
pub fn llmgw_bin() -> PathBuf {
    built("llmgw", "LLMGW_BIN", "llmgw-cli")
}

/// The simulated engine: `$LLMGW_ENGINE_SIM`, or
/// `target/<profile>/llmgw-engine-sim`.
pub fn engine_sim_bin() -> PathBuf {
    built("llmgw-engine-sim", "LLMGW_ENGINE_SIM", "llmgw-engine-sim")
}

/// A missing binary fails the test with the command that builds it,
/// rather than testing something stale or nothing.
fn built(name: &str, variable: &str, package: &str) -> PathBuf {
    let bin = match std::env::var_os(variable) {
        Some(path) => PathBuf::from(path),
        None => {
            let test_exe = std::env::current_exe().expect("the test binary's path");
            // target/<profile>/deps/<test> -> target/<profile>/<name>
            test_exe
                .parent()
                .and_then(|deps| deps.parent())
                .expect("the test binary lives in target/<profile>/deps")
                .join(name)
        }
    };
    assert!(
        bin.is_file(),
        "{} does not exist: build it first with `cargo build -p {package}` (same profile and \
         CARGO_TARGET_DIR as the tests; scripts/test does), or point {variable} at one",
        bin.display()
    );
    bin
}
