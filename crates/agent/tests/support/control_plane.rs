//! A fake control-plane peer: a real tonic `AgentService` on 127.0.0.1
//! that either redirects every agent to a leader address, or plays the
//! leader: it records every message agents send and lets the test push
//! commands down the newest stream.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_server::{AgentService, AgentServiceServer};
use llmgw_proto::agent::control_message::Body as Down;
use llmgw_proto::agent::{AgentMessage, ControlMessage, HeartbeatAck, Redirect};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

type DownTx = mpsc::Sender<Result<ControlMessage, Status>>;

#[derive(Clone)]
struct Fake {
    redirect_to: Option<String>,
    term: u64,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// (connection number, message) for every message received.
    received: Mutex<Vec<(usize, AgentMessage)>>,
    down: Mutex<Option<DownTx>>,
    connections: Mutex<usize>,
    /// The term of the last command sent; heartbeats are answered with it.
    term: Mutex<u64>,
    /// A silent leader answers nothing, like a paused process.
    silent: std::sync::atomic::AtomicBool,
}

#[tonic::async_trait]
impl AgentService for Fake {
    type ConnectStream = ReceiverStream<Result<ControlMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let connection = {
            let mut c = self.shared.connections.lock().unwrap();
            *c += 1;
            *c
        };
        let mut inbound = request.into_inner();
        if let Some(leader) = &self.redirect_to {
            // Like the real peers: the Register is read before the
            // redirect is answered. Read after it, the message could be
            // lost to the agent closing the stream on the redirect.
            if let Ok(Some(m)) = inbound.message().await {
                self.shared.received.lock().unwrap().push((connection, m));
            }
            let _ = tx
                .send(Ok(ControlMessage {
                    term: self.term,
                    command_id: 0,
                    leader_id: 0,
                    epoch: 0,
                    body: Some(Down::Redirect(Redirect {
                        leader_addr: leader.clone(),
                        leader_id: "peer-2".into(),
                        reason: "not the leader".into(),
                    })),
                }))
                .await;
            // Dropping tx closes the stream after the redirect.
            return Ok(Response::new(ReceiverStream::new(rx)));
        }
        *self.shared.down.lock().unwrap() = Some(tx.clone());
        let shared = self.shared.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                // Like the real leader: every heartbeat is answered.
                if let Some(Up::Heartbeat(beat)) = &m.body
                    && !shared.silent.load(std::sync::atomic::Ordering::Relaxed)
                {
                    let term = *shared.term.lock().unwrap();
                    let _ = tx.try_send(Ok(ControlMessage {
                        term,
                        command_id: 0,
                        leader_id: 0,
                        epoch: 0,
                        body: Some(Down::HeartbeatAck(HeartbeatAck { seq: beat.seq })),
                    }));
                }
                shared.received.lock().unwrap().push((connection, m));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

pub struct FakePeer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakePeer {
    /// A follower that redirects every agent to `leader`.
    pub async fn follower(leader: &str, term: u64) -> FakePeer {
        Self::start(Some(leader.to_string()), term).await
    }

    pub async fn leader() -> FakePeer {
        Self::start(None, 0).await
    }

    async fn start(redirect_to: Option<String>, term: u64) -> FakePeer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let fake = Fake {
            redirect_to,
            term,
            shared: shared.clone(),
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(AgentServiceServer::new(fake))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        FakePeer {
            addr,
            shared,
            server,
        }
    }

    pub fn connections(&self) -> usize {
        *self.shared.connections.lock().unwrap()
    }

    pub fn received(&self) -> Vec<(usize, AgentMessage)> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Stops (or resumes) answering heartbeats, as a paused leader would.
    pub fn set_silent(&self, silent: bool) {
        self.shared
            .silent
            .store(silent, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sends a command down the newest stream.
    pub async fn send(&self, term: u64, command_id: u64, body: Down) {
        {
            let mut highest = self.shared.term.lock().unwrap();
            *highest = (*highest).max(term);
        }
        let tx = self
            .shared
            .down
            .lock()
            .unwrap()
            .clone()
            .expect("no agent connected");
        tx.send(Ok(ControlMessage {
            term,
            command_id,
            leader_id: 0,
            epoch: 0,
            body: Some(body),
        }))
        .await
        .expect("stream open");
    }

    /// Waits for a message matching `pick`, which returns what the test wants.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        within: Duration,
        mut pick: impl FnMut(usize, &Up) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            for (conn, m) in self.received() {
                if let Some(body) = &m.body
                    && let Some(t) = pick(conn, body)
                {
                    return t;
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; received: {:#?}",
                self.received()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
