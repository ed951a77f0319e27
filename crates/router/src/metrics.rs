//! The router's Prometheus metrics, rendered in the text format at
//! `/metrics`. A request only touches atomics: per-model series are found
//! by name under a read lock (written once, when a model or endpoint is
//! first seen), so counting costs no allocation and no exclusive lock on
//! the hot path. Rare events (retries, ejections, resumptions) use short
//! locks.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::endpoints::Registry;
use crate::resume::ResumeMemory;

/// Seconds; from a fast non-streamed answer to a long generation.
const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

#[derive(Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Requests one endpoint answered for one model, by HTTP status.
struct StatusCounts([AtomicU64; 600]);

impl StatusCounts {
    fn new() -> Self {
        StatusCounts(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    fn add(&self, status: u16) {
        let slot = usize::from(status).min(599);
        self.0[slot].fetch_add(1, Ordering::Relaxed);
    }
}

/// Everything counted per model.
#[derive(Default)]
struct ModelSeries {
    in_flight: AtomicI64,
    duration: Histogram,
    ttft: Histogram,
    /// Requests waiting at the router for a replica with room now.
    waiting_for_room: AtomicI64,
    room_wait: Histogram,
    /// By endpoint URL (`none` for answers the router gave itself).
    requests: RwLock<HashMap<String, Arc<StatusCounts>>>,
    retries: Mutex<BTreeMap<&'static str, u64>>,
    resumptions: Mutex<BTreeMap<&'static str, u64>>,
}

impl ModelSeries {
    fn count(&self, endpoint: &str, status: u16) {
        let known = self
            .requests
            .read()
            .expect("metrics lock")
            .get(endpoint)
            .cloned();
        let counts = known.unwrap_or_else(|| {
            let mut requests = self.requests.write().expect("metrics lock");
            Arc::clone(
                requests
                    .entry(endpoint.to_string())
                    .or_insert_with(|| Arc::new(StatusCounts::new())),
            )
        });
        counts.add(status);
    }
}

#[derive(Default)]
pub struct Metrics {
    models: RwLock<HashMap<String, Arc<ModelSeries>>>,
    ejections: Mutex<BTreeMap<String, u64>>,
}

/// The endpoint label of answers the router gave itself.
pub const NO_ENDPOINT: &str = "none";

impl Metrics {
    fn model(&self, model: &str) -> Arc<ModelSeries> {
        if let Some(series) = self.models.read().expect("metrics lock").get(model) {
            return Arc::clone(series);
        }
        let mut models = self.models.write().expect("metrics lock");
        Arc::clone(models.entry(model.to_string()).or_default())
    }

    pub fn request_started(&self, model: &str) {
        self.model(model).in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub fn request_finished(&self, model: &str, endpoint: &str, status: u16, elapsed: Duration) {
        let series = self.model(model);
        series.in_flight.fetch_sub(1, Ordering::Relaxed);
        series.count(endpoint, status);
        series.duration.observe(elapsed);
    }

    /// A request refused before any endpoint was chosen (auth, bad body,
    /// unknown model); it counts, but not towards latency.
    pub fn request_refused(&self, model: &str, status: u16) {
        self.model(model).count(NO_ENDPOINT, status);
    }

    /// A request waits for a replica with room (`max_requests_per_replica`).
    pub fn queued(&self, model: &str) {
        self.model(model)
            .waiting_for_room
            .fetch_add(1, Ordering::Relaxed);
    }

    /// It stopped waiting, sent with a place or without one.
    pub fn waited_for_room(&self, model: &str, waited: Duration) {
        let series = self.model(model);
        series.waiting_for_room.fetch_sub(1, Ordering::Relaxed);
        series.room_wait.observe(waited);
    }

    pub fn first_token(&self, model: &str, elapsed: Duration) {
        self.model(model).ttft.observe(elapsed);
    }

    pub fn retry(&self, model: &str, reason: &'static str) {
        *self
            .model(model)
            .retries
            .lock()
            .expect("metrics lock")
            .entry(reason)
            .or_default() += 1;
    }

    /// A stream whose engine failed mid-answer: `resumed`, `failed` (no
    /// replica could continue), or why it could not be resumed.
    pub fn resumption(&self, model: &str, outcome: &'static str) {
        *self
            .model(model)
            .resumptions
            .lock()
            .expect("metrics lock")
            .entry(outcome)
            .or_default() += 1;
    }

    pub fn ejection(&self, endpoint: &str) {
        *self
            .ejections
            .lock()
            .expect("metrics lock")
            .entry(endpoint.to_string())
            .or_default() += 1;
    }

    pub fn render(&self, registry: &Registry, resume_memory: &ResumeMemory) -> String {
        let mut out = String::with_capacity(4096);
        let models: BTreeMap<String, Arc<ModelSeries>> = self
            .models
            .read()
            .expect("metrics lock")
            .iter()
            .map(|(name, series)| (esc(name), Arc::clone(series)))
            .collect();
        render_requests(&mut out, &models);
        histogram(
            &mut out,
            "llmgw_router_request_duration_seconds",
            "Time from request to the last byte of the answer.",
            &models,
            |s| &s.duration,
        );
        histogram(
            &mut out,
            "llmgw_router_time_to_first_token_seconds",
            "Time from request to the first byte of the upstream answer body.",
            &models,
            |s| &s.ttft,
        );
        header(
            &mut out,
            "llmgw_router_in_flight_requests",
            "gauge",
            "Requests being answered now.",
        );
        for (model, series) in &models {
            let _ = writeln!(
                out,
                "llmgw_router_in_flight_requests{{model=\"{model}\"}} {}",
                series.in_flight.load(Ordering::Relaxed)
            );
        }
        histogram(
            &mut out,
            "llmgw_router_queue_wait_seconds",
            "Time requests waited at the router for a replica with room (max_requests_per_replica), of those that waited.",
            &models,
            |s| &s.room_wait,
        );
        header(
            &mut out,
            "llmgw_router_waiting_requests",
            "gauge",
            "Requests waiting at the router now for a replica with room (max_requests_per_replica).",
        );
        for (model, series) in &models {
            let _ = writeln!(
                out,
                "llmgw_router_waiting_requests{{model=\"{model}\"}} {}",
                series.waiting_for_room.load(Ordering::Relaxed)
            );
        }
        render_rare_events(&mut out, &models, &self.ejections);
        header(
            &mut out,
            "llmgw_router_resume_bytes_held",
            "gauge",
            "Request bodies and answer text kept so that streams can be resumed (capped by resume.memory_cap_bytes).",
        );
        let _ = writeln!(
            out,
            "llmgw_router_resume_bytes_held {}",
            resume_memory.used()
        );
        render_endpoints(&mut out, registry);
        out
    }
}

/// `llmgw_router_requests_total`: one series per model, endpoint and
/// status that answered at least once.
fn render_requests(out: &mut String, models: &BTreeMap<String, Arc<ModelSeries>>) {
    header(
        out,
        "llmgw_router_requests_total",
        "counter",
        "Requests answered, by model, endpoint and HTTP status.",
    );
    for (model, series) in models {
        let requests: BTreeMap<String, Arc<StatusCounts>> = series
            .requests
            .read()
            .expect("metrics lock")
            .iter()
            .map(|(endpoint, counts)| (esc(endpoint), Arc::clone(counts)))
            .collect();
        for (endpoint, counts) in &requests {
            for (status, count) in counts.0.iter().enumerate() {
                let count = count.load(Ordering::Relaxed);
                if count > 0 {
                    let _ = writeln!(
                        out,
                        "llmgw_router_requests_total{{model=\"{model}\",endpoint=\"{endpoint}\",status=\"{status}\"}} {count}"
                    );
                }
            }
        }
    }
}

/// The counters kept under short locks: retries, resumptions, ejections.
fn render_rare_events(
    out: &mut String,
    models: &BTreeMap<String, Arc<ModelSeries>>,
    ejections: &Mutex<BTreeMap<String, u64>>,
) {
    header(
        out,
        "llmgw_router_retries_total",
        "counter",
        "Attempts moved to another endpoint, by reason.",
    );
    for (model, series) in models {
        for (reason, v) in series.retries.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "llmgw_router_retries_total{{model=\"{model}\",reason=\"{reason}\"}} {v}"
            );
        }
    }
    header(
        out,
        "llmgw_router_stream_resumptions_total",
        "counter",
        "Mid-stream failover by outcome: resumed, failed (no replica could continue), or why a stream could not be resumed (memory_cap also counts streams left unprotected at their start).",
    );
    for (model, series) in models {
        for (outcome, v) in series.resumptions.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "llmgw_router_stream_resumptions_total{{model=\"{model}\",outcome=\"{outcome}\"}} {v}"
            );
        }
    }
    header(
        out,
        "llmgw_router_ejections_total",
        "counter",
        "Times an endpoint was taken out of rotation after consecutive failures.",
    );
    for (endpoint, v) in ejections.lock().expect("metrics lock").iter() {
        let _ = writeln!(
            out,
            "llmgw_router_ejections_total{{endpoint=\"{}\"}} {v}",
            esc(endpoint)
        );
    }
}

/// The per-endpoint gauges, read from the endpoint registry at scrape time.
fn render_endpoints(out: &mut String, registry: &Registry) {
    let mut endpoints = registry.all();
    endpoints.sort_by(|a, b| a.url.cmp(&b.url));
    header(
        out,
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
        out,
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
        out,
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
        out,
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
}

pub(crate) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    models: &BTreeMap<String, Arc<ModelSeries>>,
    pick: impl Fn(&ModelSeries) -> &Histogram,
) {
    header(out, name, "histogram", help);
    for (model, series) in models {
        let h = pick(series);
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&h.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{model=\"{model}\",le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = h.count.load(Ordering::Relaxed);
        let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_bucket{{model=\"{model}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(out, "{name}_sum{{model=\"{model}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{model=\"{model}\"}} {count}");
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
        let text = m.render(&Registry::default(), &ResumeMemory::new(0));
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
