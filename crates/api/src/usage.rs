//! API keys' usage as routers report it and the admin API answers it.

use serde::{Deserialize, Serialize};

pub use llmgw_state::{KeySpend, UsageRow, UsageTotals, civil_from_days, days_from_civil};

/// `POST /api/v1/usage`: what a router's keyed requests used since its last
/// report. Numbered per router: a report the control plane already counted
/// is answered 409 and its sender moves on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    pub reporter: String,
    pub seq: u64,
    pub rows: Vec<UsageRow>,
    /// Requests asked for per key with per-minute limits (admitted or not)
    /// since the previous report: what the router's share of those limits
    /// follows. A router reports every such key it knows, 0 when idle.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub demand: std::collections::BTreeMap<String, u64>,
    /// Milliseconds since the previous report.
    #[serde(default)]
    pub interval_ms: u64,
}

/// One line of `GET /api/v1/usage`: a key's use of a model on one UTC day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageDay {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub key: String,
    /// The key's team when the key is the control plane's.
    #[serde(default)]
    pub team: String,
    pub model: String,
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// `?days=N` of `GET /api/v1/usage`: the last N days, today included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageQuery {
    #[serde(default = "default_days")]
    pub days: u64,
}

fn default_days() -> u64 {
    7
}

impl Default for UsageQuery {
    fn default() -> Self {
        UsageQuery {
            days: default_days(),
        }
    }
}

/// The UTC date of a day counted from the Unix epoch, as `YYYY-MM-DD`.
pub fn utc_date(days_since_epoch: u64) -> String {
    let (year, month, day) = civil_from_days(days_since_epoch);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Seconds from `now_ms` until the next UTC day and the next UTC month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewals {
    pub day_s: u64,
    pub month_s: u64,
}

pub fn renewals(now_ms: u64) -> Renewals {
    let now_s = now_ms / 1_000;
    let today = now_s / 86_400;
    let (year, month, _) = civil_from_days(today);
    let (next_year, next_month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let next_month_s = days_from_civil(next_year, next_month, 1) * 86_400;
    Renewals {
        day_s: (today + 1) * 86_400 - now_s,
        month_s: next_month_s.saturating_sub(now_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(59), "1970-03-01");
        assert_eq!(utc_date(11_016), "2000-02-29");
        // 2026-12-06
        assert_eq!(utc_date(20_793), "2026-12-06");
    }
}
