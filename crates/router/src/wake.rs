//! Requests for a model scaled to zero: held while a replica starts, not
//! refused. The router asks the control plane for a replica (through the
//! [`ModelWaker`] it was given) and waits for one to be ready in its
//! routing table, up to `hold_for_replica`; past `max_held_requests` held
//! at once, or past the wait, the client gets a 503 with `Retry-After`.
//! A streamed request gets its `200` and event stream at once instead, with
//! an SSE comment every `held_keep_alive` while it waits (so clients and
//! proxies with idle timeouts keep it), and any refusal as the stream's
//! error event.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use tokio::sync::mpsc;

use crate::keys::Grant;
use crate::limits::Admitted;
use crate::openai::ApiError;
use crate::relay::{BoxError, ResponseBody};
use crate::service::Shared;
use crate::table::RoutingTable;

/// Asks the control plane for a replica of a model scaled to zero. Called
/// for every held request: implementations coalesce.
pub trait ModelWaker: Send + Sync + 'static {
    fn wake(&self, model: &str);
}

/// Seconds a client is told to wait before trying again.
const RETRY_AFTER_S: u64 = 10;

/// Holds the request until `model` has a ready replica: the routing table
/// that has it, or the refusal to send.
pub(crate) async fn until_ready(
    shared: &Shared,
    model: &str,
) -> Result<Arc<RoutingTable>, ApiError> {
    let held = shared.held_requests.fetch_add(1, Ordering::Relaxed) + 1;
    let _release = Release(shared);
    let limit = shared.settings.max_held_requests;
    if held > limit {
        return Err(unavailable(format!(
            "model `{model}` is starting from zero replicas and {limit} requests already wait for it; retry in {RETRY_AFTER_S}s"
        )));
    }
    match &shared.waker {
        Some(waker) => waker.wake(model),
        None => tracing::debug!(
            model,
            "holding a request for a model scaled to zero; this router cannot ask for a replica, others may"
        ),
    }
    tracing::info!(
        model,
        held,
        "holding a request while a replica of the model starts (scaled to zero)"
    );
    let mut table = shared.table.clone();
    let deadline = tokio::time::Instant::now() + shared.settings.hold_for_replica;
    loop {
        let now = Arc::clone(&table.borrow_and_update());
        match now.resolve(model) {
            Some(routed) if routed.ready_endpoints().next().is_some() => return Ok(now),
            Some(_) => {}
            None => return Err(ApiError::model_not_found(model)),
        }
        if tokio::time::timeout_at(deadline, table.changed())
            .await
            .map_or(true, |changed| changed.is_err())
        {
            return Err(unavailable(format!(
                "no replica of model `{model}` became ready within {}s of this request (it was scaled to zero); retry in {RETRY_AFTER_S}s",
                shared.settings.hold_for_replica.as_secs()
            )));
        }
    }
}

/// A streamed request admitted for a model with no ready replica.
pub(crate) struct HeldRequest {
    pub parts: hyper::http::request::Parts,
    pub bytes: Bytes,
    pub grant: Option<Arc<Grant>>,
    pub admitted: Admitted,
}

/// Largest engine refusal turned into an error event.
const MAX_REFUSAL_BYTES: usize = 64 * 1024;

/// Answers a held stream at once: comments while a replica starts, then
/// the engine's events, or the refusal as an error event.
pub(crate) fn held_stream(
    shared: Arc<Shared>,
    model: String,
    held: HeldRequest,
) -> Response<ResponseBody> {
    let (events, receiver) = mpsc::channel(8);
    tokio::spawn(async move {
        let Some(table) = wait_saying_so(&shared, &model, &events).await else {
            return;
        };
        let HeldRequest {
            parts,
            bytes,
            grant,
            admitted,
        } = held;
        let Ok(peeked) = crate::peek::peek(&bytes) else {
            return; // read whole before it was held
        };
        let response =
            crate::service::dispatch(&shared, &table, parts, &bytes, &peeked, grant, admitted)
                .await;
        relay_as_events(response, &events).await;
    });
    let mut response = Response::new(Events { receiver }.boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Waits for a ready replica, sending a comment every `held_keep_alive`;
/// the table once one is ready, `None` once the client left or the wait
/// was refused (the refusal sent as the stream's end).
async fn wait_saying_so(
    shared: &Shared,
    model: &str,
    events: &mpsc::Sender<Bytes>,
) -> Option<Arc<RoutingTable>> {
    let every = shared.settings.held_keep_alive;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let waiting = until_ready(shared, model);
    tokio::pin!(waiting);
    let ready = loop {
        tokio::select! {
            ready = &mut waiting => break ready,
            () = events.closed() => return None,
            _ = tick.tick() => {
                let note = format!(": waiting for a replica of {model} to start (scaled to zero)\n\n");
                if events.send(Bytes::from(note)).await.is_err() {
                    return None;
                }
            }
        }
    };
    match ready {
        Ok(table) => Some(table),
        Err(refusal) => {
            shared
                .metrics
                .request_refused(model, refusal.status.as_u16());
            let _ = events.send(refusal.stream_tail(true)).await;
            None
        }
    }
}

/// The engine's answer, passed on as events: a stream as it comes, any
/// other answer (a refusal) as an error event and `[DONE]`.
async fn relay_as_events(response: Response<ResponseBody>, events: &mpsc::Sender<Bytes>) {
    let status = response.status();
    let streamed = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut body = response.into_body();
    if status.is_success() && streamed {
        while let Some(frame) = body.frame().await {
            let data = match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue, // trailers
                },
                Err(error) => {
                    let failed =
                        ApiError::new(StatusCode::BAD_GATEWAY, "upstream_error", error.to_string());
                    let _ = events.send(failed.stream_tail(false)).await;
                    return;
                }
            };
            if events.send(data).await.is_err() {
                return; // the client left: dropping the body cancels the engine's work
            }
        }
        return;
    }
    let mut text = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            text.extend_from_slice(&data);
            if text.len() > MAX_REFUSAL_BYTES {
                break;
            }
        }
    }
    let event = match serde_json::from_slice::<serde_json::Value>(&text) {
        Ok(value) if value.get("error").is_some() => {
            Bytes::from(format!("data: {value}\n\ndata: [DONE]\n\n"))
        }
        _ => ApiError::new(
            status,
            "upstream_error",
            format!(
                "the engine answered {status}: {}",
                String::from_utf8_lossy(&text[..text.len().min(1024)])
            ),
        )
        .stream_tail(true),
    };
    let _ = events.send(event).await;
}

/// A response body fed by a channel; it ends when the sender is dropped.
struct Events {
    receiver: mpsc::Receiver<Bytes>,
}

impl Body for Events {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.receiver
            .poll_recv(cx)
            .map(|event| event.map(|data| Ok(Frame::data(data))))
    }
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "model_starting", message)
        .retry_after(RETRY_AFTER_S)
}

/// Counts a held request out when it stops waiting.
struct Release<'a>(&'a Shared);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.held_requests.fetch_sub(1, Ordering::Relaxed);
    }
}
