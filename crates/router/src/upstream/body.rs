//! The engine's response body, decoded off the socket as it is polled:
//! every frame is a slice of the read buffer (no copy), and everything
//! already buffered is yielded before the socket is read again, so the
//! server side can write several tokens in one go.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

use super::wire::Framing;
use super::{HostPool, UpstreamError};
use crate::framing::{Broken, Decoder, Step};

pub struct UpstreamBody {
    /// None once the body is over (the connection went back to its pool or
    /// was closed).
    stream: Option<TcpStream>,
    buffer: BytesMut,
    decoder: Decoder,
    keep_alive: bool,
    pool: Arc<HostPool>,
}

impl UpstreamBody {
    pub(crate) fn new(
        stream: TcpStream,
        buffer: BytesMut,
        framing: Framing,
        keep_alive: bool,
        pool: Arc<HostPool>,
    ) -> Self {
        let decoder = match framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::length(n),
            Framing::Chunked => Decoder::chunked(),
            Framing::UntilClose => Decoder::UntilClose,
        };
        let mut body = UpstreamBody {
            stream: Some(stream),
            buffer,
            decoder,
            keep_alive,
            pool,
        };
        if body.decoder == Decoder::Done {
            body.finish();
        }
        body
    }

    /// The body is over: the connection is reusable if the engine said so
    /// and sent nothing past the end.
    fn finish(&mut self) {
        self.decoder = Decoder::Done;
        if let Some(stream) = self.stream.take()
            && self.keep_alive
            && self.buffer.is_empty()
        {
            self.pool.give_back(stream);
        }
    }

    /// Decodes what the buffer holds. With `yield_data` false it stops at
    /// data instead of taking it (and says NeedMore).
    fn step(&mut self, yield_data: bool) -> Result<Step, UpstreamError> {
        self.decoder
            .step(&mut self.buffer, yield_data)
            .map_err(|Broken(what)| {
                self.stream = None;
                UpstreamError::Protocol(format!("the engine broke the body's framing: {what}"))
            })
    }

    /// Reads what the socket has; Ready(0) is the engine closing.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let stream = self
            .stream
            .as_ref()
            .expect("a body in progress has its stream");
        if self.buffer.capacity() - self.buffer.len() < 1024 {
            self.buffer.reserve(16 * 1024);
        }
        loop {
            ready!(stream.poll_read_ready(cx))?;
            match stream.try_read_buf(&mut self.buffer) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = &mut *self;
        loop {
            match this.step(true) {
                Ok(Step::Data(data)) => {
                    // The end of the body usually arrives with its last
                    // bytes: notice it now, so the connection is pooled and
                    // the server finishes the answer without another poll.
                    if matches!(this.step_to_end(), Ok(true)) {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(e) => {
                    this.abandon();
                    return Poll::Ready(Some(Err(e)));
                }
            }
            match ready!(this.poll_fill(cx)) {
                Ok(0) if this.decoder == Decoder::UntilClose => {
                    this.keep_alive = false;
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    this.abandon();
                    return Poll::Ready(Some(Err(UpstreamError::Closed)));
                }
                Ok(_) => {}
                Err(e) => {
                    this.abandon();
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder == Decoder::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.exact_left() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl UpstreamBody {
    /// Advances past framing that carries no data (a chunk's CRLF, the
    /// last chunk, trailers) as far as the buffer allows; true when that
    /// reaches the end of the body.
    fn step_to_end(&mut self) -> Result<bool, UpstreamError> {
        Ok(matches!(self.step(false)?, Step::End))
    }

    /// The body failed: the connection is in an unknown state and closed.
    fn abandon(&mut self) {
        self.decoder = Decoder::Done;
        self.stream = None;
    }
}
