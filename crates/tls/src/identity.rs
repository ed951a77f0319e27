//! Who a certificate speaks for: a control-plane peer or the agent of one
//! node, written as a SAN URI (`llmgw://peer/<ID>`, `llmgw://node/<NODE_ID>`).

use std::fmt;

use rustls_pki_types::CertificateDer;

use crate::TlsError;

/// The scheme and authority every llmgw identity URI starts with.
const SCHEME: &str = "llmgw://";

/// The role and name a certificate carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A control-plane peer, by its Raft id.
    Peer(u64),
    /// The agent of one GPU node, by its node id.
    Node(String),
}

impl Identity {
    /// The SAN URI that names this identity.
    pub fn uri(&self) -> String {
        match self {
            Identity::Peer(id) => format!("{SCHEME}peer/{id}"),
            Identity::Node(id) => format!("{SCHEME}node/{id}"),
        }
    }

    /// Parses an identity URI; `None` for URIs that are not llmgw's.
    pub fn from_uri(uri: &str) -> Option<Result<Identity, String>> {
        let rest = uri.strip_prefix(SCHEME)?;
        Some(match rest.split_once('/') {
            Some(("peer", id)) => match id.parse::<u64>() {
                Ok(id) if id > 0 => Ok(Identity::Peer(id)),
                _ => Err(format!("{uri:?}: a peer id is a number from 1")),
            },
            Some(("node", id)) => check_node_id(id)
                .map(|()| Identity::Node(id.to_owned()))
                .map_err(|why| format!("{uri:?}: {why}")),
            _ => Err(format!(
                "{uri:?} is neither {SCHEME}peer/<ID> nor {SCHEME}node/<NODE_ID>"
            )),
        })
    }

    /// Reads the identity from a DER certificate. A certificate must carry
    /// exactly one llmgw URI.
    pub fn from_certificate(cert: &CertificateDer<'_>) -> Result<Identity, TlsError> {
        let parsed = webpki::EndEntityCert::try_from(cert)
            .map_err(|e| TlsError::Identity(format!("the certificate does not parse: {e}")))?;
        let mut found = Vec::new();
        for uri in parsed.valid_uri_names() {
            if let Some(identity) = Identity::from_uri(uri) {
                found.push(identity.map_err(TlsError::Identity)?);
            }
        }
        match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(TlsError::Identity(format!(
                "the certificate names no llmgw identity; it needs a subjectAltName URI \
                 {SCHEME}peer/<ID> or {SCHEME}node/<NODE_ID>"
            ))),
            _ => Err(TlsError::Identity(format!(
                "the certificate names {} llmgw identities ({}); it must name one",
                found.len(),
                found
                    .iter()
                    .map(Identity::uri)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Peer(id) => write!(f, "peer {id}"),
            Identity::Node(id) => write!(f, "node {id}"),
        }
    }
}

pub use llmgw_node_id::check_node_id;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip() {
        for identity in [Identity::Peer(3), Identity::Node("gpu-07.rack2".into())] {
            assert_eq!(
                Identity::from_uri(&identity.uri()).unwrap().unwrap(),
                identity
            );
        }
        assert!(Identity::from_uri("https://example.com").is_none());
        assert!(Identity::from_uri("llmgw://peer/0").unwrap().is_err());
        assert!(Identity::from_uri("llmgw://peer/x").unwrap().is_err());
        assert!(Identity::from_uri("llmgw://node/a/b").unwrap().is_err());
        assert!(Identity::from_uri("llmgw://router/1").unwrap().is_err());
    }
}
