//! One of two engines dies under load: requests that had not started
//! streaming are retried, and streams that had are resumed on the survivor
//! with exactly the text one uninterrupted answer has.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use llmgw_router::{Endpoint, Settings};
use llmgw_test_kit::{DEADLINE, eventually};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_engine_mid_stream_is_invisible_to_clients() {
    let [mut victim, survivor, reference] = slow_pair_and_a_fast_reference().await;
    let settings = Settings {
        consecutive_failures: 2,
        ..test_settings()
    };
    let router = TestRouter::start(
        settings,
        vec![model(
            "m",
            &[],
            vec![
                Endpoint::ready(victim.url()),
                Endpoint::ready(survivor.url()),
            ],
        )],
    )
    .await;
    let load = ClientLoad::start(&format!("{}/v1/chat/completions", router.url()));
    until_streams_run_on(&router, &victim, &survivor).await;
    victim.kill();
    let answered_at_kill = load.answered();
    // Every worker finishes what the kill cut, and one more request besides.
    eventually("the load to go on past the kill", DEADLINE, || async {
        let after = load.answered() - answered_at_kill;
        if after >= 2 * WORKERS {
            Ok(())
        } else {
            Err(format!("{after} answers since the kill"))
        }
    })
    .await;
    let total = load.stop().await;

    assert_no_client_saw_a_failure(&total);
    assert_streams_on_the_killed_engine_were_resumed(&router).await;
    assert_every_answer_is_an_uninterrupted_one(&reference, &total.answers).await;
}

/// Two engines streaming slowly, and the same weights at full speed
/// (what each answer must be); all ready.
async fn slow_pair_and_a_fast_reference() -> [Sim; 3] {
    // 40 tokens 10 ms apart: every stream lasts about 0.4 s, so streams are
    // running on both engines whenever the kill comes.
    let slow = [
        ("LLMGW_SIM_ITL", "10ms"),
        ("LLMGW_SIM_OUTPUT_TOKENS", "200"),
    ];
    let victim = Sim::start(SMALL, &["m"], &slow);
    let survivor = Sim::start(SMALL, &["m"], &slow);
    let reference = Sim::start(
        SMALL,
        &["m"],
        &[("LLMGW_SIM_ITL", "0ms"), ("LLMGW_SIM_OUTPUT_TOKENS", "200")],
    );
    for sim in [&victim, &survivor, &reference] {
        sim.wait_ready().await;
    }
    [victim, survivor, reference]
}

#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    streams_complete: usize,
    failures: Vec<String>,
    /// (request body, what the client read) of every answer.
    answers: Vec<(String, String, Option<serde_json::Value>)>,
}

impl Tally {
    /// Counts one request's outcome: an answer with its text and usage, or
    /// the reason the client would see it as failed.
    fn record(&mut self, body: String, stream: bool, outcome: Result<(u16, String), String>) {
        match outcome {
            Ok((200, answer)) if !stream => self.record_completion(body, &answer),
            Ok((200, answer)) => self.record_stream(body, &answer),
            Ok((status, answer)) => self.failures.push(format!("status {status}: {answer}")),
            Err(e) => self.failures.push(e),
        }
    }

    fn record_completion(&mut self, body: String, answer: &str) {
        let v: serde_json::Value = serde_json::from_str(answer).unwrap_or_default();
        match v["choices"][0]["message"]["content"].as_str() {
            Some(text) => {
                self.ok += 1;
                self.answers
                    .push((body, text.to_string(), Some(v["usage"].clone())));
            }
            None => self
                .failures
                .push(format!("200 without a completion: {answer}")),
        }
    }

    fn record_stream(&mut self, body: String, answer: &str) {
        let read = read_stream(answer);
        if !read.done {
            self.failures
                .push(format!("stream without [DONE]: {answer}"));
        } else if let Some(error) = read.error {
            self.failures
                .push(format!("stream ended with an error: {error}"));
        } else if read.ids.len() != 1 {
            self.failures
                .push(format!("one stream, several ids: {:?}", read.ids));
        } else {
            self.streams_complete += 1;
            self.answers.push((body, read.text, read.usage));
        }
    }

    fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        self.streams_complete += other.streams_complete;
        self.failures.extend(other.failures);
        self.answers.extend(other.answers);
    }
}

