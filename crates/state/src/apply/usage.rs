//! Routers' usage reports.

use crate::command::{Outcome, Rejection};
use crate::types::FleetState;
use std::collections::BTreeMap;

use crate::usage::{DEMAND_KEPT_MS, Demand, LastReport, MAX_USAGE_ROWS, UsageRow};

const MINUTE_MS: u64 = 60_000;

/// How far ahead of the leader's clock a reported minute may be.
const MAX_CLOCK_AHEAD_MINUTES: u64 = 10;

/// The most (key, model) pairs usage is kept for: a router holding only a
/// read token cannot grow the state without bound by reporting made-up
/// keys. Far above what an operator's keys and models make.
pub const MAX_USAGE_ACCOUNTS: usize = 100_000;

impl FleetState {
    pub(super) fn record_usage(
        &mut self,
        reporter: &str,
        seq: u64,
        rows: &[UsageRow],
        retain_minutes: u64,
        (demand, interval_ms): (&BTreeMap<String, u64>, u64),
        at_ms: u64,
    ) -> Outcome {
        if reporter.is_empty() || reporter.len() > 128 {
            return Rejection::invalid("a usage reporter is named with 1 to 128 bytes");
        }
        if demand.len() > MAX_USAGE_ROWS {
            return Rejection::invalid(format!(
                "a usage report carries demand for at most {MAX_USAGE_ROWS} keys"
            ));
        }
        if rows.len() > MAX_USAGE_ROWS {
            return Rejection::invalid(format!(
                "a usage report carries at most {MAX_USAGE_ROWS} rows, not {}",
                rows.len()
            ));
        }
        // A router's clock runs ahead of the leader's by seconds, not
        // hours: a minute further ahead would outlive every retention.
        let latest_allowed = at_ms / MINUTE_MS + MAX_CLOCK_AHEAD_MINUTES;
        if let Some(row) = rows.iter().find(|row| row.minute > latest_allowed) {
            return Rejection::invalid(format!(
                "usage of key {} for minute {} is more than {MAX_CLOCK_AHEAD_MINUTES} minutes ahead of the leader's clock",
                row.key, row.minute
            ));
        }
        let usage = &mut self.usage;
        let accounts: usize = usage.minutes.values().map(|models| models.len()).sum();
        let new_accounts = rows
            .iter()
            .filter(|row| {
                usage
                    .minutes
                    .get(&row.key)
                    .is_none_or(|models| !models.contains_key(&row.model))
            })
            .map(|row| (&row.key, &row.model))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        if accounts + new_accounts > MAX_USAGE_ACCOUNTS {
            return Rejection::conflict(format!(
                "usage is kept for at most {MAX_USAGE_ACCOUNTS} (key, model) pairs; this report would add {new_accounts} to {accounts}"
            ));
        }
        if let Some(last) = usage.reporters.get(reporter)
            && last.seq >= seq
        {
            return Rejection::conflict(format!(
                "usage report {seq} of {reporter} is already counted (last: {})",
                last.seq
            ));
        }
        // Each model's price as the catalog says now, decoded once.
        let mut prices: BTreeMap<&str, Option<llmgw_catalog::Price>> = BTreeMap::new();
        for row in rows {
            prices.entry(row.model.as_str()).or_insert_with(|| {
                self.models
                    .get(&row.model)
                    .and_then(|record| record.spec.model().ok())
                    .and_then(|model| model.price)
            });
        }
        let usage = &mut self.usage;
        let oldest_kept = (at_ms / MINUTE_MS).saturating_sub(retain_minutes);
        for row in rows.iter().filter(|row| row.minute >= oldest_kept) {
            usage.add(
                row,
                prices.get(row.model.as_str()).copied().flatten().as_ref(),
            );
        }
        usage
            .reporters
            .insert(reporter.to_owned(), LastReport { seq, at_ms });
        for (key, asked) in demand {
            usage.demand.entry(key.clone()).or_default().insert(
                reporter.to_owned(),
                Demand {
                    asked: *asked,
                    over_ms: interval_ms,
                    at_ms,
                },
            );
        }
        usage.demand.retain(|_, routers| {
            routers.retain(|_, d| d.at_ms + DEMAND_KEPT_MS >= at_ms);
            !routers.is_empty()
        });
        // Forget what the retention no longer covers.
        let oldest_ms = oldest_kept * MINUTE_MS;
        usage.reporters.retain(|_, last| last.at_ms >= oldest_ms);
        for per_day in [&mut usage.daily_tokens, &mut usage.daily_cost] {
            per_day.retain(|_, days| {
                days.retain(|day, _| *day >= oldest_kept / 1_440);
                !days.is_empty()
            });
        }
        usage.minutes.retain(|_, models| {
            models.retain(|_, minutes| {
                minutes.retain(|minute, _| *minute >= oldest_kept);
                !minutes.is_empty()
            });
            !models.is_empty()
        });
        Outcome::Applied
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Outcome, RejectionKind};
    use crate::types::FleetState;
    use crate::usage::{UsageRow, UsageTotals};

