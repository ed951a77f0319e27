//! What checking a request's API key and holding it to its limits costs on
//! the router's hot path, per request: no keys at all (what a router
//! without keys pays), a key from router.yaml, a control-plane key without
//! limits (the SHA-256 lookup), one with a per-minute and a concurrency
//! limit (lookup, bucket, permit taken and released), and that with the
//! answer metered for usage (a whole non-streamed answer read through the
//! meter and charged to the key).
//!
//!     cargo run --release -p llmgw-router --example key-cost
//!
//! Prints nanoseconds per request, min / median / max over `ROUNDS`
//! rounds, on one thread.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use hyper::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use llmgw_api::keys::{ApiKeyRecord, KeyLimits, KeySettings, secret_digest};
use llmgw_router::{KeyGrant, KeyRing, Settings};

const REQUESTS: u32 = 200_000;
const ROUNDS: usize = 9;
/// Keys the control plane holds, so the lookup is in a map of some size.
const KEYS: usize = 1_000;
const SECRET: &str = "sk-llmgw-4f1c0d7e2b9a8c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";

fn record(name: String, secret: &str, limits: KeyLimits) -> ApiKeyRecord {
    ApiKeyRecord {
        name,
        settings: KeySettings {
            limits,
            ..KeySettings::default()
        },
        secret_sha256: secret_digest(secret),
        secret_prefix: String::new(),
        created_at_ms: 0,
        rotated_at_ms: None,
        revoked_at_ms: None,
    }
}

fn ring(limits: KeyLimits) -> KeyRing {
    let mut records: Vec<ApiKeyRecord> = (0..KEYS)
        .map(|i| record(format!("k{i}"), &format!("sk-llmgw-other-{i}"), limits))
        .collect();
    records.push(record("bench".into(), SECRET, limits));
    KeyRing::from_records(&records)
}

/// A non-streamed chat answer as vLLM writes it.
const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"total_tokens":21,"completion_tokens":9,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}"#;

fn per_request(
    settings: &Settings,
    ring: &KeyRing,
    headers: &HeaderMap,
    reads: Option<bool>,
    runtime: &tokio::runtime::Runtime,
) -> Vec<f64> {
    let limiter = llmgw_router::Limiter::default();
    let ledger = Arc::new(llmgw_router::UsageLedger::default());
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..REQUESTS {
            let grant = llmgw_router::authenticate(settings, ring, headers, 1).expect("admitted");
            if let Some(grant) = grant {
                let admitted = limiter
                    .admit(&grant, tokio::time::Instant::now(), 1)
                    .expect("within the limits");
                std::hint::black_box(&admitted);
                if let Some(metered) = reads {
                    let body = Full::new(Bytes::from_static(ANSWER.as_bytes()))
                        .map_err(|never| match never {})
                        .boxed_unsync();
                    let answer = if metered {
                        ledger
                            .meter(&grant.name, &grant.team, "m", 200, body)
                            .boxed_unsync()
                    } else {
                        body
                    };
                    runtime.block_on(answer.collect()).expect("a whole answer");
                }
            }
        }
        rounds.push(started.elapsed().as_nanos() as f64 / f64::from(REQUESTS));
    }
    rounds.sort_by(f64::total_cmp);
    rounds
}

fn main() {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {SECRET}")).unwrap(),
    );
    let open = Settings::default();
    let configured = Settings {
        api_keys: vec![KeyGrant {
            name: "bench".into(),
            key: SECRET.into(),
            models: Vec::new(),
        }],
        ..Settings::default()
    };
    let limited = KeyLimits {
        // High enough that the bench never meets it.
        requests_per_minute: Some(u32::MAX),
        max_concurrent_requests: Some(u32::MAX),
        ..KeyLimits::default()
    };
    // The last field: whether a whole answer is read after admission
    // (`Some`), and then whether through the usage meter.
    let cases = [
        ("no keys", &open, KeyRing::default(), None),
        ("router.yaml key", &configured, KeyRing::default(), None),
        ("control-plane key", &open, ring(KeyLimits::default()), None),
        (
            "control-plane key, rpm + concurrency",
            &open,
            ring(limited),
            None,
        ),
        (
            "... + answer read, unmetered",
            &open,
            ring(limited),
            Some(false),
        ),
        (
            "... + answer metered for usage",
            &open,
            ring(limited),
            Some(true),
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    println!("{REQUESTS} requests a round, {ROUNDS} rounds, {KEYS} other keys held");
    println!(
        "{:<40} {:>10} {:>10} {:>10}",
        "case", "min ns", "median ns", "max ns"
    );
    for (name, settings, ring, reads) in &cases {
        let rounds = per_request(settings, ring, &headers, *reads, &runtime);
        println!(
            "{name:<40} {:>10.0} {:>10.0} {:>10.0}",
            rounds[0],
            rounds[rounds.len() / 2],
            rounds[rounds.len() - 1]
        );
    }
}
