//! The HTTP server: hyper directly, one task per connection, and a body type
//! that is either a ready buffer or a channel of stream chunks.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::generate::Stop;

/// A response body: a whole buffer, or stream chunks from a generator task.
/// An `Err` item aborts the connection, which is how a crash mid-stream
/// looks to the client.
pub enum SimBody {
    Full(Option<Bytes>),
    /// The guard lives as long as hyper holds the body, so a shutdown can
    /// wait until the last chunk has been handed to the socket.
    Stream {
        rx: mpsc::Receiver<Result<Bytes, Stop>>,
        _guard: Option<Box<dyn Send + Sync>>,
    },
}

/// The error a stream ends with when it is cut.
#[derive(Debug)]
pub struct StreamCut(pub Stop);

impl std::fmt::Display for StreamCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream cut: {:?}", self.0)
    }
}

impl std::error::Error for StreamCut {}

impl Body for SimBody {
    type Data = Bytes;
    type Error = StreamCut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamCut>>> {
        match &mut *self {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Stream { rx, .. } => match rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Poll::Ready(Some(Err(stop))) => Poll::Ready(Some(Err(StreamCut(stop)))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Stream { .. } => SizeHint::default(),
        }
    }
}

pub type SimResponse = Response<SimBody>;

static JSON: HeaderValue = HeaderValue::from_static("application/json");

/// A response with a JSON body.
pub fn json(status: u16, body: impl Into<Bytes>) -> SimResponse {
    let mut r = Response::new(SimBody::Full(Some(body.into())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(CONTENT_TYPE, JSON.clone());
    r
}

/// A response with no body (`/health`).
pub fn empty(status: u16) -> SimResponse {
    let mut r = Response::new(SimBody::Full(None));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r
}

/// A response with a text body of the given content type.
pub fn text(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> SimResponse {
    let mut r = Response::new(SimBody::Full(Some(body.into())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// An event stream fed by `rx`.
pub fn event_stream(
    content_type: &'static str,
    rx: mpsc::Receiver<Result<Bytes, Stop>>,
    guard: Option<Box<dyn Send + Sync>>,
) -> SimResponse {
    let mut r = Response::new(SimBody::Stream { rx, _guard: guard });
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Request bodies larger than this are refused; no real prompt needs more.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Reads a whole request body, bounded.
pub async fn read_body(body: Incoming) -> Result<Bytes, String> {
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(format!("cannot read request body: {e}")),
    }
}

/// What a handler returns: a response, or "drop the connection".
pub type HandlerResult = Result<SimResponse, StreamCut>;

/// Routes one request; implemented by each server personality.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> impl Future<Output = HandlerResult> + Send;
}

/// Accepts connections until `stop` turns true, then lets each connection
/// finish its in-flight request (graceful) and closes it.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    stop: watch::Receiver<bool>,
) {
    let mut stop_accept = stop.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped(&mut stop_accept) => break,
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            // Out of descriptors or a reset before accept: keep serving.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let handler = handler.clone();
                async move { handler.handle(req).await }
            });
            let conn = http1::Builder::new()
                .keep_alive(true)
                .writev(false)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Splits `/path?query` into its path.
pub fn path_of(req: &Request<Incoming>) -> &str {
    req.uri().path()
}

/// The bearer token of a request, if any.
pub fn bearer(req: &Request<Incoming>) -> Option<&str> {
    req.headers()
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}
