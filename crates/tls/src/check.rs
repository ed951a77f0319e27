//! Who may call what: Raft RPCs only from peers, `Register` only from the
//! node the agent's certificate names.

use tonic::{Extensions, Request, Status};

use crate::{ConnInfo, Identity};

/// What a connection is, as far as authorization goes.
fn conn_info(extensions: &Extensions) -> Result<&ConnInfo, Status> {
    // Fail closed: a server that did not go through `incoming` cannot tell
    // who is calling.
    extensions.get::<ConnInfo>().ok_or_else(|| {
        tracing::error!("a gRPC request arrived without connection info; refused");
        Status::internal("the server cannot tell who is calling; refused")
    })
}

/// The caller's address, on a server fed by [`crate::incoming`] (tonic's
/// own `remote_addr` does not know llmgw's connections).
pub fn remote_addr(extensions: &Extensions) -> Option<std::net::SocketAddr> {
    extensions.get::<ConnInfo>().and_then(|info| info.remote)
}

/// A tonic interceptor for the Raft service: the caller's certificate must
/// be a peer's. Plaintext connections (`insecure: true`) carry no identity
/// and pass.
pub fn require_peer(request: Request<()>) -> Result<Request<()>, Status> {
    let info = conn_info(request.extensions())?;
    match &info.identity {
        None | Some(Identity::Peer(_)) => Ok(request),
        Some(other) => {
            let remote = info
                .remote
                .map_or_else(|| "unknown".to_owned(), |r| r.to_string());
            tracing::warn!(
                %remote,
                identity = %other,
                "refused a Raft RPC: only control-plane peers may call the Raft service"
            );
            Err(Status::permission_denied(format!(
                "the Raft service accepts only peer certificates (llmgw://peer/<ID>); this \
                 connection's certificate is {other}'s"
            )))
        }
    }
}

/// Checks that a request claiming to come from `node_id` arrived on a
/// connection whose certificate names that node. Plaintext connections
/// (`insecure: true`) pass.
pub fn check_node_identity(extensions: &Extensions, node_id: &str) -> Result<(), Status> {
    let info = conn_info(extensions)?;
    let remote = info
        .remote
        .map_or_else(|| "unknown".to_owned(), |r| r.to_string());
    match &info.identity {
        None => Ok(()),
        Some(Identity::Node(id)) if id == node_id => Ok(()),
        Some(other) => {
            tracing::warn!(
                %remote,
                identity = %other,
                claimed = %node_id,
                "refused a node registration: the certificate names another identity"
            );
            Err(Status::permission_denied(format!(
                "this connection's certificate is {other}'s; it cannot register as node \
                 {node_id:?}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(identity: Option<Identity>) -> Request<()> {
        let mut request = Request::new(());
        request.extensions_mut().insert(ConnInfo {
            remote: None,
            identity,
        });
        request
    }

    #[test]
    fn raft_only_from_peers() {
        assert!(require_peer(request(Some(Identity::Peer(2)))).is_ok());
        assert!(require_peer(request(None)).is_ok());
        let refused = require_peer(request(Some(Identity::Node("gpu-1".into())))).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(refused.message().contains("node gpu-1"));
        let missing = require_peer(Request::new(())).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Internal);
    }

    #[test]
    fn node_registers_as_itself_only() {
        let a = request(Some(Identity::Node("a".into())));
        assert!(check_node_identity(a.extensions(), "a").is_ok());
        let refused = check_node_identity(a.extensions(), "b").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        let peer = request(Some(Identity::Peer(1)));
        assert!(check_node_identity(peer.extensions(), "a").is_err());
        let plain = request(None);
        assert!(check_node_identity(plain.extensions(), "a").is_ok());
        assert!(check_node_identity(Request::new(()).extensions(), "a").is_err());
    }
}
