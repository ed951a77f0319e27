//! Serving: exact stream and response shapes, limits, errors and metrics.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

fn parse(events: &[String]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
        .collect()
}

#[test]
fn chat_stream_has_role_content_finish_usage_and_done() {
    for persona in PERSONAS {
        let sim = Sim::ready(persona, SMALL, &[], &[]);
        let body = chat_body(
            SMALL,
            4,
            true,
            ",\"stream_options\":{\"include_usage\":true}",
        );
        let reply = post(sim.port, "/v1/chat/completions", &body).unwrap();
        assert_eq!(reply.status, 200, "{persona}");
        assert!(
            reply
                .header("content-type")
                .unwrap()
                .starts_with("text/event-stream"),
            "{persona}"
        );
        assert!(reply.complete, "{persona}");
        let events = reply.events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{persona}"
        );
        let chunks = parse(&events);
        let id = chunks[0]["id"].clone();
        assert!(
            chunks
                .iter()
                .all(|c| c["id"] == id && c["object"] == "chat.completion.chunk"),
            "{persona}"
        );
        assert_eq!(
            chunks[0]["choices"][0]["delta"]["role"], "assistant",
            "{persona}"
        );
        assert_eq!(chunks[0]["choices"][0]["delta"]["content"], "", "{persona}");
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], Value::Array(vec![]), "{persona}");
        assert_eq!(usage["usage"]["completion_tokens"], 4, "{persona}");
        let prompt = usage["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(usage["usage"]["total_tokens"], prompt + 4, "{persona}");
        let content: Vec<&Value> = chunks[1..chunks.len() - 1].iter().collect();
        if is_vllm(persona) {
            // vLLM: four content chunks, the last carrying finish_reason.
            assert_eq!(content.len(), 4, "{persona}: {events:?}");
            assert!(
                content[..3]
                    .iter()
                    .all(|c| c["choices"][0]["finish_reason"].is_null())
            );
            assert_eq!(content[3]["choices"][0]["finish_reason"], "length");
            assert!(
                content[3]["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            );
            assert!(content[3]["choices"][0]["stop_reason"].is_null());
        } else {
            // SGLang: four content chunks, then an empty-delta finish chunk.
            assert_eq!(content.len(), 5, "{persona}: {events:?}");
            assert!(
                content[..4]
                    .iter()
                    .all(|c| c["choices"][0]["finish_reason"].is_null())
            );
            assert_eq!(content[4]["choices"][0]["finish_reason"], "length");
            assert!(content[4]["choices"][0]["delta"]["content"].is_null());
            assert!(
                content[0].get("usage").is_some_and(Value::is_null),
                "SGLang serializes null fields"
            );
        }
    }
}

#[test]
fn stream_without_include_usage_has_no_usage_chunk() {
    for persona in PERSONAS {
        let sim = Sim::ready(persona, SMALL, &[], &[]);
        let reply = post(
            sim.port,
            "/v1/completions",
            &format!(
                "{{\"model\":\"{SMALL}\",\"prompt\":\"Once\",\"max_tokens\":3,\"stream\":true}}"
            ),
        )
        .unwrap();
        let chunks = parse(&reply.events());
        assert!(
            chunks.iter().all(|c| c["object"] == "text_completion"
                && !c["choices"].as_array().unwrap().is_empty()),
            "{persona}: {chunks:?}"
        );
        assert!(
            chunks
                .iter()
                .all(|c| c.get("usage").is_none_or(Value::is_null)),
            "{persona}"
        );
        assert_eq!(reply.events().last().map(String::as_str), Some("[DONE]"));
    }
}

#[test]
fn non_stream_reports_usage_stop_and_n() {
    for persona in PERSONAS {
        let sim = Sim::ready(persona, SMALL, &[], &[]);
        let reply = post(
            sim.port,
            "/v1/chat/completions",
            &chat_body(
                SMALL,
                40,
                false,
                ",\"n\":2,\"ignore_eos\":true,\"stop\":[\"fox\"]",
            ),
        )
        .unwrap();
        assert_eq!(reply.status, 200, "{persona}: {}", reply.body);
        let json = reply.json();
        assert_eq!(json["object"], "chat.completion");
        let choices = json["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2, "{persona}");
        let mut tokens = 0;
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i);
            let text = c["message"]["content"].as_str().unwrap();
            assert!(
                !text.contains("fox"),
                "{persona}: stop string leaked: {text}"
            );
            assert_eq!(c["finish_reason"], "stop", "{persona}: {c}");
            let matched = if is_vllm(persona) {
                &c["stop_reason"]
            } else {
                &c["matched_stop"]
            };
            assert_eq!(matched, "fox", "{persona}");
            tokens += 1;
        }
        assert!(tokens == 2);
        let usage = &json["usage"];
        assert_eq!(
            usage["total_tokens"].as_u64(),
            Some(
                usage["prompt_tokens"].as_u64().unwrap()
                    + usage["completion_tokens"].as_u64().unwrap()
            )
        );
        if is_vllm(persona) {
            assert!(json["id"].as_str().unwrap().starts_with("chatcmpl-"));
        } else {
            assert_eq!(
                json["id"].as_str().unwrap().len(),
                32,
                "SGLang ids are uuid hex"
            );
        }
    }
}

