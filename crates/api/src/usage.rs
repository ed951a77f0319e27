//! API keys' usage as routers report it and the admin API answers it.

use serde::{Deserialize, Serialize};

pub use llmgw_state::{UsageRow, UsageTotals};

/// `POST /api/v1/usage`: what a router's keyed requests used since its last
/// report. Numbered per router: a report the control plane already counted
/// is answered 409 and its sender moves on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    pub reporter: String,
    pub seq: u64,
    pub rows: Vec<UsageRow>,
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

/// The UTC date of a day counted from the Unix epoch, as `YYYY-MM-DD`
/// (Howard Hinnant's civil-from-days).
pub fn utc_date(days_since_epoch: u64) -> String {
    let z = days_since_epoch as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
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
