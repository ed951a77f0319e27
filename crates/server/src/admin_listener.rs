//! The admin API's listener for axum: connections accepted by
//! [`llmgw_tls::incoming_https`], HTTPS when the peer has TLS material and
//! plaintext with `insecure: true`.

use std::io;
use std::net::SocketAddr;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use llmgw_tls::{Conn, Tls};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

pub(crate) struct AdminListener {
    conns: mpsc::Receiver<Result<Conn, io::Error>>,
    local: SocketAddr,
}

impl AdminListener {
    pub(crate) fn new(listener: TcpListener, tls: Option<Tls>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let conns = llmgw_tls::incoming_https(listener, tls).into_inner();
        Ok(AdminListener { conns, local })
    }
}

impl axum::serve::Listener for AdminListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        loop {
            match self.conns.recv().await {
                Some(Ok(conn)) => {
                    let remote = conn.info().remote.unwrap_or(self.local);
                    return (conn, remote);
                }
                // The accept loop logs and retries its own errors.
                Some(Err(_)) => continue,
                // The accept loop ended: nothing more comes; the server
                // stops through its graceful shutdown.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Who called the admin API, for logs of refused requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller(pub SocketAddr);

impl Connected<IncomingStream<'_, AdminListener>> for Caller {
    fn connect_info(stream: IncomingStream<'_, AdminListener>) -> Self {
        Caller(*stream.remote_addr())
    }
}
