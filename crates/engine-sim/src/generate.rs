//! Turning an OpenAI request into simulated tokens: the plan (text, finish
//! reason, usage), then its delivery at the simulated pace, streamed or not.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use crate::knobs::{Fault, StreamCrash};
use crate::persona::Engine;
use crate::rng::SplitMix;
use crate::state::{EngineState, Interrupt};
use crate::wire::{self, Envelope, Finish, Route, Usage};

/// What the model "says": a fixed vocabulary so that `stop` is testable.
const VOCABULARY: &[&str] = &[
    "The",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " the",
    " lazy",
    " dog",
    ".",
    " A",
    " simulated",
    " engine",
    " answers",
    " every",
    " request",
    " with",
    " plain",
    " words",
    ",",
    " one",
    " token",
    " at",
    " a",
    " time",
    ".",
];

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
    pub prompt_fingerprint: u64,
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

fn fingerprint(text: &str) -> u64 {
    // FNV-1a over the first 256 bytes: a shared system prompt is a shared prefix.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes().iter().take(256) {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
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
    let mut prompt_text = String::new();
    let prompt_tokens = match route {
        Route::Chat => {
            let messages = request.messages.as_ref().ok_or_else(|| {
                Rejection::bad_request(
                    "[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]",
                )
            })?;
            if messages.is_empty() {
                return Err(Rejection::bad_request("messages must not be empty"));
            }
            let mut tokens = 3;
            for m in messages {
                let start = prompt_text.len();
                if let Some(role) = &m.role {
                    prompt_text.push_str(role);
                }
                if let Some(content) = &m.content {
                    text_of(content, &mut prompt_text);
                }
                tokens += 4 + count_tokens(&prompt_text[start..]);
            }
            tokens
        }
        Route::Completion => {
            let prompt = request.prompt.as_ref().ok_or_else(|| {
                Rejection::bad_request(
                    "[{'type': 'missing', 'loc': ('body', 'prompt'), 'msg': 'Field required'}]",
                )
            })?;
            text_of(prompt, &mut prompt_text);
            1 + count_tokens(&prompt_text)
        }
    };
    let max_len = state.max_model_len;
    let max_tokens = request.max_completion_tokens.or(request.max_tokens);
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
    let limit = max_tokens.unwrap_or(max_len - prompt_tokens);
    let eos = state
        .cfg
        .knobs
        .output_tokens
        .unwrap_or_else(|| 16 + rng.below(49));
    let ignore_eos = request.ignore_eos.unwrap_or(false);
    let choices = (0..n)
        .map(|_| plan_choice(&mut rng, engine, limit, eos, ignore_eos, &stops, state))
        .collect();
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
    let stream = request.stream.unwrap_or(false);
    let include_usage = request
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false)
        || (engine == Engine::Vllm && state.cfg.force_include_usage);
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Plan {
        envelope: Envelope {
            engine,
            route,
            id,
            created,
            model: wire::js(model),
        },
        prompt_tokens,
        prompt_fingerprint: fingerprint(&prompt_text),
        choices,
        stream,
        include_usage,
        rng,
    })
}

fn plan_choice(
    rng: &mut SplitMix,
    engine: Engine,
    limit: u64,
    eos: u64,
    ignore_eos: bool,
    stops: &[String],
    state: &EngineState,
) -> ChoicePlan {
    let natural = if ignore_eos { limit } else { eos.min(limit) };
    let start = rng.below(VOCABULARY.len() as u64) as usize;
    let mut pieces: Vec<Cow<'static, str>> = Vec::with_capacity(natural as usize);
    let mut text = String::new();
    for i in 0..natural as usize {
        let piece = VOCABULARY[(start + i) % VOCABULARY.len()];
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
            pieces.push(Cow::Owned(piece[..keep.min(piece.len())].to_string()));
            let matched = wire::js(stop);
            return ChoicePlan {
                pieces,
                finish: Finish {
                    reason: "stop",
                    matched,
                },
            };
        }
        pieces.push(Cow::Borrowed(piece));
    }
    let finish = if natural < limit {
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

/// Why delivery stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    ClientGone,
    Abort,
    EngineDead,
}

