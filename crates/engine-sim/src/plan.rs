//! Validating an OpenAI chat or completion request against the served
//! model and deciding its simulated output up front: text, finish reason,
//! usage, ids.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use serde::Deserialize;

use crate::continuation::{self, VOCABULARY};
use crate::persona::Engine;
use crate::rng::SplitMix;
use crate::state::EngineState;
use crate::tokens::{self, ChatTokens};
use crate::wire::{self, Envelope, Finish, Route};
use llmgw_tokenizer::{PromptFields, TokenizerError};

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct Message {
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<serde_json::Value>,
}

/// The fields of a chat or completion request the simulator acts on.
#[derive(Debug, Default, Deserialize)]
pub struct GenRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    #[serde(default)]
    pub prompt: Option<serde_json::Value>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Chat: the final message is an answer to go on with, not a turn to
    /// answer.
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
}

/// A rejected request: status, message and OpenAI error type.
#[derive(Debug)]
pub struct Rejection {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
}

impl Rejection {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            kind: "BadRequestError",
        }
    }
}

/// One choice's simulated output, decided up front.
#[derive(Debug, Clone)]
pub struct ChoicePlan {
    pub pieces: Vec<Cow<'static, str>>,
    pub finish: Finish,
}

/// A request, validated and planned.
pub struct Plan {
    pub envelope: Envelope,
    pub prompt_tokens: u64,
    /// The prompt as token ids, for the prefix cache.
    pub prompt_token_ids: Vec<u32>,
    pub choices: Vec<ChoicePlan>,
    pub stream: bool,
    pub include_usage: bool,
    pub rng: SplitMix,
}

impl Plan {
    pub fn completion_tokens(&self) -> u64 {
        self.choices.iter().map(|c| c.pieces.len() as u64).sum()
    }
}

fn text_of(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::String(s) => out.push_str(s),
        serde_json::Value::Array(parts) => {
            for part in parts {
                if let Some(t) = part.get("text").and_then(|t| t.as_str()) {
                    out.push_str(t);
                } else {
                    text_of(part, out);
                }
            }
        }
        serde_json::Value::Number(n) => out.push_str(&n.to_string()),
        _ => {}
    }
}

/// Roughly four characters a token, plus the chat template's framing.
fn count_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

/// The prompt's token ids, as `/tokenize` answers for a chat (`messages`)
/// or a completion (`prompt`) request: by the model's own tokenizer where
/// the engine was given one, else the simulated one.
pub fn prompt_token_ids(
    state: &EngineState,
    request: &GenRequest,
    body: &[u8],
) -> Result<Vec<u32>, Rejection> {
    if let Some(ids) = model_token_ids(state, body)? {
        return Ok(ids);
    }
    let model_name = state.cfg.model.as_str();
    let prompt = if request.messages.is_some() {
        chat_prompt(request)?
    } else {
        completion_prompt(request, model_name)?
    };
    let mut ids = prompt.token_ids;
    if let Some(said) = prompt.continued {
        tokens::text_ids(&said, &mut ids);
    }
    Ok(ids)
}

/// The prompt's ids by the model's tokenizer (`--tokenizer DIR`); none
/// without one, or for a request it leaves to the simulated tokenizer
/// (content given as parts). A template that refuses the request is a 400,
/// as the engines answer it.
fn model_token_ids(state: &EngineState, body: &[u8]) -> Result<Option<Vec<u32>>, Rejection> {
    let Some(tokenizer) = &state.tokenizer else {
        return Ok(None);
    };
    let Ok(fields) = serde_json::from_slice::<PromptFields<'_>>(body) else {
        return Ok(None);
    };
    match fields.token_ids(tokenizer) {
        Ok(ids) => Ok(Some(ids)),
        Err(TokenizerError::Template(message)) => Err(Rejection::bad_request(message)),
        Err(_) => Ok(None),
    }
}

