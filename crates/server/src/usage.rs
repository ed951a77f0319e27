//! The in-peer router's usage reports: `RecordUsage` writes, forwarded to
//! the leader like any other.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use llmgw_api::usage::UsageReport;
use llmgw_raft::{ControlError, ControlPlane, now_ms};
use llmgw_state::{Command, RejectionKind};

pub struct PeerUsageSink {
    control: ControlPlane,
    retention: Duration,
}

impl PeerUsageSink {
    pub fn new(control: ControlPlane, retention: Duration) -> Self {
        PeerUsageSink { control, retention }
    }
}

/// The command that records `report`, keeping `retention` of usage.
pub fn record(report: UsageReport, retention: Duration) -> Command {
    Command::RecordUsage {
        reporter: report.reporter,
        seq: report.seq,
        rows: report.rows,
        retain_minutes: retention.as_secs() / 60,
        demand: report.demand,
        interval_ms: report.interval_ms,
        at_ms: now_ms(),
    }
}

impl llmgw_router::UsageSink for PeerUsageSink {
    fn send(
        &self,
        report: UsageReport,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        let control = self.control.clone();
        let command = record(report, self.retention);
        Box::pin(async move {
            match control.write(command).await {
                Ok(_) => Ok(()),
                // Counted before: an earlier try whose answer was lost.
                Err(ControlError::Rejected(r)) if r.kind == RejectionKind::Conflict => Ok(()),
                Err(error) => Err(error.to_string()),
            }
        })
    }
}
