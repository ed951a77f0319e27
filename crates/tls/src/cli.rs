//! `llmgw certs`: a development CA and the certificates llmgw processes
//! present to each other.

use std::path::PathBuf;
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
    /// Issue a certificate signed by the CA in DIR.
    #[command(group(clap::ArgGroup::new("who").required(true).args(["peer", "node"])))]
    Issue {
        /// Directory holding the CA (from `llmgw certs init`).
        #[arg(long)]
        dir: PathBuf,
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
        /// Where to write the certificate and key; default the CA directory.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u64,
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
            let out = out.unwrap_or_else(|| dir.clone());
            let files = certs::issue(&dir, &out, &request)?;
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
    }
}
