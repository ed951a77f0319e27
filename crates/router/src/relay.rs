//! The response body the client reads: upstream frames passed on as they
//! arrive, with the stall timeout and request deadline enforced between
//! frames. A stream cut mid-way (engine died, stalled, deadline) ends with an
//! OpenAI error event and `data: [DONE]` instead of a hang or a torn
//! connection, unless the stream can be resumed on another replica (see
//! `resume`). Dropping it (the client went away) drops the upstream body,
//! which closes that connection and so cancels the engine's request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::StatusCode;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::endpoints::InFlight;
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::resume::{Opening, Resumable, why_not};
use crate::sse;
use crate::upstream::UpstreamBody;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// The answer with `guard` kept until its body is done or dropped: what
/// the request holds (a key's concurrency permit, a replica's place) is
/// held while the client reads.
pub(crate) fn holding<G: Send + Unpin + 'static>(
    response: hyper::Response<ResponseBody>,
    guard: G,
) -> hyper::Response<ResponseBody> {
    use http_body_util::BodyExt;
    response.map(|inner| {
        Holding {
            inner,
            _guard: guard,
        }
        .boxed_unsync()
    })
}

struct Holding<G> {
    inner: ResponseBody,
    _guard: G,
}

impl<G: Unpin> Body for Holding<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Bookkeeping done once the answer is over, however it ends.
pub struct Finish {
    pub metrics: Arc<Metrics>,
    pub model: String,
    pub status: u16,
    pub started: Instant,
    pub in_flight: InFlight,
    pub failure_threshold: u32,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.metrics.request_finished(
            &self.model,
            &self.in_flight.endpoint().url,
            self.status,
            self.started.elapsed(),
        );
    }
}

enum State {
    Streaming,
    /// Another replica is being asked for the rest of the answer.
    Resuming(Opening),
    Done,
}

pub struct Relay {
    /// Yielded before anything else: the first frame, or the closing error
    /// event of a stream that was cut.
    queued: Option<Frame<Bytes>>,
    /// The closing error event of a stream that was cut, after what was
    /// queued.
    pending_tail: Option<Frame<Bytes>>,
    /// A non-stream body that was cut is aborted with this.
    abort: Option<BoxError>,
    /// None while a continuation is being opened.
    upstream: Option<UpstreamBody>,
    /// Fires at the stall limit or the deadline. Frames only note their
    /// time in `last_activity`; the timer is moved when it fires early, not
    /// on every frame (re-registering a timer per token costs more than
    /// relaying the token).
    timer: Option<Pin<Box<Sleep>>>,
    last_activity: tokio::time::Instant,
    stall: Duration,
    deadline: tokio::time::Instant,
    /// Server-sent events can carry a closing error event; other bodies can
    /// only be aborted.
    sse: bool,
    at_event_boundary: bool,
    state: State,
    /// Present while the stream can still be resumed elsewhere.
    resume: Option<Box<Resumable>>,
    /// What failed the stream that is being resumed, for the error event
    /// if no replica can continue it.
    resuming_after: String,
    finish: Finish,
}

/// Why the engine stopped serving the stream.
struct Failure {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Failure {
    fn cut(message: String) -> Self {
        Failure {
            status: StatusCode::BAD_GATEWAY,
            code: "upstream_stream_cut",
            message,
        }
    }
}

/// What one upstream frame gives the client.
enum Passed {
    Forward(Frame<Bytes>),
    /// Only part of an event: held until its end arrives.
    Nothing,
    /// The engine reported an error; what came before it is forwarded.
    Failed(Option<Frame<Bytes>>, Failure),
}

impl Relay {
    pub fn new(
        first: Option<Frame<Bytes>>,
        upstream: UpstreamBody,
        stall: Duration,
        deadline: tokio::time::Instant,
        sse: bool,
        resume: Option<Box<Resumable>>,
        finish: Finish,
    ) -> Self {
        let mut relay = Relay {
            queued: None,
            pending_tail: None,
            abort: None,
            upstream: Some(upstream),
            timer: None,
            last_activity: tokio::time::Instant::now(),
            stall,
            deadline,
            sse,
            at_event_boundary: true,
            state: State::Streaming,
            resume,
            resuming_after: String::new(),
            finish,
        };
        if let Some(frame) = first {
            match relay.pass(frame) {
                Passed::Forward(frame) => relay.queued = Some(frame),
                Passed::Nothing => {}
                Passed::Failed(forward, failure) => {
                    relay.queued = forward;
                    relay.fail(failure);
                }
            }
        }
        relay
    }

    fn note(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref()
            && !data.is_empty()
        {
            self.at_event_boundary = sse::ends_an_event(data);
        }
    }

