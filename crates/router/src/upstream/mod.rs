//! The router's own HTTP/1.1 client for engines: kept-alive connections per
//! host, the request written in one system call, the response head parsed
//! in place and the body decoded straight off the socket by whoever polls
//! it.
//!
//! A general client runs each connection as a task of its own and passes
//! every request and every body chunk to it through channels; for a proxy
//! that doubles the task wake-ups per token and was most of the router's
//! cost per request. Here the task that relays the answer to the client
//! reads the engine's socket itself, so a token costs one wake-up, as in
//! nginx.
//!
//! A connection goes back to its host's idle list once its response body
//! has been read to the end; one dropped early (the client went away) is
//! closed, which is how the engine learns to cancel the request.

mod body;
mod wire;

#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::header::HeaderMap;
use hyper::{Method, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use body::UpstreamBody;
pub(crate) use wire::take_head;

/// Engines behind uvicorn (vLLM, SGLang) close a kept-alive connection
/// after 5 s of silence; one idle for this long is not worth the risk of
/// meeting that close halfway.
pub const IDLE_LIMIT: Duration = Duration::from_secs(4);
/// Idle connections kept per host; more are closed when they finish.
const MAX_IDLE_PER_HOST: usize = 1024;
/// An engine that closes an idle connection just as a request goes out on
/// it closes at once, without reading it; one that stays silent longer
/// after the request and then closes had read it (and died, or dropped
/// it), so the request is not sent to it a second time.
pub(crate) const IDLE_CLOSE_RACE: Duration = Duration::from_secs(1);
/// A response head larger than this is refused (engines send a few hundred
/// bytes).
const MAX_HEAD_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("invalid URL {0}")]
    Url(String),
    #[error("connecting to {authority}: {source}")]
    Connect {
        authority: String,
        source: io::Error,
    },
    #[error("no connection to {0} within {1:?}")]
    ConnectTimeout(String, Duration),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the engine broke HTTP/1.1: {0}")]
    Protocol(String),
    #[error("the connection closed before the answer was complete")]
    Closed,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The most [`Upstream::get_text`] reads: an engine's `/metrics` page is
/// tens of KiB, and one that streams without end must not fill the
/// router's memory.
pub const GET_TEXT_LIMIT: usize = 4 << 20;

/// The pooled client every upstream call goes through; cheap to clone.
#[derive(Clone)]
pub struct Upstream {
    /// Indexed by reactor (see [`drive_own_reactor`]).
    hosts: Arc<Mutex<Vec<Hosts>>>,
    connect_timeout: Duration,
}

/// One reactor's pools, by `host:port`.
type Hosts = HashMap<String, Arc<HostPool>>;

thread_local! {
    /// Which runtime's reactor this thread's sockets belong to: 0 for the
    /// caller's runtime, one number per router thread otherwise.
    static REACTOR: Cell<usize> = const { Cell::new(0) };
}

/// Marks this thread as the only one driving a runtime of its own, so the
/// connections it opens are pooled apart and reused only here. A socket is
/// registered with the reactor of the runtime that opened it; used from
/// another thread, every readiness event would wake two threads instead
/// of one.
pub(crate) fn drive_own_reactor(reactor: usize) {
    REACTOR.set(reactor);
}

/// The idle connections to one `host:port`, most recently used last.
pub(crate) struct HostPool {
    idle: Mutex<Vec<(TcpStream, Instant)>>,
}

