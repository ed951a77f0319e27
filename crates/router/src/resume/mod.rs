//! Mid-stream failover: when the engine behind a stream fails after the
//! first byte (connection cut, error event, stall), the rest of the answer
//! is asked of another ready replica, with the text so far as the answer
//! to continue, and spliced into the same stream. See docs/router.md,
//! "Streams that survive their engine", for what is and is not preserved.

mod splice;
mod transcript;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use hyper::StatusCode;
use hyper::header::HeaderMap;
use hyper::http::uri::PathAndQuery;

pub use transcript::{Charge, ResumeMemory, Route};

use crate::balance::{Affinity, choose};
use crate::endpoints::InFlight;
use crate::openai::ApiError;
use crate::proxy::{candidates, send_to};
use crate::service::Shared;
use crate::sse::{self, Event, EventFramer};
use crate::upstream::UpstreamBody;
pub(crate) use splice::{Spliced, continuation_request, request_refusal, splice_event};
use transcript::Seen;
pub(crate) use transcript::Transcript;

/// How resumption is bounded; `router.yaml`'s `resume` section.
#[derive(Debug, Clone)]
pub struct ResumeSettings {
    pub enabled: bool,
    /// Resumptions one stream may use.
    pub max_resumptions: u32,
    /// Text one stream keeps for resuming; past it the stream is no longer
    /// resumable.
    pub max_text_bytes: usize,
    /// Request bodies and text kept by all streams together.
    pub memory_cap_bytes: usize,
}

impl Default for ResumeSettings {
    fn default() -> Self {
        ResumeSettings {
            enabled: true,
            max_resumptions: 2,
            max_text_bytes: 256 * 1024,
            memory_cap_bytes: 256 * 1024 * 1024,
        }
    }
}

/// Says why a stream was not resumed, for its closing error event.
pub fn why_not(reason: &str) -> &'static str {
    match reason {
        "resumption_limit" => {
            "not resumed: the stream used all its resumptions (resume.max_resumptions)"
        }
        "text_budget" => "not resumed: the answer grew past resume.max_text_bytes",
        "memory_cap" => "not resumed: resumable streams already held resume.memory_cap_bytes",
        "n" => "not resumed: answers with n > 1 are not resumed",
        "logprobs" => "not resumed: answers with logprobs are not resumed",
        "echo" => "not resumed: answers that echo the prompt are not resumed",
        "tool_calls" => "not resumed: a tool call was being streamed",
        "reasoning" => {
            "not resumed: the answer streamed reasoning (reasoning or reasoning_content), which a continuation cannot carry"
        }
        "structured_output" => "not resumed: structured output cannot be continued mid-way",
        "prompt_not_text" => "not resumed: the prompt is not a single string",
        "token_budget_spent" => "not resumed: every token of max_tokens was streamed",
        "deadline" => "not resumed: the request deadline passed",
        "unreadable_event" => "not resumed: the engine streamed an event that is not OpenAI JSON",
        _ => "not resumed: the request could not be read again",
    }
}

/// The route a streamed request to `path` answers, if resumable at all.
pub fn route_of(path: &str) -> Option<Route> {
    match path {
        "/v1/chat/completions" => Some(Route::Chat),
        "/v1/completions" => Some(Route::Completion),
        _ => None,
    }
}

/// A continuation being opened on another replica.
pub type Opening = Pin<Box<dyn Future<Output = Result<Continuation, ApiError>> + Send>>;

/// The replica that took over the stream.
pub struct Continuation {
    pub body: UpstreamBody,
    pub in_flight: InFlight,
}

/// What the relay forwards for some upstream bytes.
pub struct Relayed {
    pub bytes: Bytes,
    /// The engine reported an error mid-stream; `bytes` ends before it.
    pub engine_error: Option<String>,
}

/// The longest event a followed stream holds back waiting for its end;
/// engines send a token or a usage summary per event, far below this.
const MAX_EVENT_BYTES: usize = 1 << 20;