#[test]
fn errors_come_in_each_engines_shape() {
    for persona in PERSONAS {
        let sim = Sim::ready(persona, SMALL, &[], &[]);
        let reply = post(
            sim.port,
            "/v1/chat/completions",
            &chat_body("no-such-model", 4, false, ""),
        )
        .unwrap();
        assert_eq!(reply.status, 404, "{persona}");
        let json = reply.json();
        let error = if is_vllm(persona) {
            assert!(json.get("object").is_none(), "{persona}: nested shape");
            json["error"].clone()
        } else {
            assert_eq!(json["object"], "error", "{persona}: flat shape");
            json.clone()
        };
        assert_eq!(
            error["message"],
            "The model `no-such-model` does not exist."
        );
        assert_eq!(error["type"], "NotFoundError");
        assert_eq!(error["code"], 404);
        let too_long = post(
            sim.port,
            "/v1/chat/completions",
            &chat_body(SMALL, 40000, false, ""),
        )
        .unwrap();
        assert_eq!(too_long.status, 400, "{persona}: {}", too_long.body);
        assert!(
            too_long.body.contains("maximum context length"),
            "{persona}"
        );
        let embed = post(
            sim.port,
            "/v1/embeddings",
            &format!("{{\"model\":\"{SMALL}\",\"input\":\"x\"}}"),
        )
        .unwrap();
        assert_eq!(
            embed.status, 400,
            "{persona}: a chat model has no embeddings"
        );
    }
}

#[test]
fn embedding_model_embeds() {
    let model = "BAAI/bge-small-en-v1.5";
    for persona in PERSONAS {
        let sim = Sim::ready(persona, model, &[], &[]);
        let reply = post(
            sim.port,
            "/v1/embeddings",
            &format!("{{\"model\":\"{model}\",\"input\":[\"a\",\"b\"]}}"),
        )
        .unwrap();
        assert_eq!(reply.status, 200, "{persona}: {}", reply.body);
        let json = reply.json();
        assert_eq!(json["data"].as_array().unwrap().len(), 2);
        assert_eq!(
            json["data"][0]["embedding"].as_array().unwrap().len(),
            384,
            "hidden size of bge-small"
        );
    }
}

#[test]
fn batch_limit_queues_and_metrics_follow_state() {
    for persona in PERSONAS {
        let limit = if is_vllm(persona) {
            "--max-num-seqs"
        } else {
            "--max-running-requests"
        };
        let mut extra = vec![limit, "1"];
        if !is_vllm(persona) {
            extra.push("--enable-metrics");
        }
        let sim = Sim::ready(persona, SMALL, &extra, &[("LLMGW_SIM_ITL", "100ms")]);
        let port = sim.port;
        let slow = std::thread::spawn(move || {
            post(
                port,
                "/v1/chat/completions",
                &chat_body(SMALL, 20, true, ""),
            )
        });
        let slow2 = std::thread::spawn(move || {
            post(
                port,
                "/v1/chat/completions",
                &chat_body(SMALL, 20, true, ""),
            )
        });
        let (running, waiting) = if is_vllm(persona) {
            ("vllm:num_requests_running", "vllm:num_requests_waiting")
        } else {
            ("sglang:num_running_reqs", "sglang:num_queue_reqs")
        };
        assert!(
            wait_until_blocking(Duration::from_secs(20), || sim.metric(running) == Some(1.0)
                && sim.metric(waiting) == Some(1.0)),
            "{persona}: expected one running and one waiting; metrics:\n{}",
            get(port, "/metrics").unwrap().body
        );
        let usage = if is_vllm(persona) {
            "vllm:kv_cache_usage_perc"
        } else {
            "sglang:token_usage"
        };
        assert!(
            sim.metric(usage).unwrap() > 0.0,
            "{persona}: KV usage follows tokens in flight"
        );
        assert!(slow.join().unwrap().unwrap().complete && slow2.join().unwrap().unwrap().complete);
        assert!(wait_until_blocking(Duration::from_secs(10), || sim
            .metric(running)
            == Some(0.0)));
        let body = get(port, "/metrics").unwrap().body;
        if is_vllm(persona) {
            assert!(
                body.contains(&format!(
                    "vllm:generation_tokens_total{{engine=\"0\",model_name=\"{SMALL}\"}} 40.0"
                )),
                "{body}"
            );
            assert!(body.contains(&format!("vllm:time_to_first_token_seconds_bucket{{engine=\"0\",model_name=\"{SMALL}\",le=\"0.001\"}}")));
            assert!(body.contains(&format!("vllm:inter_token_latency_seconds_count{{engine=\"0\",model_name=\"{SMALL}\"}} 38.0")), "{body}");
            assert!(body.contains("vllm:request_success_total{engine=\"0\",model_name=\"Qwen/Qwen2.5-0.5B-Instruct\",finished_reason=\"length\"} 2.0"));
        } else {
            assert!(body.contains(&format!("sglang:generation_tokens_total{{engine_type=\"unified\",model_name=\"{SMALL}\",pp_rank=\"0\",tp_rank=\"0\"}} 40.0")), "{body}");
        }
    }
}

