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
    ) -> Metered {
        Metered {
            inner: body,
            inner_done: false,
            strip: None,
            meter: Meter {
                ledger: Arc::clone(self),
                account: Account {
                    key: key.to_owned(),
                    team: team.to_owned(),
                    model: model.to_owned(),
                },
                failed: status >= 400,
                charge: None,
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

pub struct Metered {
    inner: ResponseBody,
    /// The inner body has ended (it is not polled again).
    inner_done: bool,
    /// Set when the router asked for usage the client did not.
    strip: Option<UsageStripper>,
    meter: Meter,
}

impl Metered {
    /// Charges the answer's tokens to the key's per-minute token limit.
    pub fn charging(mut self, limiter: Option<Arc<crate::limits::Limiter>>) -> Self {
        self.meter.charge = limiter;
        self
    }

    /// The router asked the engine for usage the client did not ask for:
    /// the usage event is read and kept from the client.
    pub fn stripping_usage(mut self, strip: bool) -> Self {
        self.strip = strip.then(UsageStripper::default);
        self
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.inner_done {
                let rest = this.strip.as_mut().map(UsageStripper::finish);
                return Poll::Ready(rest.filter(|r| !r.is_empty()).map(|r| Ok(Frame::data(r))));
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    this.meter.ended = true;
                    this.inner_done = true;
                    continue;
                }
                Poll::Ready(Some(Err(error))) => {
                    this.meter.failed = true;
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Pending => return Poll::Pending,
            };
            if let Some(data) = frame.data_ref() {
                this.meter.observe(data);
            }
            // The client's side may stop at the last frame without asking
            // for the end.
            if this.inner.is_end_stream() {
                this.meter.ended = true;
                this.inner_done = true;
            }
            let Some(strip) = this.strip.as_mut() else {
                return Poll::Ready(Some(Ok(frame)));
            };
            let mut passed = match frame.into_data() {
                Ok(data) => strip.pass(&data),
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            if this.inner_done {
                let rest = strip.finish();
                if !rest.is_empty() {
                    let mut joined = Vec::with_capacity(passed.len() + rest.len());
                    joined.extend_from_slice(&passed);
                    joined.extend_from_slice(&rest);
                    passed = Bytes::from(joined);
                }
            }
            if !passed.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(passed))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner_done && self.strip.as_ref().is_none_or(|s| s.partial.is_empty())
            || (self.strip.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.strip.is_some() {
            return SizeHint::default();
        }
        self.inner.size_hint()
    }
}

/// The request with `stream_options.include_usage` set, for a stream whose
/// client did not ask for usage; `None` when it did (or the body is not a
/// JSON object, which the engine refuses on its own).
pub(crate) fn ask_for_usage(body: &[u8]) -> Option<Bytes> {
    let mut request: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).ok()?;
    let options = request
        .entry("stream_options")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    let serde_json::Value::Object(options) = options else {
        return None;
    };
    if options.get("include_usage") == Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&request).ok().map(Bytes::from)
}

/// Takes the usage event the client did not ask for out of a stream:
/// complete events pass at once, a partial one waits for its end. Engines
/// end events with a blank line (`\n\n`).
#[derive(Default)]
struct UsageStripper {
    partial: Vec<u8>,
}

static EVENT_END: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\n\n"));
static USAGE_OBJECT: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"usage\":{"));
static NO_CHOICES: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"choices\":[]"));

impl UsageStripper {
    /// What of `data` goes to the client now.
    fn pass(&mut self, data: &[u8]) -> Bytes {
        self.partial.extend_from_slice(data);
        let Some(end) = memmem::rfind(&self.partial, b"\n\n") else {
            return Bytes::new();
        };
        let rest = self.partial.split_off(end + 2);
        let complete = std::mem::replace(&mut self.partial, rest);
        if USAGE_OBJECT.find(&complete).is_none() {
            return Bytes::from(complete);
        }
        let mut out = Vec::with_capacity(complete.len());
        let mut start = 0;
        for at in EVENT_END.find_iter(&complete) {
            let event = &complete[start..at + 2];
            if !is_usage_event(event) {
                out.extend_from_slice(event);
            }
            start = at + 2;
        }
        Bytes::from(out)
    }

    /// What is left once the stream ended (an event without its blank
    /// line), passed as it is.
    fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.partial))
    }
}

/// `data: {...,"choices":[],...,"usage":{...}}`: the usage chunk.
fn is_usage_event(event: &[u8]) -> bool {
    event.starts_with(b"data: {")
        && NO_CHOICES.find(event).is_some()
        && USAGE_OBJECT.find(event).is_some()
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
        let metered = ledger.meter("ci", "search", "qwen", 200, body(&[head, rest]));
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
            .meter("ci", "", "qwen", 200, body(&events))
            .collect()
            .await
            .unwrap();
        // The client reads two events and goes away.
        let mut cut = ledger.meter("ci", "", "qwen", 200, body(&events));
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

    #[tokio::test]
    async fn usage_the_client_did_not_ask_for_is_counted_and_kept_from_it() {
        let ledger = Arc::new(UsageLedger::default());
        let stream = [
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"cho",
            "ices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
            "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
        ];
        let seen = ledger
            .meter("ci", "", "qwen", 200, body(&stream))
            .stripping_usage(true)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(
            String::from_utf8_lossy(&seen),
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
             data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n\
             data: [DONE]\n\n"
        );
        let text = page(&ledger);
        assert!(text.contains("kind=\"prompt\"} 7"), "{text}");
        assert!(text.contains("kind=\"completion\"} 2"), "{text}");
        assert!(
            text.contains("estimated_requests_total{key=\"ci\",team=\"\",model=\"qwen\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn usage_is_asked_for_unless_the_client_did() {
        let asked = ask_for_usage(
            br#"{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}"#,
        )
        .unwrap();
        let asked: serde_json::Value = serde_json::from_slice(&asked).unwrap();
        assert_eq!(asked["stream_options"]["include_usage"], true);
        assert_eq!(asked["stream_options"]["continuous_usage_stats"], false);
        assert_eq!(
            ask_for_usage(br#"{"stream_options":{"include_usage":true}}"#),
            None
        );
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
