//! The response body the client reads: upstream frames passed on as they
//! arrive, with the stall timeout and request deadline enforced between
//! frames. A stream cut mid-way (engine died, stalled, deadline) ends with an
//! OpenAI error event and `data: [DONE]` instead of a hang or a torn
//! connection. Dropping it (the client went away) drops the upstream body,
//! which closes that connection and so cancels the engine's request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::StatusCode;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Sleep;

use crate::endpoints::InFlight;
use crate::metrics::Metrics;
use crate::openai::ApiError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

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
    Done,
}

pub struct Relay {
    first: Option<Frame<Bytes>>,
    upstream: Incoming,
    timer: Pin<Box<Sleep>>,
    stall: Duration,
    deadline: tokio::time::Instant,
    /// Server-sent events can carry a closing error event; other bodies can
    /// only be aborted.
    sse: bool,
    at_event_boundary: bool,
    state: State,
    finish: Finish,
}

impl Relay {
    pub fn new(
        first: Option<Frame<Bytes>>,
        upstream: Incoming,
        stall: Duration,
        deadline: tokio::time::Instant,
        sse: bool,
        finish: Finish,
    ) -> Self {
        let mut relay = Relay {
            first: None,
            upstream,
            timer: Box::pin(tokio::time::sleep_until(next_wake(stall, deadline))),
            stall,
            deadline,
            sse,
            at_event_boundary: true,
            state: State::Streaming,
            finish,
        };
        if let Some(frame) = first {
            relay.note(&frame);
            relay.first = Some(frame);
        }
        relay
    }

    fn note(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref()
            && !data.is_empty()
        {
            self.at_event_boundary = data.ends_with(b"\n\n");
        }
    }

    /// Ends the answer early: an error event for streams, an aborted body
    /// otherwise.
    fn cut(&mut self, error: ApiError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        tracing::warn!(endpoint = %self.finish.in_flight.endpoint().url, model = %self.finish.model, "{}", error.message);
        self.state = State::Done;
        if self.sse {
            Poll::Ready(Some(Ok(Frame::data(
                error.stream_tail(self.at_event_boundary),
            ))))
        } else {
            Poll::Ready(Some(Err(error.message.into())))
        }
    }
}

fn next_wake(stall: Duration, deadline: tokio::time::Instant) -> tokio::time::Instant {
    (tokio::time::Instant::now() + stall).min(deadline)
}

impl Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if matches!(this.state, State::Done) {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.upstream).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.note(&frame);
                let wake = next_wake(this.stall, this.deadline);
                this.timer.as_mut().reset(wake);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let endpoint = Arc::clone(this.finish.in_flight.endpoint());
                endpoint.record_failure(this.finish.failure_threshold);
                this.cut(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream_stream_cut",
                    format!("the engine at {} stopped mid-answer: {e}", endpoint.url),
                ))
            }
            Poll::Ready(None) => {
                this.state = State::Done;
                this.finish.in_flight.endpoint().record_success();
                Poll::Ready(None)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let message = if tokio::time::Instant::now() >= this.deadline {
                        "the request deadline passed before the engine finished".to_string()
                    } else {
                        format!(
                            "the engine at {} sent nothing for {:?} (stall timeout)",
                            this.finish.in_flight.endpoint().url,
                            this.stall
                        )
                    };
                    this.cut(ApiError::new(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream_timeout",
                        message,
                    ))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse {
            SizeHint::default()
        } else {
            let mut hint = self.upstream.size_hint();
            if let Some(first) = self.first.as_ref().and_then(Frame::data_ref) {
                let n = first.len() as u64;
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper + n);
                }
                hint.set_lower(hint.lower() + n);
            }
            hint
        }
    }
}