    fn row(key: &str, minute: u64, prompt: u64) -> UsageRow {
        UsageRow {
            key: key.into(),
            model: "qwen".into(),
            minute,
            totals: UsageTotals {
                completed: 1,
                prompt_tokens: prompt,
                ..UsageTotals::default()
            },
        }
    }

    fn report(reporter: &str, seq: u64, rows: Vec<UsageRow>, at_minute: u64) -> Command {
        Command::RecordUsage {
            reporter: reporter.into(),
            seq,
            rows,
            retain_minutes: 60,
            demand: Default::default(),
            interval_ms: 0,
            at_ms: at_minute * 60_000,
        }
    }

    #[test]
    fn reports_add_up_once_each_and_age_out() {
        let mut state = FleetState::default();
        assert_eq!(
            state.apply(&report("a", 1, vec![row("ci", 100, 10)], 100)),
            Outcome::Applied
        );
        assert_eq!(
            state.apply(&report("b", 1, vec![row("ci", 100, 5)], 100)),
            Outcome::Applied,
            "another router's first report"
        );
        match state.apply(&report("a", 1, vec![row("ci", 100, 10)], 101)) {
            Outcome::Rejected(r) => assert_eq!(r.kind, RejectionKind::Conflict),
            other => panic!("a report sent again was counted: {other:?}"),
        }
        let totals = state.usage.minutes["ci"]["qwen"][&100];
        assert_eq!((totals.completed, totals.prompt_tokens), (2, 15));
        // An hour and more later the minute is dropped, and router b,
        // silent since, forgotten.
        assert_eq!(
            state.apply(&report("a", 2, vec![row("ci", 170, 1)], 170)),
            Outcome::Applied
        );
        let rows: Vec<_> = state.usage.rows().collect();
        assert_eq!(rows, vec![row("ci", 170, 1)]);
        assert!(!state.usage.reporters.contains_key("b"));
    }

    fn put_priced(state: &mut FleetState, name: &str, price: Option<serde_json::Value>) {
        let mut spec = serde_json::json!({
            "name": name, "endpoints": ["http://10.0.0.9:8000"],
        });
        if let Some(price) = price {
            spec["price"] = price;
        }
        let put = Command::PutModel {
            name: name.into(),
            spec: crate::ModelSpec::from_stored(spec),
            replicas: 0,
            at_ms: 1,
        };
        assert_eq!(state.apply(&put), Outcome::Applied);
    }

