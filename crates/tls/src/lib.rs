//! mTLS for llmgw's gRPC links (agent to peer, peer to peer), and HTTPS for
//! the admin API.
//!
//! * [`Tls`]: this process's CA bundle, certificate and key as rustls server
//!   and client configs (ring, TLS 1.2 and 1.3), client certificates
//!   required and verified against the CA, reloaded when the files change.
//! * [`Identity`]: who a certificate speaks for, from its SAN URI
//!   (`llmgw://peer/<ID>`, `llmgw://node/<NODE_ID>`).
//! * [`incoming_https`]: the admin API's listener, HTTPS with the same
//!   certificate (no client certificate), or plaintext without TLS.
//! * [`https_client_config`]: what admin API clients trust (the CA bundle).
//! * [`incoming`]: a listener for tonic's `serve_with_incoming`; every
//!   request carries a [`ConnInfo`] extension with the caller's identity.
//! * [`require_peer`] (Raft RPCs) and [`check_node_identity`] (`Register`).
//! * [`connect_lazy`] / [`connect`]: channels that dial with this process's
//!   certificate and accept only peer certificates from the server.
//! * [`certs`]: a development CA and certificates (`llmgw certs`).

pub mod certs;
mod check;
mod cli;
mod client;
mod der;
mod identity;
mod material;
mod server;

use std::path::PathBuf;

pub use check::{check_node_identity, remote_addr, require_peer};
pub use cli::{CertsArgs, CertsCommand, run_certs};
pub use client::{TlsConnectorService, connect, connect_lazy, endpoint, probe};
pub use identity::{Identity, check_node_id};
pub use material::{RELOAD_INTERVAL, Tls, TlsFiles, https_client_config, read_certificates};
pub use server::{Conn, ConnInfo, incoming, incoming_https};

/// Why TLS material could not be loaded or made. Never carries key bytes.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {why}", path.display())]
    Pem { path: PathBuf, why: String },
    #[error("{0}")]
    Identity(String),
    #[error("{}: the certificate is {found}'s, but this process is {expected}", path.display())]
    WrongIdentity {
        path: PathBuf,
        found: Identity,
        expected: Identity,
    },
    #[error("{what}: {source}")]
    Rustls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot make the certificate: {0}")]
    Generate(String),
    #[error("{} exists; remove it first if you really mean to replace it", .0.display())]
    Exists(PathBuf),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An error and its causes on one line (rustls's reasons hide in the causes
/// of the errors that carry them).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
