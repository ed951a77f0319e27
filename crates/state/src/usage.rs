//! What API keys used, summed per key, model and minute over every router,
//! and the last report applied from each router. Routers report in
//! batches (a log entry per batch, never per request), each numbered, so a
//! batch sent again after an unclear answer counts once.

use std::collections::BTreeMap;

use llmgw_catalog::{Price, Usd};
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
    /// What these tokens cost by the model's price when the control plane
    /// applied them; routers report none.
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub cost: Usd,
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
        self.cost = self.cost.saturating_add(other.cost);
    }

    pub fn requests(&self) -> u64 {
        self.completed + self.cancelled + self.failed
    }
}

/// Tokens (prompt and completion) a key used in the current UTC day and
/// month, over every router: what budgets are checked against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySpend {
    #[serde(default)]
    pub day_tokens: u64,
    #[serde(default)]
    pub month_tokens: u64,
    /// Their cost by the models' prices.
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub day_cost: Usd,
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub month_cost: Usd,
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
    /// Tokens (prompt and completion) per key and UTC day, summed from
    /// `minutes` as reports are added: what budgets are checked against,
    /// read every second by every router, without walking a month of
    /// minutes each time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daily_tokens: BTreeMap<String, BTreeMap<u64, u64>>,
    /// What those tokens cost per key and UTC day, in micro-dollars: what
    /// money budgets are checked against.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daily_cost: BTreeMap<String, BTreeMap<u64, u64>>,
    /// Per key with per-minute limits, each router's recent demand:
    /// what its share of the limit follows.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub demand: BTreeMap<String, BTreeMap<String, Demand>>,
}

/// Requests a router was asked for under one key over its last report's
/// interval, admitted or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    pub asked: u64,
    pub over_ms: u64,
    pub at_ms: u64,
}

/// A router's demand counts towards shares for this long after its last
/// report; a router silent longer has left the key's traffic.
pub const DEMAND_KEPT_MS: u64 = 60_000;

