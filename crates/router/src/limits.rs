//! Per-key limits, held by each router on its own: requests per minute (a
//! token bucket that refills at the per-minute rate, so a key may burst to
//! its whole minute and then goes at the rate) and concurrent requests (a
//! permit held until the answer's body is done or dropped).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use tokio::time::Instant;

use crate::keys::Grant;
use crate::openai::ApiError;
use crate::relay::{BoxError, ResponseBody};

#[derive(Debug, Default)]
pub struct Limiter {
    keys: Mutex<HashMap<String, KeyWindow>>,
    /// Requests over a limit, by (key, limit, shadow).
    over: Mutex<BTreeMap<(String, &'static str, bool), u64>>,
}

#[derive(Debug)]
struct KeyWindow {
    tokens: f64,
    refilled: Instant,
    per_minute: u32,
    in_flight: Arc<AtomicU32>,
}

/// What admitting a request holds: the concurrency permit, and the
/// `x-ratelimit-*` figures to send back.
#[derive(Debug, Default)]
pub struct Admitted {
    permit: Option<Permit>,
    rate: Option<RateHeaders>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct RateHeaders {
    limit: u32,
    remaining: u32,
    /// Until the bucket is full again.
    reset: Duration,
}

/// One request in flight under a key with limits.
#[derive(Debug)]
struct Permit(Arc<AtomicU32>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

const REQUESTS_PER_MINUTE: &str = "requests_per_minute";
const CONCURRENT: &str = "max_concurrent_requests";

impl Limiter {
    /// Admits a request under `grant`'s limits, or says which it is over
    /// and when to try again (a key in shadow mode is admitted and its
    /// would-be refusal counted).
    pub fn admit(&self, grant: &Grant, now: Instant) -> Result<Admitted, ApiError> {
        let limits = grant.limits;
        if limits.is_unlimited() {
            return Ok(Admitted::default());
        }
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let window = keys.entry(grant.name.clone()).or_insert_with(|| KeyWindow {
            tokens: f64::from(limits.requests_per_minute.unwrap_or(0)),
            refilled: now,
            per_minute: limits.requests_per_minute.unwrap_or(0),
            in_flight: Arc::default(),
        });
        let rate = limits.requests_per_minute;
        if let Some(per_minute) = rate {
            window.refill(per_minute, now);
        }
        let in_flight = window.in_flight.load(Ordering::Acquire);
        let over = if rate.is_some() && window.tokens < 1.0 {
            Some(REQUESTS_PER_MINUTE)
        } else if limits
            .max_concurrent_requests
            .is_some_and(|max| in_flight >= max)
        {
            Some(CONCURRENT)
        } else {
            None
        };
        if let Some(limit) = over {
            let mut counts = self.over.lock().unwrap_or_else(|p| p.into_inner());
            *counts
                .entry((grant.name.clone(), limit, limits.shadow))
                .or_default() += 1;
            if !limits.shadow {
                let headers = rate.map(|limit| window.headers(limit));
                return Err(refusal(grant, limit, window, in_flight, headers));
            }
        }
        if window.tokens >= 1.0 {
            window.tokens -= 1.0;
        }
        window.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Admitted {
            permit: Some(Permit(Arc::clone(&window.in_flight))),
            rate: rate.map(|limit| window.headers(limit)),
        })
    }

    /// `llmgw_router_key_limited_total`, for `/metrics`.
    pub fn render(&self, page: &mut String) {
        let counts = self.over.lock().unwrap_or_else(|p| p.into_inner());
        if counts.is_empty() {
            return;
        }
        page.push_str(
            "# HELP llmgw_router_key_limited_total Requests over an API key's limit: refused (mode=\"enforced\") or, for a key in shadow mode, admitted and counted (mode=\"shadow\").\n\
             # TYPE llmgw_router_key_limited_total counter\n",
        );
        // Only control-plane keys have limits, and their names are letters,
        // digits, `-`, `_` and `.`: nothing to escape.
        for ((key, limit, shadow), n) in counts.iter() {
            let mode = if *shadow { "shadow" } else { "enforced" };
            page.push_str(&format!(
                "llmgw_router_key_limited_total{{key=\"{key}\",limit=\"{limit}\",mode=\"{mode}\"}} {n}\n"
            ));
        }
    }
}

impl KeyWindow {
    fn refill(&mut self, per_minute: u32, now: Instant) {
        let per_second = f64::from(per_minute) / 60.0;
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        if self.per_minute != per_minute {
            // A limit just set starts with a full minute; a lowered one
            // keeps no more than it allows.
            self.tokens = if self.per_minute == 0 {
                f64::from(per_minute)
            } else {
                self.tokens.min(f64::from(per_minute))
            };
            self.per_minute = per_minute;
        }
        self.tokens = (self.tokens + elapsed * per_second).min(f64::from(per_minute));
        self.refilled = now;
    }

    fn headers(&self, per_minute: u32) -> RateHeaders {
        let per_second = f64::from(per_minute.max(1)) / 60.0;
        RateHeaders {
            limit: per_minute,
            remaining: self.tokens.max(0.0).floor() as u32,
            reset: Duration::from_secs_f64(
                (f64::from(per_minute) - self.tokens).max(0.0) / per_second,
            ),
        }
    }