/// Everything a stream keeps so that another replica can finish it.
pub struct Resumable {
    shared: Arc<Shared>,
    model: String,
    path: PathAndQuery,
    headers: HeaderMap,
    body: Bytes,
    transcript: Transcript,
    framer: EventFramer,
    resumptions: u32,
    /// Tokens streamed before the running continuation began; None while
    /// the first engine streams.
    spliced_after: Option<u64>,
    tried: Vec<String>,
    /// Keeps the request body's bytes counted against the memory cap;
    /// None once the stream can no longer be resumed (the body is let go).
    body_charge: Option<Charge>,
}

impl Resumable {
    /// Err names why the stream cannot be resumed from the start.
    pub fn new(
        shared: &Arc<Shared>,
        model: &str,
        route: Route,
        path: &PathAndQuery,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<Self, &'static str> {
        let memory = Arc::clone(&shared.resume_memory);
        // A request that could never be continued keeps nothing against
        // the cap; if its stream fails, it ends saying why.
        let refusal = request_refusal(body, route);
        let body_charge = match refusal {
            Some(_) => None,
            None => Some(Charge::new(Arc::clone(&memory), body.len()).ok_or("memory_cap")?),
        };
        let text_charge = Charge::new(memory, 0).ok_or("memory_cap")?;
        let mut transcript =
            Transcript::new(route, shared.settings.resume.max_text_bytes, text_charge);
        if let Some(reason) = refusal {
            transcript.refuse(reason);
        }
        Ok(Resumable {
            shared: Arc::clone(shared),
            model: model.to_owned(),
            path: path.clone(),
            headers: headers.clone(),
            body: if refusal.is_some() {
                Bytes::new()
            } else {
                body.clone()
            },
            transcript,
            framer: EventFramer::default(),
            resumptions: 0,
            spliced_after: None,
            tried: Vec::new(),
            body_charge,
        })
    }

    /// Whole events of `data` as the client should read them.
    pub fn relay(&mut self, data: Bytes) -> Relayed {
        if self.spliced_after.is_none() && self.transcript.refusal.is_some() {
            // Not followed: bytes pass as they come, anything held first.
            let bytes = self.framer.release(data);
            self.transcript.note_unfollowed(&bytes);
            return Relayed {
                bytes,
                engine_error: None,
            };
        }
        let events = self.framer.push(data);
        if self.framer.held() > MAX_EVENT_BYTES {
            // An event without an end: the engine is not streaming events.
            self.framer.discard();
            return Relayed {
                bytes: events,
                engine_error: Some(format!(
                    "an event went past {MAX_EVENT_BYTES} bytes without ending"
                )),
            };
        }
        let relayed = match self.spliced_after {
            None => self.follow(events),
            Some(before) => self.splice(&events, before),
        };
        if self.transcript.refusal.is_some() {
            // Never to be resumed now: the request goes with its charge.
            self.body_charge = None;
            self.body = Bytes::new();
        }
        relayed
    }

    /// The first engine's events pass unchanged; the transcript follows.
    fn follow(&mut self, events: Bytes) -> Relayed {
        for (span, event) in sse::payloads(&events) {
            let seen = match event {
                Event::Done => {
                    self.transcript.note_done();
                    Seen::Event
                }
                Event::Data(payload) => self.transcript.observe(&payload),
            };
            if let Seen::EngineError(message) = seen {
                return Relayed {
                    bytes: events.slice(..span.start),
                    engine_error: Some(message),
                };
            }
        }
        Relayed {
            bytes: events,
            engine_error: None,
        }
    }

    /// A continuation's events, rewritten to read as the first answer.
    fn splice(&mut self, events: &[u8], before: u64) -> Relayed {
        let mut out = BytesMut::with_capacity(events.len() + 64);
        for (_, event) in sse::payloads(events) {
            match event {
                Event::Done => {
                    self.transcript.note_done();
                    out.extend_from_slice(b"data: [DONE]\n\n");
                }
                Event::Data(payload) => {
                    if let Seen::EngineError(message) = self.transcript.observe(&payload) {
                        return Relayed {
                            bytes: out.freeze(),
                            engine_error: Some(message),
                        };
                    }
                    if let Spliced::Send(json) = splice_event(&payload, &self.transcript, before) {
                        out.extend_from_slice(sse::encode(&json).as_bytes());
                    }
                }
            }
        }
        Relayed {
            bytes: out.freeze(),
            engine_error: None,
        }
    }

