//! What protects a peer: mTLS on its gRPC listener and when it dials other
//! peers, and tokens on its admin API.

use std::net::SocketAddr;

use llmgw_tls::{Identity, Tls, TlsFiles};

use crate::auth::AdminAuth;
use crate::serve::ServerError;

/// A peer's security settings, resolved from server.yaml.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// mTLS material; `None` only with `insecure: true`.
    pub tls: Option<TlsFiles>,
    pub admin: AdminAuth,
}

impl Security {
    /// Whether gRPC links are plaintext.
    pub fn insecure(&self) -> bool {
        self.tls.is_none()
    }

    /// Loads the TLS material (this peer's certificate must name `peer
    /// <id>`), starts watching it for rotation, and says out loud what is
    /// not protected.
    pub(crate) fn start(
        &self,
        id: u64,
        grpc: SocketAddr,
        admin: SocketAddr,
    ) -> Result<Option<Tls>, ServerError> {
        if self.admin.is_open() {
            tracing::warn!(
                "no admin tokens configured: the admin API on {admin} is open to anyone who can \
                 reach it; add `admin.tokens` to server.yaml"
            );
        }
        let Some(files) = &self.tls else {
            tracing::warn!(
                "insecure: true — gRPC on {grpc} (peers and agents) is plaintext and \
                 unauthenticated: anyone who reaches it can disturb the cluster; use only on a \
                 trusted network"
            );
            return Ok(None);
        };
        let tls = Tls::load(files.clone(), Identity::Peer(id))
            .map_err(|e| ServerError::Config(format!("tls: {e}")))?;
        tls.watch(llmgw_tls::RELOAD_INTERVAL);
        Ok(Some(tls))
    }
}
