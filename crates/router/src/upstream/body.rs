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

/// A chunk-size line longer than this is not HTTP.
const MAX_LINE: usize = 4096;

pub struct UpstreamBody {
    /// None once the body is over (the connection went back to its pool or
    /// was closed).
    stream: Option<TcpStream>,
    buffer: BytesMut,
    decoder: Decoder,
    keep_alive: bool,
    pool: Arc<HostPool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoder {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    Trailers,
    UntilClose,
    Done,
    /// The framing was broken: every later step fails too, so an error
    /// noticed while looking ahead is not skipped over.
    Broken,
}

enum Step {
    Data(Bytes),
    NeedMore,
    End,
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
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::ChunkSize,
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
        self.decode(yield_data).inspect_err(|_| {
            self.decoder = Decoder::Broken;
            self.stream = None;
        })
    }

    fn decode(&mut self, yield_data: bool) -> Result<Step, UpstreamError> {
        loop {
            match self.decoder {
                Decoder::Broken => return Err(protocol("the engine broke the body's framing")),
                Decoder::Done => return Ok(Step::End),
                Decoder::Length(0) => return Ok(Step::End),
                Decoder::Length(left) | Decoder::ChunkData(left) => {
                    if self.buffer.is_empty() || !yield_data {
                        return Ok(Step::NeedMore);
                    }
                    let take = left.min(self.buffer.len() as u64);
                    let rest = left - take;
                    self.decoder = match self.decoder {
                        Decoder::Length(_) => Decoder::Length(rest),
                        _ if rest == 0 => Decoder::ChunkEnd,
                        _ => Decoder::ChunkData(rest),
                    };
                    let data = self.buffer.split_to(take as usize).freeze();
                    return Ok(Step::Data(data));
                }
                Decoder::UntilClose => {
                    if self.buffer.is_empty() || !yield_data {
                        return Ok(Step::NeedMore);
                    }
                    return Ok(Step::Data(self.buffer.split().freeze()));
                }
                Decoder::ChunkEnd => {
                    if self.buffer.len() < 2 {
                        return Ok(Step::NeedMore);
                    }
                    if &self.buffer[..2] != b"\r\n" {
                        return Err(protocol("chunk data not followed by CRLF"));
                    }
                    let _ = self.buffer.split_to(2);
                    self.decoder = Decoder::ChunkSize;
                }
                Decoder::ChunkSize => {
                    let Some(line) = self.take_line()? else {
                        return Ok(Step::NeedMore);
                    };
                    let size = chunk_size(&line)?;
                    self.decoder = if size == 0 {
                        Decoder::Trailers
                    } else {
                        Decoder::ChunkData(size)
                    };
                }
                Decoder::Trailers => {
                    let Some(line) = self.take_line()? else {
                        return Ok(Step::NeedMore);
                    };
                    if line.is_empty() {
                        return Ok(Step::End);
                    }
                }
            }
        }
    }

    /// One CRLF-terminated line from the buffer, without its CRLF.
    fn take_line(&mut self) -> Result<Option<BytesMut>, UpstreamError> {
        match self.buffer.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let mut line = self.buffer.split_to(end + 1);
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                Ok(Some(line))
            }
            None if self.buffer.len() > MAX_LINE => Err(protocol("chunk line too long")),
            None => Ok(None),
        }
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

fn protocol(what: &str) -> UpstreamError {
    UpstreamError::Protocol(what.to_string())
}

/// The hex size at the start of a chunk line (extensions after `;` are
/// ignored).
fn chunk_size(line: &[u8]) -> Result<u64, UpstreamError> {
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return Err(protocol("bad chunk size"));
    }
    digits.iter().try_fold(0u64, |size, &b| {
        let digit = (b as char)
            .to_digit(16)
            .ok_or_else(|| protocol("bad chunk size"))?;
        Ok(size * 16 + u64::from(digit))
    })
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
        match self.decoder {
            Decoder::Length(n) => SizeHint::with_exact(n),
            Decoder::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
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
