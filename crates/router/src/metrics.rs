//! The router's Prometheus metrics, rendered in the text format at
//! `/metrics`. Label sets are small (models × endpoints × statuses), so
//! plain maps behind short locks are enough; nothing is held across I/O.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::endpoints::Registry;

/// Seconds; from a fast non-streamed answer to a long generation.
const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            self.counts[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, String, u16), u64>,
    duration: BTreeMap<String, Histogram>,
    ttft: BTreeMap<String, Histogram>,
    in_flight: BTreeMap<String, i64>,
    retries: BTreeMap<(String, &'static str), u64>,
    ejections: BTreeMap<String, u64>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// The endpoint label of answers the router gave itself.
pub const NO_ENDPOINT: &str = "none";

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().expect("metrics lock"))
    }

    pub fn request_started(&self, model: &str) {
        self.with(|m| *m.in_flight.entry(model.to_string()).or_default() += 1);
    }

    pub fn request_finished(&self, model: &str, endpoint: &str, status: u16, elapsed: Duration) {
        self.with(|m| {
            *m.in_flight.entry(model.to_string()).or_default() -= 1;
            *m.requests
                .entry((model.to_string(), endpoint.to_string(), status))
                .or_default() += 1;
            m.duration
                .entry(model.to_string())
                .or_default()
                .observe(elapsed.as_secs_f64());
        });
    }

    /// A request refused before any endpoint was chosen (auth, bad body,
    /// unknown model); it counts, but not towards latency.
    pub fn request_refused(&self, model: &str, status: u16) {
        self.with(|m| {
            *m.requests
                .entry((model.to_string(), NO_ENDPOINT.to_string(), status))
                .or_default() += 1;
        });
    }

    pub fn first_token(&self, model: &str, elapsed: Duration) {
        self.with(|m| {
            m.ttft
                .entry(model.to_string())
                .or_default()
                .observe(elapsed.as_secs_f64())
        });
    }

    pub fn retry(&self, model: &str, reason: &'static str) {
        self.with(|m| *m.retries.entry((model.to_string(), reason)).or_default() += 1);
    }

    pub fn ejection(&self, endpoint: &str) {
        self.with(|m| *m.ejections.entry(endpoint.to_string()).or_default() += 1);
    }

    pub fn render(&self, registry: &Registry) -> String {
        let mut out = String::with_capacity(4096);
        self.with(|m| {
            header(&mut out, "llmgw_router_requests_total", "counter", "Requests answered, by model, endpoint and HTTP status.");
            for ((model, endpoint, status), v) in &m.requests {
                let _ = writeln!(out, "llmgw_router_requests_total{{model=\"{}\",endpoint=\"{}\",status=\"{status}\"}} {v}", esc(model), esc(endpoint));
            }
            histogram(&mut out, "llmgw_router_request_duration_seconds", "Time from request to the last byte of the answer.", &m.duration);
            histogram(&mut out, "llmgw_router_time_to_first_token_seconds", "Time from request to the first byte of the upstream answer body.", &m.ttft);
            header(&mut out, "llmgw_router_in_flight_requests", "gauge", "Requests being answered now.");
            for (model, v) in &m.in_flight {
                let _ = writeln!(out, "llmgw_router_in_flight_requests{{model=\"{}\"}} {v}", esc(model));
            }
            header(&mut out, "llmgw_router_retries_total", "counter", "Attempts moved to another endpoint, by reason.");
            for ((model, reason), v) in &m.retries {
                let _ = writeln!(out, "llmgw_router_retries_total{{model=\"{}\",reason=\"{reason}\"}} {v}", esc(model));
            }
            header(&mut out, "llmgw_router_ejections_total", "counter", "Times an endpoint was taken out of rotation after consecutive failures.");
            for (endpoint, v) in &m.ejections {
                let _ = writeln!(out, "llmgw_router_ejections_total{{endpoint=\"{}\"}} {v}", esc(endpoint));
            }
        });
        let mut endpoints = registry.all();
        endpoints.sort_by(|a, b| a.url.cmp(&b.url));
        header(
            &mut out,
            "llmgw_router_endpoint_outstanding_requests",
            "gauge",
            "Requests this router has in flight at the endpoint.",
        );
        for e in &endpoints {
            let _ = writeln!(
                out,
                "llmgw_router_endpoint_outstanding_requests{{endpoint=\"{}\"}} {}",
                esc(&e.url),
                e.outstanding()
            );
        }
        header(
            &mut out,
            "llmgw_router_endpoint_ejected",
            "gauge",
            "1 while the endpoint is ejected and waiting for a passing health probe.",
        );
        for e in &endpoints {
            let _ = writeln!(
                out,
                "llmgw_router_endpoint_ejected{{endpoint=\"{}\"}} {}",
                esc(&e.url),
                u8::from(e.is_ejected())
            );
        }
        header(
            &mut out,
            "llmgw_router_engine_requests_waiting",
            "gauge",
            "The engine's queue as last read from its /metrics.",
        );
        for e in &endpoints {
            if let Some(w) = e.engine_load().waiting {
                let _ = writeln!(
                    out,
                    "llmgw_router_engine_requests_waiting{{endpoint=\"{}\"}} {w}",
                    esc(&e.url)
                );
            }
        }
        header(
            &mut out,
            "llmgw_router_engine_kv_cache_usage",
            "gauge",
            "The engine's KV cache usage (0..1) as last read from its /metrics.",
        );
        for e in &endpoints {
            if let Some(kv) = e.engine_load().kv_usage {
                let _ = writeln!(
                    out,
                    "llmgw_router_engine_kv_cache_usage{{endpoint=\"{}\"}} {kv}",
                    esc(&e.url)
                );
            }
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, help: &str, series: &BTreeMap<String, Histogram>) {
    header(out, name, "histogram", help);
    for (model, h) in series {
        let model = esc(model);
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(h.counts) {
            cumulative += count;
            let _ = writeln!(
                out,
                "{name}_bucket{{model=\"{model}\",le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{model=\"{model}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(out, "{name}_sum{{model=\"{model}\"}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{model=\"{model}\"}} {}", h.count);
    }
}

/// Label values come from clients (model names): escape what the text
/// format requires.
fn esc(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_buckets() {
        let m = Metrics::default();
        m.request_started("m");
        m.request_finished("m", "http://e:1", 200, Duration::from_millis(3));
        m.request_refused("m\"x", 404);
        m.retry("m", "connect");
        let text = m.render(&Registry::default());
        assert!(text.contains(
            "llmgw_router_requests_total{model=\"m\",endpoint=\"http://e:1\",status=\"200\"} 1"
        ));
        assert!(text.contains(
            "llmgw_router_requests_total{model=\"m\\\"x\",endpoint=\"none\",status=\"404\"} 1"
        ));
        assert!(
            text.contains(
                "llmgw_router_request_duration_seconds_bucket{model=\"m\",le=\"0.0025\"} 0"
            )
        );
        assert!(
            text.contains(
                "llmgw_router_request_duration_seconds_bucket{model=\"m\",le=\"0.005\"} 1"
            )
        );
        assert!(text.contains("llmgw_router_in_flight_requests{model=\"m\"} 0"));
        assert!(text.contains("llmgw_router_retries_total{model=\"m\",reason=\"connect\"} 1"));
    }
}