    /// The upstream body ended cleanly: false when the answer was not
    /// complete and could be resumed (a cut at an event boundary looks like
    /// a clean end). A first stream that can no longer be resumed is not
    /// followed, so its end is taken as it comes.
    pub fn complete(&self) -> bool {
        let unfollowed = self.spliced_after.is_none() && self.transcript.refusal.is_some();
        self.answer_over() || unfollowed
    }

    /// The first choice finished (or `[DONE]` came): whatever fails now,
    /// the client already has the whole answer.
    pub fn answer_over(&self) -> bool {
        self.transcript.done || self.transcript.finished
    }

    /// `[DONE]` reached the client.
    pub fn done_sent(&self) -> bool {
        self.transcript.done
    }

    /// Starts asking another replica for the rest, after `failed` failed
    /// the stream. Err names why the stream cannot be resumed.
    pub fn begin(&mut self, failed: &str) -> Result<Opening, &'static str> {
        if let Some(reason) = self.transcript.refusal {
            return Err(reason);
        }
        if self.resumptions >= self.shared.settings.resume.max_resumptions {
            return Err("resumption_limit");
        }
        let body = continuation_request(&self.body, &self.transcript)?;
        self.resumptions += 1;
        self.spliced_after = Some(self.transcript.tokens);
        // Half an event from the failed engine never reached the client.
        self.framer.discard();
        self.tried.push(failed.to_owned());
        Ok(Box::pin(open(
            Arc::clone(&self.shared),
            self.model.clone(),
            self.path.clone(),
            self.headers.clone(),
            Bytes::from(body),
            self.tried.clone(),
        )))
    }
}

/// Sends the continuation to the best replica not yet tried, moving on as
/// a first attempt would when one cannot take it.
async fn open(
    shared: Arc<Shared>,
    model: String,
    path: PathAndQuery,
    headers: HeaderMap,
    body: Bytes,
    tried: Vec<String>,
) -> Result<Continuation, ApiError> {
    let table = Arc::clone(&shared.table.borrow());
    let no_replica = || {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_stream_cut",
            format!("no other ready replica of `{model}` could continue the answer"),
        )
    };
    let routed = table.resolve(&model).ok_or_else(no_replica)?;
    let mut pool = candidates(&shared, routed, &tried);
    let settings = &shared.settings;
    // The survivor holding the longest cached prefix of this very
    // sequence takes it over, under cache-aware routing.
    let tokens = if settings.policy == llmgw_config::BalancePolicy::CacheAware {
        crate::kv::request_tokens(&shared, routed, &body, &tried).await
    } else {
        None
    };
    let mut last_error = None;
    for _ in 0..=settings.max_retries {
        let uncached = tokens
            .as_deref()
            .and_then(|tokens| crate::kv::uncached_tokens(&shared, &pool, tokens));
        let affinity = match &uncached {
            Some(uncached) => Affinity::Cache {
                uncached,
                load_weight_tokens: settings.load_weight_tokens,
            },
            None => Affinity::None,
        };
        let Some(index) = choose(settings.policy, &pool, affinity, settings.load_factor) else {
            break;
        };
        let endpoint = pool.swap_remove(index);
        let in_flight = endpoint.start_request();
        let head_within = Some(settings.stall_timeout);
        match send_to(&shared, &endpoint, &path, &headers, &body, head_within).await {
            Ok(response) if response.status().is_success() => {
                return Ok(Continuation {
                    body: response.into_body(),
                    in_flight,
                });
            }
            Ok(response) => {
                // The request was refused as such (4xx): another replica
                // of the same engine would refuse it too.
                return Err(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream_stream_cut",
                    format!(
                        "the engine at {} refused to continue the answer ({})",
                        endpoint.url,
                        response.status()
                    ),
                ));
            }
            Err((_, error)) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(no_replica))
}
