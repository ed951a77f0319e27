//! A test that cannot run on this machine says so where a person looks:
//! in its output, and in the summary of `scripts/test`, which lists every
//! skip it was told of. Where nothing may be skipped (CI:
//! `LLMGW_REQUIRE_ALL=1`), a skip fails the test instead.

use std::io::Write;

/// Where `scripts/test` collects skips, one `test: why` line each.
const SKIP_LOG: &str = "LLMGW_SKIP_LOG";
/// Set (to anything but `0`): a test that cannot run fails.
const REQUIRE_ALL: &str = "LLMGW_REQUIRE_ALL";

/// Records that `test` does not run here, and why; the caller returns
/// after it. Panics instead when `LLMGW_REQUIRE_ALL` is set.
pub fn skipped(test: &str, why: &str) {
    if std::env::var_os(REQUIRE_ALL).is_some_and(|v| v != "0") {
        panic!("{test} cannot run on this machine ({REQUIRE_ALL} is set): {why}");
    }
    println!("SKIPPED: {why}");
    let Some(log) = std::env::var_os(SKIP_LOG) else {
        return;
    };
    let line = format!("{test}: {}\n", why.replace('\n', " "));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = written {
        println!("cannot note the skip in {}: {error}", log.to_string_lossy());
    }
}
