//! `llmgw certs`: a development CA and the certificates llmgw processes
//! present to each other.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};

use crate::certs::{self, IssueRequest};
use crate::{Identity, TlsError};

/// Create a development CA and certificates for peers and nodes.
#[derive(Debug, Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    pub command: CertsCommand,
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create a CA (ca.pem, ca.key) in DIR.
    Init {
        /// Directory for the CA; created if missing.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue a certificate signed by the CA in DIR, or by your own CA
    /// (--ca-cert and --ca-key).
    #[command(group(clap::ArgGroup::new("who").required(true).args(["peer", "node"])))]
    #[command(group(clap::ArgGroup::new("ca").required(true).args(["dir", "ca_cert"])))]
    Issue {
        /// Directory holding the CA (from `llmgw certs init`).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Your own CA's certificate (PEM), instead of --dir.
        #[arg(long, requires_all = ["ca_key", "out"])]
        ca_cert: Option<PathBuf>,
        /// Your own CA's private key (PEM: ECDSA, Ed25519 or RSA).
        #[arg(long, requires = "ca_cert")]
        ca_key: Option<PathBuf>,
        /// A control-plane peer's certificate, for the peer with this Raft id.
        #[arg(long)]
        peer: Option<u64>,
        /// An agent's certificate, for the node with this node id.
        #[arg(long)]
        node: Option<String>,
        /// DNS name or IP address the holder is dialled at; repeat for
        /// several. Peers need every name others use in `peers[].grpc`.
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Where to write the certificate and key; default the CA directory
        /// (required with --ca-cert).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u64,
    },
    /// Revoke a certificate: add it to the CA's revocation list (crl.pem in
    /// DIR), which processes with `tls.crl` reload like their certificates.
    Revoke {
        /// Directory holding the CA (from `llmgw certs init`).
        #[arg(long)]
        dir: PathBuf,
        /// The certificate to revoke (PEM).
        #[arg(long)]
        cert: PathBuf,
    },
}

/// Runs the subcommand; returns what to print.
pub fn run_certs(args: CertsArgs) -> Result<String, TlsError> {
    match args.command {
        CertsCommand::Init { dir } => {
            let ca = certs::init_ca(&dir)?;
            Ok(format!(
                "CA written: {} (key {}; keep it private)\n\
                 next: llmgw certs issue --dir {} --peer 1 --host <peer-1 address>\n",
                ca.display(),
                dir.join(certs::CA_KEY).display(),
                dir.display()
            ))
        }
        CertsCommand::Issue {
            dir,
            ca_cert,
            ca_key,
            peer,
            node,
            hosts,
            out,
            days,
        } => {
            let identity = match (peer, node) {
                (Some(0), _) => {
                    return Err(TlsError::Identity("peer ids start at 1".to_owned()));
                }
                (Some(id), None) => Identity::Peer(id),
                (None, Some(id)) => Identity::Node(id),
                _ => {
                    return Err(TlsError::Identity(
                        "give one of --peer ID or --node ID".to_owned(),
                    ));
                }
            };
            if matches!(identity, Identity::Peer(_)) && hosts.is_empty() {
                return Err(TlsError::Identity(
                    "a peer certificate needs --host for each name or address other peers and \
                     agents dial it at"
                        .to_owned(),
                ));
            }
            let mut request = IssueRequest::new(identity.clone(), hosts);
            request.not_after = SystemTime::now() + Duration::from_secs(days.max(1) * 24 * 3600);
            let (ca_cert, ca_key) = match (dir, ca_cert, ca_key) {
                (_, Some(cert), Some(key)) => (cert, key),
                (Some(dir), _, _) => certs::ca_files(&dir),
                _ => {
                    return Err(TlsError::Identity(
                        "give --dir DIR, or --ca-cert FILE --ca-key FILE --out DIR".to_owned(),
                    ));
                }
            };
            let out = out
                .or_else(|| ca_cert.parent().map(Path::to_path_buf))
                .unwrap_or_default();
            let files = certs::issue_with(&ca_cert, &ca_key, &out, &request)?;
            let section = if matches!(identity, Identity::Peer(_)) {
                "server.yaml"
            } else {
                "agent.yaml"
            };
            Ok(format!(
                "certificate for {identity} ({}) written: {}\n\
                 in {section}:\n\
                 tls:\n  ca: {}\n  cert: {}\n  key: {}\n",
                identity.uri(),
                files.cert.display(),
                files.ca.display(),
                files.cert.display(),
                files.key.display()
            ))
        }
        CertsCommand::Revoke { dir, cert } => {
            let (crl, count) = certs::revoke(&dir, &cert)?;
            Ok(format!(
                "{} revoked; {} now lists {count} certificate(s)\n\
                 every peer and agent with `tls.crl: {}` refuses it within a reload \
                 (about {} s); new connections only\n",
                cert.display(),
                crl.display(),
                crl.display(),
                crate::RELOAD_INTERVAL.as_secs()
            ))
        }
    }
}
