//! The two rewrites a resumption needs: the request that asks another
//! replica to continue the answer, and each event of its continuation made
//! to read as part of the first answer.

use serde_json::{Map, Value};

use super::transcript::{Route, Transcript};

/// OpenAI's default `max_tokens` for completions, which vLLM and SGLang
/// follow; chat has none.
const COMPLETION_DEFAULT_MAX_TOKENS: i64 = 16;

/// The request asking for the rest of the answer: the original request
/// with the text so far as the answer to continue, and the token budget
/// reduced by what was streamed. Err names why it cannot be faithful.
pub fn continuation_request(original: &[u8], t: &Transcript) -> Result<Vec<u8>, &'static str> {
    let mut request: Map<String, Value> =
        serde_json::from_slice(original).map_err(|_| "unreadable_request")?;
    if let Some(reason) = refusal_of(|field| request.get(field).cloned(), t.route) {
        return Err(reason);
    }
    let sent = i64::try_from(t.tokens).unwrap_or(i64::MAX);
    // With both limits set, the smaller one binds.
    let mut budget_left: Option<i64> = None;
    for field in ["max_tokens", "max_completion_tokens"] {
        if let Some(limit) = request.get(field).and_then(Value::as_i64) {
            let left = limit.saturating_sub(sent);
            budget_left = Some(budget_left.map_or(left, |other| other.min(left)));
            request.insert(field.to_string(), Value::from(left.max(0)));
        }
    }
    // A floor on the answer's length counts what was already streamed: an
    // unreduced one above the budget left is refused by vLLM.
    if let Some(floor) = request.get("min_tokens").and_then(Value::as_i64) {
        request.insert(
            "min_tokens".into(),
            Value::from(floor.saturating_sub(sent).max(0)),
        );
    }
    match t.route {
        Route::Chat => {
            let continues_own = request
                .get("continue_final_message")
                .is_some_and(|v| v.as_bool() == Some(true));
            let messages = request
                .get_mut("messages")
                .and_then(Value::as_array_mut)
                .ok_or("unreadable_request")?;
            let last_is_assistant_text = messages.last().is_some_and(|m| {
                m.get("role").and_then(Value::as_str) == Some("assistant")
                    && m.get("content").is_some_and(Value::is_string)
            });
            if continues_own && last_is_assistant_text {
                let last = messages.last_mut().expect("checked above");
                let before = last["content"].as_str().unwrap_or_default();
                last["content"] = Value::from(format!("{before}{}", t.text));
            } else if continues_own {
                return Err("unreadable_request");
            } else {
                messages.push(serde_json::json!({"role": "assistant", "content": t.text}));
            }
            request.insert("continue_final_message".into(), Value::Bool(true));
            request.insert("add_generation_prompt".into(), Value::Bool(false));
        }
        Route::Completion => {
            let prompt = request
                .get("prompt")
                .and_then(Value::as_str)
                .ok_or("prompt_not_text")?;
            let joined = format!("{prompt}{}", t.text);
            request.insert("prompt".into(), Value::from(joined));
            if budget_left.is_none() {
                let left = COMPLETION_DEFAULT_MAX_TOKENS - sent;
                budget_left = Some(left);
                request.insert("max_tokens".into(), Value::from(left));
            }
        }
    }
    if budget_left.is_some_and(|left| left <= 0) {
        return Err("token_budget_spent");
    }
    serde_json::to_vec(&request).map_err(|_| "unreadable_request")
}

/// Why a request could never be continued faithfully, whatever happens
/// to its stream; None when it could. Read from the request alone, so a
/// stream can be known unresumable before anything is kept for it.
pub fn request_refusal(original: &[u8], route: Route) -> Option<&'static str> {
    // Only the top-level fields are looked at; their values are read when
    // one matters.
    let fields: std::collections::HashMap<&str, &serde_json::value::RawValue> =
        match serde_json::from_slice(original) {
            Ok(fields) => fields,
            Err(_) => return Some("unreadable_request"),
        };
    refusal_of(
        |field| {
            fields
                .get(field)
                .and_then(|raw| serde_json::from_str(raw.get()).ok())
        },
        route,
    )
}