    /// Seconds until one more request fits the rate.
    fn next_token_in(&self) -> u64 {
        let per_second = f64::from(self.per_minute.max(1)) / 60.0;
        (((1.0 - self.tokens).max(0.0)) / per_second)
            .ceil()
            .max(1.0) as u64
    }
}

fn refusal(
    grant: &Grant,
    limit: &'static str,
    window: &KeyWindow,
    in_flight: u32,
    headers: Option<RateHeaders>,
) -> ApiError {
    let (message, retry) = if limit == REQUESTS_PER_MINUTE {
        let retry = window.next_token_in();
        (
            format!(
                "Rate limit reached for requests on API key `{}`: limit {} per minute (requests_per_minute). Please try again in {retry}s.",
                grant.name, window.per_minute
            ),
            retry,
        )
    } else {
        (
            format!(
                "Too many concurrent requests on API key `{}`: {in_flight} in flight, limit {} (max_concurrent_requests). Please try again when one finishes.",
                grant.name,
                grant.limits.max_concurrent_requests.unwrap_or(0)
            ),
            1,
        )
    };
    let mut error = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_exceeded",
        message,
    )
    .retry_after(retry);
    error.rate_headers = headers.map(|h| Box::new(h.pairs()));
    error
}

impl RateHeaders {
    fn pairs(self) -> [(&'static str, String); 3] {
        [
            ("x-ratelimit-limit-requests", self.limit.to_string()),
            ("x-ratelimit-remaining-requests", self.remaining.to_string()),
            ("x-ratelimit-reset-requests", duration_text(self.reset)),
        ]
    }
}

/// As OpenAI writes resets: `20ms`, `6s`, `1m30s`.
fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs_f64().ceil() as u64;
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
    }
}

pub(crate) fn insert_rate_headers(headers: &mut HeaderMap, pairs: &[(&'static str, String)]) {
    for (name, value) in pairs {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(*name, value);
        }
    }
}

impl Admitted {
    /// The answer with the `x-ratelimit-*` headers, its body holding the
    /// concurrency permit until it is done or dropped.
    pub fn attach(self, mut response: Response<ResponseBody>) -> Response<ResponseBody> {
        if let Some(rate) = self.rate {
            insert_rate_headers(response.headers_mut(), &rate.pairs());
        }
        match self.permit {
            None => response,
            Some(permit) => response.map(|inner| {
                WithPermit {
                    inner,
                    _permit: permit,
                }
                .boxed_unsync()
            }),
        }
    }
}

struct WithPermit {
    inner: ResponseBody,
    _permit: Permit,
}

impl Body for WithPermit {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
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
    use llmgw_api::keys::KeyLimits;

    fn grant(limits: KeyLimits) -> Grant {
        Grant {
            name: "ci".into(),
            team: String::new(),
            models: Vec::new(),
            limits,
            expires_at_ms: None,
            revoked: false,
        }
    }

    #[test]
    fn a_minute_of_requests_then_the_rate() {
        let limiter = Limiter::default();
        let key = grant(KeyLimits {
            requests_per_minute: Some(60),
            ..KeyLimits::default()
        });
        let start = Instant::now();
        for _ in 0..60 {
            limiter
                .admit(&key, start)
                .expect("within the minute's burst");
        }
        let refused = limiter.admit(&key, start).unwrap_err();
        assert_eq!(refused.status, 429);
        assert_eq!(refused.retry_after_s, Some(1));
        let headers = refused.rate_headers.clone().unwrap();
        assert_eq!(headers[0].1, "60");
        assert_eq!(headers[1].1, "0");
        assert_eq!(headers[2].1, "1m0s");
        // One request a second comes back.
        limiter
            .admit(&key, start + Duration::from_millis(1_001))
            .expect("refilled at 1/s");
        assert!(
            limiter
                .admit(&key, start + Duration::from_millis(1_002))
                .is_err()
        );
        let mut page = String::new();
        limiter.render(&mut page);
        assert!(page.contains(
            "llmgw_router_key_limited_total{key=\"ci\",limit=\"requests_per_minute\",mode=\"enforced\"} 2"
        ), "{page}");
    }

    #[test]
    fn concurrency_is_held_until_the_answer_is_dropped() {
        let limiter = Limiter::default();
        let key = grant(KeyLimits {
            max_concurrent_requests: Some(2),
            ..KeyLimits::default()
        });
        let now = Instant::now();
        let first = limiter.admit(&key, now).unwrap();
        let second = limiter.admit(&key, now).unwrap();
        let refused = limiter.admit(&key, now).unwrap_err();
        assert!(
            refused.message.contains("2 in flight"),
            "{}",
            refused.message
        );
        let answer = first.attach(crate::openai::json_response(StatusCode::OK, "{}".into()));
        drop(answer);
        let third = limiter
            .admit(&key, now)
            .expect("the first answer released its slot");
        drop((second, third));
    }

    #[test]
    fn shadow_mode_counts_and_admits() {
        let limiter = Limiter::default();
        let key = grant(KeyLimits {
            requests_per_minute: Some(1),
            shadow: true,
            ..KeyLimits::default()
        });
        let now = Instant::now();
        for _ in 0..3 {
            limiter
                .admit(&key, now)
                .expect("shadow mode refuses nothing");
        }
        let mut page = String::new();
        limiter.render(&mut page);
        assert!(page.contains("mode=\"shadow\"} 2"), "{page}");
    }

    #[test]
    fn resets_are_written_as_openai_writes_them() {
        assert_eq!(duration_text(Duration::from_millis(20)), "20ms");
        assert_eq!(duration_text(Duration::from_millis(5_200)), "6s");
        assert_eq!(duration_text(Duration::from_secs(90)), "1m30s");
    }
}
