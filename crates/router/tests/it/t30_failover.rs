//! One of two engines dies under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use llmgw_router::{Endpoint, Settings};

use crate::common::*;

#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    streams_complete: usize,
    streams_cut_cleanly: usize,
    failures: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_engine_fails_no_request_that_had_not_started_streaming() {
    // 40 tokens 10 ms apart: every stream lasts about 0.4 s, so streams are
    // running on both engines whenever the kill comes.
    let slow = [
        ("LLMGW_SIM_ITL", "10ms"),
        ("LLMGW_SIM_OUTPUT_TOKENS", "200"),
    ];
    let mut victim = Sim::start(SMALL, &["m"], &slow);
    let survivor = Sim::start(SMALL, &["m"], &slow);
    victim.wait_ready().await;
    survivor.wait_ready().await;
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
            for _ in 0..200 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match post(&c, &url, chat_body("m", stream, 40), &[]).await {
                    Ok((200, body)) if !stream => {
                        if body.contains("\"chat.completion\"") {
                            tally.ok += 1;
                        } else {
                            tally
                                .failures
                                .push(format!("200 without a completion: {body}"));
                        }
                    }
                    Ok((200, body)) => {
                        let ends_done = body.ends_with("data: [DONE]\n\n");
                        if !ends_done {
                            tally
                                .failures
                                .push(format!("stream without [DONE]: {body}"));
                        } else if body.contains("data: {\"error\"") {
                            tally.streams_cut_cleanly += 1;
                        } else {
                            tally.streams_complete += 1;
                        }
                    }
                    Ok((status, body)) => tally.failures.push(format!("status {status}: {body}")),
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
        total.streams_cut_cleanly += t.streams_cut_cleanly;
        total.failures.extend(t.failures);
    }
    println!("{total:?}");
    assert!(
        total.failures.is_empty(),
        "client-visible failures: {:#?}",
        total.failures
    );
    assert!(total.ok > 0 && total.streams_complete > 0, "{total:?}");
    // Streams on the killed engine had started: they end with an error
    // event and [DONE], which the match above already checked.
    assert!(
        total.streams_cut_cleanly > 0,
        "no stream was on the killed engine: {total:?}"
    );
}
