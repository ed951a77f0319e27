//! The answering side of the peer transport.

use llmgw_proto::raft::raft_service_server::{RaftService, RaftServiceServer};
use llmgw_proto::raft::{RaftPayload, SnapshotChunk};
use llmgw_store::TypeConfig;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::vote::RaftLeaderId;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::control::ControlPlane;
use crate::forward::ForwardRequest;
use crate::inbound;

/// The Raft service with its caller check.
pub type RaftGrpcService = InterceptedService<RaftServiceServer<RaftGrpc>, CallerCheck>;
type CallerCheck = fn(Request<()>) -> Result<Request<()>, Status>;

/// The tonic service to mount on this peer's gRPC listener, served through
/// [`llmgw_tls::incoming`]: on an mTLS listener only callers with a peer
/// certificate get through, so an agent's certificate cannot vote, append
/// or forward.
pub fn raft_grpc_service(control: ControlPlane) -> RaftGrpcService {
    let service = RaftServiceServer::new(RaftGrpc {
        control,
        foreign_logged: std::sync::Mutex::new(None),
    })
    .max_decoding_message_size(64 << 20)
    .max_encoding_message_size(64 << 20);
    InterceptedService::new(service, llmgw_tls::require_peer as CallerCheck)
}

pub struct RaftGrpc {
    control: ControlPlane,
    /// When an RPC of another cluster was last logged: a misplaced peer
    /// calls at heartbeat rate, and one line a minute says it.
    foreign_logged: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often RPCs of another cluster are logged.
const FOREIGN_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

fn parse<T: DeserializeOwned>(payload: &RaftPayload) -> Result<T, Status> {
    serde_json::from_slice(&payload.data)
        .map_err(|e| Status::invalid_argument(format!("request does not decode: {e}")))
}

/// A refusal of a malformed RPC, logged with the caller.
fn refuse<T>(request: &Request<T>, why: String) -> Status {
    refuse_as(request, Status::invalid_argument(why))
}

impl RaftGrpc {
    /// Refuses an RPC from a peer of another cluster. A peer that does not
    /// know its cluster yet (one still empty, or an older release) is
    /// answered: it learns the cluster from what it is sent.
    fn same_cluster<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let theirs = request
            .metadata()
            .get(crate::network::CLUSTER_HEADER)
            .and_then(|value| value.to_str().ok());
        match (theirs, self.control.cluster_id()) {
            (Some(theirs), Some(ours)) if theirs != ours => {
                let status = Status::failed_precondition(format!(
                    "this peer belongs to cluster {ours}, and the caller to cluster {theirs}: \
                     check the peer addresses in both clusters' server.yaml"
                ));
                let mut logged = self
                    .foreign_logged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if logged.is_none_or(|at| at.elapsed() >= FOREIGN_LOG_EVERY) {
                    *logged = Some(std::time::Instant::now());
                    return Err(refuse_as(request, status));
                }
                Err(status)
            }
            _ => Ok(()),
        }
    }
}

fn refuse_as<T>(request: &Request<T>, status: Status) -> Status {
    let remote = llmgw_tls::remote_addr(request.extensions());
    tracing::warn!(remote = ?remote, "refused a Raft RPC: {}", status.message());
    status
}

fn answer<T: Serialize, E: std::fmt::Display>(
    result: Result<T, E>,
) -> Result<Response<RaftPayload>, Status> {
    Ok(Response::new(match result {
        Ok(value) => RaftPayload {
            data: serde_json::to_vec(&value).map_err(|e| Status::internal(e.to_string()))?,
            error: String::new(),
        },
        Err(error) => RaftPayload {
            data: Vec::new(),
            error: error.to_string(),
        },
    }))
}

#[tonic::async_trait]
impl RaftService for RaftGrpc {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.same_cluster(&request)?;
        let rpc: AppendEntriesRequest<TypeConfig> = parse(request.get_ref())?;
        inbound::check_append(&rpc).map_err(|why| refuse(&request, why))?;
        let sender = *rpc.vote.leader_id().node_id();
        let result = self.control.raft().append_entries(rpc).await;
        if result
            .as_ref()
            .is_ok_and(|response| !matches!(response, AppendEntriesResponse::HigherVote(_)))
        {
            self.control.heard_from_leader(sender);
        }
        answer(result)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.same_cluster(&request)?;
        let rpc = parse(request.get_ref())?;
        answer(self.control.raft().vote(rpc).await)
    }

    async fn pre_vote(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.same_cluster(&request)?;
        let rpc = parse(request.get_ref())?;
        answer(self.control.raft().pre_vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.same_cluster(&request)?;
        let remote = llmgw_tls::remote_addr(request.extensions());
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        type Meta = (
            openraft::alias::VoteOf<TypeConfig>,
            openraft::alias::SnapshotMetaOf<TypeConfig>,
        );
        let (vote, meta): Meta = serde_json::from_slice(&first.meta)
            .map_err(|e| Status::invalid_argument(format!("snapshot meta does not decode: {e}")))?;
        let mut data = first.data;
        while let Some(chunk) = stream.message().await? {
            data.extend_from_slice(&chunk.data);
        }
        let committed = self.control.metrics().local_committed;
        if let Err(why) = inbound::check_snapshot(&vote, &meta, &data, committed.as_ref()) {
            tracing::warn!(remote = ?remote, "refused a Raft RPC: {why}");
            return Err(Status::invalid_argument(why));
        }
        let snapshot = openraft::Snapshot {
            meta,
            snapshot: data,
        };
        let sender = *vote.leader_id().node_id();
        let result = self
            .control
            .raft()
            .install_full_snapshot(vote, snapshot)
            .await;
        if result
            .as_ref()
            .is_ok_and(|response| response.vote.leader_id().node_id() == &sender)
        {
            self.control.heard_from_leader(sender);
        }
        answer(result)
    }

    async fn forward(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.same_cluster(&request)?;
        let forwarded: ForwardRequest = parse(request.get_ref())?;
        let response = self.control.handle_forwarded(forwarded).await;
        answer(Ok::<_, std::convert::Infallible>(response))
    }

    async fn status(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let status = if request.get_ref().data == crate::status::LINK_PROBE {
            self.control.status_without_hash()
        } else {
            self.control.local_status()
        };
        answer(Ok::<_, std::convert::Infallible>(status))
    }
}