/// Of a key's per-minute limits, this part is split evenly among the
/// routers that serve it and the rest by their demand: a router with
/// little traffic keeps room for a burst, a busy one gets most.
pub const EVEN_PART: f64 = 0.2;

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
        self.minutes.is_empty()
            && self.reporters.is_empty()
            && self.demand.is_empty()
            && self.daily_tokens.is_empty()
            && self.daily_cost.is_empty()
    }

    /// Each router's share of `key`'s per-minute limits at `now_ms`: an
    /// even part and the rest by demand, summing to 1 over the routers
    /// that reported for the key in the last minute. Empty when none did.
    pub fn shares(&self, key: &str, now_ms: u64) -> BTreeMap<String, f64> {
        let Some(routers) = self.demand.get(key) else {
            return BTreeMap::new();
        };
        let active: Vec<(&String, f64)> = routers
            .iter()
            .filter(|(_, d)| d.at_ms + DEMAND_KEPT_MS >= now_ms)
            .map(|(name, d)| (name, d.asked as f64 / d.over_ms.max(1) as f64))
            .collect();
        let n = active.len() as f64;
        let total: f64 = active.iter().map(|(_, rate)| rate).sum();
        active
            .into_iter()
            .map(|(name, rate)| {
                let share = if total > 0.0 {
                    EVEN_PART / n + (1.0 - EVEN_PART) * rate / total
                } else {
                    1.0 / n
                };
                (name.clone(), share)
            })
            .collect()
    }

    /// What `key` spent in the UTC day and month of `now_ms`.
    pub fn spent(&self, key: &str, now_ms: u64) -> KeySpend {
        let today = now_ms / 86_400_000;
        let (year, month, _) = civil_from_days(today);
        let month_start = days_from_civil(year, month, 1);
        // (this month, today) of one per-day map.
        let sum = |per_day: &BTreeMap<String, BTreeMap<u64, u64>>| {
            per_day.get(key).map_or((0, 0), |days| {
                days.range(month_start..)
                    .fold((0u64, 0u64), |(month, day), (d, n)| {
                        let today_part = if *d == today { *n } else { 0 };
                        (month.saturating_add(*n), day.saturating_add(today_part))
                    })
            })
        };
        let (month_tokens, day_tokens) = sum(&self.daily_tokens);
        let (month_cost, day_cost) = sum(&self.daily_cost);
        KeySpend {
            day_tokens,
            month_tokens,
            day_cost: Usd::from_micros(day_cost),
            month_cost: Usd::from_micros(month_cost),
        }
    }

    /// Adds one report row to the per-minute totals and the key's day,
    /// costed by `price` (the model's, as applied now; what a router
    /// claims a row cost is not taken).
    pub fn add(&mut self, row: &UsageRow, price: Option<&Price>) {
        let mut totals = row.totals;
        totals.cost = price.map_or(Usd::ZERO, |price| {
            price.cost(
                totals.prompt_tokens,
                totals.cached_tokens,
                totals.completion_tokens,
            )
        });
        self.minutes
            .entry(row.key.clone())
            .or_default()
            .entry(row.model.clone())
            .or_default()
            .entry(row.minute)
            .or_default()
            .add(&totals);
        if !totals.cost.is_zero() {
            let day = self
                .daily_cost
                .entry(row.key.clone())
                .or_default()
                .entry(row.minute / 1_440)
                .or_default();
            *day = day.saturating_add(totals.cost.micros);
        }
        *self
            .daily_tokens
            .entry(row.key.clone())
            .or_default()
            .entry(row.minute / 1_440)
            .or_default() += row.totals.prompt_tokens + row.totals.completion_tokens;
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

/// The UTC (year, month, day) of a day counted from the Unix epoch
/// (Howard Hinnant's civil-from-days).
pub fn civil_from_days(days_since_epoch: u64) -> (i64, u32, u32) {
    let z = days_since_epoch as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day, counted from the Unix epoch, of a UTC date (days-from-civil).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_round_trip() {
        for day in [0, 59, 11_016, 20_793, 20_818, 40_000] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(20_793), (2026, 12, 6));
    }

    #[test]
    fn shares_follow_demand_and_sum_to_one() {
        let mut usage = Usage::default();
        let demand = |asked, at_ms| Demand {
            asked,
            over_ms: 5_000,
            at_ms,
        };
        let routers = usage.demand.entry("ci".into()).or_default();
        routers.insert("a".into(), demand(90, 100_000));
        routers.insert("b".into(), demand(10, 100_000));
        routers.insert("gone".into(), demand(500, 10_000));
        let shares = usage.shares("ci", 100_000);
        assert_eq!(shares.len(), 2, "a router silent for a minute has no share");
        assert!((shares["a"] - (0.1 + 0.8 * 0.9)).abs() < 1e-9, "{shares:?}");
        assert!((shares["b"] - (0.1 + 0.8 * 0.1)).abs() < 1e-9, "{shares:?}");
        assert!((shares.values().sum::<f64>() - 1.0).abs() < 1e-9);
        // Idle routers split it evenly.
        let idle = usage.demand.entry("idle".into()).or_default();
        idle.insert("a".into(), demand(0, 100_000));
        idle.insert("b".into(), demand(0, 100_000));
        assert_eq!(usage.shares("idle", 100_000)["a"], 0.5);
        assert!(usage.shares("none", 0).is_empty());
    }

    #[test]
    fn spend_counts_the_current_day_and_month() {
        let mut usage = Usage::default();
        let day = 20_793; // 2026-12-06
        let tokens = |minute, n| UsageRow {
            key: "ci".into(),
            model: "qwen".into(),
            minute,
            totals: UsageTotals {
                prompt_tokens: n,
                completion_tokens: n,
                ..UsageTotals::default()
            },
        };
        // A dollar per million tokens either way: 2n tokens cost 2n micro-dollars.
        let dollar = Usd::from_dollars(1.0).unwrap();
        let price = Price {
            input_per_million: dollar,
            cached_input_per_million: None,
            output_per_million: dollar,
        };
        usage.add(&tokens((day - 6) * 1_440, 1), Some(&price)); // 2026-11-30: last month
        usage.add(&tokens((day - 5) * 1_440, 10), Some(&price)); // 2026-12-01
        usage.add(&tokens(day * 1_440 + 5, 100), None);
        let spent = usage.spent("ci", day * 86_400_000 + 3_600_000);
        assert_eq!(
            spent,
            KeySpend {
                day_tokens: 200,
                month_tokens: 220,
                day_cost: Usd::ZERO,
                month_cost: Usd::from_micros(20),
            }
        );
        assert_eq!(usage.spent("other", 0), KeySpend::default());
    }
}
