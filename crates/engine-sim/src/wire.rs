//! Exact JSON shapes of each engine's responses and stream chunks.
//!
//! Built as strings: the non-streamed path must answer tens of thousands of
//! requests a second, and the key order and null fields are part of what a
//! client sees.

use std::fmt::Write;

use crate::persona::Engine;

/// A JSON string literal.
pub fn js(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Which OpenAI route a generation serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completion,
}

/// Fields shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub engine: Engine,
    pub route: Route,
    pub id: String,
    pub created: u64,
    /// Already a JSON string literal.
    pub model: String,
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: &'static str,
    /// vLLM's `stop_reason` / SGLang's `matched_stop`, as JSON.
    pub matched: String,
}

#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
}

impl Usage {
    fn json(&self, engine: Engine) -> String {
        let total = self.prompt + self.completion;
        match engine {
            Engine::Vllm => format!(
                "{{\"prompt_tokens\":{},\"total_tokens\":{total},\"completion_tokens\":{},\"prompt_tokens_details\":null}}",
                self.prompt, self.completion
            ),
            Engine::Sglang => format!(
                "{{\"prompt_tokens\":{},\"total_tokens\":{total},\"completion_tokens\":{},\"prompt_tokens_details\":null,\"reasoning_tokens\":0}}",
                self.prompt, self.completion
            ),
        }
    }

    /// vLLM's stream usage chunk leaves out the unset details field.
    fn stream_json(&self, engine: Engine) -> String {
        match engine {
            Engine::Vllm => format!(
                "{{\"prompt_tokens\":{},\"total_tokens\":{},\"completion_tokens\":{}}}",
                self.prompt,
                self.prompt + self.completion,
                self.completion
            ),
            Engine::Sglang => self.json(engine),
        }
    }
}

fn stop_field(engine: Engine) -> &'static str {
    match engine {
        Engine::Vllm => "stop_reason",
        Engine::Sglang => "matched_stop",
    }
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.route, chunk) {
            (Route::Chat, true) => "chat.completion.chunk",
            (Route::Chat, false) => "chat.completion",
            (Route::Completion, _) => "text_completion",
        }
    }

    fn head(&self, chunk: bool) -> String {
        format!(
            "{{\"id\":{},\"object\":\"{}\",\"created\":{},\"model\":{},",
            js(&self.id),
            self.object(chunk),
            self.created,
            self.model
        )
    }

    fn sse(&self, body: String) -> String {
        format!("data: {body}\n\n")
    }

    fn tail(&self) -> &'static str {
        match self.engine {
            Engine::Vllm => "}",
            Engine::Sglang => ",\"usage\":null}",
        }
    }

    /// The first chat chunk of a choice: the assistant role, empty content.
    pub fn role_chunk(&self, index: usize) -> String {
        let delta = match self.engine {
            Engine::Vllm => "{\"role\":\"assistant\",\"content\":\"\"}",
            Engine::Sglang => {
                "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":null,\"tool_calls\":null}"
            }
        };
        let extra = match self.engine {
            Engine::Vllm => "",
            Engine::Sglang => ",\"matched_stop\":null",
        };
        self.sse(format!(
            "{}\"choices\":[{{\"index\":{index},\"delta\":{delta},\"logprobs\":null,\"finish_reason\":null{extra}}}]{}",
            self.head(true),
            self.tail()
        ))
    }

    /// A content chunk; with `finish` set (vLLM) it also ends the choice.
    pub fn content_chunk(&self, index: usize, piece: &str, finish: Option<&Finish>) -> String {
        let (reason, matched) = match finish {
            Some(f) => (format!("\"{}\"", f.reason), f.matched.as_str()),
            None => ("null".to_string(), "null"),
        };
        let stop = stop_field(self.engine);
        let choice = match (self.route, self.engine) {
            (Route::Chat, Engine::Vllm) => {
                let stop_part = if finish.is_some() {
                    format!(",\"{stop}\":{matched}")
                } else {
                    String::new()
                };
                format!(
                    "{{\"index\":{index},\"delta\":{{\"content\":{}}},\"logprobs\":null,\"finish_reason\":{reason}{stop_part}}}",
                    js(piece)
                )
            }
            (Route::Chat, Engine::Sglang) => format!(
                "{{\"index\":{index},\"delta\":{{\"role\":null,\"content\":{},\"reasoning_content\":null,\"tool_calls\":null}},\"logprobs\":null,\"finish_reason\":{reason},\"{stop}\":{matched}}}",
                js(piece)
            ),
            (Route::Completion, _) => format!(
                "{{\"index\":{index},\"text\":{},\"logprobs\":null,\"finish_reason\":{reason},\"{stop}\":{matched}}}",
                js(piece)
            ),
        };
        self.sse(format!(
            "{}\"choices\":[{choice}]{}",
            self.head(true),
            self.tail()
        ))
    }

    /// SGLang's separate finish chunk with an empty delta.
    pub fn finish_chunk(&self, index: usize, finish: &Finish) -> String {
        let choice = match self.route {
            Route::Chat => format!(
                "{{\"index\":{index},\"delta\":{{\"role\":null,\"content\":null,\"reasoning_content\":null,\"tool_calls\":null}},\"logprobs\":null,\"finish_reason\":\"{}\",\"matched_stop\":{}}}",
                finish.reason, finish.matched
            ),
            Route::Completion => format!(
                "{{\"index\":{index},\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"{}\",\"matched_stop\":{}}}",
                finish.reason, finish.matched
            ),
        };
        self.sse(format!(
            "{}\"choices\":[{choice}]{}",
            self.head(true),
            self.tail()
        ))
    }

    /// The usage chunk: `choices` empty.
    pub fn usage_chunk(&self, usage: Usage) -> String {
        self.sse(format!(
            "{}\"choices\":[],\"usage\":{}}}",
            self.head(true),
            usage.stream_json(self.engine)
        ))
    }

    /// A whole non-streamed response.
    pub fn full_response(&self, choices: &[(String, Finish)], usage: Usage) -> String {
        let stop = stop_field(self.engine);
        let mut out = self.head(false);
        out.push_str("\"choices\":[");
        for (i, (text, finish)) in choices.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let message = match (self.route, self.engine) {
                (Route::Chat, Engine::Vllm) => format!(
                    "\"message\":{{\"role\":\"assistant\",\"content\":{},\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[],\"reasoning_content\":null}},",
                    js(text)
                ),
                (Route::Chat, Engine::Sglang) => format!(
                    "\"message\":{{\"role\":\"assistant\",\"content\":{},\"reasoning_content\":null,\"tool_calls\":null}},",
                    js(text)
                ),
                (Route::Completion, _) => format!("\"text\":{},", js(text)),
            };
            let extra = match (self.route, self.engine) {
                (Route::Completion, Engine::Vllm) => ",\"prompt_logprobs\":null",
                _ => "",
            };
            let _ = write!(
                out,
                "{{\"index\":{i},{message}\"logprobs\":null,\"finish_reason\":\"{}\",\"{stop}\":{}{extra}}}",
                finish.reason, finish.matched
            );
        }
        out.push_str("],");
        match self.engine {
            Engine::Vllm => {
                let _ = write!(
                    out,
                    "\"service_tier\":null,\"system_fingerprint\":null,\"usage\":{},",
                    usage.json(self.engine)
                );
                if self.route == Route::Chat {
                    out.push_str("\"prompt_logprobs\":null,\"prompt_token_ids\":null,");
                }
                out.push_str("\"kv_transfer_params\":null}");
            }
            Engine::Sglang => {
                let _ = write!(
                    out,
                    "\"usage\":{},\"metadata\":{{\"weight_version\":\"default\"}}}}",
                    usage.json(self.engine)
                );
            }
        }
        out
    }
}