/// The one list of what cannot be continued: `field` reads a top-level
/// field of the request.
fn refusal_of(field: impl Fn(&str) -> Option<Value>, route: Route) -> Option<&'static str> {
    for (name, reason) in [
        ("logprobs", "logprobs"),
        ("top_logprobs", "logprobs"),
        // vLLM: logprobs of the prompt, which a continuation changes.
        ("prompt_logprobs", "logprobs"),
        ("echo", "echo"),
        ("guided_json", "structured_output"),
        ("guided_regex", "structured_output"),
        ("guided_choice", "structured_output"),
        ("guided_grammar", "structured_output"),
        ("structured_outputs", "structured_output"),
        // SGLang's constraints: a continuation would start the grammar over.
        ("regex", "structured_output"),
        ("ebnf", "structured_output"),
        ("json_schema", "structured_output"),
    ] {
        if field(name).is_some_and(|v| is_set(&v)) {
            return Some(reason);
        }
    }
    let count = |name: &str| field(name).and_then(|v| v.as_i64()).unwrap_or(1);
    if count("n") != 1 || count("best_of") != 1 {
        return Some("n");
    }
    if let Some(format) = field("response_format")
        && format.get("type").and_then(Value::as_str) != Some("text")
        && !format.is_null()
    {
        return Some("structured_output");
    }
    if route == Route::Completion && !field("prompt").is_some_and(|p| p.is_string()) {
        return Some("prompt_not_text");
    }
    None
}

fn is_set(value: &Value) -> bool {
    !matches!(value, Value::Null | Value::Bool(false))
}

/// A continuation event, rewritten for the client.
#[derive(Debug, PartialEq)]
pub enum Spliced {
    Send(String),
    /// Says nothing the client has not had (the second role announcement).
    Skip,
}