#[test]
fn client_disconnect_cancels_the_request() {
    for persona in PERSONAS {
        let mut extra = vec![];
        if !is_vllm(persona) {
            extra.push("--enable-metrics");
        }
        let sim = Sim::ready(persona, SMALL, &extra, &[("LLMGW_SIM_ITL", "200ms")]);
        let running = if is_vllm(persona) {
            "vllm:num_requests_running"
        } else {
            "sglang:num_running_reqs"
        };
        let body = chat_body(SMALL, 200, true, "");
        let mut stream = TcpStream::connect(("127.0.0.1", sim.port)).unwrap();
        write!(stream, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0);
        assert!(
            wait_until_blocking(Duration::from_secs(10), || sim.metric(running) == Some(1.0)),
            "{persona}"
        );
        drop(stream);
        assert!(
            wait_until_blocking(Duration::from_secs(10), || sim.metric(running) == Some(0.0)),
            "{persona}: cancelled request still running"
        );
    }
}

#[test]
fn same_seed_same_answer() {
    let a = Sim::ready("vllm=0.34.0", SMALL, &[], &[]);
    let b = Sim::ready("vllm=0.34.0", SMALL, &[], &[]);
    let body = format!("{{\"model\":\"{SMALL}\",\"prompt\":\"x\"}}");
    let ra = post(a.port, "/v1/completions", &body).unwrap().json();
    let rb = post(b.port, "/v1/completions", &body).unwrap().json();
    assert_eq!(ra["choices"], rb["choices"]);
    assert_eq!(ra["id"], rb["id"]);
}

