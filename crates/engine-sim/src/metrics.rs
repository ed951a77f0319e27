//! Counters and histograms behind `/metrics`, lock-free so that they cost
//! nothing on the request path, rendered in the Prometheus text format with
//! each engine's metric names, labels and bucket edges.
//!
//! The text is written here rather than by the `prometheus-client` crate:
//! the engines export through Python's `prometheus_client`, whose text the
//! simulator reproduces (`le="1.0"`, bucket counts as `2.0`, HELP texts as
//! each engine words them), while the crate writes Go's form (`le="1"`,
//! `2`) and ends every HELP text with a period of its own.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// vLLM's time-to-first-token bucket edges (seconds).
pub const VLLM_TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token-latency bucket edges (seconds).
pub const VLLM_ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's end-to-end and queue-time bucket edges (seconds).
pub const VLLM_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// SGLang's time-to-first-token bucket edges (seconds).
pub const SGLANG_TTFT_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];
/// SGLang's inter-token-latency bucket edges (seconds).
pub const SGLANG_ITL_BUCKETS: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
    0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
];
/// SGLang's end-to-end and queue-time bucket edges (seconds).
pub const SGLANG_LATENCY_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 800.0,
];

/// A histogram with fixed edges; the sum is kept in microseconds.
#[derive(Debug)]
pub struct Histogram {
    pub edges: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn new(edges: &'static [f64]) -> Self {
        Self {
            edges,
            counts: edges.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        // Non-cumulative per-bucket counts; rendering accumulates them.
        if let Some(i) = self.edges.iter().position(|edge| seconds <= *edge) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (edge, count) in self.edges.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}.0",
                float_text(*edge)
            );
        }
        let total = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}.0");
        let _ = writeln!(out, "{name}_count{{{labels}}} {total}.0");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", float_text(sum));
    }
}

/// Python's float repr for the values that appear here (`1.0`, `0.025`).
fn float_text(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// Every series one engine exports.
#[derive(Debug)]
pub struct Metrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub finished_stop: AtomicU64,
    pub finished_length: AtomicU64,
    pub finished_abort: AtomicU64,
    pub requests_total: AtomicU64,
}

/// The gauges, read from the live engine state at scrape time.
#[derive(Debug, Clone, Copy)]
pub struct Gauges {
    pub running: u64,
    pub waiting: u64,
    pub kv_usage: f64,
    pub kv_tokens_used: u64,
    pub kv_capacity: u64,
    pub gen_throughput: f64,
    /// vLLM sleep mode's level (0 awake); none without sleep mode.
    pub sleep_level: Option<u8>,
}

impl Metrics {
    pub fn new(vllm: bool) -> Self {
        let (ttft, itl, lat) = if vllm {
            (VLLM_TTFT_BUCKETS, VLLM_ITL_BUCKETS, VLLM_LATENCY_BUCKETS)
        } else {
            (
                SGLANG_TTFT_BUCKETS,
                SGLANG_ITL_BUCKETS,
                SGLANG_LATENCY_BUCKETS,
            )
        };
        Self {
            ttft: Histogram::new(ttft),
            itl: Histogram::new(itl),
            e2e: Histogram::new(lat),
            queue: Histogram::new(lat),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            finished_stop: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
            finished_abort: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
        }
    }

