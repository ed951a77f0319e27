//! Waiting for a condition: polled until it holds, with a deadline long
//! enough for a noisy two-core machine, and a failure that says what was
//! awaited and what was seen last.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a cluster-level condition (a leader, convergence, a replica
/// ready) gets before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// How often [`eventually`] and [`wait_until`] ask.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// Polls `check` until it answers `Ok`, and returns that value; panics
/// after `within` with `what` and the last reason `check` gave.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll_until_ok(within, POLL, check)
        .await
        .unwrap_or_else(|last| panic!("{what}: not within {within:?}; last seen: {last}"))
}

/// Polls `check` every `every` until it answers `Ok`, and returns that
/// value; after `within`, the last reason `check` gave. [`eventually`]
/// without the panic, for callers that report a failure themselves (the
/// benches); a finer `every` keeps a short measurement from being mostly
/// the poll's own granularity.
pub async fn poll_until_ok<T, F, Fut>(
    within: Duration,
    every: Duration,
    mut check: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() >= deadline => return Err(why),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Polls `check` until it holds: true, or false once `within` passed.
pub async fn wait_until<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_until`] for tests without a runtime: the thread sleeps between
/// polls.
pub fn wait_until_blocking(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
