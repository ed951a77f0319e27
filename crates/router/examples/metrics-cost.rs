//! What one request's metric updates cost on the router's hot path: the
//! router's own lock-free `Metrics` against the same series kept with the
//! `prometheus-client` crate. One request records what a streamed answer
//! records: started, first token, finished (status counter, in-flight
//! gauge, two histograms).
//!
//!     cargo run --release -p llmgw-router --example metrics-cost
//!
//! Prints nanoseconds per request for 1 thread and for every core at once
//! (all threads on the same model and endpoint: the contended case), the
//! best of `ROUNDS` rounds so that other load on the machine counts least.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llmgw_router::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";
const ENDPOINT: &str = "http://127.0.0.1:18501";
const REQUESTS_PER_THREAD: u32 = 1_000_000;
const ROUNDS: usize = 7;
/// The router's bucket edges (crates/router/src/metrics.rs).
const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    model: String,
    endpoint: String,
    status: u16,
}

/// The router's request series kept with `prometheus-client`.
struct LibraryMetrics {
    requests: Family<RequestLabels, Counter>,
    in_flight: Family<ModelLabels, Gauge>,
    duration: Family<ModelLabels, Histogram, fn() -> Histogram>,
    ttft: Family<ModelLabels, Histogram, fn() -> Histogram>,
}

fn router_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

impl LibraryMetrics {
    fn new() -> Self {
        let metrics = Self {
            requests: Family::default(),
            in_flight: Family::default(),
            duration: Family::new_with_constructor(router_histogram as fn() -> Histogram),
            ttft: Family::new_with_constructor(router_histogram as fn() -> Histogram),
        };
        let mut registry = Registry::default();
        registry.register(
            "llmgw_router_requests",
            "Requests answered",
            metrics.requests.clone(),
        );
        registry.register(
            "llmgw_router_in_flight_requests",
            "Requests being answered now",
            metrics.in_flight.clone(),
        );
        registry.register(
            "llmgw_router_request_duration_seconds",
            "Time from request to the last byte of the answer",
            metrics.duration.clone(),
        );
        registry.register(
            "llmgw_router_time_to_first_token_seconds",
            "Time from request to the first byte of the upstream answer body",
            metrics.ttft.clone(),
        );
        metrics
    }

    /// One request, its labels built from the `&str` names the router's
    /// proxy holds (as the router would have to).
    fn record(&self, model: &str, endpoint: &str, status: u16, ttft: Duration, took: Duration) {
        let model_labels = ModelLabels {
            model: model.to_owned(),
        };
        self.in_flight.get_or_create(&model_labels).inc();
        self.ttft
            .get_or_create(&model_labels)
            .observe(ttft.as_secs_f64());
        self.in_flight.get_or_create(&model_labels).dec();
        self.requests
            .get_or_create(&RequestLabels {
                model: model.to_owned(),
                endpoint: endpoint.to_owned(),
                status,
            })
            .inc();
        self.duration
            .get_or_create(&model_labels)
            .observe(took.as_secs_f64());
    }

    /// One request with its label sets built once, outside the loop: the
    /// least the library can cost (its locks and hashing alone).
    fn record_prebuilt(
        &self,
        model_labels: &ModelLabels,
        request_labels: &RequestLabels,
        ttft: Duration,
        took: Duration,
    ) {
        self.in_flight.get_or_create(model_labels).inc();
        self.ttft
            .get_or_create(model_labels)
            .observe(ttft.as_secs_f64());
        self.in_flight.get_or_create(model_labels).dec();
        self.requests.get_or_create(request_labels).inc();
        self.duration
            .get_or_create(model_labels)
            .observe(took.as_secs_f64());
    }
}

fn record_router(metrics: &Metrics, ttft: Duration, took: Duration) {
    metrics.request_started(MODEL);
    metrics.first_token(MODEL, ttft);
    metrics.request_finished(MODEL, ENDPOINT, 200, took);
}

/// Nanoseconds per request with `threads` threads each recording
/// `REQUESTS_PER_THREAD` requests through `record(i)`.
fn ns_per_request(threads: usize, record: impl Fn(u32) + Sync) -> f64 {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for i in 0..REQUESTS_PER_THREAD {
                    record(i);
                }
            });
        }
    });
    // Wall time over requests per thread: what each request waited for.
    started.elapsed().as_nanos() as f64 / f64::from(REQUESTS_PER_THREAD)
}

/// Latencies that spread over the buckets, as real requests do.
fn latencies(i: u32) -> (Duration, Duration) {
    let micros = u64::from(i % 4096) * 97;
    (
        Duration::from_micros(micros / 4),
        Duration::from_micros(micros),
    )
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let router = Arc::new(Metrics::default());
    let library = Arc::new(LibraryMetrics::new());
    let model_labels = ModelLabels {
        model: MODEL.to_owned(),
    };
    let request_labels = RequestLabels {
        model: MODEL.to_owned(),
        endpoint: ENDPOINT.to_owned(),
        status: 200,
    };
    println!(
        "ns per request's metric updates ({REQUESTS_PER_THREAD} requests per thread, best of {ROUNDS} rounds)"
    );
    println!(
        "{:<44} {:>10} {:>10}",
        "implementation",
        "1 thread",
        format!("{cores} threads")
    );
    let mut best = [[f64::INFINITY; 2]; 3];
    // The first round also warms caches and creates every series.
    for _ in 0..ROUNDS {
        for (threads_index, threads) in [1, cores].into_iter().enumerate() {
            let figures = [
                ns_per_request(threads, |i| {
                    let (ttft, took) = latencies(i);
                    record_router(&router, ttft, took);
                }),
                ns_per_request(threads, |i| {
                    let (ttft, took) = latencies(i);
                    library.record(MODEL, ENDPOINT, 200, ttft, took);
                }),
                ns_per_request(threads, |i| {
                    let (ttft, took) = latencies(i);
                    library.record_prebuilt(&model_labels, &request_labels, ttft, took);
                }),
            ];
            for (row, ns) in figures.into_iter().enumerate() {
                best[row][threads_index] = best[row][threads_index].min(ns);
            }
        }
    }
    let names = [
        "router's own (atomics)",
        "prometheus-client (labels per request)",
        "prometheus-client (labels built once)",
    ];
    for (name, [one, all]) in names.into_iter().zip(best) {
        println!("{name:<44} {one:>10.1} {all:>10.1}");
    }
}
