//! `AgentService.Connect` on every peer: a follower redirects the agent to
//! the leader; the leader registers the node (a Raft write only when
//! something changed), answers with `Registered`, and then reads
//! heartbeats, shard statuses and acks until the stream ends.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_server::{AgentService, AgentServiceServer};
use llmgw_proto::agent::control_message::Body as Down;
use llmgw_proto::agent::{AgentMessage, ControlMessage, Redirect, ShardStatus};
use llmgw_raft::{ControlPlane, now_ms};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::hub::Hub;
use super::rate::{AGENT_MESSAGE_BURST, AGENT_MESSAGES_PER_SECOND, RateLimit};
use super::registrar::Registrar;
use llmgw_agent_wire::node_facts;
use llmgw_api::Refusal;
use llmgw_reconcile::{desired_for_node, managed_models};
use llmgw_state::FleetState;

/// How long a new stream may take to send its `Register`.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// Commands queued for one agent before it counts as stuck.
const OUTBOX: usize = 1024;
/// The largest message an agent may send. A `Register` with a full
/// inventory and every running shard is tens of kilobytes.
pub const MAX_AGENT_MESSAGE_BYTES: usize = 4 << 20;

/// A shard status from the node that sent it.
#[derive(Debug)]
pub struct Report {
    pub node: String,
    pub status: ShardStatus,
}

#[derive(Clone)]
pub struct AgentStreams {
    pub control: ControlPlane,
    pub hub: Arc<Hub>,
    pub reports: mpsc::UnboundedSender<Report>,
    /// Sent to agents in `Registered`; zero keeps each agent's own.
    pub heartbeat_interval: Duration,
    /// Commits registrations in groups.
    pub registrar: Registrar,
    /// How recently a node's session must have been heard for a Register
    /// from another agent instance to be refused (the node TTL).
    pub claim_window: Duration,
}

impl AgentStreams {
    pub fn into_service(self) -> AgentServiceServer<Self> {
        AgentServiceServer::new(self).max_decoding_message_size(MAX_AGENT_MESSAGE_BYTES)
    }

    fn redirect(&self, node: &str, tx: &mpsc::Sender<Result<ControlMessage, Status>>) {
        let (leader_id, leader_addr, reason) = match self.control.leader() {
            // This peer holds the Raft role but not the lease: naming
            // itself would bring the agent straight back.
            Some((id, _)) if id == self.control.id() => (
                String::new(),
                String::new(),
                self.control.inactive_leader_reason().unwrap_or_else(|| {
                    format!(
                        "peer {id} is not ready to command agents: its leadership just \
                             changed, or the cluster is beginning its epoch (new or restored)"
                    )
                }),
            ),
            Some((id, peer)) => (
                id.to_string(),
                peer.grpc,
                format!("peer {} is a follower; peer {id} leads", self.control.id()),
            ),
            None => (
                String::new(),
                String::new(),
                "no leader is elected yet".to_owned(),
            ),
        };
        tracing::debug!(node, leader = %leader_addr, "redirecting an agent to the leader");
        let _ = tx.try_send(Ok(ControlMessage {
            term: 0,
            epoch: 0,
            command_id: 0,
            leader_id: 0,
            body: Some(Down::Redirect(Redirect {
                leader_addr,
                leader_id,
                reason,
            })),
        }));
    }
}

impl AgentStreams {
    /// The epoch this leader commands agents under: the cluster's, epoch
    /// 0 while a cluster from before epochs has none yet, `None` while a
    /// restored cluster has not begun its own (redirect the agent, which
    /// comes back shortly). An agent that joined another cluster is
    /// refused, naming both.
    fn cluster_epoch(
        &self,
        node: &str,
        register: &llmgw_proto::agent::Register,
        remote: &str,
    ) -> Result<Option<u64>, Status> {
        let standing = self.control.read(|fleet| match &fleet.cluster {
            None => Some((String::new(), 0)),
            Some(identity) if identity.settled() => Some((identity.id.clone(), identity.epoch)),
            Some(_) => None,
        });
        let Some((cluster_id, epoch)) = standing else {
            return Ok(None);
        };
        if !cluster_id.is_empty()
            && !register.cluster_id.is_empty()
            && register.cluster_id != cluster_id
        {
            let why = format!(
                "node {node} joined cluster {}, and this is cluster {cluster_id}: its agent \
                 obeys no other. Point it at its own cluster's peers, or, if the node really \
                 moves, stop the agent and remove the leader-term file in its work directory",
                register.cluster_id
            );
            tracing::error!(node, %remote, "refused a registration: {why}");
            return Err(Status::failed_precondition(why));
        }
        self.hub.set_cluster(&cluster_id, epoch);
        Ok(Some(epoch))
    }
}

