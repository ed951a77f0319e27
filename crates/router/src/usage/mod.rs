//! What each key used, per model: requests by how they ended, and tokens
//! as the engine reported them in the answer's `usage` (a non-streamed
//! answer always has it; a stream has it when the client asked with
//! `stream_options.include_usage`). A stream without it is counted from
//! the events relayed to the client and marked estimated.
//!
//! Only requests made with a key are metered: the answer's body is wrapped
//! and read as it passes, and what it held is recorded when the body is
//! done or dropped.

mod meter;
mod report;
mod strip;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Mutex;

use llmgw_api::usage::{UsageRow, UsageTotals};

use meter::Reported;
pub(crate) use report::report_loop;
pub use report::{REPORT_EVERY, UsageSink, reporter_name};
pub(crate) use strip::ask_for_usage;

#[derive(Debug, Default)]
pub struct UsageLedger {
    by_key: Mutex<BTreeMap<Account, UsageTotals>>,
    /// What is not yet reported to the control plane, by key, model and
    /// minute.
    pending: Mutex<BTreeMap<(String, String, u64), UsageTotals>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Account {
    key: String,
    team: String,
    model: String,
}

impl UsageLedger {
    fn record(&self, account: Account, outcome: Outcome) {
        let mut charged = UsageTotals::default();
        match outcome.ended {
            Ended::Completed => charged.completed = 1,
            Ended::Cancelled => charged.cancelled = 1,
            Ended::Failed => charged.failed = 1,
        }
        match outcome.usage {
            Some(usage) => {
                charged.prompt_tokens = usage.prompt_tokens;
                charged.completion_tokens = usage.completion_tokens;
                charged.cached_tokens = usage
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0);
            }
            None if outcome.ended != Ended::Failed => {
                charged.estimated = 1;
                charged.completion_tokens = outcome.relayed_events;
            }
            None => {}
        }
        let minute = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 60);
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((account.key.clone(), account.model.clone(), minute))
            .or_default()
            .add(&charged);
        self.by_key
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(account)
            .or_default()
            .add(&charged);
    }

    /// What was charged since the last call, as report rows.
    pub(crate) fn take_pending(&self) -> Vec<UsageRow> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        pending
            .into_iter()
            .map(|((key, model, minute), totals)| UsageRow {
                key,
                model,
                minute,
                totals,
            })
            .collect()
    }

    /// The per-key series, for `/metrics`. Their labels are bounded by the
    /// keys and models an operator configured.
    pub fn render(&self, page: &mut String) {
        let ledger = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        if ledger.is_empty() {
            return;
        }
        page.push_str(
            "# HELP llmgw_router_key_requests_total Requests made with an API key, by how they ended.\n\
             # TYPE llmgw_router_key_requests_total counter\n",
        );
        for (account, totals) in ledger.iter() {
            for (outcome, n) in [
                ("completed", totals.completed),
                ("cancelled", totals.cancelled),
                ("failed", totals.failed),
            ] {
                if n > 0 {
                    page.push_str(&format!(
                        "llmgw_router_key_requests_total{{{},outcome=\"{outcome}\"}} {n}\n",
                        account.labels()
                    ));
                }
            }
        }
        page.push_str(
            "# HELP llmgw_router_key_tokens_total Tokens used with an API key: prompt, completion, and the prompt tokens the engine found cached.\n\
             # TYPE llmgw_router_key_tokens_total counter\n",
        );
        for (account, totals) in ledger.iter() {
            for (kind, n) in [
                ("prompt", totals.prompt_tokens),
                ("completion", totals.completion_tokens),
                ("cached", totals.cached_tokens),
            ] {
                page.push_str(&format!(
                    "llmgw_router_key_tokens_total{{{},kind=\"{kind}\"}} {n}\n",
                    account.labels()
                ));
            }
        }
        page.push_str(
            "# HELP llmgw_router_key_estimated_requests_total Requests whose engine reported no usage (a stream without stream_options.include_usage): completion tokens counted from the events relayed.\n\
             # TYPE llmgw_router_key_estimated_requests_total counter\n",
        );
        for (account, totals) in ledger.iter() {
            page.push_str(&format!(
                "llmgw_router_key_estimated_requests_total{{{}}} {}\n",
                account.labels(),
                totals.estimated
            ));
        }
    }
}

impl Account {
    fn labels(&self) -> String {
        format!(
            "key=\"{}\",team=\"{}\",model=\"{}\"",
            escape(&self.key),
            escape(&self.team),
            escape(&self.model)
        )
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Completed,
    Cancelled,
    Failed,
}

struct Outcome {
    ended: Ended,
    usage: Option<Reported>,
    relayed_events: u64,
}
