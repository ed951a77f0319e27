//! Routers' usage reports.

use crate::command::{Outcome, Rejection};
use crate::types::FleetState;
use crate::usage::{LastReport, MAX_USAGE_ROWS, UsageRow};

const MINUTE_MS: u64 = 60_000;

impl FleetState {
    pub(super) fn record_usage(
        &mut self,
        reporter: &str,
        seq: u64,
        rows: &[UsageRow],
        retain_minutes: u64,
        at_ms: u64,
    ) -> Outcome {
        if reporter.is_empty() || reporter.len() > 128 {
            return Rejection::invalid("a usage reporter is named with 1 to 128 bytes");
        }
        if rows.len() > MAX_USAGE_ROWS {
            return Rejection::invalid(format!(
                "a usage report carries at most {MAX_USAGE_ROWS} rows, not {}",
                rows.len()
            ));
        }
        let usage = &mut self.usage;
        if let Some(last) = usage.reporters.get(reporter)
            && last.seq >= seq
        {
            return Rejection::conflict(format!(
                "usage report {seq} of {reporter} is already counted (last: {})",
                last.seq
            ));
        }
        let oldest_kept = (at_ms / MINUTE_MS).saturating_sub(retain_minutes);
        for row in rows.iter().filter(|row| row.minute >= oldest_kept) {
            usage
                .minutes
                .entry(row.key.clone())
                .or_default()
                .entry(row.model.clone())
                .or_default()
                .entry(row.minute)
                .or_default()
                .add(&row.totals);
        }
        usage
            .reporters
            .insert(reporter.to_owned(), LastReport { seq, at_ms });
        // Forget what the retention no longer covers.
        let oldest_ms = oldest_kept * MINUTE_MS;
        usage.reporters.retain(|_, last| last.at_ms >= oldest_ms);
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