    /// What to forward of one upstream frame.
    fn pass(&mut self, frame: Frame<Bytes>) -> Passed {
        let Some(resume) = self.resume.as_mut() else {
            self.note(&frame);
            return Passed::Forward(frame);
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => return Passed::Forward(frame),
        };
        let relayed = resume.relay(data);
        let forward = (!relayed.bytes.is_empty()).then(|| Frame::data(relayed.bytes));
        if let Some(frame) = &forward {
            // A stream no longer followed passes bytes as they come.
            self.note(frame);
        }
        match (relayed.engine_error, forward) {
            (Some(message), forward) => Passed::Failed(
                forward,
                Failure::cut(format!(
                    "the engine at {} stopped mid-answer: {message}",
                    self.finish.in_flight.endpoint().url
                )),
            ),
            (None, Some(frame)) => Passed::Forward(frame),
            (None, None) => Passed::Nothing,
        }
    }

    /// The engine failed the stream: resume it elsewhere when possible,
    /// otherwise end it.
    fn fail(&mut self, failure: Failure) {
        let url = self.finish.in_flight.endpoint().url.clone();
        let outcome = match self.resume.as_mut() {
            None => {
                self.end(failure);
                return;
            }
            Some(resume) if resume.answer_over() => {
                // Only the end of the stream was lost (the usage event,
                // `[DONE]`): the client has the whole answer, and another
                // replica asked to continue it would add text after it.
                let done_sent = resume.done_sent();
                tracing::warn!(endpoint = %url, model = %self.finish.model, "{} after the answer was over; ending the stream", failure.message);
                self.stop_upstream();
                if !done_sent {
                    // A stream passed as it came may have stopped mid-event.
                    let lead: &[u8] = if self.at_event_boundary { b"" } else { b"\n\n" };
                    let tail = [lead, b"data: [DONE]\n\n"].concat();
                    self.pending_tail = Some(Frame::data(Bytes::from(tail)));
                }
                return;
            }
            Some(_) if tokio::time::Instant::now() >= self.deadline => Err("deadline"),
            Some(resume) => resume.begin(&url),
        };
        match outcome {
            Ok(opening) => {
                tracing::warn!(endpoint = %url, model = %self.finish.model, "{}; resuming the stream on another replica", failure.message);
                self.upstream = None;
                self.last_activity = tokio::time::Instant::now();
                self.state = State::Resuming(opening);
                self.resuming_after = failure.message;
            }
            Err(reason) => {
                self.finish.metrics.resumption(&self.finish.model, reason);
                let message = format!("{}; {}", failure.message, why_not(reason));
                self.end(Failure { message, ..failure });
            }
        }
    }

    /// Ends the answer early: an error event for streams, an aborted body
    /// otherwise.
    fn end(&mut self, failure: Failure) {
        tracing::warn!(endpoint = %self.finish.in_flight.endpoint().url, model = %self.finish.model, "{}", failure.message);
        self.stop_upstream();
        let error = ApiError::new(failure.status, failure.code, failure.message);
        if self.sse {
            self.pending_tail = Some(Frame::data(error.stream_tail(self.at_event_boundary)));
        } else {
            self.abort = Some(error.message.into());
        }
    }

    /// Nothing more comes from an engine: only what is queued or pending
    /// for the client is left.
    fn stop_upstream(&mut self) {
        self.state = State::Done;
        self.upstream = None;
        self.resume = None;
    }

    fn stalled(&self) -> Failure {
        Failure {
            status: StatusCode::GATEWAY_TIMEOUT,
            code: "upstream_timeout",
            message: format!(
                "the engine at {} sent nothing for {:?} (stall timeout)",
                self.finish.in_flight.endpoint().url,
                self.stall
            ),
        }
    }

    fn past_deadline() -> Failure {
        Failure {
            status: StatusCode::GATEWAY_TIMEOUT,
            code: "upstream_timeout",
            message: "the request deadline passed before the engine finished".to_string(),
        }
    }