/// A non-streamed error body in the engine's shape.
pub fn error_body(engine: Engine, message: &str, kind: &str, code: u16) -> String {
    match engine {
        Engine::Vllm => {
            format!(
                "{{\"error\":{{\"message\":{},\"type\":\"{kind}\",\"param\":null,\"code\":{code}}}}}",
                js(message)
            )
        }
        Engine::Sglang => {
            format!(
                "{{\"object\":\"error\",\"message\":{},\"type\":\"{kind}\",\"param\":null,\"code\":{code}}}",
                js(message)
            )
        }
    }
}

/// An error inside a stream: nested for both engines, then `[DONE]`.
pub fn stream_error_event(message: &str, kind: &str, code: u16) -> String {
    format!(
        "data: {{\"error\":{{\"message\":{},\"type\":\"{kind}\",\"param\":null,\"code\":{code}}}}}\n\ndata: [DONE]\n\n",
        js(message)
    )
}

pub const DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn env(engine: Engine, route: Route) -> Envelope {
        Envelope {
            engine,
            route,
            id: "chatcmpl-1".into(),
            created: 7,
            model: js("m"),
        }
    }

    #[test]
    fn every_chunk_is_valid_json() {
        let finish = Finish {
            reason: "stop",
            matched: "null".into(),
        };
        for engine in [Engine::Vllm, Engine::Sglang] {
            for route in [Route::Chat, Route::Completion] {
                let e = env(engine, route);
                for chunk in [
                    e.role_chunk(0),
                    e.content_chunk(0, "a\"b", None),
                    e.content_chunk(0, "x", Some(&finish)),
                    e.finish_chunk(0, &finish),
                    e.usage_chunk(Usage {
                        prompt: 1,
                        completion: 2,
                    }),
                ] {
                    let body = chunk.strip_prefix("data: ").unwrap().trim_end();
                    serde_json::from_str::<serde_json::Value>(body)
                        .unwrap_or_else(|err| panic!("{err}: {body}"));
                }
                let full = e.full_response(
                    &[("hi".into(), finish.clone())],
                    Usage {
                        prompt: 1,
                        completion: 1,
                    },
                );
                serde_json::from_str::<serde_json::Value>(&full)
                    .unwrap_or_else(|err| panic!("{err}: {full}"));
            }
        }
    }
}
