//! The dialing side: tonic channels whose connections are mTLS with this
//! process's certificate, to servers that must present a peer certificate.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{Identity, Tls};

/// A tonic connector: TCP, then an mTLS handshake with the material current
/// at dial time (so rotation reaches every new connection), then a check
/// that the server is a control-plane peer.
#[derive(Clone)]
pub struct TlsConnectorService {
    tls: Tls,
}

impl TlsConnectorService {
    pub fn new(tls: Tls) -> Self {
        Self { tls }
    }
}

impl tower::Service<Uri> for TlsConnectorService {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.tls.client_config();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| invalid(format!("{uri} has no host")))?
                .trim_matches(['[', ']'])
                .to_owned();
            let port = uri
                .port_u16()
                .ok_or_else(|| invalid(format!("{uri} has no port")))?;
            let name = ServerName::try_from(host.clone())
                .map_err(|e| invalid(format!("{host:?} is not a host name or address: {e}")))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let stream = TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "mTLS handshake with {host}:{port} failed: {}",
                            crate::error_chain(&e)
                        ),
                    )
                })?;
            let (_, session) = stream.get_ref();
            let identity = session
                .peer_certificates()
                .and_then(|certs| certs.first())
                .map(Identity::from_certificate);
            match identity {
                Some(Ok(Identity::Peer(_))) => Ok(TokioIo::new(stream)),
                Some(Ok(other)) => Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{host}:{port} presented the certificate of {other}; only control-plane \
                         peers serve llmgw's gRPC"
                    ),
                )),
                Some(Err(e)) => Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{host}:{port}: {e}"),
                )),
                None => Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{host}:{port} presented no certificate"),
                )),
            }
        })
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// The endpoint for `addr` (`host:port`). Its scheme is always `http`: with
/// mTLS, the connector below does TLS, not tonic.
pub fn endpoint(addr: &str) -> Result<Endpoint, String> {
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad gRPC address {addr:?}: {e}"))
}

/// A channel that connects on first use: mTLS with `tls`, plaintext without.
pub fn connect_lazy(endpoint: &Endpoint, tls: Option<&Tls>) -> Channel {
    match tls {
        Some(tls) => endpoint.connect_with_connector_lazy(TlsConnectorService::new(tls.clone())),
        None => endpoint.connect_lazy(),
    }
}

/// Connects now: mTLS with `tls`, plaintext without.
pub async fn connect(
    endpoint: &Endpoint,
    tls: Option<&Tls>,
) -> Result<Channel, tonic::transport::Error> {
    match tls {
        Some(tls) => {
            endpoint
                .connect_with_connector(TlsConnectorService::new(tls.clone()))
                .await
        }
        None => endpoint.connect().await,
    }
}

/// Opens one mTLS connection to `addr` (`host:port`) with `tls` and returns
/// the certificate chain the server presented, for diagnosis and tests (is
/// a rotated certificate served yet?).
pub async fn probe(
    addr: &str,
    tls: &Tls,
) -> io::Result<Vec<rustls_pki_types::CertificateDer<'static>>> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| invalid(format!("{addr:?} is not host:port")))?;
    let host = host.trim_matches(['[', ']']).to_owned();
    let port: u16 = port
        .parse()
        .map_err(|_| invalid(format!("{addr:?} has no valid port")))?;
    let name = ServerName::try_from(host.clone())
        .map_err(|e| invalid(format!("{host:?} is not a host name or address: {e}")))?;
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    let stream = TlsConnector::from(tls.client_config())
        .connect(name, tcp)
        .await?;
    let (_, session) = stream.get_ref();
    Ok(session
        .peer_certificates()
        .map(|certs| certs.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default())
}
