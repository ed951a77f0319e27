//! Per-key limits, held by each router on its own: requests per minute and
//! tokens per minute (token buckets that hold a minute's worth and refill
//! at the per-minute rate, so a key may burst to its whole minute and then
//! goes at the rate), concurrent requests (a permit held until the
//! answer's body is done or dropped), and token budgets per UTC day and
//! month (checked against the fleet-wide spend the control plane keeps).
//!
//! Tokens are charged when the answer is over, from the usage the engine
//! reported: a request is admitted while its key's token bucket is not
//! empty, and may take it below zero, which later requests then wait out.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use tokio::time::Instant;

use crate::keys::Grant;
use crate::openai::ApiError;
use crate::relay::ResponseBody;

#[derive(Debug, Default)]
pub struct Limiter {
    keys: Mutex<HashMap<String, KeyWindow>>,
    /// Requests over a limit, by (key, limit, shadow).
    over: Mutex<BTreeMap<(String, &'static str, bool), u64>>,
    /// The name this router reports under: its share of each key's
    /// per-minute limits is found by it.
    reporter: std::sync::OnceLock<String>,
    /// Requests asked for per key with per-minute limits since the last
    /// report, admitted or not.
    asked: Mutex<BTreeMap<String, u64>>,
}

#[derive(Debug, Default)]
struct KeyWindow {
    requests: Bucket,
    tokens: Bucket,
    in_flight: Arc<AtomicU32>,
}

/// A minute's worth of something, refilled at the per-minute rate.
#[derive(Debug, Default)]
struct Bucket {
    level: f64,
    refilled: Option<Instant>,
    per_minute: u32,
}

impl Bucket {
    fn refill(&mut self, per_minute: u32, now: Instant) {
        if self.per_minute != per_minute {
            // A limit just set starts with a full minute; a lowered one
            // keeps no more than it allows.
            self.level = if self.per_minute == 0 {
                f64::from(per_minute)
            } else {
                self.level.min(f64::from(per_minute))
            };
            self.per_minute = per_minute;
        }
        let elapsed = self
            .refilled
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        self.level = (self.level + elapsed * self.per_second()).min(f64::from(per_minute));
        self.refilled = Some(now);
    }

    fn per_second(&self) -> f64 {
        f64::from(self.per_minute.max(1)) / 60.0
    }

    /// Seconds until the level reaches `level`.
    fn seconds_until(&self, level: f64) -> u64 {
        ((level - self.level).max(0.0) / self.per_second())
            .ceil()
            .max(1.0) as u64
    }