/// Validates a request against the served model and plans its output.
pub fn plan(state: &EngineState, route: Route, body: &[u8]) -> Result<Plan, Rejection> {
    let engine = state.cfg.persona.engine;
    let request: GenRequest = serde_json::from_slice(body).map_err(|e| match engine {
        Engine::Vllm => Rejection::bad_request(format!("JSON decode error: {e}")),
        Engine::Sglang => Rejection::bad_request(format!("Invalid request body: {e}")),
    })?;
    let requested_model = request.model.as_deref().unwrap_or("");
    if !requested_model.is_empty() && !state.cfg.served_names.iter().any(|n| n == requested_model) {
        return Err(Rejection {
            status: 404,
            message: format!("The model `{requested_model}` does not exist."),
            kind: "NotFoundError",
        });
    }
    // The weights decide the words, not the name they are served under.
    let model_name = state.cfg.model.clone();
    let Prompt {
        mut text,
        mut tokens,
        mut token_ids,
        continued,
    } = match route {
        Route::Chat => chat_prompt(&request)?,
        Route::Completion => completion_prompt(&request, &model_name)?,
    };
    let mut content = continuation::content_rng(&model_name, &text);
    let first_word = continuation::first_word(&mut content);
    // Words of its own answer already given: they count as prompt, and the
    // answer goes on after them.
    let said_words = match &continued {
        Some(said) => match continuation::words_matching(said, first_word) {
            Some(words) => words,
            None => {
                tokens += count_tokens(said);
                0
            }
        },
        None => 0,
    };
    let mut prompt_tokens = tokens + said_words;
    if let Some(said) = continued {
        tokens::text_ids(&said, &mut token_ids);
        text.push_str(&said);
    }
    if let Some(ids) = model_token_ids(state, body)? {
        prompt_tokens = ids.len() as u64;
        token_ids = ids;
    }
    let max_len = state.max_model_len;
    let max_tokens = request.max_completion_tokens.or(request.max_tokens);
    check_lengths(engine, prompt_tokens, max_tokens, max_len)?;
    let n = request.n.unwrap_or(1);
    if n == 0 || n > 128 {
        return Err(Rejection::bad_request(format!(
            "n must be between 1 and 128, got {n}"
        )));
    }
    let stops: Vec<String> = match request.stop {
        None => Vec::new(),
        Some(StopSpec::One(s)) => vec![s],
        Some(StopSpec::Many(v)) => v,
    };
    let counter = state.request_counter.fetch_add(1, Ordering::Relaxed);
    let mut rng = SplitMix::new(state.cfg.knobs.seed ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let words = Words {
        first: first_word,
        said: said_words,
        limit: max_tokens.unwrap_or(max_len - prompt_tokens),
        eos: state
            .cfg
            .knobs
            .output_tokens
            .unwrap_or_else(|| 16 + content.below(49)),
        ignore_eos: request.ignore_eos.unwrap_or(false),
    };
    let choices = (0..n)
        .map(|_| plan_choice(&words, engine, &stops, state))
        .collect();
    let envelope = envelope(state, route, requested_model, &mut rng);
    let stream = request.stream.unwrap_or(false);
    let include_usage = request
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false)
        || (engine == Engine::Vllm && state.cfg.force_include_usage);
    Ok(Plan {
        envelope,
        prompt_tokens,
        prompt_token_ids: token_ids,
        choices,
        stream,
        include_usage,
        rng,
    })
}

