//! The time to first token of a model's engines between two scrapes, from
//! the histogram vLLM and SGLang serve (`vllm:time_to_first_token_seconds`,
//! `sglang:time_to_first_token_seconds`): the autoscaler's latency signal.
//!
//! A histogram's buckets count every request since the engine started, so
//! a percentile of "now" comes from the difference between two scrapes of
//! the same engine. An engine seen for the first time, or whose counts went
//! back (it restarted), gives nothing until its next scrape.

use std::collections::{BTreeMap, HashMap};

const BUCKET_SERIES: [&str; 2] = [
    "vllm:time_to_first_token_seconds_bucket",
    "sglang:time_to_first_token_seconds_bucket",
];

/// Cumulative counts by upper bound (`le`, in seconds; `+Inf` last), summed
/// over a page's label sets. The key is the bound's bits: for the positive
/// bounds a histogram has, their order is the numbers' order.
type Buckets = BTreeMap<u64, f64>;

/// The time-to-first-token buckets of one engine's `/metrics` page; empty
/// when it serves none.
pub fn buckets(page: &str) -> Buckets {
    let mut buckets = Buckets::new();
    for sample in llmgw_prometheus::samples(page) {
        if !BUCKET_SERIES.contains(&sample.name) || !sample.value.is_finite() {
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

/// Each engine's last buckets, while this peer leads.
#[derive(Debug, Default)]
pub struct TtftWatch {
    last: HashMap<String, Buckets>,
}

impl TtftWatch {
    /// The p90 in milliseconds of the first tokens the engines of one model
    /// (endpoint, buckets) gave since their last scrape; none when none
    /// gave one, or none can be compared yet.
    pub fn p90_since_last(&mut self, engines: Vec<(String, Buckets)>) -> Option<u32> {
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
        quantile_ms(&new, 0.9)
    }

    /// Forgets engines no longer scraped.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.last.retain(|endpoint, _| keep(endpoint));
    }
}

/// The upper bound of the bucket that holds the `q` quantile, in ms; the
/// largest finite bound when it lies beyond every one.
fn quantile_ms(buckets: &Buckets, q: f64) -> Option<u32> {
    let total = buckets.values().copied().fold(0.0, f64::max);
    if total < 1.0 {
        return None;
    }
    let finite = || {
        buckets
            .iter()
            .map(|(le, count)| (f64::from_bits(*le), *count))
            .filter(|(le, _)| le.is_finite())
    };
    let seconds = finite()
        .find(|(_, count)| *count >= q * total)
        .or_else(|| finite().next_back())?
        .0;
    Some((seconds * 1000.0).round().min(f64::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut watch = TtftWatch::default();
        // Before: 100 fast requests. The first scrape only sets the base.
        let first = vec![("e1".to_owned(), buckets(&page([100, 100, 100, 100])))];
        assert_eq!(watch.p90_since_last(first), None);
        // Since: 10 more, 9 of them under 0.5 s, one under 1 s: the p90
        // falls in the 0.5 s bucket, though all requests ever are fast.
        let second = vec![("e1".to_owned(), buckets(&page([100, 109, 110, 110])))];
        assert_eq!(watch.p90_since_last(second), Some(500));
        // Two engines add up; an engine whose counts went back restarted
        // and gives nothing this time.
        watch
            .last
            .insert("e2".into(), buckets(&page([0, 0, 50, 50])));
        let third = vec![
            ("e1".to_owned(), buckets(&page([100, 109, 120, 120]))),
            ("e2".to_owned(), buckets(&page([0, 0, 0, 0]))),
        ];
        assert_eq!(watch.p90_since_last(third), Some(1000));
        // Nothing new: no p90. Beyond every bound: the largest one.
        let same = vec![("e1".to_owned(), buckets(&page([100, 109, 120, 120])))];
        assert_eq!(watch.p90_since_last(same), None);
        let slow = vec![("e1".to_owned(), buckets(&page([100, 109, 120, 140])))];
        assert_eq!(watch.p90_since_last(slow), Some(1000));
    }

    #[test]
    fn sglang_buckets_count_and_other_series_do_not() {
        let text = "sglang:time_to_first_token_seconds_bucket{le=\"0.25\"} 4\n\
                    sglang:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n\
                    sglang:e2e_request_latency_seconds_bucket{le=\"0.25\"} 9\n";
        let got = buckets(text);
        assert_eq!(got.len(), 2);
        assert_eq!(got[&0.25f64.to_bits()], 4.0);
        assert_eq!(got[&f64::INFINITY.to_bits()], 5.0);
        assert!(buckets("vllm:num_requests_running 3\n").is_empty());
        // A label that ends in `le` is not the bound.
        let text = "vllm:time_to_first_token_seconds_bucket{rule=\"9\",le=\"0.5\"} 2\n";
        assert_eq!(buckets(text)[&0.5f64.to_bits()], 2.0);
    }
}