/// Makes one continuation event part of the first answer: its id and
/// `created`, no second role announcement, and usage that counts the
/// tokens streamed before the resumption as completion, not prompt.
pub fn splice_event(payload: &[u8], t: &Transcript, tokens_before: u64) -> Spliced {
    let Ok(Value::Object(mut event)) = serde_json::from_slice::<Value>(payload) else {
        return Spliced::Send(String::from_utf8_lossy(payload).into_owned());
    };
    if let Some(id) = &t.id {
        event.insert("id".into(), Value::from(id.as_str()));
    }
    if let Some(created) = t.created {
        event.insert("created".into(), Value::from(created));
    }
    if let Some(Value::Array(choices)) = event.get_mut("choices") {
        let mut only_role = !choices.is_empty();
        for choice in choices.iter_mut() {
            let finished = choice.get("finish_reason").is_some_and(|f| !f.is_null());
            let Some(Value::Object(delta)) = choice.get_mut("delta") else {
                only_role = false;
                continue;
            };
            let announced_role = delta.remove("role").is_some_and(|r| !r.is_null());
            let says_something = delta.iter().any(|(k, v)| {
                k != "content" && is_set(v)
                    || k == "content" && v.as_str().is_some_and(|s| !s.is_empty())
            });
            only_role &= announced_role && !says_something && !finished;
        }
        if only_role && event.get("usage").is_none_or(Value::is_null) {
            return Spliced::Skip;
        }
    }
    if let Some(Value::Object(usage)) = event.get_mut("usage") {
        let count = |usage: &Map<String, Value>, k: &str| usage.get(k).and_then(Value::as_u64);
        if let (Some(prompt), Some(completion)) = (
            count(usage, "prompt_tokens"),
            count(usage, "completion_tokens"),
        ) {
            let prompt = prompt.saturating_sub(tokens_before);
            let completion = completion.saturating_add(tokens_before);
            usage.insert("prompt_tokens".into(), Value::from(prompt));
            usage.insert("completion_tokens".into(), Value::from(completion));
            usage.insert(
                "total_tokens".into(),
                Value::from(prompt.saturating_add(completion)),
            );
        }
    }
    Spliced::Send(Value::Object(event).to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::transcript::{Charge, ResumeMemory};
    use super::*;

    fn transcript(route: Route, text: &str, tokens: u64) -> Transcript {
        let memory = Arc::new(ResumeMemory::new(1 << 20));
        let mut t = Transcript::new(route, 1 << 20, Charge::new(memory, 0).unwrap());
        t.id = Some("chatcmpl-first".into());
        t.created = Some(100);
        t.text = text.into();
        t.tokens = tokens;
        t
    }

    fn json(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn chat_continues_the_answer_with_the_budget_left() {
        let t = transcript(Route::Chat, "The quick", 2);
        let body = continuation_request(
            br#"{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#,
            &t,
        )
        .unwrap();
        let v = json(&body);
        assert_eq!(v["max_tokens"], 8);
        assert_eq!(v["continue_final_message"], true);
        assert_eq!(v["add_generation_prompt"], false);
        assert_eq!(
            v["messages"][1],
            serde_json::json!({"role":"assistant","content":"The quick"})
        );
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn the_smaller_limit_binds_and_the_floor_counts_what_was_sent() {
        let t = transcript(Route::Chat, "The quick brown", 30);
        let body = continuation_request(
            br#"{"max_tokens":100,"max_completion_tokens":40,"min_tokens":80,"messages":[{"role":"user","content":"hi"}]}"#,
            &t,
        )
        .unwrap();
        let v = json(&body);
        assert_eq!(
            (
                &v["max_tokens"],
                &v["max_completion_tokens"],
                &v["min_tokens"]
            ),
            (&Value::from(70), &Value::from(10), &Value::from(50))
        );
        // The smaller limit is spent: nothing is left to ask for, whatever
        // the other says.
        let spent = continuation_request(
            br#"{"max_tokens":30,"max_completion_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
            &t,
        );
        assert_eq!(spent, Err("token_budget_spent"));
    }

    #[test]
    fn a_continued_message_is_extended_not_repeated() {
        let t = transcript(Route::Chat, " brown", 1);
        let body = continuation_request(
            br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"The quick"}],"continue_final_message":true,"add_generation_prompt":false}"#,
            &t,
        )
        .unwrap();
        let v = json(&body);
        assert_eq!(v["messages"][1]["content"], "The quick brown");
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn completions_append_to_the_prompt_and_default_to_sixteen_tokens() {
        let t = transcript(Route::Completion, " fox", 3);
        let v = json(&continuation_request(br#"{"prompt":"Say:","stream":true}"#, &t).unwrap());
        assert_eq!(v["prompt"], "Say: fox");
        assert_eq!(v["max_tokens"], 13);
    }

    #[test]
    fn what_cannot_be_continued_faithfully_is_refused_with_its_reason() {
        let t = transcript(Route::Chat, "x", 1);
        let chat = |extra: &str| {
            format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#).into_bytes()
        };
        assert_eq!(continuation_request(&chat(r#","n":2"#), &t), Err("n"));
        assert_eq!(
            continuation_request(&chat(r#","logprobs":true"#), &t),
            Err("logprobs")
        );
        assert_eq!(
            continuation_request(&chat(r#","response_format":{"type":"json_object"}"#), &t),
            Err("structured_output")
        );
        assert_eq!(
            continuation_request(&chat(r#","prompt_logprobs":0"#), &t),
            Err("logprobs")
        );
        for sglang in [r#","regex":"[a-z]+""#, r#","ebnf":"root ::= [a-z]+""#] {
            assert_eq!(
                continuation_request(&chat(sglang), &t),
                Err("structured_output"),
                "{sglang}"
            );
        }
        assert!(continuation_request(&chat(r#","logprobs":false,"n":1"#), &t).is_ok());
        assert_eq!(
            continuation_request(&chat(r#","max_tokens":1"#), &t),
            Err("token_budget_spent")
        );
        let batch = transcript(Route::Completion, "x", 1);
        assert_eq!(
            continuation_request(br#"{"prompt":["a","b"]}"#, &batch),
            Err("prompt_not_text")
        );
    }

    #[test]
    fn continuation_events_read_as_the_first_answer() {
        let t = transcript(Route::Chat, "The quick", 2);
        let role = br#"{"id":"other","created":200,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert_eq!(splice_event(role, &t, 2), Spliced::Skip);
        let content = br#"{"id":"other","created":200,"choices":[{"index":0,"delta":{"content":" brown"},"finish_reason":null}]}"#;
        let Spliced::Send(text) = splice_event(content, &t, 2) else {
            panic!("content was skipped")
        };
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["id"], "chatcmpl-first");
        assert_eq!(v["created"], 100);
        assert_eq!(v["choices"][0]["delta"]["content"], " brown");
        let usage = br#"{"id":"other","created":200,"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
        let Spliced::Send(text) = splice_event(usage, &t, 2) else {
            panic!("usage was skipped")
        };
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["usage"],
            serde_json::json!({"prompt_tokens":10,"completion_tokens":7,"total_tokens":17})
        );
    }
}
