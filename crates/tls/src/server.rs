//! The accepting side: a TCP listener turned into a stream of connections
//! for tonic's `serve_with_incoming`, each carrying who is on the other end.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::{Identity, Tls};

/// A client that does not finish its handshake in this time is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a handler knows about the connection a request came on; a request
/// extension on every request served through [`incoming`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// The identity in the client's verified certificate; `None` on a
    /// plaintext listener (`insecure: true`) and on the admin API.
    pub identity: Option<Identity>,
}

impl ConnInfo {
    /// Whether the client presented a verified certificate (mTLS).
    pub fn is_tls(&self) -> bool {
        self.identity.is_some()
    }
}

/// One accepted connection, plaintext or mTLS.
pub struct Conn {
    io: Io,
    info: ConnInfo,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    pub fn info(&self) -> &ConnInfo {
        &self.info
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Accepts connections on `listener`: with `tls`, each completes an mTLS
/// handshake (a client certificate signed by the CA and naming an llmgw
/// identity) before tonic sees it; a refused client is logged with the
/// reason. Without `tls` connections are plaintext. The accept loop stops
/// when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Tls>,
) -> ReceiverStream<Result<Conn, io::Error>> {
    accept_loop(listener, tls, Mode::MutualTls)
}

/// Accepts connections for the admin API: with `tls`, HTTPS with this
/// process's certificate and no client certificate asked for (callers
/// present bearer tokens); without, plaintext. A client that speaks plain
/// HTTP to the HTTPS port gets a 400 saying to use https://.
pub fn incoming_https(
    listener: TcpListener,
    tls: Option<Tls>,
) -> ReceiverStream<Result<Conn, io::Error>> {
    accept_loop(listener, tls, Mode::Https)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// gRPC: both sides present certificates.
    MutualTls,
    /// The admin API: only the server does.
    Https,
}

fn accept_loop(
    listener: TcpListener,
    tls: Option<Tls>,
    mode: Mode,
) -> ReceiverStream<Result<Conn, io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!(%error, ?mode, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Some(tls) = &tls else {
                let conn = Conn {
                    io: Io::Plain(stream),
                    info: ConnInfo {
                        remote: Some(remote),
                        identity: None,
                    },
                };
                if tx.send(Ok(conn)).await.is_err() {
                    return;
                }
                continue;
            };
            let tx = tx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let result = match mode {
                    Mode::MutualTls => {
                        handshake(TlsAcceptor::from(tls.server_config()), stream, remote).await
                    }
                    Mode::Https => https_handshake(&tls, stream, remote).await,
                };
                match result {
                    Ok(conn) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Err(why) if mode == Mode::MutualTls => tracing::warn!(
                        %remote,
                        reason = %why,
                        "refused a gRPC connection: mTLS handshake failed"
                    ),
                    Err(why) => tracing::info!(
                        %remote,
                        reason = %why,
                        "refused an admin API connection: HTTPS handshake failed"
                    ),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The first byte of every TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a plain HTTP client gets from the HTTPS port.
const PLAIN_HTTP_REFUSAL: &str = "This is llmgw's admin API over HTTPS (server.yaml has `tls`): \
use https:// and trust the cluster's CA bundle (llmgw ctl --ca, LLMGW_CA).\n";

/// Reads the request head (so closing does not reset the connection
/// before the client reads the answer), answers 400 and closes.
async fn refuse_plain_http(mut stream: TcpStream) -> io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{PLAIN_HTTP_REFUSAL}",
        PLAIN_HTTP_REFUSAL.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

async fn https_handshake(tls: &Tls, stream: TcpStream, remote: SocketAddr) -> Result<Conn, String> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Err(_) => return Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")),
        Ok(Err(error)) => return Err(error.to_string()),
        Ok(Ok(0)) => return Err("closed before the handshake".to_owned()),
        Ok(Ok(_)) => {}
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        // Most likely plain HTTP: say what to do instead of dropping the
        // connection on a client that cannot tell why.
        let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, refuse_plain_http(stream)).await;
        return Err("the client spoke plain HTTP to the HTTPS port".to_owned());
    }
    let acceptor = TlsAcceptor::from(tls.https_server_config());
    let stream = tls_accept(acceptor, stream).await?;
    Ok(Conn {
        io: Io::Tls(Box::new(stream)),
        info: ConnInfo {
            remote: Some(remote),
            identity: None,
        },
    })
}

async fn tls_accept(
    acceptor: TlsAcceptor,
    stream: TcpStream,
) -> Result<TlsStream<TcpStream>, String> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Err(_) => Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")),
        Ok(Err(error)) => Err(crate::error_chain(&error)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

async fn handshake(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    remote: SocketAddr,
) -> Result<Conn, String> {
    let stream = tls_accept(acceptor, stream).await?;
    let identity = {
        let (_, session) = stream.get_ref();
        let cert = session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .ok_or_else(|| "the client sent no certificate".to_owned())?;
        Identity::from_certificate(cert).map_err(|e| {
            format!(
                "the client certificate ({}) is signed by the CA but {e}",
                crate::material::describe(cert)
            )
        })?
    };
    tracing::debug!(%remote, %identity, "mTLS connection accepted");
    Ok(Conn {
        io: Io::Tls(Box::new(stream)),
        info: ConnInfo {
            remote: Some(remote),
            identity: Some(identity),
        },
    })
}
