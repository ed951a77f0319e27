//! Sending what a router's keys used to the control plane.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use llmgw_api::usage::UsageReport;

use crate::service::Shared;

/// Where a router sends its usage reports: the control plane.
pub trait UsageSink: Send + Sync + 'static {
    /// Ok once the control plane counted the report, now or before.
    fn send(&self, report: UsageReport)
    -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
}

/// A name for this router process's reports: `role` (e.g. `router`,
/// `peer-2`), the host's name and the process's id and start time, so no
/// two router processes share one.
pub fn reporter_name(role: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{role}@{}/{}-{started}", host.trim(), std::process::id())
}

/// How often a router reports by default (router.yaml
/// `usage_report_interval`). A report is one Raft log entry.
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends what the ledger charged, and the demand for each key with
/// per-minute limits, every `every`, until the router is gone. A report
/// that fails is sent again, with its number, until the control plane has
/// it: a report applied whose answer was lost is then refused as counted,
/// so nothing is counted twice or dropped while the router runs.
pub(crate) async fn report_loop(
    shared: std::sync::Weak<Shared>,
    sink: Arc<dyn UsageSink>,
    reporter: String,
    every: std::time::Duration,
) {
    let mut seq = 1;
    let mut unsent: Option<UsageReport> = None;
    let mut failing = false;
    let mut last_built = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if unsent.is_none() {
            let rows = shared.usage.take_pending();
            let mut demand = shared.limiter.take_demand();
            // An idle router says so: its share of each key's per-minute
            // limits stays counted (and small).
            for key in shared.table.borrow().keys.per_minute_limited() {
                demand.entry(key.to_owned()).or_insert(0);
            }
            if rows.is_empty() && demand.is_empty() {
                continue;
            }
            let now = tokio::time::Instant::now();
            unsent = Some(UsageReport {
                reporter: reporter.clone(),
                seq,
                rows,
                demand,
                interval_ms: now.duration_since(last_built).as_millis() as u64,
            });
            last_built = now;
        }
        drop(shared);
        let report = unsent.clone().expect("a report to send");
        match sink.send(report).await {
            Ok(()) => {
                unsent = None;
                seq += 1;
                if failing {
                    tracing::info!(reporter, "usage reports reach the control plane again");
                    failing = false;
                }
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(reporter, %error, "usage report not taken; kept and sent again");
                    failing = true;
                }
            }
        }
    }
}
