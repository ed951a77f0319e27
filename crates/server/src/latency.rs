//! Latencies of a model's engines between two scrapes, from the histograms
//! vLLM and SGLang serve: the time to first token and the time a request
//! waited in the queue, the autoscaler's latency signals.
//!
//! A histogram's buckets count every request since the engine started, so
//! a percentile of "now" comes from the difference between two scrapes of
//! the same engine. An engine seen for the first time, or whose counts went
//! back (it restarted), gives nothing until its next scrape.

use std::collections::{BTreeMap, HashMap};

/// The time-to-first-token histogram, as each engine names it.
pub const TIME_TO_FIRST_TOKEN: [&str; 2] = [
    "vllm:time_to_first_token_seconds_bucket",
    "sglang:time_to_first_token_seconds_bucket",
];

/// The queue-wait histogram, as each engine names it.
pub const QUEUE_WAIT: [&str; 2] = [
    "vllm:request_queue_time_seconds_bucket",
    "sglang:queue_time_seconds_bucket",
];

/// Cumulative counts by upper bound (`le`, in seconds; `+Inf` last), summed
/// over a page's label sets. The key is the bound's bits: for the positive
/// bounds a histogram has, their order is the numbers' order.
type Buckets = BTreeMap<u64, f64>;

/// The buckets of one histogram (`series`: its names, one per engine) on
/// an engine's `/metrics` page; empty when it serves none.
pub fn buckets(page: &str, series: &[&str]) -> Buckets {
    let mut buckets = Buckets::new();
    for sample in llmgw_prometheus::samples(page) {
        if !series.contains(&sample.name) || !sample.value.is_finite() {
            continue;
        }
        let Some(le) = label(sample.labels, "le").and_then(bound) else {
            continue;
        };
        *buckets.entry(le.to_bits()).or_default() += sample.value;
    }
    buckets
}

/// A label's value in a label set as written (`{a="1",le="0.5"}`).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let at = ["{", ","]
        .iter()
        .find_map(|sep| labels.find(&format!("{sep}{key}=\"")))?;
    let start = at + key.len() + 3;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

fn bound(text: &str) -> Option<f64> {
    let value = match text {
        "+Inf" | "Inf" => f64::INFINITY,
        number => number.parse().ok()?,
    };
    (value > 0.0).then_some(value)
}

/// Each engine's last buckets of one histogram.
#[derive(Debug, Default)]
pub struct LatencyWatch {
    last: HashMap<String, Buckets>,
}

impl LatencyWatch {
    /// What the engines of one model (endpoint, buckets) observed since
    /// their last scrape. An engine seen for the first time, or restarted,
    /// adds nothing this time.
    pub fn since_last(&mut self, engines: Vec<(String, Buckets)>) -> Observed {
        let mut new = Buckets::new();
        for (endpoint, now) in engines {
            if let Some(before) = self.last.get(&endpoint) {
                let went_back = now
                    .iter()
                    .any(|(le, count)| before.get(le).is_some_and(|b| b > count));
                if !went_back {
                    for (le, count) in &now {
                        *new.entry(*le).or_default() += count - before.get(le).unwrap_or(&0.0);
                    }
                }
            }
            self.last.insert(endpoint, now);
        }
        Observed(new)
    }

    /// Forgets engines no longer scraped.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.last.retain(|endpoint, _| keep(endpoint));
    }
}

/// A histogram's observations between two scrapes.
#[derive(Debug, Default)]
pub struct Observed(Buckets);

impl Observed {
    /// The 90th percentile in milliseconds; none when nothing was observed.
    pub fn p90_ms(&self) -> Option<u32> {
        quantile_ms(&self.0, 0.9)
    }

    /// How many observations there were (the `+Inf` bucket's count).
    pub fn count(&self) -> f64 {
        self.0.values().copied().fold(0.0, f64::max)
    }
}

