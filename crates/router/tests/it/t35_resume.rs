//! The bounds of mid-stream failover: resumptions per stream, the memory
//! all streams may hold, and the per-request switch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_router::{Endpoint, ResumeSettings, Settings};

use crate::common::*;

/// Engines that cut every stream after three tokens.
fn cutting_engines(count: usize) -> Vec<Sim> {
    (0..count)
        .map(|_| {
            Sim::start(
                SMALL,
                &["m"],
                &[
                    ("LLMGW_SIM_FAULT", "crash_mid_stream:cut@3"),
                    ("LLMGW_SIM_OUTPUT_TOKENS", "30"),
                ],
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_resumption_budget_ends_with_an_error_event() {
    let engines = cutting_engines(3);
    let reference = Sim::start(SMALL, &["m"], &[("LLMGW_SIM_OUTPUT_TOKENS", "30")]);
    for sim in engines.iter().chain([&reference]) {
        sim.wait_ready().await;
    }
    let settings = Settings {
        resume: ResumeSettings {
            max_resumptions: 1,
            ..ResumeSettings::default()
        },
        ..test_settings()
    };
    let endpoints = engines.iter().map(|e| Endpoint::ready(e.url())).collect();
    let router = TestRouter::start(settings, vec![model("m", &[], endpoints)]).await;
    let url = format!("{}/v1/chat/completions", router.url());
    let body = tagged_chat_body("budget", true, 20);
    // The first six tokens of the uninterrupted answer.
    let (six_tokens, _) =
        reference_answer(&reference.url(), &tagged_chat_body("budget", true, 6)).await;
    let (three_tokens, _) =
        reference_answer(&reference.url(), &tagged_chat_body("budget", true, 3)).await;

    let (status, answer) = post(&client(), &url, body.clone(), &[]).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    let read = read_stream(&answer);
    // Three tokens from the first engine, three from the one that took
    // over, then no resumption was left.
    assert_eq!(read.text, six_tokens, "{answer}");
    let error = read.error.expect("the stream ended with an error event");
    assert!(error.contains("stopped mid-answer"), "{error}");
    assert!(error.contains("resumptions"), "{error}");
    assert!(read.done, "{answer}");
    assert_eq!(read.ids.len(), 1, "{:?}", read.ids);

    let (_, metrics) = get(&format!("{}/metrics", router.url())).await.unwrap();
    for (outcome, count) in [("resumed", 1.0), ("resumption_limit", 1.0)] {
        let series =
            format!("llmgw_router_stream_resumptions_total{{model=\"m\",outcome=\"{outcome}\"}}");
        assert_eq!(metric(&metrics, &series), Some(count), "{metrics}");
    }

    // Turned off for one request: the first cut ends the stream.
    let (status, answer) = post(&client(), &url, body, &[("x-llmgw-resume", "off")])
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    let read = read_stream(&answer);
    assert!(read.error.is_some(), "{answer}");
    assert_eq!(read.text, three_tokens, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_streams_hold_no_more_than_the_memory_cap() {
    let slow = [
        ("LLMGW_SIM_ITL", "20ms"),
        ("LLMGW_SIM_OUTPUT_TOKENS", "200"),
    ];
    let engine = Sim::start(SMALL, &["m"], &slow);
    engine.wait_ready().await;
    let cap = 1200;
    let settings = Settings {
        resume: ResumeSettings {
            max_text_bytes: 100,
            memory_cap_bytes: cap,
            ..ResumeSettings::default()
        },
        ..test_settings()
    };
    let router = TestRouter::start(
        settings,
        vec![model("m", &[], vec![Endpoint::ready(engine.url())])],
    )
    .await;
    let url = format!("{}/v1/chat/completions", router.url());
    let metrics_url = format!("{}/metrics", router.url());
    let held = || async {
        let (_, metrics) = get(&metrics_url).await.expect("metrics");
        metric(&metrics, "llmgw_router_resume_bytes_held").expect("the gauge is there")
    };

    // Streams of about 4 s each. As many as the cap holds go first; once
    // their bodies are held, seven more cannot all be protected, however
    // slowly a loaded machine opens them (opened all at once, they could
    // arrive as the first ones end, and every one fit).
    let body =
        |i: usize| tagged_chat_body(&format!("stream {i:02} {}", "x".repeat(100)), true, 200);
    let body_len = body(0).len();
    let first = cap / body_len;
    let open = |i: usize| {
        let url = url.clone();
        let body = body(i);
        tokio::spawn(async move { post(&client(), &url, body, &[]).await })
    };
    let mut streams: Vec<_> = (0..first).map(open).collect();
    let charged = (first * body_len) as f64;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while held().await < charged {
        assert!(
            std::time::Instant::now() < deadline,
            "the first {first} streams were never all held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    streams.extend((first..first + 7).map(open));
    let mut most = 0.0_f64;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !streams.iter().all(|s| s.is_finished()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the streams did not finish"
        );
        most = most.max(held().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("most held while streaming: {most} bytes (cap {cap})");
    assert!(most > 0.0, "nothing was held: the gauge does not move");
    assert!(
        most <= cap as f64,
        "held {most} bytes, over the cap of {cap}"
    );
    for stream in streams {
        let (status, answer) = stream.await.unwrap().unwrap();
        assert_eq!(status, 200, "{answer}");
        assert!(read_stream(&answer).error.is_none(), "{answer}");
    }
    assert_eq!(held().await, 0.0, "finished streams still hold memory");
    let (_, metrics) = get(&metrics_url).await.unwrap();
    let unprotected = metric(
        &metrics,
        "llmgw_router_stream_resumptions_total{model=\"m\",outcome=\"memory_cap\"}",
    );
    assert!(unprotected.is_some_and(|n| n >= 1.0), "{metrics}");
}

/// Engines that die once an answer is over (its finish reason sent; the
/// usage event and `[DONE]` lost) are not asked to continue it: the client
/// reads the whole answer once, ended as a stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_finish_is_ended_not_resumed() {
    let ten_tokens = [("LLMGW_SIM_OUTPUT_TOKENS", "10")];
    let cutters: Vec<Sim> = (0..2)
        .map(|_| {
            Sim::start(
                SMALL,
                &["m"],
                &[
                    ("LLMGW_SIM_FAULT", "crash_mid_stream:cut_after_finish"),
                    ten_tokens[0],
                ],
            )
        })
        .collect();
    let reference = Sim::start(SMALL, &["m"], &ten_tokens);
    for sim in cutters.iter().chain([&reference]) {
        sim.wait_ready().await;
    }
    let endpoints = cutters.iter().map(|e| Endpoint::ready(e.url())).collect();
    let router = TestRouter::start(test_settings(), vec![model("m", &[], endpoints)]).await;
    let url = format!("{}/v1/chat/completions", router.url());

    // Ten tokens and a stop within 20, and six cut short by max_tokens.
    for (tag, max_tokens, finish) in [("stops", 20, "stop"), ("runs out", 6, "length")] {
        let body = tagged_chat_body(tag, true, max_tokens);
        let (expected, _) = reference_answer(&reference.url(), &body).await;
        let (status, answer) = post(&client(), &url, body, &[]).await.unwrap();
        assert_eq!(status, 200, "{answer}");
        let read = read_stream(&answer);
        assert_eq!(read.error, None, "{answer}");
        assert_eq!(read.text, expected, "{answer}");
        assert_eq!(read.finish_reason.as_deref(), Some(finish), "{answer}");
        assert_eq!(
            answer.matches("\"finish_reason\":\"").count(),
            1,
            "{answer}"
        );
        assert!(read.done, "{answer}");
    }
    let (_, metrics) = get(&format!("{}/metrics", router.url())).await.unwrap();
    let resumed = "llmgw_router_stream_resumptions_total{model=\"m\",outcome=\"resumed\"}";
    assert_eq!(metric(&metrics, resumed), None, "{metrics}");
}

/// A request that could never be continued (here: logprobs) keeps nothing
/// against the memory cap while it streams, and when its engine dies the
/// stream ends saying why it was not resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_could_never_be_resumed_holds_nothing() {
    let engine = Sim::start(
        SMALL,
        &["m"],
        &[
            ("LLMGW_SIM_ITL", "20ms"),
            ("LLMGW_SIM_OUTPUT_TOKENS", "100"),
            ("LLMGW_SIM_FAULT", "crash_mid_stream:cut@25"),
        ],
    );
    engine.wait_ready().await;
    let router = TestRouter::start(
        test_settings(),
        vec![model("m", &[], vec![Endpoint::ready(engine.url())])],
    )
    .await;
    let url = format!("{}/v1/chat/completions", router.url());
    let metrics_url = format!("{}/metrics", router.url());
    let body = r#"{"model":"m","stream":true,"max_tokens":60,"logprobs":true,"messages":[{"role":"user","content":"never resumed"}]}"#;
    let stream = tokio::spawn(async move { post(&client(), &url, body.to_string(), &[]).await });

    let (mut most, mut samples_in_flight) = (0.0_f64, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !stream.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream did not end"
        );
        let (_, metrics) = get(&metrics_url).await.expect("metrics");
        let in_flight = metric(&metrics, "llmgw_router_in_flight_requests{model=\"m\"}");
        if in_flight == Some(1.0) {
            samples_in_flight += 1;
            most = most.max(metric(&metrics, "llmgw_router_resume_bytes_held").unwrap_or(0.0));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(samples_in_flight > 0, "never saw the stream in flight");
    assert_eq!(most, 0.0, "an unresumable stream held {most} bytes");
    let (status, answer) = stream.await.unwrap().unwrap();
    assert_eq!(status, 200, "{answer}");
    let error = read_stream(&answer)
        .error
        .expect("the cut ends with an error event");
    assert!(
        error.contains("answers with logprobs are not resumed"),
        "{error}"
    );
}

/// An engine whose stream is not made of events (no blank line ever ends
/// one) is not buffered without end: past a megabyte the stream is taken
/// as failed and ends with an error event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_without_end_is_not_held_without_limit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = vec![0u8; 64 * 1024];
        let _ = socket.read(&mut request).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        socket.write_all(head.as_bytes()).await.unwrap();
        let piece = format!("{:x}\r\ndata: {}\r\n", 6 + 64 * 1024, "x".repeat(64 * 1024));
        // 4 MiB of one endless data line, then the engine stays silent.
        for _ in 0..64 {
            if socket.write_all(piece.as_bytes()).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    let router = TestRouter::start(
        test_settings(),
        vec![model("m", &[], vec![Endpoint::ready(&engine_url)])],
    )
    .await;
    let url = format!("{}/v1/chat/completions", router.url());
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        post(&client(), &url, tagged_chat_body("endless", true, 10), &[]),
    )
    .await
    .expect("the stream was held open")
    .unwrap();
    assert_eq!(answer.0, 200);
    let tail = &answer.1[answer.1.len().saturating_sub(600)..];
    assert!(tail.contains("without ending"), "{tail}");
    assert!(tail.ends_with("data: [DONE]\n\n"), "{tail}");
}

/// Engines on `listeners` ports that answer the i-th request of all of
/// them together with `answers[i]` (raw bytes after a 200 event-stream
/// head, or a whole response when it starts with its own head; the
/// connection closes after it) and keep every request body.
async fn scripted_engines(
    listeners: usize,
    answers: Vec<&'static str>,
) -> (Vec<String>, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answers = Arc::new(Mutex::new(answers.into_iter()));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let mut urls = Vec::new();
    for _ in 0..listeners {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        urls.push(format!("http://{}", listener.local_addr().unwrap()));
        let (answers, requests) = (Arc::clone(&answers), Arc::clone(&requests));
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, then as many body bytes as it declares.
                let body = loop {
                    let Ok(n @ 1..) = socket.read(&mut buf).await else {
                        break None;
                    };
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).into_owned();
                    let Some(head_end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let length = text[..head_end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if request.len() >= head_end + 4 + length {
                        break Some(text[head_end + 4..].to_string());
                    }
                };
                let Some(body) = body else { continue };
                if request.starts_with(b"GET") {
                    // Health probes and metrics scrapes: healthy, no figures.
                    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = socket.write_all(ok.as_bytes()).await;
                    continue;
                }
                requests.lock().unwrap().push(body);
                let answer = answers.lock().unwrap().next().unwrap_or("");
                // An answer with its own head is sent as it is.
                let head = if answer.starts_with("HTTP/") {
                    ""
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                };
                let _ = socket.write_all(format!("{head}{answer}").as_bytes()).await;
            }
        });
    }
    (urls, requests)
}

/// Events whose lines end with CRLF (the SSE format allows LF, CRLF and
/// CR) are framed as events: a whole answer passes as it came, and one
/// cut mid-way is resumed from exactly the text the client read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_ended_by_crlf_are_followed_and_resumed() {
    const ROLE: &str = "data: {\"id\":\"chatcmpl-a\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\r\n\r\n";
    const HELLO: &str = "data: {\"id\":\"chatcmpl-a\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\r\n\r\n";
    const THERE: &str = "data: {\"id\":\"chatcmpl-a\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}]}\r\n\r\n";
    const FINISH: &str = "data: {\"id\":\"chatcmpl-a\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\r\n\r\ndata: [DONE]\r\n\r\n";
    const REST: &str = "data: {\"id\":\"chatcmpl-b\",\"created\":9,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\r\n\r\ndata: {\"id\":\"chatcmpl-b\",\"created\":9,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" friend\"},\"finish_reason\":\"stop\"}]}\r\n\r\ndata: [DONE]\r\n\r\n";
    let client_reads = |answer: &str| read_stream(&answer.replace("\r\n", "\n"));

    // Whole: the client reads the answer unchanged.
    let whole: &'static str = Box::leak(format!("{ROLE}{HELLO}{THERE}{FINISH}").into_boxed_str());
    let (urls, _) = scripted_engines(1, vec![whole]).await;
    let router = TestRouter::start(
        test_settings(),
        vec![model("m", &[], vec![Endpoint::ready(&urls[0])])],
    )
    .await;
    let url = format!("{}/v1/chat/completions", router.url());
    let (status, answer) = post(&client(), &url, tagged_chat_body("crlf", true, 10), &[])
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, whole);

    // Cut after two words: the second engine is asked to continue them.
    let cut: &'static str = Box::leak(format!("{ROLE}{HELLO}{THERE}").into_boxed_str());
    let (urls, requests) = scripted_engines(2, vec![cut, REST]).await;
    let endpoints = urls.iter().map(Endpoint::ready).collect();
    let router = TestRouter::start(test_settings(), vec![model("m", &[], endpoints)]).await;
    let url = format!("{}/v1/chat/completions", router.url());
    let (status, answer) = post(&client(), &url, tagged_chat_body("crlf cut", true, 10), &[])
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    let read = client_reads(&answer);
    assert_eq!(read.error, None, "{answer}");
    assert_eq!(read.text, "Hello there friend", "{answer}");
    assert_eq!(read.ids.len(), 1, "{answer}");
    assert_eq!(read.finish_reason.as_deref(), Some("stop"), "{answer}");
    assert!(read.done, "{answer}");
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let continuation: serde_json::Value = serde_json::from_str(&requests[1]).unwrap();
    let messages = continuation["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap(),
        &serde_json::json!({"role": "assistant", "content": "Hello there"}),
        "{continuation}"
    );
    assert_eq!(continuation["continue_final_message"], true);
}

/// A stream no longer followed (a tool call) whose engine breaks after the
/// answer finished lost only its end: the client reads `[DONE]`, not an
/// error after a complete answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfollowed_stream_broken_after_its_finish_ends_cleanly() {
    let events = [
        r#"data: {"id":"c","created":1,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        r#"data: {"id":"c","created":1,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}"#,
        r#"data: {"id":"c","created":1,"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
    ];
    // Chunked, and cut before its last chunk: the body breaks.
    let mut answer =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_string();
    for event in events {
        let chunk = format!("{event}\n\n");
        answer.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    answer.push_str("40\r\ndata: {\"id\"");
    let (urls, _) = scripted_engines(1, vec![Box::leak(answer.into_boxed_str())]).await;
    let router = TestRouter::start(
        test_settings(),
        vec![model("m", &[], vec![Endpoint::ready(&urls[0])])],
    )
    .await;
    let url = format!("{}/v1/chat/completions", router.url());
    let (status, answer) = post(&client(), &url, tagged_chat_body("tool", true, 10), &[])
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(!answer.contains("\"error\""), "{answer}");
    assert!(
        answer.contains("\"finish_reason\":\"tool_calls\""),
        "{answer}"
    );
    assert!(answer.ends_with("\n\ndata: [DONE]\n\n"), "{answer}");
}
