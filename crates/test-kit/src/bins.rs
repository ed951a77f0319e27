//! The binaries tests and benches run as processes. Cargo builds a
//! package's own binaries for its integration tests (`CARGO_BIN_EXE_*`),
//! but not other packages' binaries: those are found in `target/<profile>/`
//! (where benches live, and above the `deps/` of test executables), or
//! where an environment variable points.

use std::path::{Path, PathBuf};

/// `llmgw`: `$LLMGW_BIN`, or `target/<profile>/llmgw`.
pub fn llmgw_bin() -> PathBuf {
    built("llmgw", "LLMGW_BIN", "llmgw-cli")
}

/// The simulated engine: `$LLMGW_ENGINE_SIM`, or
/// `target/<profile>/llmgw-engine-sim`.
pub fn engine_sim_bin() -> PathBuf {
    built("llmgw-engine-sim", "LLMGW_ENGINE_SIM", "llmgw-engine-sim")
}

/// A missing binary stops the test (or bench) with the command that
/// builds it, rather than running something stale or nothing.
fn built(name: &str, variable: &str, package: &str) -> PathBuf {
    let bin = match std::env::var_os(variable) {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = std::env::current_exe().expect("the running executable's path");
            profile_dir(&exe)
                .expect("the executable lives in target/<profile> or target/<profile>/deps")
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

/// `target/<profile>` for an executable Cargo built: a test executable
/// lives in its `deps/`, a binary (a bench) in it directly.
fn profile_dir(exe: &Path) -> Option<&Path> {
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent()
    } else {
        Some(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::profile_dir;
    use std::path::Path;

    #[test]
    fn binaries_are_found_beside_benches_and_above_test_executables() {
        let test = Path::new("/t/target/debug/deps/cluster-0123abcd");
        let bench = Path::new("/t/target/release/fleet-bench");
        assert_eq!(profile_dir(test), Some(Path::new("/t/target/debug")));
        assert_eq!(profile_dir(bench), Some(Path::new("/t/target/release")));
    }
}