/// The `q` quantile in ms, interpolated linearly inside the bucket that
/// holds it (as Prometheus' `histogram_quantile` does, the first bucket
/// starting at 0); the largest finite bound when it lies beyond every one.
fn quantile_ms(buckets: &Buckets, q: f64) -> Option<u32> {
    let total = buckets.values().copied().fold(0.0, f64::max);
    if total < 1.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    let mut seconds = None;
    for (le, count) in buckets
        .iter()
        .map(|(le, count)| (f64::from_bits(*le), *count))
    {
        if !le.is_finite() {
            break;
        }
        if count >= rank {
            let inside = (count - below).max(f64::MIN_POSITIVE);
            seconds = Some(lower + (le - lower) * ((rank - below) / inside).clamp(0.0, 1.0));
            break;
        }
        (lower, below) = (le, count);
    }
    let seconds = seconds.unwrap_or(lower);
    Some((seconds * 1000.0).round().min(f64::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttft(page: &str) -> Buckets {
        buckets(page, &TIME_TO_FIRST_TOKEN)
    }

    fn page(counts: [u32; 4]) -> String {
        let [a, b, c, all] = counts;
        format!(
            "# TYPE vllm:time_to_first_token_seconds histogram\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"0.1\",model_name=\"q\"}} {a}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"0.5\",model_name=\"q\"}} {b}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"1.0\",model_name=\"q\"}} {c}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\",model_name=\"q\"}} {all}\n\
             vllm:time_to_first_token_seconds_count{{model_name=\"q\"}} {all}\n\
             vllm:num_requests_running{{model_name=\"q\"}} 3\n"
        )
    }

    #[test]
    fn the_p90_is_of_the_first_tokens_since_the_last_scrape() {
        let mut watch = LatencyWatch::default();
        // Before: 100 fast requests. The first scrape only sets the base.
        let first = vec![("e1".to_owned(), ttft(&page([100, 100, 100, 100])))];
        assert_eq!(watch.since_last(first).p90_ms(), None);
        // Since: 10 more, 9 of them between 0.1 and 0.5 s, one under 1 s:
        // the p90 is at the top of the 0.5 s bucket, though all requests
        // ever are fast.
        let second = vec![("e1".to_owned(), ttft(&page([100, 109, 110, 110])))];
        let observed = watch.since_last(second);
        assert_eq!(observed.p90_ms(), Some(500));
        assert_eq!(observed.count(), 10.0, "the requests since, not ever");
        // Two engines add up; an engine whose counts went back restarted
        // and gives nothing this time.
        watch.last.insert("e2".into(), ttft(&page([0, 0, 50, 50])));
        let third = vec![
            ("e1".to_owned(), ttft(&page([100, 109, 120, 120]))),
            ("e2".to_owned(), ttft(&page([0, 0, 0, 0]))),
        ];
        // All 10 between 0.5 and 1 s: 90 % of the way through the bucket.
        assert_eq!(watch.since_last(third).p90_ms(), Some(950));
        // Nothing new: no p90. Beyond every bound: the largest one.
        let same = vec![("e1".to_owned(), ttft(&page([100, 109, 120, 120])))];
        let observed = watch.since_last(same);
        assert_eq!((observed.p90_ms(), observed.count()), (None, 0.0));
        let slow = vec![("e1".to_owned(), ttft(&page([100, 109, 120, 140])))];
        assert_eq!(watch.since_last(slow).p90_ms(), Some(1000));
    }

    #[test]
    fn the_quantile_is_interpolated_inside_its_bucket_from_zero() {
        let one_bucket = |count: f64| {
            Buckets::from([(0.3f64.to_bits(), count), (f64::INFINITY.to_bits(), count)])
        };
        // Every request under 0.3 s: 90 % of the way from 0 to 0.3 s, not
        // the bound itself (a 200 ms target is met).
        assert_eq!(quantile_ms(&one_bucket(10.0), 0.9), Some(270));
        assert_eq!(quantile_ms(&one_bucket(0.0), 0.9), None);
    }

    #[test]
    fn sglang_buckets_count_and_other_series_do_not() {
        let text = "sglang:time_to_first_token_seconds_bucket{le=\"0.25\"} 4\n\
                    sglang:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n\
                    sglang:queue_time_seconds_bucket{le=\"0.25\"} 7\n\
                    sglang:e2e_request_latency_seconds_bucket{le=\"0.25\"} 9\n";
        let got = ttft(text);
        assert_eq!(buckets(text, &QUEUE_WAIT)[&0.25f64.to_bits()], 7.0);
        assert_eq!(got.len(), 2);
        assert_eq!(got[&0.25f64.to_bits()], 4.0);
        assert_eq!(got[&f64::INFINITY.to_bits()], 5.0);
        assert!(ttft("vllm:num_requests_running 3\n").is_empty());
        // A label that ends in `le` is not the bound.
        let text = "vllm:time_to_first_token_seconds_bucket{rule=\"9\",le=\"0.5\"} 2\n";
        assert_eq!(ttft(text)[&0.5f64.to_bits()], 2.0);
    }
}