/// Sleeps unless the request is interrupted or its client is gone.
async fn pause(
    duration: Duration,
    interrupt: &mut watch::Receiver<Interrupt>,
    client: Option<&mpsc::Sender<Result<Bytes, Stop>>>,
) -> Result<(), Stop> {
    let check = |i: Interrupt| match i {
        Interrupt::None => Ok(()),
        Interrupt::Abort => Err(Stop::Abort),
        Interrupt::EngineDead => Err(Stop::EngineDead),
    };
    check(*interrupt.borrow())?;
    if duration.is_zero() {
        return Ok(());
    }
    let closed = async {
        match client {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(duration) => Ok(()),
        _ = closed => Err(Stop::ClientGone),
        changed = interrupt.changed() => match changed {
            Ok(()) => check(*interrupt.borrow()),
            Err(_) => Ok(()),
        },
    }
}

fn jittered(rng: &mut SplitMix, base: Duration) -> Duration {
    if base.is_zero() {
        return base;
    }
    // +-10% so that latency histograms spread like a real engine's.
    base.mul_f64(0.9 + rng.unit() * 0.2)
}

struct Pace {
    ttft: Duration,
    itl: Duration,
    stall: bool,
    crash: Option<(StreamCrash, u64)>,
    oom_after: Option<u64>,
}

fn pace(state: &EngineState) -> Pace {
    let knobs = &state.cfg.knobs;
    let spike = knobs.faults.iter().find_map(|f| {
        if let Fault::TtftSpike(d) = f {
            Some(*d)
        } else {
            None
        }
    });
    Pace {
        ttft: knobs.ttft + spike.unwrap_or_default(),
        itl: knobs.itl.mul_f64(knobs.itl_factor()),
        stall: knobs.faults.contains(&Fault::Stall),
        crash: knobs.faults.iter().find_map(|f| match f {
            Fault::CrashMidStream { mode, after_tokens } => Some((*mode, *after_tokens)),
            _ => None,
        }),
        oom_after: knobs.faults.iter().find_map(|f| {
            if let Fault::OomAfterTokens(n) = f {
                Some(*n)
            } else {
                None
            }
        }),
    }
}

/// Counts generated tokens; returns true when the OOM fault fires.
fn count_generated(state: &Arc<EngineState>, oom_after: Option<u64>, tokens: u64) -> bool {
    state
        .metrics
        .generation_tokens
        .fetch_add(tokens, Ordering::Relaxed);
    let total = state.tokens_generated.fetch_add(tokens, Ordering::Relaxed) + tokens;
    matches!(oom_after, Some(limit) if total >= limit)
}

fn record_finish(state: &EngineState, plan: &Plan) {
    for c in &plan.choices {
        let counter = if c.finish.reason == "length" {
            &state.metrics.finished_length
        } else {
            &state.metrics.finished_stop
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    state.metrics.requests_total.fetch_add(1, Ordering::Relaxed);
}

/// Runs a non-streamed request to completion; `Ok(body)` or why it stopped.
pub async fn run_full(state: Arc<EngineState>, mut plan: Plan) -> Result<String, Stop> {
    let mut interrupt = state.interrupt.subscribe();
    let p = pace(&state);
    let start = Instant::now();
    let (mut guard, queued) = tokio::select! {
        admitted = state.admit() => admitted,
        stop = wait_interrupt(&mut interrupt) => return Err(stop),
    };
    state.metrics.queue.observe(queued.as_secs_f64());
    state
        .metrics
        .prompt_tokens
        .fetch_add(plan.prompt_tokens, Ordering::Relaxed);
    state.record_prefix(plan.prompt_fingerprint, plan.prompt_tokens);
    let completion = plan.completion_tokens();
    guard.add_kv(plan.prompt_tokens + completion);
    let ttft = jittered(&mut plan.rng, p.ttft);
    pause(ttft, &mut interrupt, None).await?;
    state.metrics.ttft.observe(ttft.as_secs_f64());
    let longest = plan
        .choices
        .iter()
        .map(|c| c.pieces.len() as u64)
        .max()
        .unwrap_or(0);
    if p.stall {
        std::future::pending::<()>().await;
    }
    if longest > 1 {
        let decode = jittered(&mut plan.rng, p.itl * (longest as u32 - 1));
        pause(decode, &mut interrupt, None).await?;
        let per_token = decode.as_secs_f64() / (longest - 1) as f64;
        for _ in 1..longest.min(64) {
            state.metrics.itl.observe(per_token);
        }
    }
    if count_generated(&state, p.oom_after, completion) {
        crate::lifecycle::engine_died(&state, crate::lifecycle::Death::CudaOom);
        return Err(Stop::EngineDead);
    }
    state.metrics.e2e.observe(start.elapsed().as_secs_f64());
    record_finish(&state, &plan);
    drop(guard);
    let choices: Vec<(String, Finish)> = plan
        .choices
        .iter()
        .map(|c| (c.pieces.concat(), c.finish.clone()))
        .collect();
    Ok(plan.envelope.full_response(
        &choices,
        Usage {
            prompt: plan.prompt_tokens,
            completion,
        },
    ))
}

async fn wait_interrupt(interrupt: &mut watch::Receiver<Interrupt>) -> Stop {
    loop {
        match *interrupt.borrow_and_update() {
            Interrupt::Abort => return Stop::Abort,
            Interrupt::EngineDead => return Stop::EngineDead,
            Interrupt::None => {}
        }
        if interrupt.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Streams a request into `tx`, chunk by chunk at the simulated pace.
pub async fn run_stream(
    state: Arc<EngineState>,
    mut plan: Plan,
    tx: mpsc::Sender<Result<Bytes, Stop>>,
) {
    let mut interrupt = state.interrupt.subscribe();
    let outcome = stream_inner(&state, &mut plan, &tx, &mut interrupt).await;
    match outcome {
        Ok(()) => record_finish(&state, &plan),
        Err(stop) => {
            state.metrics.finished_abort.fetch_add(1, Ordering::Relaxed);
            if stop != Stop::ClientGone {
                let _ = tx.send(Err(stop)).await;
            }
        }
    }
}

async fn stream_inner(
    state: &Arc<EngineState>,
    plan: &mut Plan,
    tx: &mpsc::Sender<Result<Bytes, Stop>>,
    interrupt: &mut watch::Receiver<Interrupt>,
) -> Result<(), Stop> {
    let p = pace(state);
    let start = Instant::now();
    let (mut guard, queued) = tokio::select! {
        admitted = state.admit() => admitted,
        stop = wait_interrupt(interrupt) => return Err(stop),
        _ = tx.closed() => return Err(Stop::ClientGone),
    };
    state.metrics.queue.observe(queued.as_secs_f64());
    state
        .metrics
        .prompt_tokens
        .fetch_add(plan.prompt_tokens, Ordering::Relaxed);
    state.record_prefix(plan.prompt_fingerprint, plan.prompt_tokens);
    guard.add_kv(plan.prompt_tokens);
    let send = |text: String| async move {
        tx.send(Ok(Bytes::from(text)))
            .await
            .map_err(|_| Stop::ClientGone)
    };
    let ttft = jittered(&mut plan.rng, p.ttft);
    pause(ttft, interrupt, Some(tx)).await?;
    state.metrics.ttft.observe(ttft.as_secs_f64());
    let env = plan.envelope.clone();
    let engine = env.engine;
    if env.route == Route::Chat {
        for i in 0..plan.choices.len() {
            send(env.role_chunk(i)).await?;
        }
    }
    let longest = plan
        .choices
        .iter()
        .map(|c| c.pieces.len())
        .max()
        .unwrap_or(0);
    for step in 0..longest {
        if step > 0 {
            if p.stall {
                pause(Duration::from_secs(u64::MAX / 4), interrupt, Some(tx)).await?;
            }
            let itl = jittered(&mut plan.rng, p.itl);
            pause(itl, interrupt, Some(tx)).await?;
            state.metrics.itl.observe(itl.as_secs_f64());
        }
        if let Some((mode, after)) = p.crash
            && step as u64 >= after
        {
            return match mode {
                StreamCrash::Cut => Err(Stop::Abort),
                StreamCrash::ErrorEvent => {
                    let event = wire::stream_error_event(
                        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "InternalServerError",
                        500,
                    );
                    send(event).await?;
                    Ok(())
                }
            };
        }
        let mut emitted = 0;
        for (i, choice) in plan.choices.iter().enumerate() {
            let Some(piece) = choice.pieces.get(step) else {
                continue;
            };
            emitted += 1;
            let last = step + 1 == choice.pieces.len();
            let chunk = if last && engine == Engine::Vllm {
                env.content_chunk(i, piece, Some(&choice.finish))
            } else {
                env.content_chunk(i, piece, None)
            };
            send(chunk).await?;
            if last && engine == Engine::Sglang {
                send(env.finish_chunk(i, &choice.finish)).await?;
            }
        }
        guard.add_kv(emitted);
        if count_generated(state, p.oom_after, emitted) {
            crate::lifecycle::engine_died(state, crate::lifecycle::Death::CudaOom);
            return Err(Stop::EngineDead);
        }
    }
    // A choice with no tokens at all still reports how it ended.
    for (i, choice) in plan
        .choices
        .iter()
        .enumerate()
        .filter(|(_, c)| c.pieces.is_empty())
    {
        match engine {
            Engine::Vllm => send(env.content_chunk(i, "", Some(&choice.finish))).await?,
            Engine::Sglang => send(env.finish_chunk(i, &choice.finish)).await?,
        }
    }
    if plan.include_usage {
        send(env.usage_chunk(Usage {
            prompt: plan.prompt_tokens,
            completion: plan.completion_tokens(),
        }))
        .await?;
    }
    send(wire::DONE.to_string()).await?;
    state.metrics.e2e.observe(start.elapsed().as_secs_f64());
    Ok(())
}