    /// Polls the running upstream; None means go round again.
    fn poll_upstream(&mut self, cx: &mut Context<'_>) -> Option<Poll<Option<Frame<Bytes>>>> {
        let upstream = self
            .upstream
            .as_mut()
            .expect("a streaming relay has an upstream");
        match Pin::new(upstream).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.last_activity = tokio::time::Instant::now();
                match self.pass(frame) {
                    Passed::Forward(frame) => Some(Poll::Ready(Some(frame))),
                    Passed::Nothing => None,
                    Passed::Failed(forward, failure) => {
                        self.fail(failure);
                        forward.map(|frame| Poll::Ready(Some(frame)))
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let endpoint = Arc::clone(self.finish.in_flight.endpoint());
                endpoint.record_failure(self.finish.failure_threshold);
                self.fail(Failure::cut(format!(
                    "the engine at {} stopped mid-answer: {e}",
                    endpoint.url
                )));
                None
            }
            Poll::Ready(None) => {
                if self.resume.as_ref().is_some_and(|r| !r.complete()) {
                    // A cut on an event boundary ends the body cleanly, but
                    // the answer is not over.
                    let endpoint = Arc::clone(self.finish.in_flight.endpoint());
                    endpoint.record_failure(self.finish.failure_threshold);
                    self.fail(Failure::cut(format!(
                        "the engine at {} ended the stream before the answer was complete",
                        endpoint.url
                    )));
                    return None;
                }
                self.state = State::Done;
                self.finish.in_flight.endpoint().record_success();
                Some(Poll::Ready(None))
            }
            Poll::Pending => match self.expired(cx) {
                Some(Expiry::Deadline) => {
                    self.end(Self::past_deadline());
                    None
                }
                Some(Expiry::Stall) => {
                    let failure = self.stalled();
                    self.fail(failure);
                    None
                }
                None => Some(Poll::Pending),
            },
        }
    }

    /// Polls the continuation being opened; None means go round again.
    fn poll_opening(&mut self, cx: &mut Context<'_>) -> Option<Poll<Option<Frame<Bytes>>>> {
        let State::Resuming(opening) = &mut self.state else {
            unreachable!("polled an opening without one");
        };
        match opening.as_mut().poll(cx) {
            Poll::Ready(Ok(continuation)) => {
                self.finish
                    .metrics
                    .resumption(&self.finish.model, "resumed");
                tracing::info!(model = %self.finish.model, endpoint = %continuation.in_flight.endpoint().url, "stream resumed on another replica");
                self.finish.in_flight = continuation.in_flight;
                self.upstream = Some(continuation.body);
                self.state = State::Streaming;
                self.last_activity = tokio::time::Instant::now();
                None
            }
            Poll::Ready(Err(error)) => {
                self.finish.metrics.resumption(&self.finish.model, "failed");
                let message = format!("{}; {}", self.resuming_after, error.message);
                self.end(Failure {
                    status: error.status,
                    code: "upstream_stream_cut",
                    message,
                });
                None
            }
            Poll::Pending => match self.expired(cx) {
                Some(expiry) => {
                    self.finish.metrics.resumption(&self.finish.model, "failed");
                    let failure = if expiry == Expiry::Deadline {
                        Self::past_deadline()
                    } else {
                        Failure {
                            status: StatusCode::GATEWAY_TIMEOUT,
                            code: "upstream_timeout",
                            message: format!(
                                "{}; no replica began continuing the answer within {:?} (stall timeout)",
                                self.resuming_after, self.stall
                            ),
                        }
                    };
                    self.end(failure);
                    None
                }
                None => Some(Poll::Pending),
            },
        }
    }

    /// Whether the stall limit or the deadline has passed; re-arms the
    /// timer (registering the waker) when it fired before either.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<Expiry> {
        let wake = (self.last_activity + self.stall).min(self.deadline);
        // Made on the first wait: an answer that arrives whole never needs
        // one.
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return None;
            }
            let now = tokio::time::Instant::now();
            if now >= self.deadline {
                return Some(Expiry::Deadline);
            }
            let stall_at = self.last_activity + self.stall;
            if now >= stall_at {
                return Some(Expiry::Stall);
            }
            timer.as_mut().reset(stall_at.min(self.deadline));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Stall,
    Deadline,
}

impl Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(frame) = this.queued.take() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(frame) = this.pending_tail.take() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(error) = this.abort.take() {
                return Poll::Ready(Some(Err(error)));
            }
            let polled = match this.state {
                State::Done => return Poll::Ready(None),
                State::Streaming => this.poll_upstream(cx),
                State::Resuming(_) => this.poll_opening(cx),
            };
            if let Some(poll) = polled {
                return poll.map(|frame| frame.map(Ok));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.queued.is_none()
            && self.pending_tail.is_none()
            && self.abort.is_none()
            && matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.upstream, self.sse) {
            (Some(upstream), false) => {
                let mut hint = upstream.size_hint();
                if let Some(first) = self.queued.as_ref().and_then(Frame::data_ref) {
                    let n = first.len() as u64;
                    if let Some(upper) = hint.upper() {
                        hint.set_upper(upper + n);
                    }
                    hint.set_lower(hint.lower() + n);
                }
                hint
            }
            _ => SizeHint::default(),
        }
    }
}
