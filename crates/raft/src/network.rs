//! The dialing side of the peer transport: openraft's RPCs over tonic, each
//! under openraft's deadline.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use llmgw_proto::raft::raft_service_client::RaftServiceClient;
use llmgw_proto::raft::{RaftPayload, SnapshotChunk};
use llmgw_store::{PeerNode, SnapshotData, TypeConfig};
use llmgw_tls::Tls;
use openraft::error::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{RaftNetworkV2, alias::SnapshotOf, alias::VoteOf};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

/// Snapshot chunks stay well under tonic's default 4 MiB message limit.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// HTTP/2 ping interval and answer deadline on peer connections.
const PEER_KEEPALIVE: Duration = Duration::from_secs(1);

/// How long a peer that refused a connection is reported unreachable
/// without being dialled again.
const DOWN_HOLD: Duration = Duration::from_millis(200);

/// Shared connections and what is known about each peer's reachability.
#[derive(Clone)]
pub(crate) struct Peers {
    self_id: u64,
    /// Deadline of a connect, and the least deadline of an AppendEntries.
    rpc_timeout: Duration,
    /// mTLS material for dialing; `None` on a plaintext (`insecure`) peer.
    tls: Option<Tls>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    down_since: Arc<Mutex<HashMap<u64, Instant>>>,
    /// This peer's cluster id once known, sent with every RPC
    /// ([`CLUSTER_HEADER`]).
    cluster_id: Arc<OnceLock<String>>,
    /// That id as a header value, made once.
    cluster_header: Arc<OnceLock<tonic::metadata::AsciiMetadataValue>>,
}

/// The request header naming the sender's cluster: a peer that knows its
/// own refuses RPCs of another (a peer of a second cluster listed by
/// mistake, a data directory restored into the wrong cluster).
pub(crate) const CLUSTER_HEADER: &str = "llmgw-cluster";

impl Peers {
    pub(crate) fn new(
        self_id: u64,
        rpc_timeout: Duration,
        tls: Option<Tls>,
        cluster_id: Arc<OnceLock<String>>,
    ) -> Self {
        Self {
            self_id,
            rpc_timeout,
            tls,
            channels: Arc::default(),
            down_since: Arc::default(),
            cluster_id,
            cluster_header: Arc::default(),
        }
    }

    pub(crate) fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.get().map(String::as_str)
    }

    /// A request under `deadline` (also sent to the receiver as
    /// grpc-timeout), naming this peer's cluster when known.
    pub(crate) fn request<T>(&self, message: T, deadline: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(deadline);
        let header = match self.cluster_header.get() {
            Some(header) => Some(header),
            None => self
                .cluster_id()
                .and_then(|id| tonic::metadata::MetadataValue::try_from(id).ok())
                .map(|header| self.cluster_header.get_or_init(|| header)),
        };
        if let Some(header) = header {
            request
                .metadata_mut()
                .insert(CLUSTER_HEADER, header.clone());
        }
        request
    }

    /// A client for `addr`; connections are made lazily and reused. With
    /// mTLS each new connection dials with the certificate current then.
    pub(crate) fn client(&self, addr: &str) -> Result<RaftServiceClient<Channel>, String> {
        let mut channels = self.channels.lock().expect("channel cache poisoned");
        if let Some(channel) = channels.get(addr) {
            return Ok(RaftServiceClient::new(channel.clone()));
        }
        // HTTP/2 pings find a connection that went dead under a partition
        // (its TCP stuck in retransmission backoff, where every RPC only
        // times out) within a few seconds, so the next RPC dials afresh
        // instead of waiting out the backoff for tens of seconds.
        let endpoint = llmgw_tls::endpoint(addr)?
            .connect_timeout(self.rpc_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE)
            .keep_alive_while_idle(true);
        let channel = llmgw_tls::connect_lazy(&endpoint, self.tls.as_ref());
        channels.insert(addr.to_owned(), channel.clone());
        Ok(RaftServiceClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20))
    }

    /// Forgets the connection to `addr`: a channel whose connection was
    /// refused does not recover by itself when the peer comes back, so the
    /// next call dials afresh.
    pub(crate) fn forget(&self, addr: &str) {
        self.channels
            .lock()
            .expect("channel cache poisoned")
            .remove(addr);
    }

    fn recently_down(&self, target: u64) -> bool {
        let down = self.down_since.lock().expect("peer health poisoned");
        down.get(&target)
            .is_some_and(|since| since.elapsed() < DOWN_HOLD)
    }

    fn mark(&self, target: u64, reachable: bool) {
        let mut down = self.down_since.lock().expect("peer health poisoned");
        if reachable {
            down.remove(&target);
        } else {
            down.insert(target, Instant::now());
        }
    }
}

/// How a failed RPC is reported to openraft.
pub(crate) enum Failure {
    Timeout,
    Unreachable(String),
    /// Not dialled at all (the target is this peer, or was just found down).
    Skipped(String),
    /// The dial failed, so the request never left this peer.
    Refused(String),
    Network(String),
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("openraft messages serialize to JSON")
}

pub(crate) fn decode<T: DeserializeOwned>(payload: RaftPayload) -> Result<T, Failure> {
    if !payload.error.is_empty() {
        return Err(Failure::Network(format!(
            "peer answered: {}",
            payload.error
        )));
    }
    serde_json::from_slice(&payload.data)
        .map_err(|e| Failure::Network(format!("peer answer does not decode: {e}")))
}

pub(crate) fn classify(status: &tonic::Status) -> Failure {
    match status.code() {
        tonic::Code::Unavailable if never_connected(status) => {
            Failure::Refused(status.message().to_owned())
        }
        tonic::Code::Unavailable => Failure::Unreachable(status.message().to_owned()),
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => Failure::Timeout,
        _ => Failure::Network(format!("{}: {}", status.code(), status.message())),
    }
}