    #[test]
    fn usage_is_costed_by_the_models_price_when_applied() {
        let mut state = FleetState::default();
        put_priced(
            &mut state,
            "qwen",
            Some(
                serde_json::json!({"input_per_million": 2.0, "output_per_million": 8.0,
                                    "cached_input_per_million": 0.5}),
            ),
        );
        put_priced(&mut state, "free", None);
        let minute = 20_793 * 1_440 + 60; // 2026-12-06 01:00 UTC
        let mut priced = row("ci", minute, 1_000);
        priced.totals.cached_tokens = 600;
        priced.totals.completion_tokens = 500;
        // A router's own idea of the cost is not taken.
        priced.totals.cost = llmgw_catalog::Usd::from_dollars(1_000.0).unwrap();
        let mut free = row("ci", minute, 1_000_000);
        free.model = "free".into();
        assert_eq!(
            state.apply(&report("a", 1, vec![priced, free], minute)),
            Outcome::Applied
        );
        // 400 x $2/M + 600 x $0.5/M + 500 x $8/M.
        let cost = state.usage.minutes["ci"]["qwen"][&minute].cost;
        assert_eq!(cost, llmgw_catalog::Usd::from_micros(5_100));
        assert!(state.usage.minutes["ci"]["free"][&minute].cost.is_zero());
        let spent = state.usage.spent("ci", minute * 60_000);
        assert_eq!(
            (spent.day_cost.micros, spent.month_cost.micros),
            (5_100, 5_100)
        );
        assert_eq!(spent.day_tokens, 1_000 + 500 + 1_000_000);
        // A price changed later costs later tokens only.
        put_priced(
            &mut state,
            "qwen",
            Some(serde_json::json!({"input_per_million": 4.0, "output_per_million": 8.0})),
        );
        assert_eq!(
            state.apply(&report(
                "a",
                2,
                vec![row("ci", minute + 1, 1_000)],
                minute + 1
            )),
            Outcome::Applied
        );
        let spent = state.usage.spent("ci", (minute + 1) * 60_000);
        assert_eq!(spent.day_cost.micros, 5_100 + 4_000);
    }

    #[test]
    fn minutes_from_the_future_are_refused() {
        let mut state = FleetState::default();
        assert!(matches!(
            state.apply(&report("a", 1, vec![row("ci", 100 + 11, 1)], 100)),
            Outcome::Rejected(_)
        ));
        assert_eq!(
            state.apply(&report("a", 1, vec![row("ci", 100 + 10, 1)], 100)),
            Outcome::Applied,
            "a clock some minutes ahead is fine"
        );
    }

    #[test]
    fn made_up_keys_cannot_grow_usage_without_bound() {
        let mut state = FleetState::default();
        let rows = |from: usize, n: usize| -> Vec<UsageRow> {
            (from..from + n)
                .map(|i| row(&format!("k{i}"), 1, 1))
                .collect()
        };
        let per_report = crate::usage::MAX_USAGE_ROWS;
        let mut seq = 0;
        for start in (0..super::MAX_USAGE_ACCOUNTS).step_by(per_report) {
            seq += 1;
            assert_eq!(
                state.apply(&report("a", seq, rows(start, per_report), 1)),
                Outcome::Applied
            );
        }
        seq += 1;
        assert!(matches!(
            state.apply(&report("a", seq, rows(super::MAX_USAGE_ACCOUNTS, 1), 1)),
            Outcome::Rejected(_)
        ));
        // Known pairs still add up.
        assert_eq!(
            state.apply(&report("a", seq, rows(0, 1), 1)),
            Outcome::Applied
        );
    }

    #[test]
    fn demand_is_kept_a_minute_per_router() {
        let mut state = FleetState::default();
        let with_demand = |seq, asked, at_ms| Command::RecordUsage {
            reporter: "a".into(),
            seq,
            rows: Vec::new(),
            retain_minutes: 60,
            demand: [("ci".to_string(), asked)].into(),
            interval_ms: 5_000,
            at_ms,
        };
        assert_eq!(state.apply(&with_demand(1, 50, 1_000)), Outcome::Applied);
        let seen = state.usage.demand["ci"]["a"];
        assert_eq!((seen.asked, seen.over_ms, seen.at_ms), (50, 5_000, 1_000));
        // Another router's report a minute later forgets a's.
        let other = Command::RecordUsage {
            reporter: "b".into(),
            seq: 1,
            rows: Vec::new(),
            retain_minutes: 60,
            demand: [("ci".to_string(), 0)].into(),
            interval_ms: 5_000,
            at_ms: 61_001,
        };
        assert_eq!(state.apply(&other), Outcome::Applied);
        assert_eq!(state.usage.demand["ci"].keys().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn an_oversized_report_is_refused_whole() {
        let mut state = FleetState::default();
        let rows = vec![row("ci", 1, 1); crate::usage::MAX_USAGE_ROWS + 1];
        assert!(matches!(
            state.apply(&report("a", 1, rows, 1)),
            Outcome::Rejected(_)
        ));
        assert!(state.usage.is_empty());
    }
}