    /// `x-ratelimit-{limit,remaining,reset}-{what}`.
    fn headers(&self, what: &str, into: &mut Vec<(&'static str, String)>) {
        let (limit, remaining, reset) = match what {
            "requests" => (
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ),
            _ => (
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ),
        };
        into.push((limit, self.per_minute.to_string()));
        into.push((remaining, (self.level.max(0.0).floor() as u64).to_string()));
        into.push((
            reset,
            duration_text(Duration::from_secs_f64(
                (f64::from(self.per_minute) - self.level).max(0.0) / self.per_second(),
            )),
        ));
    }
}

/// What admitting a request holds: the concurrency permit, and the
/// `x-ratelimit-*` headers to send back.
#[derive(Debug, Default)]
pub struct Admitted {
    permit: Option<Permit>,
    headers: Vec<(&'static str, String)>,
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
const TOKENS_PER_MINUTE: &str = "tokens_per_minute";
const CONCURRENT: &str = "max_concurrent_requests";
const TOKENS_PER_DAY: &str = "tokens_per_day";
const TOKENS_PER_MONTH: &str = "tokens_per_month";
const USD_PER_DAY: &str = "usd_per_day";
const USD_PER_MONTH: &str = "usd_per_month";

/// Why a request is over a limit, and what to tell the client.
struct Over {
    limit: &'static str,
    code: &'static str,
    message: String,
    retry_after_s: u64,
}

impl Limiter {
    /// Admits a request under `grant`'s limits, or says which it is over
    /// and when to try again (a key in shadow mode is admitted and its
    /// would-be refusal counted). `now_ms`: the wall clock, for budgets.
    pub fn admit(&self, grant: &Grant, now: Instant, now_ms: u64) -> Result<Admitted, ApiError> {
        let limits = grant.limits;
        if limits.is_unlimited() {
            return Ok(Admitted::default());
        }
        let share = self.share_of(grant);
        if limits.has_per_minute() {
            let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
            match asked.get_mut(&grant.name) {
                Some(n) => *n += 1,
                None => {
                    asked.insert(grant.name.clone(), 1);
                }
            }
        }
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if !keys.contains_key(&grant.name) {
            keys.insert(grant.name.clone(), KeyWindow::default());
        }
        let window = keys.get_mut(&grant.name).expect("inserted above");
        if let Some(per_minute) = limits.requests_per_minute {
            window.requests.refill(share.of(per_minute), now);
        }
        if let Some(per_minute) = limits.tokens_per_minute {
            window.tokens.refill(share.of(per_minute), now);
        }
        let mut headers = Vec::new();
        if limits.requests_per_minute.is_some() {
            window.requests.headers("requests", &mut headers);
        }
        if limits.tokens_per_minute.is_some() {
            window.tokens.headers("tokens", &mut headers);
        }
        if let Some(over) = over_a_limit(grant, window, share, now_ms) {
            let mut counts = self.over.lock().unwrap_or_else(|p| p.into_inner());
            *counts
                .entry((grant.name.clone(), over.limit, limits.shadow))
                .or_default() += 1;
            if !limits.shadow {
                let mut error =
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, over.code, over.message)
                        .retry_after(over.retry_after_s);
                error.rate_headers = (!headers.is_empty()).then(|| headers.into_boxed_slice());
                return Err(error);
            }
        }
        if limits.requests_per_minute.is_some() {
            window.requests.level = (window.requests.level - 1.0).max(0.0);
        }
        window.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Admitted {
            permit: Some(Permit(Arc::clone(&window.in_flight))),
            headers,
        })
    }

    /// Names the router's reports; its share of each key's per-minute
    /// limits is looked up by it.
    pub fn set_reporter(&self, name: &str) {
        let _ = self.reporter.set(name.to_owned());
    }

    /// This router's part of `grant`'s per-minute limits: its share as the
    /// control plane computed it; before any router reported for the key,
    /// all of it; a router not among those that reported, an even part as
    /// if it were one more.
    fn share_of(&self, grant: &Grant) -> Share {
        if grant.shares.is_empty() {
            return Share(1.0);
        }
        let mine = self.reporter.get().and_then(|me| grant.shares.get(me));
        Share(
            mine.copied()
                .unwrap_or(1.0 / (grant.shares.len() as f64 + 1.0)),
        )
    }