    /// vLLM's exposition: `{engine="0",model_name="..."}` on every series.
    pub fn render_vllm(
        &self,
        model_name: &str,
        gauges: Gauges,
        show_hidden: bool,
        legacy_names: bool,
    ) -> String {
        let labels = format!("engine=\"0\",model_name=\"{}\"", escape_label(model_name));
        let mut out = String::with_capacity(16 * 1024);
        let mut gauge_rows = vec![
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                gauges.running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                gauges.waiting as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                gauges.kv_usage,
            ),
        ];
        if legacy_names && show_hidden {
            gauge_rows.push((
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.(Deprecated; use vllm:kv_cache_usage_perc instead.)",
                gauges.kv_usage,
            ));
        }
        for (name, help, value) in gauge_rows {
            gauge(&mut out, &labels, name, help, value);
        }
        if let Some(level) = gauges.sleep_level {
            let name = "vllm:engine_sleep_state";
            let _ = writeln!(
                out,
                "# HELP {name} Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n# TYPE {name} gauge"
            );
            for (i, state) in crate::sleep::STATES.iter().enumerate() {
                let on = usize::from(level) == i;
                let _ = writeln!(
                    out,
                    "{name}{{{labels},sleep_state=\"{state}\"}} {}",
                    if on { "1.0" } else { "0.0" }
                );
            }
        }
        for (name, help, value) in [
            (
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.prefix_queries.load(Ordering::Relaxed),
            ),
            (
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.prefix_hits.load(Ordering::Relaxed),
            ),
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
                0,
            ),
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                self.generation_tokens.load(Ordering::Relaxed),
            ),
        ] {
            counter(&mut out, &labels, name, help, value);
        }
        self.render_vllm_finished(&mut out, &labels);
        self.render_histograms(
            &mut out,
            &labels,
            [
                (
                    "vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.",
                ),
                (
                    "vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.",
                ),
                (
                    "vllm:e2e_request_latency_seconds",
                    "Histogram of e2e request latency in seconds.",
                ),
                (
                    "vllm:request_queue_time_seconds",
                    "Histogram of time spent in WAITING phase for request.",
                ),
            ],
        );
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
            gauges.kv_capacity / 16
        );
        out
    }

    /// `vllm:request_success_total`, one series per finish reason.
    fn render_vllm_finished(&self, out: &mut String, labels: &str) {
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter"
        );
        for (reason, v) in [
            ("stop", &self.finished_stop),
            ("length", &self.finished_length),
            ("abort", &self.finished_abort),
        ] {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {}.0",
                v.load(Ordering::Relaxed)
            );
        }
    }

    /// The four latency histograms in the order both engines export them:
    /// time to first token, inter-token latency, end to end, queue time;
    /// `names` gives each one's (name, help).
    fn render_histograms(&self, out: &mut String, labels: &str, names: [(&str, &str); 4]) {
        let histograms = [&self.ttft, &self.itl, &self.e2e, &self.queue];
        for (histogram, (name, help)) in histograms.into_iter().zip(names) {
            histogram.render(out, name, help, labels);
        }
    }

    /// SGLang's exposition: `{engine_type, model_name, pp_rank, tp_rank}`.
    pub fn render_sglang(&self, model_name: &str, gauges: Gauges) -> String {
        let labels = format!(
            "engine_type=\"unified\",model_name=\"{}\",pp_rank=\"0\",tp_rank=\"0\"",
            escape_label(model_name)
        );
        let mut out = String::with_capacity(16 * 1024);
        let queries = self.prefix_queries.load(Ordering::Relaxed);
        let hits = self.prefix_hits.load(Ordering::Relaxed);
        let hit_rate = if queries == 0 {
            0.0
        } else {
            hits as f64 / queries as f64
        };
        for (name, help, value) in [
            (
                "sglang:num_running_reqs",
                "The number of running requests.",
                gauges.running as f64,
            ),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                gauges.waiting as f64,
            ),
            (
                "sglang:num_used_tokens",
                "The number of used tokens.",
                gauges.kv_tokens_used as f64,
            ),
            ("sglang:token_usage", "The token usage.", gauges.kv_usage),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                gauges.kv_capacity as f64,
            ),
            (
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                gauges.gen_throughput,
            ),
            (
                "sglang:cache_hit_rate",
                "The prefix cache hit rate.",
                hit_rate,
            ),
        ] {
            gauge(&mut out, &labels, name, help, value);
        }
        for (name, help, value) in [
            (
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                self.generation_tokens.load(Ordering::Relaxed),
            ),
            (
                "sglang:cached_tokens_total",
                "Number of cached prompt tokens.",
                hits,
            ),
            (
                "sglang:num_requests_total",
                "Number of requests processed.",
                self.requests_total.load(Ordering::Relaxed),
            ),
        ] {
            counter(&mut out, &labels, name, help, value);
        }
        self.render_histograms(
            &mut out,
            &labels,
            [
                (
                    "sglang:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.",
                ),
                (
                    "sglang:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.",
                ),
                (
                    "sglang:e2e_request_latency_seconds",
                    "Histogram of End-to-end request latency in seconds",
                ),
                (
                    "sglang:queue_time_seconds",
                    "Histogram of queueing time in seconds.",
                ),
            ],
        );
        out
    }
}

/// One gauge series with its HELP and TYPE lines.
fn gauge(out: &mut String, labels: &str, name: &str, help: &str, v: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {}",
        float_text(v)
    );
}

/// One counter series with its HELP and TYPE lines.
fn counter(out: &mut String, labels: &str, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {v}.0"
    );
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(VLLM_TTFT_BUCKETS);
        h.observe(0.003);
        h.observe(0.09);
        let mut out = String::new();
        h.render(&mut out, "x", "help", "a=\"b\"");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.001\"} 0.0\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.005\"} 1.0\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.1\"} 2.0\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 2.0\n"));
        assert!(out.contains("x_count{a=\"b\"} 2.0\n"));
    }
}
