//! Sending what a router's keys used to the control plane.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use llmgw_api::usage::UsageReport;

use super::UsageLedger;

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

/// Sends what the ledger charged every `every`, until the ledger (the
/// router) is gone. A report that fails is sent again, with its number,
/// until the control plane has it: a report applied whose answer was lost
/// is then refused as counted, so nothing is counted twice or dropped
/// while the router runs.
pub(crate) async fn report_loop(
    ledger: std::sync::Weak<UsageLedger>,
    sink: Arc<dyn UsageSink>,
    reporter: String,
    every: std::time::Duration,
) {
    let mut seq = 1;
    let mut unsent: Option<UsageReport> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(ledger) = ledger.upgrade() else {
            return;
        };
        if unsent.is_none() {
            let rows = ledger.take_pending();
            if rows.is_empty() {
                continue;
            }
            unsent = Some(UsageReport {
                reporter: reporter.clone(),
                seq,
                rows,
            });
        }
        drop(ledger);
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