    /// Requests asked for per key with per-minute limits since the last
    /// call.
    pub(crate) fn take_demand(&self) -> BTreeMap<String, u64> {
        std::mem::take(&mut *self.asked.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Charges `tokens` (prompt and completion) to the key's per-minute
    /// token bucket once its answer is over. The bucket may go below zero,
    /// by at most a minute's worth.
    pub fn charge(&self, key: &str, tokens: u64) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(window) = keys.get_mut(key)
            && window.tokens.per_minute > 0
        {
            let floor = -f64::from(window.tokens.per_minute);
            window.tokens.level = (window.tokens.level - tokens as f64).max(floor);
        }
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

/// A router's part of a key's per-minute limits, 0 to 1.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Share(f64);

impl Share {
    /// This router's part of `limit`: at least one, rounded up.
    fn of(self, limit: u32) -> u32 {
        ((f64::from(limit) * self.0).ceil() as u32).clamp(1, limit.max(1))
    }

    /// `` (all of it), or ` on this router (its 90% share of the key's
    /// 600)`.
    fn words(self, limit: u32) -> String {
        if self.0 >= 1.0 {
            String::new()
        } else {
            format!(
                " on this router (its {:.0}% share of the key's {limit}, which follows each router's traffic)",
                self.0 * 100.0
            )
        }
    }
}

/// The first limit the request is over, if any.
fn over_a_limit(grant: &Grant, window: &KeyWindow, share: Share, now_ms: u64) -> Option<Over> {
    let limits = grant.limits;
    let name = &grant.name;
    if let Some(per_minute) = limits.requests_per_minute
        && window.requests.level < 1.0
    {
        let retry = window.requests.seconds_until(1.0);
        return Some(Over {
            limit: REQUESTS_PER_MINUTE,
            code: "rate_limit_exceeded",
            message: format!(
                "Rate limit reached for requests on API key `{name}`: limit {} per minute{} (requests_per_minute). Please try again in {retry}s.",
                share.of(per_minute),
                share.words(per_minute)
            ),
            retry_after_s: retry,
        });
    }
    if let Some(per_minute) = limits.tokens_per_minute
        && window.tokens.level <= 0.0
    {
        let retry = window.tokens.seconds_until(1.0);
        return Some(Over {
            limit: TOKENS_PER_MINUTE,
            code: "rate_limit_exceeded",
            message: format!(
                "Rate limit reached for tokens on API key `{name}`: limit {} per minute{} (tokens_per_minute). Please try again in {retry}s.",
                share.of(per_minute),
                share.words(per_minute)
            ),
            retry_after_s: retry,
        });
    }
    let in_flight = window.in_flight.load(Ordering::Acquire);
    if let Some(max) = limits.max_concurrent_requests
        && in_flight >= max
    {
        return Some(Over {
            limit: CONCURRENT,
            code: "rate_limit_exceeded",
            message: format!(
                "Too many concurrent requests on API key `{name}`: {in_flight} in flight, limit {max} (max_concurrent_requests). Please try again when one finishes."
            ),
            retry_after_s: 1,
        });
    }
    let renewals = llmgw_api::usage::renewals(now_ms);
    let spent = &grant.spent;
    const TOKENS: &str = " tokens";
    const BY_PRICE: &str = " by the models' prices";
    for (limit, reached, period, renews_in) in [
        (
            TOKENS_PER_DAY,
            reached(limits.tokens_per_day, spent.day_tokens, TOKENS),
            "today",
            renewals.day_s,
        ),
        (
            TOKENS_PER_MONTH,
            reached(limits.tokens_per_month, spent.month_tokens, TOKENS),
            "this month",
            renewals.month_s,
        ),
        (
            USD_PER_DAY,
            reached(limits.usd_per_day, spent.day_cost, BY_PRICE),
            "today",
            renewals.day_s,
        ),
        (
            USD_PER_MONTH,
            reached(limits.usd_per_month, spent.month_cost, BY_PRICE),
            "this month",
            renewals.month_s,
        ),
    ] {
        if let Some(amounts) = reached {
            return Some(Over {
                limit,
                code: "insufficient_quota",
                message: format!(
                    "API key `{name}` has used its budget for {period}: {amounts} ({limit}). It renews in {}.",
                    duration_text(Duration::from_secs(renews_in))
                ),
                retry_after_s: renews_in.max(1),
            });
        }
    }
    None
}

/// `spent of budget` and the unit, once a budget is set and spent.
fn reached<T: PartialOrd + std::fmt::Display>(
    budget: Option<T>,
    spent: T,
    unit: &str,
) -> Option<String> {
    let budget = budget?;
    (spent >= budget).then(|| format!("{spent} of {budget}{unit}"))
}

/// As OpenAI writes resets: `20ms`, `6s`, `1m30s`; longer ones `3h12m0s`.
fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs_f64().ceil() as u64;
    match s {
        s if s < 60 => format!("{s}s"),
        s if s < 3_600 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{}h{}m{}s", s / 3_600, (s % 3_600) / 60, s % 60),
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
        insert_rate_headers(response.headers_mut(), &self.headers);
        match self.permit {
            None => response,
            Some(permit) => crate::relay::holding(response, permit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmgw_api::keys::KeyLimits;
    use llmgw_api::usage::KeySpend as Spent;

    fn grant(limits: KeyLimits) -> Grant {
        Grant {
            name: "ci".into(),
            team: String::new(),
            models: Vec::new(),
            limits,
            expires_at_ms: None,
            revoked: false,
            spent: Spent::default(),
            shares: Default::default(),
        }
    }

    fn header<'a>(error: &'a ApiError, name: &str) -> &'a str {
        error
            .rate_headers
            .as_ref()
            .and_then(|h| h.iter().find(|(n, _)| *n == name))
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name}"))
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
                .admit(&key, start, 0)
                .expect("within the minute's burst");
        }
        let refused = limiter.admit(&key, start, 0).unwrap_err();
        assert_eq!(refused.status, 429);
        assert_eq!(refused.retry_after_s, Some(1));
        assert_eq!(header(&refused, "x-ratelimit-limit-requests"), "60");
        assert_eq!(header(&refused, "x-ratelimit-remaining-requests"), "0");
        assert_eq!(header(&refused, "x-ratelimit-reset-requests"), "1m0s");
        // One request a second comes back.
        limiter
            .admit(&key, start + Duration::from_millis(1_001), 0)
            .expect("refilled at 1/s");
        assert!(
            limiter
                .admit(&key, start + Duration::from_millis(1_002), 0)
                .is_err()
        );
        let mut page = String::new();
        limiter.render(&mut page);
        assert!(
            page.contains(
                "llmgw_router_key_limited_total{key=\"ci\",limit=\"requests_per_minute\",mode=\"enforced\"} 2"
            ),
            "{page}"
        );
    }

    #[test]
    fn tokens_are_charged_after_the_answer_and_waited_out() {
        let limiter = Limiter::default();
        let key = grant(KeyLimits {
            tokens_per_minute: Some(600),
            ..KeyLimits::default()
        });
        let start = Instant::now();
        drop(
            limiter
                .admit(&key, start, 0)
                .expect("a full minute of tokens"),
        );
        // A large answer takes the bucket below zero.
        limiter.charge("ci", 900);
        let refused = limiter.admit(&key, start, 0).unwrap_err();
        assert!(
            refused.message.contains("tokens_per_minute"),
            "{}",
            refused.message
        );
        // 300 tokens of debt at 10 a second: 30 s.
        assert_eq!(refused.retry_after_s, Some(31));
        limiter
            .admit(&key, start + Duration::from_secs(31), 0)
            .expect("the debt is paid off");
    }

    #[test]
    fn budgets_refuse_until_the_day_or_month_renews() {
        let limiter = Limiter::default();
        let mut key = grant(KeyLimits {
            tokens_per_day: Some(1_000),
            tokens_per_month: Some(100_000),
            ..KeyLimits::default()
        });
        key.spent = Spent {
            day_tokens: 999,
            month_tokens: 5_000,
            ..Spent::default()
        };
        // 2026-12-06 23:00 UTC.
        let now_ms = (20_793 * 86_400 + 23 * 3_600) * 1_000;
        limiter
            .admit(&key, Instant::now(), now_ms)
            .expect("under the day's budget");
        key.spent.day_tokens = 1_000;
        let refused = limiter.admit(&key, Instant::now(), now_ms).unwrap_err();
        assert_eq!(refused.code, "insufficient_quota");
        assert_eq!(refused.retry_after_s, Some(3_600));
        assert!(
            refused.message.contains("1000 of 1000 tokens"),
            "{}",
            refused.message
        );
        key.spent.day_tokens = 0;
        key.spent.month_tokens = 100_000;
        let refused = limiter.admit(&key, Instant::now(), now_ms).unwrap_err();
        assert!(
            refused.message.contains("this month"),
            "{}",
            refused.message
        );
        // 2027-01-01 00:00 UTC is 25 days and an hour away.
        assert_eq!(refused.retry_after_s, Some(25 * 86_400 + 3_600));
    }

    #[test]
    fn money_budgets_refuse_once_spent_by_the_models_prices() {
        use llmgw_catalog::Usd;
        let limiter = Limiter::default();
        let mut key = grant(KeyLimits {
            usd_per_day: Usd::from_dollars(5.0),
            usd_per_month: Usd::from_dollars(100.0),
            ..KeyLimits::default()
        });
        key.spent.day_cost = Usd::from_dollars(4.99).unwrap();
        let now_ms = (20_793 * 86_400 + 23 * 3_600) * 1_000;
        limiter
            .admit(&key, Instant::now(), now_ms)
            .expect("under the day's budget");
        key.spent.day_cost = Usd::from_dollars(5.000_001).unwrap();
        let refused = limiter.admit(&key, Instant::now(), now_ms).unwrap_err();
        assert_eq!(refused.code, "insufficient_quota");
        assert!(
            refused.message.contains("$5.000001 of $5.00")
                && refused.message.contains("usd_per_day"),
            "{}",
            refused.message
        );
        assert_eq!(refused.retry_after_s, Some(3_600));
        key.spent.day_cost = Usd::ZERO;
        key.spent.month_cost = Usd::from_dollars(100.0).unwrap();
        let refused = limiter.admit(&key, Instant::now(), now_ms).unwrap_err();
        assert!(
            refused.message.contains("this month"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn concurrency_is_held_until_the_answer_is_dropped() {
        let limiter = Limiter::default();
        let key = grant(KeyLimits {
            max_concurrent_requests: Some(2),
            ..KeyLimits::default()
        });
        let now = Instant::now();
        let first = limiter.admit(&key, now, 0).unwrap();
        let second = limiter.admit(&key, now, 0).unwrap();
        let refused = limiter.admit(&key, now, 0).unwrap_err();
        assert!(
            refused.message.contains("2 in flight"),
            "{}",
            refused.message
        );
        let answer = first.attach(crate::openai::json_response(StatusCode::OK, "{}".into()));
        drop(answer);
        let third = limiter
            .admit(&key, now, 0)
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
                .admit(&key, now, 0)
                .expect("shadow mode refuses nothing");
        }
        let mut page = String::new();
        limiter.render(&mut page);
        assert!(page.contains("mode=\"shadow\"} 2"), "{page}");
    }

    #[test]
    fn a_router_holds_its_share_of_a_per_minute_limit() {
        let limiter = Limiter::default();
        limiter.set_reporter("a");
        let mut key = grant(KeyLimits {
            requests_per_minute: Some(600),
            ..KeyLimits::default()
        });
        key.shares = [("a".to_string(), 0.9), ("b".to_string(), 0.1)].into();
        let now = Instant::now();
        let admitted = limiter.admit(&key, now, 0).unwrap();
        let limit = admitted
            .headers
            .iter()
            .find(|(n, _)| *n == "x-ratelimit-limit-requests")
            .map(|(_, v)| v.clone());
        assert_eq!(limit.as_deref(), Some("540"));
        // A router the control plane has not heard from yet takes an even
        // part as one more router.
        let newcomer = Limiter::default();
        newcomer.set_reporter("c");
        for _ in 0..200 {
            newcomer.admit(&key, now, 0).unwrap();
        }
        let refused = newcomer.admit(&key, now, 0).unwrap_err();
        assert!(
            refused
                .message
                .contains("limit 200 per minute on this router (its 33% share of the key's 600"),
            "{}",
            refused.message
        );
        assert_eq!(
            newcomer.take_demand()["ci"],
            201,
            "refused requests are demand too"
        );
        assert!(newcomer.take_demand().is_empty());
    }

    #[test]
    fn resets_are_written_as_openai_writes_them() {
        assert_eq!(duration_text(Duration::from_millis(20)), "20ms");
        assert_eq!(duration_text(Duration::from_millis(5_200)), "6s");
        assert_eq!(duration_text(Duration::from_secs(90)), "1m30s");
        assert_eq!(duration_text(Duration::from_secs(3_661)), "1h1m1s");
    }
}
