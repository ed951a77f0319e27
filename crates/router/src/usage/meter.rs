//! Reading an answer as it passes: the tail where its `usage` is, the
//! events relayed, how it ended; charged to the key when the body is done
//! or dropped.

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use memchr::memmem;
use serde::Deserialize;

use super::strip::UsageStripper;
use super::{Account, Ended, Outcome, UsageLedger};
use crate::relay::{BoxError, ResponseBody};

/// How much of an answer's end is kept to find its `usage`: past the
/// usage object a vLLM answer has only a few short fields (unless prompt
/// log-probabilities were asked for, and then the count is estimated).
const TAIL_BYTES: usize = 16 * 1024;

/// The engine's `usage` object, as vLLM and SGLang write it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) struct Reported {
    #[serde(default)]
    pub(super) prompt_tokens: u64,
    #[serde(default)]
    pub(super) completion_tokens: u64,
    #[serde(default)]
    pub(super) prompt_tokens_details: Option<Details>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) struct Details {
    #[serde(default)]
    pub(super) cached_tokens: Option<u64>,
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
pub(super) fn last_usage(text: &[u8]) -> Option<Reported> {
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