/// Whether the call failed while dialling, so the request never left.
fn never_connected(status: &tonic::Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Runs `call` under `deadline`, enforced both here and, through the
/// grpc-timeout header, on the receiving peer.
pub(crate) async fn with_deadline<T, F>(deadline: Duration, call: F) -> Result<T, Failure>
where
    F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    match tokio::time::timeout(deadline, call).await {
        Err(_) => Err(Failure::Timeout),
        Ok(Err(status)) => Err(classify(&status)),
        Ok(Ok(response)) => Ok(response.into_inner()),
    }
}

/// Creates one [`PeerClient`] per replication stream.
pub(crate) struct NetworkFactory {
    pub(crate) peers: Peers,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &PeerNode) -> PeerClient {
        PeerClient {
            peers: self.peers.clone(),
            target,
            addr: node.grpc.clone(),
        }
    }
}

pub(crate) struct PeerClient {
    peers: Peers,
    target: u64,
    addr: String,
}

impl PeerClient {
    fn to_rpc_error(
        &self,
        failure: Failure,
        action: RPCTypes,
        deadline: Duration,
    ) -> RPCError<TypeConfig> {
        match failure {
            Failure::Timeout => RPCError::Timeout(Timeout {
                action,
                id: self.peers.self_id,
                target: self.target,
                timeout: deadline,
            }),
            Failure::Unreachable(why) | Failure::Refused(why) => {
                self.peers.mark(self.target, false);
                self.peers.forget(&self.addr);
                RPCError::Unreachable(Unreachable::from_string(format!(
                    "peer {} at {} is unreachable: {why}",
                    self.target, self.addr
                )))
            }
            Failure::Skipped(why) => RPCError::Unreachable(Unreachable::from_string(format!(
                "peer {} at {}: {why}",
                self.target, self.addr
            ))),
            Failure::Network(why) => RPCError::Network(NetworkError::from_string(why)),
        }
    }

    /// Refuses before dialling when the target is this peer or was just
    /// found down.
    fn precheck(&self) -> Result<RaftServiceClient<Channel>, Failure> {
        if self.target == self.peers.self_id {
            return Err(Failure::Skipped("a peer never dials itself".to_owned()));
        }
        if self.peers.recently_down(self.target) {
            return Err(Failure::Skipped(
                "refused a connection moments ago".to_owned(),
            ));
        }
        self.peers.client(&self.addr).map_err(Failure::Unreachable)
    }

    async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        action: RPCTypes,
        message: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        // openraft gives an AppendEntries the heartbeat interval (80 ms) as
        // its deadline. A busy follower answers later than that; the entries
        // are sent again and again, and a new leader whose first entry is
        // never acknowledged in time never starts leading (seen with 5,000
        // agents reconnecting on two cores). An AppendEntries may take up to
        // the RPC timeout; a heartbeat answered late still renews the lease.
        let deadline = match action {
            RPCTypes::AppendEntries => option.hard_ttl().max(self.peers.rpc_timeout),
            _ => option.hard_ttl(),
        };
        let result = async {
            let mut client = self.precheck()?;
            let payload = RaftPayload {
                data: encode(message),
                error: String::new(),
            };
            let request = self.peers.request(payload, deadline);
            let answer = with_deadline(deadline, async {
                match action {
                    RPCTypes::AppendEntries => client.append_entries(request).await,
                    RPCTypes::Vote => client.vote(request).await,
                    _ => client.pre_vote(request).await,
                }
            })
            .await?;
            decode(answer)
        }
        .await;
        match result {
            Ok(response) => {
                self.peers.mark(self.target, true);
                Ok(response)
            }
            Err(failure) => Err(self.to_rpc_error(failure, action, deadline)),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(RPCTypes::AppendEntries, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(RPCTypes::Vote, &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        // Any action other than AppendEntries and Vote selects PreVote.
        self.unary(RPCTypes::TransferLeader, &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let deadline = option.hard_ttl();
        let meta = encode(&(vote, snapshot.meta.clone()));
        let data = snapshot.snapshot;
        let mut chunks = vec![SnapshotChunk {
            meta,
            data: Vec::new(),
        }];
        chunks.extend(
            data.chunks(SNAPSHOT_CHUNK_BYTES)
                .map(|chunk| SnapshotChunk {
                    meta: Vec::new(),
                    data: chunk.to_vec(),
                }),
        );
        let send = async {
            let mut client = self.precheck()?;
            let request = self.peers.request(tokio_stream::iter(chunks), deadline);
            let answer = with_deadline(deadline, client.install_snapshot(request)).await?;
            decode::<SnapshotResponse<TypeConfig>>(answer)
        };
        let result = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            result = send => result,
        };
        match result {
            Ok(response) => {
                self.peers.mark(self.target, true);
                Ok(response)
            }
            Err(failure) => Err(
                match self.to_rpc_error(failure, RPCTypes::InstallSnapshot, deadline) {
                    RPCError::Timeout(e) => StreamingError::Timeout(e),
                    RPCError::Unreachable(e) => StreamingError::Unreachable(e),
                    RPCError::Network(e) => StreamingError::Network(e),
                    RPCError::RemoteError(e) => {
                        StreamingError::Network(NetworkError::from_string(e.to_string()))
                    }
                },
            ),
        }
    }

    fn backoff(&self) -> Option<Backoff> {
        // An unreachable peer is retried at a growing interval capped below
        // the election timeout, so a restarted peer is found again quickly.
        let steps = [100u64, 200, 400, 800];
        Some(Backoff::new(
            steps
                .into_iter()
                .chain(std::iter::repeat(800))
                .map(Duration::from_millis),
        ))
    }
}
