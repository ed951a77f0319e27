//! The router's HTTP/1.1 server side: one task per client connection reads
//! a request (head, then the whole body: every route needs all of it before
//! anything is forwarded), hands it to [`handle`], and writes the answer.
//!
//! Written for the relay's cost rather than taken from a general server:
//! the head and whatever body frames are ready leave in one write, frames
//! that arrive together are batched into one write, and request header
//! values stay slices of the read buffer. While it waits for the engine,
//! the connection watches its client: a client that closes cancels the
//! request, which closes the engine's connection and so stops generation.
//! Pipelined requests are answered in order.

mod request;
mod response;

pub use self::request::RequestBody;
pub(crate) use self::request::{BodyReader, take_head};

use std::future::{Future, poll_fn};
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::Body;
use hyper::{Method, Request, Response, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

use self::request::{BodyFraming, Head, MAX_HEAD_BYTES, Refusal};
use self::response::{Framing, encode_head};
use crate::framing::Broken;
use crate::openai::ApiError;
use crate::relay::ResponseBody;
use crate::service::{Shared, handle};
use crate::settings::Settings;

/// Bytes read ahead of the current request (pipelining) are kept up to
/// this; past it the client is not read until the answer is out.
const READ_AHEAD_LIMIT: usize = MAX_HEAD_BYTES;
/// Body frames ready together are written together up to this size.
const WRITE_BATCH: usize = 64 * 1024;
/// How long a connection closed with a request body unread keeps reading
/// (and discarding) it, so the client reads the answer instead of a reset.
const LINGER: Duration = Duration::from_secs(1);

pub(crate) async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let mut connection = Connection {
        stream,
        read_buffer: BytesMut::with_capacity(8 * 1024),
        write_buffer: Vec::new(),
    };
    if let Err(e) = connection.serve(&shared).await {
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

struct Connection {
    stream: TcpStream,
    read_buffer: BytesMut,
    write_buffer: Vec<u8>,
}

/// How an exchange left the connection.
enum Next {
    KeepAlive,
    Close,
    /// Close, but read what the client still sends for a moment first.
    Linger,
}

impl Connection {
    async fn serve(&mut self, shared: &Arc<Shared>) -> io::Result<()> {
        loop {
            let head = match self.read_head(&shared.settings).await? {
                Ok(Some(head)) => head,
                Ok(None) => return Ok(()),
                Err(refusal) => {
                    self.refuse(refusal, Version::HTTP_11).await?;
                    return self.linger().await;
                }
            };
            match self.exchange(shared, head).await? {
                Next::KeepAlive => {}
                Next::Close => return Ok(()),
                Next::Linger => return self.linger().await,
            }
        }
    }

    async fn exchange(&mut self, shared: &Arc<Shared>, head: Head) -> io::Result<Next> {
        let body = match self.read_body(&head, &shared.settings).await? {
            Ok(body) => body,
            Err(refusal) => {
                self.refuse(refusal, head.version).await?;
                return Ok(Next::Linger);
            }
        };
        let body_unread = matches!(body, RequestBody::TooLarge);
        let Head {
            method,
            uri,
            version,
            headers,
            keep_alive,
            ..
        } = head;
        let head_request = method == Method::HEAD;
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.version_mut() = version;
        *request.headers_mut() = headers;
        let Some(response) = self.until_client_gone(handle(shared, request)).await else {
            return Ok(Next::Close);
        };
        let keep_alive = keep_alive && !body_unread && !wants_close(&response);
        let kept = self
            .respond(response, version, keep_alive, head_request)
            .await?;
        Ok(match (kept, body_unread) {
            (true, _) => Next::KeepAlive,
            (false, true) => Next::Linger,
            (false, false) => Next::Close,
        })
    }

    /// The next request head; Ok(None) when the client closed between
    /// requests or stayed idle past `client_idle_timeout`. A head must be
    /// complete within `client_read_timeout` of its first byte.
    async fn read_head(
        &mut self,
        settings: &Settings,
    ) -> io::Result<Result<Option<Head>, Refusal>> {
        let mut deadline = None;
        loop {
            if !self.read_buffer.is_empty() {
                match take_head(&mut self.read_buffer) {
                    Ok(Some(head)) => return Ok(Ok(Some(head))),
                    Ok(None) => {}
                    Err(refusal) => return Ok(Err(refusal)),
                }
            }
            let read = if deadline.is_none() && self.read_buffer.is_empty() {
                match timeout(settings.client_idle_timeout, self.fill()).await {
                    Ok(read) => read?,
                    Err(_) => return Ok(Ok(None)),
                }
            } else {
                let deadline =
                    *deadline.get_or_insert_with(|| Instant::now() + settings.client_read_timeout);
                match timeout_at(deadline, self.fill()).await {
                    Ok(read) => read?,
                    Err(_) => {
                        return Ok(Err(Refusal::timeout(format!(
                            "the request head was not complete within {:?} of its first byte \
                             (timeouts.client_read)",
                            settings.client_read_timeout
                        ))));
                    }
                }
            };
            if read == 0 {
                return if self.read_buffer.is_empty() {
                    Ok(Ok(None))
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
    }

    /// The whole body, or TooLarge without reading it when it is over
    /// `max_body_bytes`; refused when its chunked framing is not HTTP or
    /// it pauses longer than `client_read_timeout`.
    async fn read_body(
        &mut self,
        head: &Head,
        settings: &Settings,
    ) -> io::Result<Result<RequestBody, Refusal>> {
        if head.body == BodyFraming::Length(0) {
            return Ok(Ok(RequestBody::Complete(Bytes::new())));
        }
        let mut reader = BodyReader::new(head.body, settings.max_body_bytes);
        let mut asked = false;
        loop {
            match reader.advance(&mut self.read_buffer) {
                Ok(Some(body)) => return Ok(Ok(body)),
                Ok(None) => {}
                Err(Broken(what)) => {
                    return Ok(Err(Refusal::malformed(format!(
                        "malformed chunked request body: {what}"
                    ))));
                }
            }
            if !asked {
                self.continue_if_asked(head).await?;
                asked = true;
            }
            let read = match timeout(settings.client_read_timeout, self.fill()).await {
                Ok(read) => read?,
                Err(_) => {
                    return Ok(Err(Refusal::timeout(format!(
                        "the request body paused for more than {:?} (timeouts.client_read)",
                        settings.client_read_timeout
                    ))));
                }
            };
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// A client that sent `expect: 100-continue` waits for this before its
    /// body; asked only when the body has not (all) arrived with the head.
    async fn continue_if_asked(&mut self, head: &Head) -> io::Result<()> {
        if head.expect_continue && head.version == Version::HTTP_11 && self.read_buffer.is_empty() {
            self.stream
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await?;
        }
        Ok(())
    }

    /// Reads what the socket has into the read buffer; 0 is the client
    /// closing.
    async fn fill(&mut self) -> io::Result<usize> {
        if self.read_buffer.capacity() - self.read_buffer.len() < 1024 {
            self.read_buffer.reserve(8 * 1024);
        }
        self.stream.read_buf(&mut self.read_buffer).await
    }

    /// Runs `work` unless the client closes first (None).
    async fn until_client_gone<T>(&mut self, work: impl Future<Output = T>) -> Option<T> {
        let mut work = pin!(work);
        poll_fn(|cx| {
            if let Poll::Ready(done) = work.as_mut().poll(cx) {
                return Poll::Ready(Some(done));
            }
            self.poll_client_gone(cx).map(|()| None)
        })
        .await
    }

    /// Ready when the client has closed or failed. What it sends meanwhile
    /// (a pipelined request) is kept for later, up to READ_AHEAD_LIMIT;
    /// past that the client is not watched until the answer is out.
    fn poll_client_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.read_buffer.len() >= READ_AHEAD_LIMIT {
                return Poll::Pending;
            }
            if self.stream.poll_read_ready(cx).is_ready() {
                self.read_buffer.reserve(4 * 1024);
                match self.stream.try_read_buf(&mut self.read_buffer) {
                    Ok(0) => return Poll::Ready(()),
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(_) => return Poll::Ready(()),
                }
            }
            return Poll::Pending;
        }
    }

    /// Answers a request the server side refused itself; the connection
    /// closes after it.
    async fn refuse(&mut self, refusal: Refusal, version: Version) -> io::Result<()> {
        let answer = ApiError::new(refusal.status, refusal.code, refusal.message).into_response();
        self.respond(answer, version, false, false).await?;
        Ok(())
    }

    /// Writes the answer; true when the connection can carry another
    /// request.
    async fn respond(
        &mut self,
        response: Response<ResponseBody>,
        version: Version,
        keep_alive: bool,
        head_request: bool,
    ) -> io::Result<bool> {
        let (parts, body) = response.into_parts();
        let mut body = pin!(body);
        let mut framing = Framing::choose(
            parts.status,
            &parts.headers,
            body.size_hint().exact(),
            version,
            head_request,
        );
        let keep_alive = keep_alive && framing.delimits_itself();
        self.write_buffer.clear();
        encode_head(
            &mut self.write_buffer,
            parts.status,
            &parts.headers,
            framing,
            version,
            keep_alive,
        );
        if framing == Framing::None {
            self.flush().await?;
            return Ok(keep_alive);
        }
        loop {
            let batch = poll_fn(|cx| self.poll_batch(body.as_mut(), &mut framing, cx)).await;
            self.flush().await?;
            match batch {
                Batch::More => {}
                Batch::End => return Ok(keep_alive),
                // The client sees an incomplete body and a closed
                // connection: the only way HTTP/1.1 can say "this answer
                // failed" after its head.
                Batch::Failed | Batch::ClientGone => return Ok(false),
            }
        }
    }

    /// Encodes every body frame that is ready into the write buffer; ready
    /// to write when the body waits with something buffered, ends or fails.
    fn poll_batch(
        &mut self,
        mut body: std::pin::Pin<&mut ResponseBody>,
        framing: &mut Framing,
        cx: &mut Context<'_>,
    ) -> Poll<Batch> {
        loop {
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data()
                        && framing.encode(&data, &mut self.write_buffer).is_err()
                    {
                        return Poll::Ready(Batch::Failed);
                    }
                    if body.is_end_stream() {
                        return Poll::Ready(self.end(framing));
                    }
                    if self.write_buffer.len() >= WRITE_BATCH {
                        return Poll::Ready(Batch::More);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "answer body failed");
                    return Poll::Ready(Batch::Failed);
                }
                Poll::Ready(None) => return Poll::Ready(self.end(framing)),
                Poll::Pending if !self.write_buffer.is_empty() => {
                    return Poll::Ready(Batch::More);
                }
                Poll::Pending => return self.poll_client_gone(cx).map(|()| Batch::ClientGone),
            }
        }
    }

    fn end(&mut self, framing: &mut Framing) -> Batch {
        match framing.finish(&mut self.write_buffer) {
            Ok(()) => Batch::End,
            Err(_) => Batch::Failed,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        if !self.write_buffer.is_empty() {
            self.stream.write_all(&self.write_buffer).await?;
            self.write_buffer.clear();
        }
        Ok(())
    }

    /// Closes the sending side and discards what the client still sends
    /// for a moment: closing with unread bytes would reset the connection,
    /// and a reset can destroy the answer before the client reads it.
    async fn linger(&mut self) -> io::Result<()> {
        self.stream.shutdown().await?;
        let _ = tokio::time::timeout(LINGER, async {
            loop {
                self.read_buffer.clear();
                if !matches!(self.fill().await, Ok(n) if n > 0) {
                    break;
                }
            }
        })
        .await;
        Ok(())
    }
}

enum Batch {
    More,
    End,
    Failed,
    ClientGone,
}

/// An answer that says `connection: close` ends the connection.
fn wants_close(response: &Response<ResponseBody>) -> bool {
    response
        .headers()
        .get(hyper::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}
