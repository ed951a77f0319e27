//! The development CA of a `llmgw dev` work directory and the certificates
//! its processes use: peers get `llmgw://peer/<ID>` for 127.0.0.1 and
//! localhost; agents get `llmgw://node/<NODE_ID>` through [`node_tls`].

use std::path::{Path, PathBuf};

use llmgw_tls::certs::{self, IssueRequest};
use llmgw_tls::{Identity, TlsError, TlsFiles};

/// Where the dev CA and every certificate live: `<work_dir>/tls`.
pub fn tls_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("tls")
}

/// Creates the dev CA unless the work directory already has one (a second
/// `llmgw dev` in the same directory keeps it, so earlier certificates stay
/// valid).
pub fn ensure_ca(work_dir: &Path) -> Result<PathBuf, TlsError> {
    let dir = tls_dir(work_dir);
    let (cert, key) = certs::ca_files(&dir);
    if cert.exists() && key.exists() {
        return Ok(cert);
    }
    certs::init_ca(&dir)
}

/// A fresh certificate for peer `id`, served on 127.0.0.1 and localhost.
pub fn peer_tls(work_dir: &Path, id: u64) -> Result<TlsFiles, TlsError> {
    ensure_ca(work_dir)?;
    let dir = tls_dir(work_dir);
    let request = IssueRequest::new(
        Identity::Peer(id),
        vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
    );
    certs::issue(&dir, &dir, &request)
}

/// A fresh certificate for the agent of node `node_id`, for agent.yaml's
/// `tls` section.
pub fn node_tls(work_dir: &Path, node_id: &str) -> Result<TlsFiles, TlsError> {
    ensure_ca(work_dir)?;
    let dir = tls_dir(work_dir);
    let request = IssueRequest::new(Identity::Node(node_id.to_owned()), Vec::new());
    certs::issue(&dir, &dir, &request)
}

/// The `tls` section of a config file for `files`.
pub fn tls_yaml(files: &TlsFiles) -> String {
    let crl = files
        .crl
        .as_ref()
        .map(|crl| format!("  crl: \"{}\"\n", crl.display()))
        .unwrap_or_default();
    format!(
        "tls:\n  ca: \"{}\"\n  cert: \"{}\"\n  key: \"{}\"\n{crl}",
        files.ca.display(),
        files.cert.display(),
        files.key.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_and_node_certificates_name_their_holder() {
        let dir = tempfile::tempdir().unwrap();
        let peer = peer_tls(dir.path(), 2).unwrap();
        let node = node_tls(dir.path(), "gpu-1").unwrap();
        let read = |path: &Path| llmgw_tls::read_certificates("certificate", path).unwrap();
        assert_eq!(
            Identity::from_certificate(&read(&peer.cert)[0]).unwrap(),
            Identity::Peer(2)
        );
        assert_eq!(
            Identity::from_certificate(&read(&node.cert)[0]).unwrap(),
            Identity::Node("gpu-1".into())
        );
        // The CA is made once and kept.
        let ca = std::fs::read(&peer.ca).unwrap();
        ensure_ca(dir.path()).unwrap();
        assert_eq!(std::fs::read(&node.ca).unwrap(), ca);
        // Both load as this process's material.
        llmgw_tls::Tls::load(peer, Identity::Peer(2)).unwrap();
        llmgw_tls::Tls::load(node, Identity::Node("gpu-1".into())).unwrap();
    }
}
