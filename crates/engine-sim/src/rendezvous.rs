//! A real TCP rendezvous between the ranks of a multi-node replica, standing
//! in for torch.distributed's TCPStore and NCCL's bootstrap.
//!
//! Rank 0 listens on the rendezvous address; every other rank connects,
//! sends `JOIN <rank> <nnodes>`, and is released with `GO` once all ranks
//! have joined. The sockets stay open afterwards: when one closes, a peer
//! died, and the survivors fail the way NCCL's watchdog fails.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Why rendezvous could not complete.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("cannot listen on rendezvous port {port}: {source}")]
    Bind { port: u16, source: std::io::Error },
    #[error("rendezvous address '{0}' is not HOST:PORT")]
    BadAddress(String),
    #[error("the head refused rank {rank}: {reason}")]
    Refused { rank: u64, reason: String },
}

/// A joined group; `lost` turns to `Some(peer)` when a peer goes away.
pub struct Membership {
    pub lost: watch::Receiver<Option<String>>,
    _keep: watch::Sender<Option<String>>,
}

fn split(addr: &str) -> Result<(String, u16), RendezvousError> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| RendezvousError::BadAddress(addr.into()))?;
    let port = port
        .parse()
        .map_err(|_| RendezvousError::BadAddress(addr.into()))?;
    Ok((host.trim_matches(['[', ']']).to_string(), port))
}

/// Rank 0: binds now (a taken port fails at once, as TCPStore does).
pub async fn bind_head(addr: &str) -> Result<TcpListener, RendezvousError> {
    let (host, port) = split(addr)?;
    TcpListener::bind((host.as_str(), port))
        .await
        .map_err(|source| RendezvousError::Bind { port, source })
}

/// Rank 0: waits until ranks `1..nnodes` have joined, then releases them.
pub async fn run_head(listener: TcpListener, nnodes: u64) -> Membership {
    let mut joined: HashMap<u64, (BufReader<TcpStream>, String)> = HashMap::new();
    while (joined.len() as u64) < nnodes.saturating_sub(1) {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let verdict = match parts.as_slice() {
            ["JOIN", rank, n] => match (rank.parse::<u64>(), n.parse::<u64>()) {
                (Ok(rank), Ok(n)) if n != nnodes => Err((
                    rank,
                    format!("nnodes mismatch: head has {nnodes}, rank has {n}"),
                )),
                (Ok(rank), Ok(_)) if rank == 0 || rank >= nnodes => Err((
                    rank,
                    format!("node rank {rank} out of range for {nnodes} nodes"),
                )),
                (Ok(rank), Ok(_)) if joined.contains_key(&rank) => {
                    Err((rank, format!("node rank {rank} joined twice")))
                }
                (Ok(rank), Ok(_)) => Ok(rank),
                _ => continue,
            },
            _ => continue,
        };
        match verdict {
            Ok(rank) => {
                joined.insert(rank, (reader, peer.to_string()));
            }
            Err((_, reason)) => {
                let _ = reader
                    .get_mut()
                    .write_all(format!("ERR {reason}\n").as_bytes())
                    .await;
            }
        }
    }
    let (tx, rx) = watch::channel(None);
    for (_, (mut reader, peer)) in joined {
        let _ = reader.get_mut().write_all(b"GO\n").await;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut sink = String::new();
            // Any read result other than data means the peer is gone.
            while let Ok(n) = reader.read_line(&mut sink).await {
                if n == 0 {
                    break;
                }
                sink.clear();
            }
            let _ = tx.send(Some(peer));
        });
    }
    Membership {
        lost: rx,
        _keep: tx,
    }
}

/// Rank > 0: connects (retrying while the head is not up yet) and waits
/// for release.
pub async fn join(addr: &str, rank: u64, nnodes: u64) -> Result<Membership, RendezvousError> {
    let (host, port) = split(addr)?;
    let stream = loop {
        match TcpStream::connect((host.as_str(), port)).await {
            Ok(s) => break s,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let mut reader = BufReader::new(stream);
    let _ = reader
        .get_mut()
        .write_all(format!("JOIN {rank} {nnodes}\n").as_bytes())
        .await;
    let mut line = String::new();
    let n = reader.read_line(&mut line).await.unwrap_or(0);
    if n == 0 {
        return Err(RendezvousError::Refused {
            rank,
            reason: "the head closed the connection".into(),
        });
    }
    if let Some(reason) = line.trim().strip_prefix("ERR ") {
        return Err(RendezvousError::Refused {
            rank,
            reason: reason.into(),
        });
    }
    let (tx, rx) = watch::channel(None);
    let peer = addr.to_string();
    let keep = tx.clone();
    tokio::spawn(async move {
        let mut sink = String::new();
        while let Ok(n) = reader.read_line(&mut sink).await {
            if n == 0 {
                break;
            }
            sink.clear();
        }
        let _ = tx.send(Some(peer));
    });
    Ok(Membership {
        lost: rx,
        _keep: keep,
    })
}

impl Membership {
    /// A membership fed by another watcher (the Ray cluster poller).
    pub fn from_channel(
        lost: watch::Receiver<Option<String>>,
        keep: watch::Sender<Option<String>>,
    ) -> Self {
        Self { lost, _keep: keep }
    }

    /// Resolves with the lost peer's address.
    pub async fn lost_peer(&mut self) -> String {
        loop {
            if let Some(peer) = self.lost.borrow_and_update().clone() {
                return peer;
            }
            if self.lost.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
