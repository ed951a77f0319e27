//! One of two engines dies under load: requests that had not started
//! streaming are retried, and streams that had are resumed on the survivor
//! with exactly the text one uninterrupted answer has.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use llmgw_router::{Endpoint, Settings};

use crate::common::*;

#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    streams_complete: usize,
    failures: Vec<String>,
    /// (request body, what the client read) of every answer.
    answers: Vec<(String, String, Option<serde_json::Value>)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_engine_mid_stream_is_invisible_to_clients() {
    // 40 tokens 10 ms apart: every stream lasts about 0.4 s, so streams are
    // running on both engines whenever the kill comes.
    let slow = [
        ("LLMGW_SIM_ITL", "10ms"),
        ("LLMGW_SIM_OUTPUT_TOKENS", "200"),
    ];
    let mut victim = Sim::start(SMALL, &["m"], &slow);
    let survivor = Sim::start(SMALL, &["m"], &slow);
    // The same weights answering at full speed: what each answer must be.
    let reference = Sim::start(
        SMALL,
        &["m"],
        &[("LLMGW_SIM_ITL", "0ms"), ("LLMGW_SIM_OUTPUT_TOKENS", "200")],
    );
    for sim in [&victim, &survivor, &reference] {
        sim.wait_ready().await;
    }
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
    let url = format!("{}/v1/chat/completions", router.url());
    let stop = Arc::new(AtomicBool::new(false));

    // Twelve workers, two thirds streaming; each stops on the flag or after
    // 200 requests, whichever comes first.
    let mut workers = Vec::new();
    for w in 0..12 {
        let url = url.clone();
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let c = client();
            let stream = w % 3 != 0;
            let mut tally = Tally::default();
            for i in 0..200 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let body = tagged_chat_body(&format!("worker {w} request {i}"), stream, 40);
                match post(&c, &url, body.clone(), &[]).await {
                    Ok((200, answer)) if !stream => {
                        let v: serde_json::Value =
                            serde_json::from_str(&answer).unwrap_or_default();
                        match v["choices"][0]["message"]["content"].as_str() {
                            Some(text) => {
                                tally.ok += 1;
                                tally.answers.push((
                                    body,
                                    text.to_string(),
                                    Some(v["usage"].clone()),
                                ));
                            }
                            None => tally
                                .failures
                                .push(format!("200 without a completion: {answer}")),
                        }
                    }
                    Ok((200, answer)) => {
                        let read = read_stream(&answer);
                        if !read.done {
                            tally
                                .failures
                                .push(format!("stream without [DONE]: {answer}"));
                        } else if let Some(error) = read.error {
                            tally
                                .failures
                                .push(format!("stream ended with an error: {error}"));
                        } else if read.ids.len() != 1 {
                            tally
                                .failures
                                .push(format!("one stream, several ids: {:?}", read.ids));
                        } else {
                            tally.streams_complete += 1;
                            tally.answers.push((body, read.text, read.usage));
                        }
                    }
                    Ok((status, answer)) => {
                        tally.failures.push(format!("status {status}: {answer}"))
                    }
                    Err(e) => tally.failures.push(e),
                }
            }
            tally
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    victim.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);

    let mut total = Tally::default();
    for worker in workers {
        let t = tokio::time::timeout(Duration::from_secs(120), worker)
            .await
            .expect("a worker hung")
            .expect("worker panicked");
        total.ok += t.ok;
        total.streams_complete += t.streams_complete;
        total.failures.extend(t.failures);
        total.answers.extend(t.answers);
    }
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

    // Every answer, resumed or not, is exactly what one uninterrupted
    // generation says, and its usage adds up to one answer's.
    for (body, text, usage) in &total.answers {
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
