//! What API keys used, summed per key, model and minute over every router,
//! and the last report applied from each router. Routers report in
//! batches (a log entry per batch, never per request), each numbered, so a
//! batch sent again after an unclear answer counts once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Requests and tokens of one key on one model in one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageTotals {
    #[serde(default)]
    pub completed: u64,
    #[serde(default)]
    pub cancelled: u64,
    #[serde(default)]
    pub failed: u64,
    /// Requests whose engine reported no usage: completion tokens counted
    /// from what was relayed.
    #[serde(default)]
    pub estimated: u64,
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
}

impl UsageTotals {
    pub fn add(&mut self, other: &UsageTotals) {
        self.completed += other.completed;
        self.cancelled += other.cancelled;
        self.failed += other.failed;
        self.estimated += other.estimated;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cached_tokens += other.cached_tokens;
    }

    pub fn requests(&self) -> u64 {
        self.completed + self.cancelled + self.failed
    }
}

/// One line of a router's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub key: String,
    pub model: String,
    /// Minutes since the Unix epoch, by the router's clock when the answer
    /// ended.
    pub minute: u64,
    pub totals: UsageTotals,
}

/// The replicated usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Key, then model, then minute.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub minutes: BTreeMap<String, BTreeMap<String, BTreeMap<u64, UsageTotals>>>,
    /// Each router's last applied report.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reporters: BTreeMap<String, LastReport>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastReport {
    pub seq: u64,
    pub at_ms: u64,
}

/// Most rows one report may carry: a router reports every few seconds, and
/// a report is one log entry.
pub const MAX_USAGE_ROWS: usize = 10_000;

impl Usage {
    pub fn is_empty(&self) -> bool {
        self.minutes.is_empty() && self.reporters.is_empty()
    }

    /// Every row, oldest minute first within each key and model.
    pub fn rows(&self) -> impl Iterator<Item = UsageRow> + '_ {
        self.minutes.iter().flat_map(|(key, models)| {
            models.iter().flat_map(move |(model, minutes)| {
                minutes.iter().map(move |(minute, totals)| UsageRow {
                    key: key.clone(),
                    model: model.clone(),
                    minute: *minute,
                    totals: *totals,
                })
            })
        })
    }
}