#[test]
fn engine_routes_answer_in_their_shapes() {
    let sim = Sim::ready(
        "vllm=0.11.0",
        SMALL,
        &[
            "--enable-server-load-tracking",
            "--show-hidden-metrics-for-version",
            "0.10",
        ],
        &[("VLLM_API_KEY", "k")],
    );
    assert_eq!(
        get(sim.port, "/version").unwrap().json(),
        serde_json::json!({"version": "0.11.0"})
    );
    assert_eq!(
        get(sim.port, "/load").unwrap().json(),
        serde_json::json!({"server_load": 0})
    );
    let metrics = get(sim.port, "/metrics").unwrap();
    assert_eq!(metrics.status, 200, "metrics are open even with an API key");
    assert!(
        metrics
            .body
            .contains("vllm:gpu_cache_usage_perc{engine=\"0\""),
        "0.11 shows the legacy gauge when asked"
    );
    assert!(
        metrics
            .body
            .contains("# TYPE vllm:time_to_first_token_seconds histogram")
    );
    assert_eq!(
        get(sim.port, "/v1/models").unwrap().status,
        401,
        "VLLM_API_KEY guards /v1"
    );
    assert_eq!(
        get(sim.port, "/nowhere").unwrap().body,
        "{\"detail\":\"Not Found\"}"
    );

    let current = Sim::ready(
        "vllm=0.34.0",
        SMALL,
        &["--show-hidden-metrics-for-version", "0.10"],
        &[],
    );
    let body = get(current.port, "/metrics").unwrap().body;
    assert!(
        body.contains("vllm:kv_cache_usage_perc{") && !body.contains("vllm:gpu_cache_usage_perc"),
        "removed in 0.34"
    );

    let sg = Sim::ready(
        "sglang=0.5.10",
        SMALL,
        &["--served-model-name", "small"],
        &[],
    );
    let info = get(sg.port, "/model_info").unwrap().json();
    assert_eq!(info["model_path"], SMALL);
    assert_eq!(info["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(info["is_generation"], true);
    let server = get(sg.port, "/server_info").unwrap().json();
    assert_eq!(server["tp_size"], 1);
    assert_eq!(server["version"], "0.5.10");
    assert!(
        server["internal_states"][0]["max_total_num_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(get(sg.port, "/get_load").unwrap().json()[0]["num_reqs"], 0);
    assert_eq!(
        get(sg.port, "/metrics").unwrap().status,
        404,
        "SGLang metrics need --enable-metrics"
    );
    let reply = post(
        sg.port,
        "/v1/chat/completions",
        &chat_body("small", 2, false, ""),
    )
    .unwrap();
    assert_eq!(
        reply.json()["model"],
        "small",
        "SGLang echoes the request's model"
    );
}

/// A model directory with a real tokenizer and chat template, and what
/// Hugging Face transformers made of a request with it.
fn tokenizer_fixture() -> (String, serde_json::Value) {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures");
    let expected = std::fs::read_to_string(fixtures.join("chatml-bpe.expected.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&expected).unwrap();
    (fixtures.join("chatml-bpe").display().to_string(), expected)
}

#[test]
fn a_tokenizer_directory_tokenizes_as_the_model_does() {
    let (dir, expected) = tokenizer_fixture();
    let case = &expected["chat"][1];
    let body =
        serde_json::json!({"model": "small", "messages": case["request"]["messages"]}).to_string();
    for (persona, flag) in [
        ("vllm=0.34.0", "--tokenizer"),
        ("sglang=0.5.23", "--tokenizer-path"),
    ] {
        let sim = Sim::ready(
            persona,
            SMALL,
            &["--served-model-name", "small", flag, &dir],
            &[],
        );
        let reply = post(sim.port, "/tokenize", &body).unwrap();
        assert_eq!(reply.json()["tokens"], case["expect"]["ids"], "{persona}");
        // Usage counts the prompt by the same tokenizer.
        let answer = post(sim.port, "/v1/chat/completions", &body)
            .unwrap()
            .json();
        assert_eq!(
            answer["usage"]["prompt_tokens"],
            case["expect"]["ids"].as_array().unwrap().len(),
            "{persona}"
        );
    }
}

/// vLLM sleep mode: the endpoints exist only in development mode, sleep
/// only with `--enable-sleep-mode`; asleep, generation is refused with 503
/// while health and the model list answer, and the sleep-state gauge
/// follows.
#[test]
fn vllm_sleeps_and_wakes_in_development_mode_only() {
    let awake = |port| {
        let page = get(port, "/metrics").unwrap().body;
        page.lines()
            .find(|l| l.starts_with("vllm:engine_sleep_state{") && l.contains("\"awake\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let chat = chat_body(SMALL, 4, false, "");
    for persona in ["vllm=0.11.0", "vllm=0.34.0"] {
        let plain = Sim::ready(persona, SMALL, &[], &[]);
        assert_eq!(
            post(plain.port, "/sleep", "").unwrap().status,
            404,
            "{persona}"
        );
        assert_eq!(awake(plain.port), None, "no gauge without sleep mode");
        let dev = Sim::ready(persona, SMALL, &[], &[("VLLM_SERVER_DEV_MODE", "1")]);
        assert_eq!(
            post(dev.port, "/sleep", "").unwrap().status,
            400,
            "{persona}"
        );

        let sim = Sim::ready(
            persona,
            SMALL,
            &["--enable-sleep-mode"],
            &[
                ("VLLM_SERVER_DEV_MODE", "1"),
                ("LLMGW_SIM_SLEEP_TIME", "10ms"),
            ],
        );
        let asleep = || get(sim.port, "/is_sleeping").unwrap().body;
        assert_eq!(asleep(), "{\"is_sleeping\":false}", "{persona}");
        assert_eq!(awake(sim.port), Some(1.0), "{persona}");
        assert_eq!(post(sim.port, "/sleep?level=3", "").unwrap().status, 400);
        assert_eq!(post(sim.port, "/sleep?level=1", "").unwrap().status, 200);
        assert_eq!(asleep(), "{\"is_sleeping\":true}", "{persona}");
        assert_eq!(awake(sim.port), Some(0.0), "{persona}");
        let refused = post(sim.port, "/v1/chat/completions", &chat).unwrap();
        assert_eq!(refused.status, 503, "{persona}: {}", refused.body);
        assert!(refused.body.contains("sleeping"), "{}", refused.body);
        assert_eq!(get(sim.port, "/health").unwrap().status, 200);
        assert_eq!(get(sim.port, "/v1/models").unwrap().status, 200);
        assert_eq!(post(sim.port, "/wake_up", "").unwrap().status, 200);
        assert_eq!(asleep(), "{\"is_sleeping\":false}", "{persona}");
        let served = post(sim.port, "/v1/chat/completions", &chat).unwrap();
        assert_eq!(served.status, 200, "{persona}: {}", served.body);
    }
}