/// What every chunk of the answer carries: its id, time and model name
/// (the one asked for, else the first served name).
fn envelope(
    state: &EngineState,
    route: Route,
    requested_model: &str,
    rng: &mut SplitMix,
) -> Envelope {
    let engine = state.cfg.persona.engine;
    let id = match (engine, route) {
        (Engine::Vllm, Route::Chat) => format!("chatcmpl-{}", rng.hex32()),
        (Engine::Vllm, Route::Completion) => format!("cmpl-{}", rng.hex32()),
        (Engine::Sglang, _) => rng.hex32(),
    };
    let model = if requested_model.is_empty() {
        state.cfg.first_name()
    } else {
        requested_model
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Envelope {
        engine,
        route,
        id,
        created,
        model: wire::js(model),
    }
}

/// A request's prompt as the model sees it.
struct Prompt {
    /// The conversation (or completion prompt) before any answer it
    /// continues.
    text: String,
    /// Tokens of `text`, template framing included.
    tokens: u64,
    /// Their ids, as `/tokenize` answers.
    token_ids: Vec<u32>,
    /// The answer so far that this request asks to continue, if any; the
    /// conversation before it decides the words.
    continued: Option<String>,
}

/// A chat's messages; with `continue_final_message` the last one is the
/// answer to go on with.
fn chat_prompt(request: &GenRequest) -> Result<Prompt, Rejection> {
    let messages = request.messages.as_ref().ok_or_else(|| {
        Rejection::bad_request(
            "[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]",
        )
    })?;
    if messages.is_empty() {
        return Err(Rejection::bad_request("messages must not be empty"));
    }
    let continue_final = request.continue_final_message.unwrap_or(false);
    if continue_final && request.add_generation_prompt.unwrap_or(true) {
        return Err(Rejection::bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    let (asked, final_message) = if continue_final {
        let (last, rest) = messages.split_last().expect("checked non-empty");
        (rest, Some(last))
    } else {
        (&messages[..], None)
    };
    let mut text = String::new();
    let mut tokens = 3;
    let mut ids = ChatTokens::new();
    for m in asked {
        let start = text.len();
        if let Some(role) = &m.role {
            text.push_str(role);
        }
        if let Some(content) = &m.content {
            text_of(content, &mut text);
        }
        tokens += 4 + count_tokens(&text[start..]);
        ids.message(m.role.as_deref(), &text[start..]);
    }
    let continued = final_message.map(|last| {
        let mut said = String::new();
        if let Some(content) = &last.content {
            text_of(content, &mut said);
        }
        said
    });
    Ok(Prompt {
        text,
        tokens,
        token_ids: ids.finish(),
        continued,
    })
}

/// A completion's prompt; one that ends in this model's own answer asks to
/// continue it.
fn completion_prompt(request: &GenRequest, model_name: &str) -> Result<Prompt, Rejection> {
    let prompt = request.prompt.as_ref().ok_or_else(|| {
        Rejection::bad_request(
            "[{'type': 'missing', 'loc': ('body', 'prompt'), 'msg': 'Field required'}]",
        )
    })?;
    let mut text = String::new();
    text_of(prompt, &mut text);
    let continued =
        continuation::split_own_answer(model_name, &text).map(|(offset, _)| text.split_off(offset));
    Ok(Prompt {
        tokens: 1 + count_tokens(&text),
        token_ids: tokens::completion_ids(&text),
        text,
        continued,
    })
}

/// The prompt and the asked-for completion fit the context, in each
/// engine's words.
fn check_lengths(
    engine: Engine,
    prompt_tokens: u64,
    max_tokens: Option<u64>,
    max_len: u64,
) -> Result<(), Rejection> {
    if let Some(max_tokens) = max_tokens {
        if prompt_tokens + max_tokens > max_len {
            let message = match engine {
                Engine::Vllm => format!(
                    "This model's maximum context length is {max_len} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                    prompt_tokens + max_tokens
                ),
                Engine::Sglang => format!(
                    "Requested token count exceeds the model's maximum context length of {max_len} tokens. You requested a total of {} tokens: {prompt_tokens} tokens from the input messages and {max_tokens} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
                    prompt_tokens + max_tokens
                ),
            };
            return Err(Rejection::bad_request(message));
        }
    } else if prompt_tokens >= max_len {
        return Err(Rejection::bad_request(format!(
            "This model's maximum context length is {max_len} tokens. However, your request has {prompt_tokens} input tokens. Please reduce the length of the input messages."
        )));
    }
    if max_tokens == Some(0) {
        return Err(Rejection::bad_request(
            "max_tokens must be at least 1, got 0.",
        ));
    }
    Ok(())
}

/// The shape of an answer: where its words start, how many were already
/// said (a continuation), how many more may be, and where it would end.
struct Words {
    first: usize,
    said: u64,
    limit: u64,
    eos: u64,
    ignore_eos: bool,
}

/// One choice: the whole answer is decided as if uninterrupted, and only
/// the words after those already said are delivered.
fn plan_choice(words: &Words, engine: Engine, stops: &[String], state: &EngineState) -> ChoicePlan {
    let total_limit = words.said + words.limit;
    let natural = if words.ignore_eos {
        total_limit
    } else {
        words.eos.min(total_limit)
    };
    let skip = words.said as usize;
    let mut pieces: Vec<Cow<'static, str>> =
        Vec::with_capacity((natural as usize).saturating_sub(skip));
    let mut text = String::new();
    for i in 0..natural as usize {
        let piece = VOCABULARY[(words.first + i) % VOCABULARY.len()];
        let before = text.len();
        text.push_str(piece);
        if let Some((pos, stop)) = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                text[before.saturating_sub(s.len())..]
                    .find(s.as_str())
                    .map(|p| (p + before.saturating_sub(s.len()), s))
            })
            .min_by_key(|(p, _)| *p)
        {
            let keep = pos.saturating_sub(before);
            if i >= skip {
                pieces.push(Cow::Owned(piece[..keep.min(piece.len())].to_string()));
            }
            let matched = wire::js(stop);
            return ChoicePlan {
                pieces,
                finish: Finish {
                    reason: "stop",
                    matched,
                },
            };
        }
        if i >= skip {
            pieces.push(Cow::Borrowed(piece));
        }
    }
    let finish = if natural < total_limit {
        Finish {
            reason: "stop",
            matched: match engine {
                Engine::Vllm => "null".into(),
                Engine::Sglang => state.eos_token_id.to_string(),
            },
        }
    } else {
        Finish {
            reason: "length",
            matched: "null".into(),
        }
    };
    ChoicePlan { pieces, finish }
}
