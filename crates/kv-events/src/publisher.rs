//! The engine's side: a PUB socket that streams `(topic, seq, payload)`
//! and a ROUTER socket that replays buffered messages from a given seq,
//! ending with seq -1, as vLLM and SGLang do. The simulator publishes
//! through it.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio::sync::broadcast;

use crate::zmtp::{Connection, Incoming, SocketType};

/// The replay socket's end-of-replay seq: -1 as a signed 8-byte integer.
pub const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

#[derive(Debug, Clone)]
pub struct PublisherConfig {
    pub topic: String,
    /// How many recent messages the replay socket can send again.
    pub buffer_steps: usize,
    /// Messages queued for one slow subscriber before it misses some (and
    /// must replay), as ZeroMQ's high-water mark drops them.
    pub hwm: usize,
    /// Replayed messages carry the topic frame (vLLM 0.34, SGLang) or not
    /// (vLLM 0.11).
    pub replay_topic_frame: bool,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            topic: String::new(),
            buffer_steps: 10_000,
            hwm: 100_000,
            replay_topic_frame: true,
        }
    }
}

struct Message {
    seq: u64,
    payload: Vec<u8>,
}

struct Shared {
    topic: Vec<u8>,
    replay_topic_frame: bool,
    buffer_steps: usize,
    /// Recent messages, oldest first, and the next seq.
    buffer: Mutex<(VecDeque<Arc<Message>>, u64)>,
    live: broadcast::Sender<Arc<Message>>,
}

/// A running publisher; dropping it does not stop the sockets (they live
/// as long as the process, like an engine's).
#[derive(Clone)]
pub struct Publisher {
    shared: Arc<Shared>,
}

impl Publisher {
    /// Listens on `stream` (PUB) and, when given, `replay` (ROUTER).
    pub async fn bind(
        stream: SocketAddr,
        replay: Option<SocketAddr>,
        config: PublisherConfig,
    ) -> io::Result<Publisher> {
        let (live, _) = broadcast::channel(config.hwm.max(1));
        let shared = Arc::new(Shared {
            topic: config.topic.into_bytes(),
            replay_topic_frame: config.replay_topic_frame,
            buffer_steps: config.buffer_steps.max(1),
            buffer: Mutex::new((VecDeque::new(), 0)),
            live,
        });
        let listener = TcpListener::bind(stream).await?;
        tokio::spawn(accept_subscribers(listener, Arc::clone(&shared)));
        if let Some(replay) = replay {
            let listener = TcpListener::bind(replay).await?;
            tokio::spawn(accept_replays(listener, Arc::clone(&shared)));
        }
        Ok(Publisher { shared })
    }

    /// Publishes one payload under the next seq, which it returns.
    pub fn publish(&self, payload: Vec<u8>) -> u64 {
        let mut guard = self
            .shared
            .buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (buffer, next) = &mut *guard;
        let message = Arc::new(Message {
            seq: *next,
            payload,
        });
        *next += 1;
        buffer.push_back(Arc::clone(&message));
        while buffer.len() > self.shared.buffer_steps {
            buffer.pop_front();
        }
        // Sent under the lock, so subscribers see seqs in order.
        let _ = self.shared.live.send(Arc::clone(&message));
        message.seq
    }
}

async fn accept_subscribers(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            if let Ok(conn) = Connection::handshake(stream, SocketType::Pub).await {
                let _ = serve_subscriber(conn, shared).await;
            }
        });
    }
}

/// Forwards live messages whose topic matches one of the peer's
/// subscriptions; a peer that falls `hwm` behind misses messages.
async fn serve_subscriber(mut conn: Connection, shared: Arc<Shared>) -> io::Result<()> {
    let mut live = shared.live.subscribe();
    let mut subscriptions: Vec<Vec<u8>> = Vec::new();
    loop {
        tokio::select! {
            incoming = conn.recv() => match incoming? {
                Incoming::Message(frames) => {
                    if let Some(first) = frames.first() {
                        subscription_change(&mut subscriptions, first.first().copied(), &first[1.min(first.len())..]);
                    }
                }
                Incoming::Command { name, body } => match name.as_str() {
                    "SUBSCRIBE" => subscription_change(&mut subscriptions, Some(1), &body),
                    "CANCEL" => subscription_change(&mut subscriptions, Some(0), &body),
                    _ => {}
                },
            },
            message = live.recv() => match message {
                Ok(message) => {
                    if subscriptions.iter().any(|s| shared.topic.starts_with(s)) {
                        conn.send(&[&shared.topic, &message.seq.to_be_bytes(), &message.payload]).await?;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
        }
    }
}

fn subscription_change(subscriptions: &mut Vec<Vec<u8>>, kind: Option<u8>, topic: &[u8]) {
    match kind {
        Some(1) => subscriptions.push(topic.to_vec()),
        Some(0) => {
            if let Some(i) = subscriptions.iter().position(|s| s == topic) {
                subscriptions.remove(i);
            }
        }
        _ => {}
    }
}

async fn accept_replays(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            if let Ok(conn) = Connection::handshake(stream, SocketType::Router).await {
                let _ = serve_replays(conn, shared).await;
            }
        });
    }
}

/// Each request's last frame is the first seq wanted (8 bytes, big-endian);
/// the answer is every buffered message from there, then the end marker.
async fn serve_replays(mut conn: Connection, shared: Arc<Shared>) -> io::Result<()> {
    loop {
        let Incoming::Message(frames) = conn.recv().await? else {
            continue;
        };
        let Some(start) = frames
            .last()
            .and_then(|f| <[u8; 8]>::try_from(f.as_slice()).ok())
            .map(u64::from_be_bytes)
        else {
            continue;
        };
        let wanted: Vec<Arc<Message>> = {
            let guard = shared
                .buffer
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            guard.0.iter().filter(|m| m.seq >= start).cloned().collect()
        };
        let topic: &[&[u8]] = if shared.replay_topic_frame {
            &[&shared.topic]
        } else {
            &[]
        };
        for message in wanted {
            let seq = message.seq.to_be_bytes();
            let frames: Vec<&[u8]> = [&b""[..]]
                .into_iter()
                .chain(topic.iter().copied())
                .chain([&seq[..], &message.payload[..]])
                .collect();
            conn.send(&frames).await?;
        }
        let end: Vec<&[u8]> = [&b""[..]]
            .into_iter()
            .chain(topic.iter().map(|_| &b""[..]))
            .chain([&END_OF_REPLAY[..], &b""[..]])
            .collect();
        conn.send(&end).await?;
    }
}