impl HostPool {
    fn checkout(&self) -> Option<TcpStream> {
        let mut idle = self.idle.lock().expect("pool lock");
        while let Some((stream, since)) = idle.pop() {
            if since.elapsed() >= IDLE_LIMIT {
                // The list is in order of use: everything below is older
                // still.
                idle.clear();
                return None;
            }
            if quiet_and_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    /// Closes idle connections older than `limit`; true when none is left.
    fn close_idle(&self, limit: Duration) -> bool {
        let mut idle = self.idle.lock().expect("pool lock");
        idle.retain(|(_, since)| since.elapsed() < limit);
        idle.is_empty()
    }

    pub(crate) fn give_back(&self, stream: TcpStream) {
        let mut idle = self.idle.lock().expect("pool lock");
        if idle.len() < MAX_IDLE_PER_HOST {
            idle.push((stream, Instant::now()));
        }
    }
}

/// True when an idle connection has nothing to read and is still open. An
/// engine's bytes after a complete answer (a late error, a second
/// response) would be read as the next request's answer, whoever sent it;
/// an engine that closed the connection while it sat idle shows as
/// end-of-file. Both wake the reactor, so a connection it saw nothing on
/// since its answer ended needs no system call; otherwise one `recv` that
/// peeks and never waits tells.
#[allow(unsafe_code)]
fn quiet_and_open(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut nobody_waits = Context::from_waker(Waker::noop());
    if stream.poll_read_ready(&mut nobody_waits).is_pending() {
        return true;
    }
    let mut byte = 0u8;
    // SAFETY: recv(2) writes at most one byte into `byte`, which lives
    // across the call; the descriptor belongs to `stream`, open while it is
    // borrowed.
    let peeked = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    peeked < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

impl Upstream {
    pub fn new(connect_timeout: Duration) -> Self {
        Upstream {
            hosts: Arc::default(),
            connect_timeout,
        }
    }

    fn host(&self, authority: &str) -> Arc<HostPool> {
        let reactor = REACTOR.get();
        let mut all = self.hosts.lock().expect("hosts lock");
        if all.len() <= reactor {
            all.resize_with(reactor + 1, HashMap::new);
        }
        let hosts = &mut all[reactor];
        if let Some(pool) = hosts.get(authority) {
            return Arc::clone(pool);
        }
        let pool = Arc::new(HostPool {
            idle: Mutex::new(Vec::new()),
        });
        hosts.insert(authority.to_string(), Arc::clone(&pool));
        pool
    }

    /// Closes connections idle for longer than `limit` and forgets hosts
    /// with nothing left: without it, the connections to an engine that
    /// left the fleet would stay open until a request went there again,
    /// which never happens.
    pub fn close_idle(&self, limit: Duration) {
        let mut all = self.hosts.lock().expect("hosts lock");
        for hosts in all.iter_mut() {
            // A host whose pool a body still holds keeps its entry.
            hosts.retain(|_, pool| !pool.close_idle(limit) || Arc::strong_count(pool) > 1);
        }
    }

    /// Sends one request to `authority` (`host:port`) and returns once the
    /// response head has arrived; the body is read as it is polled.
    pub async fn send(
        &self,
        method: &Method,
        authority: &str,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let host = self.host(authority);
        let request = wire::encode_request(method, authority, path, headers, body);
        let no_body = method == Method::HEAD;
        if let Some(stream) = host.checkout() {
            match exchange(stream, &request, no_body).await {
                Ok(answer) => return Ok(answer.into_response(host)),
                // The engine closed the idle connection as the request went
                // out: it never saw the request, so a fresh connection may
                // carry it.
                Err(Exchange::ClosedBeforeAnswer) => {}
                Err(Exchange::Failed(e)) => return Err(e),
            }
        }
        let stream = self.connect(authority).await?;
        match exchange(stream, &request, no_body).await {
            Ok(answer) => Ok(answer.into_response(host)),
            Err(Exchange::ClosedBeforeAnswer) => Err(UpstreamError::Closed),
            Err(Exchange::Failed(e)) => Err(e),
        }
    }

    async fn connect(&self, authority: &str) -> Result<TcpStream, UpstreamError> {
        let connect = TcpStream::connect(authority);
        let stream = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| {
                UpstreamError::ConnectTimeout(authority.to_string(), self.connect_timeout)
            })?
            .map_err(|source| UpstreamError::Connect {
                authority: authority.to_string(),
                source,
            })?;
        // Tokens are small writes that must leave at once.
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    /// A small GET (health, metrics, admin API): status and body text, at
    /// most [`GET_TEXT_LIMIT`] bytes of it.
    pub async fn get_text(
        &self,
        url: &str,
        limit: Duration,
    ) -> Result<(u16, String), UpstreamError> {
        let (authority, path) =
            split_http_url(url).ok_or_else(|| UpstreamError::Url(url.to_string()))?;
        let (status, body) = self
            .fetch(
                &Method::GET,
                &authority,
                &path,
                &HeaderMap::new(),
                &[],
                limit,
            )
            .await?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// One small exchange read whole: status and body, at most
    /// [`GET_TEXT_LIMIT`] bytes of it, all within `limit`.
    pub async fn fetch(
        &self,
        method: &Method,
        authority: &str,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
        limit: Duration,
    ) -> Result<(u16, Bytes), UpstreamError> {
        let fetch = async {
            let response = self.send(method, authority, path, headers, body).await?;
            let status = response.status().as_u16();
            let body = http_body_util::Limited::new(response.into_body(), GET_TEXT_LIMIT)
                .collect()
                .await
                .map_err(|e| match e.downcast::<UpstreamError>() {
                    Ok(upstream) => *upstream,
                    Err(_) => {
                        UpstreamError::Protocol(format!("body longer than {GET_TEXT_LIMIT} bytes"))
                    }
                })?
                .to_bytes();
            Ok::<_, UpstreamError>((status, body))
        };
        tokio::time::timeout(limit, fetch)
            .await
            .map_err(|_| UpstreamError::Timeout(limit))?
    }
}

/// `http://host:port/path?query` as (`host:port`, `/path?query`); None for
/// anything but plain http.
pub fn split_http_url(url: &str) -> Option<(String, String)> {
    let uri: hyper::Uri = url.parse().ok()?;
    if uri.scheme() != Some(&hyper::http::uri::Scheme::HTTP) {
        return None;
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    Some((uri.authority()?.to_string(), path.to_string()))
}

enum Exchange {
    ClosedBeforeAnswer,
    Failed(UpstreamError),
}

/// A response head and the connection its body will come on.
struct Answer {
    stream: TcpStream,
    buffer: BytesMut,
    head: wire::Head,
}

impl Answer {
    fn into_response(self, host: Arc<HostPool>) -> Response<UpstreamBody> {
        let wire::Head {
            status,
            headers,
            framing,
            keep_alive,
        } = self.head;
        let body = UpstreamBody::new(self.stream, self.buffer, framing, keep_alive, host);
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

/// Writes the request and reads until a whole response head has arrived.
async fn exchange(
    mut stream: TcpStream,
    request: &[u8],
    no_body: bool,
) -> Result<Answer, Exchange> {
    if let Err(e) = stream.write_all(request).await {
        return Err(match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                Exchange::ClosedBeforeAnswer
            }
            _ => Exchange::Failed(e.into()),
        });
    }
    let written = Instant::now();
    let mut buffer = BytesMut::with_capacity(8 * 1024);
    let mut interim = 0;
    loop {
        if buffer.capacity() - buffer.len() < 1024 {
            buffer.reserve(8 * 1024);
        }
        // Nothing at all came back, at once: the engine closed the
        // connection without reading the request. An interim answer, or
        // a long silence first, says it read it.
        let silent = buffer.is_empty() && interim == 0;
        let result = stream.read_buf(&mut buffer).await;
        let silent = silent && written.elapsed() < IDLE_CLOSE_RACE;
        match result {
            Ok(0) if silent => return Err(Exchange::ClosedBeforeAnswer),
            Ok(0) => return Err(Exchange::Failed(UpstreamError::Closed)),
            Ok(_) => {}
            Err(e) if silent && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Exchange::ClosedBeforeAnswer);
            }
            Err(e) => return Err(Exchange::Failed(e.into())),
        }
        match wire::take_head(&mut buffer, no_body, &mut interim) {
            Ok(Some(head)) => {
                return Ok(Answer {
                    stream,
                    buffer,
                    head,
                });
            }
            Ok(None) if buffer.len() > MAX_HEAD_BYTES => {
                return Err(Exchange::Failed(UpstreamError::Protocol(format!(
                    "response head longer than {MAX_HEAD_BYTES} bytes"
                ))));
            }
            Ok(None) => {}
            Err(e) => return Err(Exchange::Failed(e)),
        }
    }
}
