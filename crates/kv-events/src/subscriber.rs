//! The router's side: a SUB connection to one engine rank's stream, with
//! gaps filled from its replay socket, and engine restarts told apart from
//! duplicates.

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use crate::publisher::END_OF_REPLAY;
use crate::zmtp::{Connection, Incoming, SocketType};

/// How long a replay may take before the subscriber gives up on it and
/// reports the gap as missed.
const REPLAY_DEADLINE: Duration = Duration::from_secs(5);

/// Where one engine rank publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// `host:port` of the PUB socket.
    pub stream: String,
    /// `host:port` of the ROUTER socket that replays.
    pub replay: Option<String>,
    pub topic: String,
}

impl Endpoints {
    /// Every rank's endpoints of an engine whose `ranks` data-parallel
    /// ranks publish on these ports moved up by the rank, as vLLM and
    /// SGLang offset a configured endpoint; rank `r` at index `r`. Ranks
    /// whose port would pass 65535 are left out.
    pub fn ranks(&self, ranks: u16) -> Vec<Endpoints> {
        (0..ranks)
            .map_while(|rank| {
                Some(Endpoints {
                    stream: offset_port(&self.stream, rank)?,
                    replay: match &self.replay {
                        Some(replay) => Some(offset_port(replay, rank)?),
                        None => None,
                    },
                    topic: self.topic.clone(),
                })
            })
            .collect()
    }
}

/// `host:port` with the port moved up by `by`.
fn offset_port(address: &str, by: u16) -> Option<String> {
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some(format!("{host}:{}", port.checked_add(by)?))
}

#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// A payload, in seq order, each seq once.
    Batch { seq: u64, payload: Vec<u8> },
    /// Seqs that could not be replayed (no replay socket, or older than its
    /// buffer): what the engine said then is unknown.
    Missed { from: u64, to: u64 },
    /// The engine's seq went back: a new engine process, whose cache
    /// starts empty.
    Restarted,
}

pub struct Subscriber {
    endpoints: Endpoints,
    stream: Connection,
    /// The last seq delivered.
    last: Option<u64>,
    /// Seqs up to this one were replayed; live copies of them are skipped.
    replayed_through: Option<u64>,
    /// Batches delivered from the replay socket rather than the stream.
    replayed: u64,
    pending: VecDeque<Delivery>,
}

impl Subscriber {
    /// Subscribes, then replays everything the engine still buffers. A
    /// connection always starts from the beginning: after a broken stream
    /// the caller cannot tell a network blip from a new engine process, so
    /// it forgets the engine and rebuilds from the replay.
    pub async fn connect(endpoints: Endpoints) -> io::Result<Self> {
        let mut stream = Connection::connect(&endpoints.stream, SocketType::Sub).await?;
        let mut subscribe = vec![1u8];
        subscribe.extend_from_slice(endpoints.topic.as_bytes());
        stream.send(&[&subscribe]).await?;
        let mut subscriber = Subscriber {
            endpoints,
            stream,
            last: None,
            replayed_through: None,
            replayed: 0,
            pending: VecDeque::new(),
        };
        subscriber.replay(0).await;
        Ok(subscriber)
    }

    /// How many batches came from the replay socket (at connection, and
    /// for every gap since).
    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    /// The next delivery; an error means the stream connection broke (the
    /// caller forgets the engine and connects again).
    pub async fn next(&mut self) -> io::Result<Delivery> {
        loop {
            if let Some(delivery) = self.pending.pop_front() {
                return Ok(delivery);
            }
            let Incoming::Message(frames) = self.stream.recv().await? else {
                continue;
            };
            let Some((seq, payload)) = message_parts(frames) else {
                continue;
            };
            if self.replayed_through.is_some_and(|r| seq <= r) {
                // Delivered by the replay already, unless the engine started
                // over after it.
                if self.last.is_some_and(|l| seq <= l) {
                    continue;
                }
            }
            match self.last {
                Some(last) if seq <= last => {
                    self.pending.push_back(Delivery::Restarted);
                    self.last = None;
                    self.replayed_through = None;
                    if seq > 0 {
                        self.replay(0).await;
                    }
                    self.accept(seq, payload);
                }
                Some(last) if seq > last + 1 => {
                    self.replay(last + 1).await;
                    self.accept(seq, payload);
                }
                _ => self.accept(seq, payload),
            }
        }
    }

    fn accept(&mut self, seq: u64, payload: Vec<u8>) {
        if self.last.is_some_and(|l| seq <= l) {
            return;
        }
        if let Some(last) = self.last
            && seq > last + 1
        {
            self.pending.push_back(Delivery::Missed {
                from: last + 1,
                to: seq - 1,
            });
        }
        self.last = Some(seq);
        self.pending.push_back(Delivery::Batch { seq, payload });
    }

    /// Asks the replay socket for everything from `from`, queueing what
    /// comes back; a failed or absent replay leaves the gap to `accept`,
    /// which reports it as missed.
    async fn replay(&mut self, from: u64) {
        let Some(addr) = self.endpoints.replay.clone() else {
            return;
        };
        let replayed = tokio::time::timeout(REPLAY_DEADLINE, fetch_replay(&addr, from)).await;
        let Ok(Ok(messages)) = replayed else {
            tracing::debug!(%addr, from, "KV event replay failed");
            return;
        };
        for (seq, payload) in messages {
            if seq >= from && self.last.is_none_or(|l| seq > l) {
                self.accept(seq, payload);
                self.replayed_through = Some(seq);
                self.replayed += 1;
            }
        }
    }
}

/// One live message: `(topic, seq, payload)`.
fn message_parts(mut frames: Vec<Vec<u8>>) -> Option<(u64, Vec<u8>)> {
    if frames.len() < 2 {
        return None;
    }
    let payload = frames.pop()?;
    let seq = u64::from_be_bytes(frames.pop()?.try_into().ok()?);
    Some((seq, payload))
}

async fn fetch_replay(addr: &str, from: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
    let mut conn = Connection::connect(addr, SocketType::Dealer).await?;
    conn.send(&[b"", &from.to_be_bytes()]).await?;
    let mut messages = Vec::new();
    loop {
        let Incoming::Message(frames) = conn.recv().await? else {
            continue;
        };
        // `["", seq, payload]` (vLLM 0.11) or `["", topic, seq, payload]`
        // (vLLM 0.34, SGLang); the end marker carries seq -1.
        match message_parts(frames) {
            Some((seq, _)) if seq == u64::from_be_bytes(END_OF_REPLAY) => return Ok(messages),
            Some(message) => messages.push(message),
            None => {}
        }
    }
}