type ControlStream = Pin<Box<dyn Stream<Item = Result<ControlMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for AgentStreams {
    type ConnectStream = ControlStream;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let (_, extensions, mut inbound) = request.into_parts();
        let remote = llmgw_tls::remote_addr(&extensions)
            .map_or_else(|| "unknown address".to_owned(), |a| a.to_string());
        let first = match tokio::time::timeout(REGISTER_TIMEOUT, inbound.message()).await {
            Err(_) => {
                tracing::warn!(%remote, "agent stream sent no Register within {REGISTER_TIMEOUT:?}");
                return Err(Status::deadline_exceeded("send Register first"));
            }
            Ok(Err(status)) => {
                tracing::warn!(%remote, %status, "agent stream broke before registering");
                return Err(status);
            }
            Ok(Ok(None)) => return Err(Status::cancelled("the stream ended before Register")),
            Ok(Ok(Some(message))) => message,
        };
        let Some(Up::Register(register)) = first.body else {
            tracing::warn!(%remote, "agent stream did not start with Register; closing it");
            return Err(Status::invalid_argument(
                "the first message on the stream must be Register",
            ));
        };
        // With mTLS, only the node the certificate names may register.
        llmgw_tls::check_node_identity(&extensions, &register.node_id)?;
        let facts = node_facts(&register).map_err(|why| {
            tracing::warn!(%remote, "refused a registration: {why}");
            Status::invalid_argument(why)
        })?;
        let node = facts.id.clone();
        let (tx, rx) = mpsc::channel(OUTBOX);
        let Some(term) = self.control.leading_term() else {
            self.redirect(&node, &tx);
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        };
        let Some(epoch) = self.cluster_epoch(&node, &register, &remote)? else {
            self.redirect(&node, &tx);
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        };
        if (register.highest_epoch, register.highest_term) > (epoch, term) {
            tracing::warn!(
                node,
                agent_epoch = register.highest_epoch,
                agent_term = register.highest_term,
                epoch,
                term,
                "agent has seen a newer leadership than this leader's; it will refuse our commands"
            );
        }
        // Before anything is written: a second machine with this node id
        // must not replace the live one's facts.
        if let Err(why) = self
            .hub
            .claim(&node, &register.instance_id, self.claim_window)
        {
            tracing::error!(node, %remote, "refused a registration: {why}");
            return Err(Status::already_exists(why));
        }
        let needs_write = self
            .control
            .read(|fleet| facts.differs_from(fleet.nodes.get(&node)));
        if needs_write {
            let command = facts.into_command(now_ms());
            if let Err(error) = self.registrar.register(term, command).await {
                tracing::warn!(node, %error, "cannot register the node now");
                return Err(Status::unavailable(format!(
                    "registration of node {node} was not committed: {error}"
                )));
            }
            tracing::info!(node, %remote, "node registered");
        }
        if self.control.leading_term() != Some(term) {
            self.redirect(&node, &tx);
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        let (desired, report_seqs) = self.control.read(|fleet| {
            let models = managed_models(fleet);
            (
                desired_for_node(fleet, &models, &node),
                report_seqs(fleet, &node),
            )
        });
        let session = self
            .hub
            .open(
                &node,
                term,
                tx,
                &desired,
                report_seqs,
                self.heartbeat_interval,
            )
            .map_err(Status::internal)?;
        self.hub.set_instance(&node, session, &register.instance_id);
        tracing::info!(node, %remote, term, shards = desired.len(), running = register.running.len(), "agent stream open");
        tokio::spawn(read_agent(
            inbound,
            node,
            session,
            self.control.clone(),
            self.hub.clone(),
            self.reports.clone(),
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Reads one agent's messages until its stream ends. A broken or garbled
/// stream ends this session only; every other agent is unaffected.
async fn read_agent(
    mut inbound: Streaming<AgentMessage>,
    node: String,
    session: u64,
    control: ControlPlane,
    hub: Arc<Hub>,
    reports: mpsc::UnboundedSender<Report>,
) {
    let mut rate = RateLimit::for_agent();
    loop {
        match inbound.message().await {
            Ok(Some(_)) if !rate.allow(std::time::Instant::now()) => {
                let why = format!(
                    "node {node} sent more than {AGENT_MESSAGE_BURST} messages at once or \
                     {AGENT_MESSAGES_PER_SECOND} per second; the leader closed its stream"
                );
                tracing::warn!(node, "{why}");
                hub.close_with(&node, session, Status::resource_exhausted(why));
                return;
            }
            Ok(Some(message)) => {
                hub.heard(&node, session);
                match message.body {
                    // Answered only while this peer leads with a live
                    // lease: a leader cut off from its peers must not keep
                    // its agents attached.
                    Some(Up::Heartbeat(beat)) => {
                        hub.note_survivor_gpus(&node, beat.survivor_gpus);
                        if let Some(term) = control.leading_term() {
                            hub.answer_heartbeat(&node, session, term, beat.seq);
                        }
                    }
                    Some(Up::ShardStatus(status)) => {
                        let _ = reports.send(Report {
                            node: node.clone(),
                            status,
                        });
                    }
                    Some(Up::Ack(ack)) if !ack.accepted => {
                        tracing::warn!(
                            node,
                            command_id = ack.command_id,
                            "agent refused a command: {}",
                            ack.message
                        );
                        hub.refused(
                            &node,
                            Refusal {
                                command_id: ack.command_id,
                                message: ack.message,
                                at_ms: now_ms(),
                            },
                        );
                    }
                    Some(Up::Ack(_)) => {}
                    Some(Up::Register(_)) => {
                        tracing::warn!(node, "ignoring a second Register on an open stream");
                    }
                    None => tracing::warn!(node, "ignoring an empty message from the agent"),
                }
            }
            Ok(None) => {
                tracing::info!(node, "agent closed its stream");
                break;
            }
            Err(status) => {
                tracing::warn!(node, %status, "agent stream broke; closing it");
                break;
            }
        }
    }
    hub.close(&node, session);
}

/// The number of the last report applied for each shard assigned to
/// `node`, which `Registered` tells the agent.
fn report_seqs(fleet: &FleetState, node: &str) -> HashMap<String, u64> {
    fleet
        .replicas
        .values()
        .flat_map(|replica| {
            replica
                .shards
                .iter()
                .filter(|shard| shard.node == node && shard.report_seq > 0)
                .map(|shard| (replica.shard_id(shard.rank), shard.report_seq))
        })
        .collect()
}
