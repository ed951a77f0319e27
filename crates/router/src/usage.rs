//! What each key used, per model: requests by how they ended, and tokens
//! as the engine reported them in the answer's `usage` (a non-streamed
//! answer always has it; a stream has it when the client asked with
//! `stream_options.include_usage`). A stream without it is counted from
//! the events relayed to the client and marked estimated.
//!
//! Only requests made with a key are metered: the answer's body is wrapped
//! and read as it passes, and what it held is recorded when the body is
//! done or dropped.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use memchr::memmem;
use serde::Deserialize;

use llmgw_api::usage::{UsageReport, UsageRow, UsageTotals};

use crate::relay::{BoxError, ResponseBody};

/// How much of an answer's end is kept to find its `usage`: past the
/// usage object a vLLM answer has only a few short fields (unless prompt
/// log-probabilities were asked for, and then the count is estimated).
const TAIL_BYTES: usize = 16 * 1024;

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

/// The engine's `usage` object, as vLLM and SGLang write it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
struct Reported {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl UsageLedger {
    /// Wraps `body` so that what it carries is recorded for the account.
    pub fn meter(
        self: &Arc<Self>,
        key: &str,
        team: &str,
        model: &str,
        status: u16,
        body: ResponseBody,
        charge: Option<Arc<crate::limits::Limiter>>,
    ) -> Metered {
        Metered {
            inner: body,
            meter: Meter {
                ledger: Arc::clone(self),
                account: Account {
                    key: key.to_owned(),
                    team: team.to_owned(),
                    model: model.to_owned(),
                },
                failed: status >= 400,
                charge,
                ended: false,
                events: 0,
                tail: Vec::new(),
            },
        }
    }

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

struct Meter {
    ledger: Arc<UsageLedger>,
    account: Account,
    failed: bool,
    /// Where the tokens are charged against the key's per-minute limit.
    charge: Option<Arc<crate::limits::Limiter>>,
    ended: bool,
    /// Server-sent events carrying a choice's delta, as relayed.
    events: u64,
    tail: Vec<u8>,
}

impl Meter {
    fn observe(&mut self, data: &[u8]) {
        // Searchers built once: building one costs more than a search.
        static DELTA: LazyLock<memmem::Finder<'static>> =
            LazyLock::new(|| memmem::Finder::new(b"\"delta\""));
        static TEXT: LazyLock<memmem::Finder<'static>> =
            LazyLock::new(|| memmem::Finder::new(b"\"text\""));
        self.events += (DELTA.find_iter(data).count() + TEXT.find_iter(data).count()) as u64;
        if data.len() >= TAIL_BYTES {
            self.tail.clear();
            self.tail
                .extend_from_slice(&data[data.len() - TAIL_BYTES..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(TAIL_BYTES);
        if overflow > 0 {
            self.tail.drain(..overflow);
        }
        self.tail.extend_from_slice(data);
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let ended = if self.failed {
            Ended::Failed
        } else if self.ended {
            Ended::Completed
        } else {
            Ended::Cancelled
        };
        let outcome = Outcome {
            ended,
            usage: last_usage(&self.tail),
            relayed_events: self.events,
        };
        if let Some(limiter) = &self.charge {
            let tokens = match outcome.usage {
                Some(usage) => usage.prompt_tokens + usage.completion_tokens,
                None => outcome.relayed_events,
            };
            limiter.charge(&self.account.key, tokens);
        }
        self.ledger
            .record(std::mem::take(&mut self.account), outcome);
    }
}

/// The last non-null `"usage":{...}` object in `text`.
fn last_usage(text: &[u8]) -> Option<Reported> {
    static USAGE: LazyLock<memmem::FinderRev<'static>> =
        LazyLock::new(|| memmem::FinderRev::new(b"\"usage\":"));
    let needle = USAGE.needle();
    let mut end = text.len();
    while let Some(at) = USAGE.rfind(&text[..end]) {
        let rest = &text[at + needle.len()..];
        let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
        if rest[start] == b'{' {
            // The usage object holds numbers and one nested object, no
            // strings: its end is where the braces balance.
            let mut depth = 0usize;
            for (i, byte) in rest[start..].iter().enumerate() {
                match byte {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            return serde_json::from_slice(&rest[start..start + i + 1]).ok();
                        }
                    }
                    _ => {}
                }
            }
            return None;
        }
        end = at;
    }
    None
}

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

/// How often a router reports. A report is one Raft log entry.
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

pub struct Metered {
    inner: ResponseBody,
    meter: Meter,
}

impl Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.meter.observe(data);
                }
                // The client's side may stop at the last frame without
                // asking for the end.
                if this.inner.is_end_stream() {
                    this.meter.ended = true;
                }
            }
            Poll::Ready(None) => this.meter.ended = true,
            Poll::Ready(Some(Err(_))) => this.meter.failed = true,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body that yields `chunks`, one frame each.
    struct Chunks(std::collections::VecDeque<&'static str>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))),
            )
        }
    }

    fn body(chunks: &[&'static str]) -> ResponseBody {
        Chunks(chunks.iter().copied().collect()).boxed_unsync()
    }

    fn page(ledger: &UsageLedger) -> String {
        let mut page = String::new();
        ledger.render(&mut page);
        page
    }

    #[tokio::test]
    async fn a_whole_answer_is_charged_what_the_engine_reported() {
        let ledger = Arc::new(UsageLedger::default());
        let answer = r#"{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}},"kv_transfer_params":null}"#;
        let (head, rest) = answer.split_at(40);
        let metered = ledger.meter("ci", "search", "qwen", 200, body(&[head, rest]), None);
        metered.collect().await.unwrap();
        let text = page(&ledger);
        for line in [
            "llmgw_router_key_requests_total{key=\"ci\",team=\"search\",model=\"qwen\",outcome=\"completed\"} 1",
            "llmgw_router_key_tokens_total{key=\"ci\",team=\"search\",model=\"qwen\",kind=\"prompt\"} 12",
            "llmgw_router_key_tokens_total{key=\"ci\",team=\"search\",model=\"qwen\",kind=\"completion\"} 5",
            "llmgw_router_key_tokens_total{key=\"ci\",team=\"search\",model=\"qwen\",kind=\"cached\"} 8",
            "llmgw_router_key_estimated_requests_total{key=\"ci\",team=\"search\",model=\"qwen\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[tokio::test]
    async fn a_stream_without_usage_is_estimated_and_a_cancelled_one_counted() {
        let ledger = Arc::new(UsageLedger::default());
        let events = [
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
            "data: [DONE]\n\n",
        ];
        ledger
            .meter("ci", "", "qwen", 200, body(&events), None)
            .collect()
            .await
            .unwrap();
        // The client reads two events and goes away.
        let mut cut = ledger.meter("ci", "", "qwen", 200, body(&events), None);
        for _ in 0..2 {
            cut.frame().await.unwrap().unwrap();
        }
        drop(cut);
        let text = page(&ledger);
        assert!(text.contains("outcome=\"completed\"} 1"), "{text}");
        assert!(text.contains("outcome=\"cancelled\"} 1"), "{text}");
        assert!(
            text.contains(
                "llmgw_router_key_estimated_requests_total{key=\"ci\",team=\"\",model=\"qwen\"} 2"
            ),
            "{text}"
        );
        // 3 delta events relayed whole, 2 of the cancelled one.
        assert!(text.contains("kind=\"completion\"} 5"), "{text}");
    }

    #[test]
    fn the_last_usage_wins_and_null_is_passed_over() {
        let text = br#"data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}

data: {"usage":{"prompt_tokens":9,"completion_tokens":4}}

data: {"usage":null}

data: [DONE]"#;
        let usage = last_usage(text).unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (9, 4));
        assert_eq!(last_usage(b"{\"usage\":null}"), None);
    }
}