/// Waits until a stream that has already sent text is running on the
/// victim: requests past their first byte and not yet finished outnumber
/// all the survivor holds, so at least one of them is on the victim.
async fn until_streams_run_on(router: &TestRouter, victim: &Sim, survivor: &Sim) {
    let metrics_url = format!("{}/metrics", router.url());
    let outstanding = |sim: &Sim| {
        format!(
            "llmgw_router_endpoint_outstanding_requests{{endpoint=\"{}\"}}",
            sim.url()
        )
    };
    let (on_victim, on_survivor) = (outstanding(victim), outstanding(survivor));
    eventually("text streaming from the engine to kill", DEADLINE, || async {
        let (_, metrics) = get(&metrics_url).await.ok_or("no /metrics")?;
        let read = |name: &str| metric(&metrics, name).unwrap_or(0.0);
        let sending = read("llmgw_router_time_to_first_token_seconds_count{model=\"m\"}")
            - read("llmgw_router_request_duration_seconds_count{model=\"m\"}");
        let (victim_holds, survivor_holds) = (read(&on_victim), read(&on_survivor));
        if victim_holds > 0.0 && sending > survivor_holds {
            Ok(())
        } else {
            Err(format!(
                "{sending} answers sending, {victim_holds} requests on the victim, {survivor_holds} on the survivor"
            ))
        }
    })
    .await;
}

const WORKERS: usize = 12;

/// Two thirds of the workers stream.
fn streams(worker: usize) -> bool {
    !worker.is_multiple_of(3)
}

/// Twelve workers, two thirds streaming; each stops on the flag or after
/// 200 requests, whichever comes first.
struct ClientLoad {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    workers: Vec<tokio::task::JoinHandle<Tally>>,
}

impl ClientLoad {
    fn start(url: &str) -> ClientLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let workers = (0..WORKERS)
            .map(|w| {
                tokio::spawn(worker(
                    w,
                    url.to_string(),
                    Arc::clone(&stop),
                    Arc::clone(&answered),
                ))
            })
            .collect();
        ClientLoad {
            stop,
            answered,
            workers,
        }
    }

    /// Requests finished so far, whatever their outcome.
    fn answered(&self) -> usize {
        self.answered.load(Ordering::Relaxed)
    }

    /// Stops the workers and adds up what they saw.
    async fn stop(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = Tally::default();
        for worker in self.workers {
            let t = tokio::time::timeout(Duration::from_secs(120), worker)
                .await
                .expect("a worker hung")
                .expect("worker panicked");
            total.add(t);
        }
        total
    }
}

async fn worker(w: usize, url: String, stop: Arc<AtomicBool>, answered: Arc<AtomicUsize>) -> Tally {
    let c = client();
    let stream = streams(w);
    let mut tally = Tally::default();
    for i in 0..200 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let body = tagged_chat_body(&format!("worker {w} request {i}"), stream, 40);
        let outcome = post(&c, &url, body.clone(), &[]).await;
        tally.record(body, stream, outcome);
        answered.fetch_add(1, Ordering::Relaxed);
    }
    tally
}

fn assert_no_client_saw_a_failure(total: &Tally) {
    println!(
        "{} answers, {} streams complete, failures: {:?}",
        total.ok, total.streams_complete, total.failures
    );
    assert!(
        total.failures.is_empty(),
        "client-visible failures: {:#?}",
        total.failures
    );
    assert!(total.ok > 0 && total.streams_complete > 0, "{total:?}");
}

async fn assert_streams_on_the_killed_engine_were_resumed(router: &TestRouter) {
    let (_, metrics) = get(&format!("{}/metrics", router.url())).await.unwrap();
    let resumed = metric(
        &metrics,
        "llmgw_router_stream_resumptions_total{model=\"m\",outcome=\"resumed\"}",
    )
    .unwrap_or(0.0);
    println!("streams resumed on the survivor: {resumed}");
    assert!(
        resumed >= 1.0,
        "no stream was on the killed engine:\n{metrics}"
    );
}

/// Every answer, resumed or not, is exactly what one uninterrupted
/// generation says, and its usage adds up to one answer's.
async fn assert_every_answer_is_an_uninterrupted_one(
    reference: &Sim,
    answers: &[(String, String, Option<serde_json::Value>)],
) {
    for (body, text, usage) in answers {
        let (expected, expected_usage) = reference_answer(&reference.url(), body).await;
        assert_eq!(
            text, &expected,
            "answer to {body} differs from an uninterrupted one"
        );
        let usage = usage.as_ref().expect("usage was asked for");
        assert_eq!(usage["completion_tokens"], 40, "{body}: {usage}");
        assert_eq!(
            usage["prompt_tokens"], expected_usage["prompt_tokens"],
            "{body}: {usage}"
        );
        assert_eq!(
            usage["total_tokens"], expected_usage["total_tokens"],
            "{body}: {usage}"
        );
    }
}
