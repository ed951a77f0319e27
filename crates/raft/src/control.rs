//! The control plane handle: proposing, forwarding, reading, membership.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use llmgw_proto::raft::RaftPayload;
use llmgw_state::{Command, FleetState, Leadership, Outcome, StateHash};
use llmgw_store::{AppliedState, ApplyStats, PeerNode, SyncStats, TypeConfig};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::{ChangeMembers, Instant as _, RaftMetrics, ReadPolicy, ServerState};

use crate::LlmgwRaft;
use crate::disk::DiskGuard;
use crate::error::ControlError;
use crate::forward::{ForwardFailure, ForwardRequest, ForwardResponse};
use crate::lease::InactiveLeader;
use crate::network::{self, Failure, NetworkFactory, Peers};
use crate::settings::RaftSettings;
use crate::status::PeerStatus;
use llmgw_api::{Membership, PeerRole, PeerView};

/// The most bytes one log entry may take. With
/// [`crate::settings::MAX_ENTRIES_PER_APPEND`] entries to an append, an
/// append stays well under the peer transport's 64 MiB message limit.
pub const MAX_ENTRY_BYTES: usize = 1 << 20;

/// The bytes `command` takes in the log (its stored JSON).
pub fn entry_bytes(command: &Command) -> usize {
    serde_json::to_vec(command).map_or(usize::MAX, |bytes| bytes.len())
}

/// A peer as named in server.yaml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub id: u64,
    pub node: PeerNode,
}

/// Counters that are not in openraft's metrics.
#[derive(Debug, Default)]
pub struct RaftCounters {
    pub leader_changes: AtomicU64,
    /// When this peer saw the latest leader changes (ms since the epoch),
    /// newest last, at most [`RECENT_LEADER_CHANGES`].
    recent_changes: std::sync::Mutex<std::collections::VecDeque<u64>>,
}

/// How many leader-change times are kept.
const RECENT_LEADER_CHANGES: usize = 256;

impl RaftCounters {
    fn leader_changed(&self) {
        self.leader_changes.fetch_add(1, Ordering::Relaxed);
        let mut recent = self
            .recent_changes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if recent.len() == RECENT_LEADER_CHANGES {
            recent.pop_front();
        }
        recent.push_back(now_ms());
    }

    /// Leader changes this peer saw in the last `window`.
    pub fn leader_changes_within(&self, window: Duration) -> usize {
        let since = now_ms().saturating_sub(u64::try_from(window.as_millis()).unwrap_or(u64::MAX));
        self.recent_changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|at| **at >= since)
            .count()
    }
}

/// How long a write keeps looking for a leader before it gives up.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// Adding a peer waits for it to catch up as a learner first.
const MEMBERSHIP_DEADLINE: Duration = Duration::from_secs(60);
/// One forwarded request's deadline. A paused or cut-off leader is left
/// sooner, as soon as this peer sees the leader change; this only bounds a
/// leader that still leads but does not answer. Long enough for a commit on
/// a busy leader (seconds under load on 2 cores).
const FORWARD_ATTEMPT: Duration = Duration::from_secs(5);
/// How long the leader waits for a majority to acknowledge a write it
/// appended. Below [`FORWARD_ATTEMPT`], so a forwarding peer hears the
/// leader's own account rather than a timeout.
const COMMIT_DEADLINE: Duration = Duration::from_millis(4_500);

/// Everything the server needs from Raft. Cheap to clone.
#[derive(Clone)]
pub struct ControlPlane {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    raft: LlmgwRaft,
    applied: Arc<RwLock<AppliedState>>,
    stats: Arc<ApplyStats>,
    sync_stats: Arc<SyncStats>,
    peers: Peers,
    settings: RaftSettings,
    configured: BTreeMap<u64, PeerNode>,
    pristine_at_start: bool,
    /// The term this peer had voted in and the last log index it held
    /// when it started: a leadership it resumes in that term after a
    /// restart (openraft restores a leader in its term) acts only once it
    /// has applied that far, since the committed index it restarted from
    /// may be older than what it had committed.
    log_at_start: Option<(u64, u64)>,
    disk: DiskGuard,
    membership_lock: tokio::sync::Mutex<()>,
    counters: Arc<RaftCounters>,
    /// The state hash and the index it was taken at: hashing ten thousand
    /// nodes takes tens of milliseconds, and status is asked often.
    state_hash: std::sync::Mutex<Option<(Option<llmgw_store::LogId>, StateHash)>>,
    /// The leader that last appended to this peer's log (or sent its
    /// heartbeat, or a snapshot), and when.
    leader_contact: std::sync::Mutex<Option<(u64, Instant)>>,
}

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] llmgw_store::StoreError),
    #[error("invalid Raft settings: {0}")]
    Settings(String),
    #[error("peer {0} is not in the peer list of its own configuration")]
    NotAPeer(u64),
    #[error("the Raft node did not start: {0}")]
    Raft(String),
}

impl ControlPlane {
    /// Opens the store in `data_dir` and starts the Raft node. The node
    /// joins or forms a cluster once [`ControlPlane::bootstrap`] runs. With
    /// `tls`, every connection to another peer is mTLS with that material;
    /// `None` is plaintext (`insecure: true`).
    pub async fn start(
        id: u64,
        data_dir: &Path,
        settings: RaftSettings,
        peers: Vec<PeerSpec>,
        tls: Option<llmgw_tls::Tls>,
    ) -> Result<Self, StartError> {
        let configured: BTreeMap<u64, PeerNode> =
            peers.into_iter().map(|p| (p.id, p.node)).collect();
        if !configured.contains_key(&id) {
            return Err(StartError::NotAPeer(id));
        }
        let config = settings.to_openraft().map_err(StartError::Settings)?;
        let store = llmgw_store::open(data_dir)?;
        let disk = DiskGuard {
            dir: data_dir.to_owned(),
            min_free: settings.min_free_disk_bytes,
        };
        let pristine_at_start = store.is_pristine();
        let log_at_start = {
            use openraft::RaftLogReader;
            use openraft::storage::RaftLogStorage;
            let mut log = store.log.clone();
            let read = |e: std::io::Error| StartError::Raft(format!("reading the log: {e}"));
            let last = log.get_log_state().await.map_err(read)?.last_log_id;
            // Only a leadership openraft restores: a committed vote for
            // this peer.
            let vote = log
                .read_vote()
                .await
                .map_err(read)?
                .filter(|vote| vote.is_committed() && vote.leader_id().node_id == id);
            vote.zip(last)
                .map(|(vote, last)| (vote.leader_id().term, last.index))
        };
        let applied = store.state_machine.applied();
        let stats = store.state_machine.stats();
        let sync_stats = store.log.sync_stats();
        let peer_net = Peers::new(
            id,
            settings.rpc_timeout,
            tls,
            store.state_machine.cluster_id(),
        );
        let factory = NetworkFactory {
            peers: peer_net.clone(),
        };
        let raft = openraft::Raft::new(
            id,
            Arc::new(config),
            factory,
            store.log,
            store.state_machine,
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let counters = Arc::new(RaftCounters::default());
        spawn_leader_watch(raft.clone(), counters.clone());
        let control = Self {
            inner: Arc::new(Inner {
                id,
                raft,
                applied,
                stats,
                sync_stats,
                peers: peer_net,
                settings,
                configured,
                pristine_at_start,
                log_at_start,
                disk,
                membership_lock: tokio::sync::Mutex::new(()),
                counters,
                state_hash: std::sync::Mutex::new(None),
                leader_contact: std::sync::Mutex::new(None),
            }),
        };
        crate::disk::spawn_disk_watch(control.clone());
        crate::links::spawn_peer_links(control.clone());
        Ok(control)
    }

    pub(crate) fn disk(&self) -> &DiskGuard {
        &self.inner.disk
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    pub fn raft(&self) -> &LlmgwRaft {
        &self.inner.raft
    }

    pub fn counters(&self) -> &RaftCounters {
        &self.inner.counters
    }

    pub fn apply_stats(&self) -> &ApplyStats {
        &self.inner.stats
    }

    /// Synced writes of this peer's Raft log and vote.
    pub fn log_sync_stats(&self) -> &SyncStats {
        &self.inner.sync_stats
    }

    pub fn metrics(&self) -> RaftMetrics<TypeConfig> {
        self.inner.raft.metrics().borrow_watched().clone()
    }

    /// The cluster this peer belongs to, once known.
    pub fn cluster_id(&self) -> Option<&str> {
        self.inner.peers.cluster_id()
    }

    pub(crate) fn applied_state(&self) -> Arc<RwLock<AppliedState>> {
        self.inner.applied.clone()
    }

    pub(crate) fn store_was_pristine(&self) -> bool {
        self.inner.pristine_at_start
    }

    pub(crate) fn peers(&self) -> &crate::network::Peers {
        &self.inner.peers
    }

    pub(crate) fn configured_peers(&self) -> &BTreeMap<u64, PeerNode> {
        &self.inner.configured
    }

    /// Reads the applied state (as of this peer; possibly stale on a
    /// follower unless [`ControlPlane::linearizable_barrier`] ran first).
    pub fn read<T>(&self, read: impl FnOnce(&FleetState) -> T) -> T {
        let applied = self.inner.applied.read().expect("state lock poisoned");
        read(&applied.fleet)
    }

    /// This peer's Raft term while it may act as the fleet's leader, `None`
    /// otherwise. Everything the leader does to the fleet (liveness,
    /// placement, registrations, commands to agents) happens only under
    /// this term, and everything it sends to agents carries it (fencing).
    /// Raft's leader role is not enough: see [`ControlPlane::inactive_leader_reason`].
    pub fn leading_term(&self) -> Option<u64> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow_watched();
        let leads =
            metrics.state == ServerState::Leader && metrics.current_leader == Some(self.inner.id);
        (leads && self.inactive(&metrics).is_none()).then_some(metrics.current_term)
    }

    /// Why this peer, while Raft calls it leader, must not act on the
    /// fleet: no majority acknowledged it within the lease (it may already
    /// be replaced), or it has not yet applied everything its predecessors
    /// committed (it would decide from an old view). `None` when it is not
    /// the leader or may act.
    pub fn inactive_leader_reason(&self) -> Option<String> {
        self.inactive_leader().map(|inactive| inactive.to_string())
    }

    fn inactive_leader(&self) -> Option<InactiveLeader> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow_watched();
        if metrics.state != ServerState::Leader {
            return None;
        }
        self.inactive(&metrics)
    }

    fn inactive(&self, metrics: &RaftMetrics<TypeConfig>) -> Option<InactiveLeader> {
        InactiveLeader::of(
            self.inner.id,
            metrics,
            self.inner.settings.leader_lease(),
            self.inner.log_at_start,
        )
    }

    /// Notes that `leader` just appended to this peer (entries or a
    /// heartbeat) or sent it a snapshot, and this peer accepted its vote.
    pub(crate) fn heard_from_leader(&self, leader: u64) {
        *self
            .inner
            .leader_contact
            .lock()
            .expect("leader contact lock") = Some((leader, Instant::now()));
    }

    /// How long ago this peer last heard the leader it names: on a
    /// follower, the leader's last append or heartbeat; on the leader, the
    /// last acknowledgement by a majority. `None` with no leader named, or
    /// none heard since this peer started. A follower cut off from its
    /// peers goes on naming the last leader it knew (it cannot elect
    /// another); this says how stale that is.
    pub fn leader_heard_ago(&self) -> Option<Duration> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow_watched();
        let leader = metrics.current_leader?;
        if leader == self.inner.id {
            if metrics.membership_config.membership().voter_ids().count() <= 1 {
                return Some(Duration::ZERO);
            }
            return metrics.last_quorum_acked.as_deref().map(|at| at.elapsed());
        }
        let contact = *self
            .inner
            .leader_contact
            .lock()
            .expect("leader contact lock");
        contact
            .filter(|(heard, _)| *heard == leader)
            .map(|(_, at)| at.elapsed())
    }

    /// Why openraft's core stopped, once it has: a storage error, or any
    /// other fatal one. Never resolves while the core runs.
    pub async fn core_stopped(&self) -> String {
        let mut metrics = self.inner.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_watched().running_state {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the Raft core ended".to_owned();
            }
        }
    }

    /// Why the Raft core is not running, `None` while it is.
    pub fn core_failure(&self) -> Option<String> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow_watched();
        metrics
            .running_state
            .as_ref()
            .err()
            .map(|fatal| fatal.to_string())
    }

    /// The known leader and how to reach it.
    pub fn leader(&self) -> Option<(u64, PeerNode)> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow_watched();
        let id = metrics.current_leader?;
        let node = metrics
            .membership_config
            .membership()
            .get_node(&id)
            .cloned()
            .or_else(|| self.inner.configured.get(&id).cloned())?;
        Some((id, node))
    }

    /// Proposes a command through the leader and waits for it to be applied.
    /// Returns the log index it was committed at.
    pub async fn write(&self, command: Command) -> Result<u64, ControlError> {
        // Refused here first, so a peer low on space answers at once and
        // clearly; the leader checks its own disk again below.
        self.inner.disk.check()?;
        let response = self
            .submit(ForwardRequest::Write(Box::new(command)), WRITE_DEADLINE)
            .await?;
        self.written(response).await
    }

    /// The answer to a write: once applied, read-your-writes on the peer
    /// that took the request (a follower answers only once it has applied
    /// the entry too); a rejection as such.
    async fn written(&self, response: ForwardResponse) -> Result<u64, ControlError> {
        match response {
            ForwardResponse::Written {
                outcome: Outcome::Applied,
                log_index,
            } => {
                self.wait_committed_applied(log_index).await?;
                Ok(log_index)
            }
            ForwardResponse::Written {
                outcome: Outcome::Rejected(rejection),
                ..
            } => Err(ControlError::Rejected(rejection)),
            ForwardResponse::Failed(failure) => Err(failure.into()),
            other => Err(unexpected(other)),
        }
    }

    /// Proposes a decision this peer took as the leader of `term`
    /// (liveness, placement, a registration). It is never forwarded: a
    /// decision taken from a leader's view belongs to that leadership, and
    /// once this peer no longer leads `term` with a live lease it is
    /// dropped, for the new leader to decide again from its own view.
    pub async fn propose_as_leader(
        &self,
        term: u64,
        commands: Vec<Command>,
    ) -> Result<u64, ControlError> {
        let superseded = || {
            ControlError::NoLeader(format!(
                "peer {} no longer leads term {term}; its decision is dropped",
                self.inner.id
            ))
        };
        if self.leading_term() != Some(term) {
            return Err(superseded());
        }
        // Apply refuses it unless this very leadership appends it, even if
        // this peer loses and regains leadership before the append.
        let decided = Command::Decided {
            leader: Leadership {
                term,
                leader: self.inner.id,
            },
            commands,
            at_ms: now_ms(),
        };
        match self
            .handle_locally(ForwardRequest::Write(Box::new(decided)))
            .await
        {
            ForwardResponse::NotLeader { .. } => Err(superseded()),
            other => self.written(other).await,
        }
    }

    async fn wait_applied(&self, index: u64) -> Result<(), ControlError> {
        self.inner
            .raft
            .wait(Some(WRITE_DEADLINE))
            .applied_index_at_least(Some(index), "apply a write")
            .await
            .map(|_| ())
            .map_err(|e| ControlError::NoLeader(format!("waiting to apply index {index}: {e}")))
    }

    /// Waits for a write this peer knows was committed at `index`.
    async fn wait_committed_applied(&self, index: u64) -> Result<(), ControlError> {
        self.wait_applied(index).await.map_err(|error| {
            let why = match error {
                ControlError::NoLeader(why) => why,
                other => other.to_string(),
            };
            ControlError::CommittedNotApplied { index, why }
        })
    }

    /// Returns once this peer has applied everything committed before the
    /// call: the leader confirms its leadership with a quorum (read index)
    /// and this peer waits until it has applied up to that index.
    pub async fn linearizable_barrier(&self) -> Result<(), ControlError> {
        let index = match self
            .submit(ForwardRequest::ReadIndex, WRITE_DEADLINE)
            .await?
        {
            ForwardResponse::ReadIndex(index) => index,
            other => return Err(unexpected(other)),
        };
        self.wait_applied(index).await
    }

    /// Adds a peer: as a learner first (it catches up), then as a voter.
    pub async fn add_peer(&self, id: u64, node: PeerNode) -> Result<(), ControlError> {
        match self
            .submit(ForwardRequest::AddPeer { id, node }, MEMBERSHIP_DEADLINE)
            .await?
        {
            ForwardResponse::PeerChanged => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Removes a peer and retires its id for good.
    pub async fn remove_peer(&self, id: u64) -> Result<(), ControlError> {
        match self
            .submit(ForwardRequest::RemovePeer { id }, MEMBERSHIP_DEADLINE)
            .await?
        {
            ForwardResponse::PeerChanged => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Runs `request` on the leader, here or over the `Forward` RPC,
    /// following leadership changes until `deadline` passes.
    async fn submit(
        &self,
        request: ForwardRequest,
        deadline: Duration,
    ) -> Result<ForwardResponse, ControlError> {
        let started = Instant::now();
        let mut last_problem = "no leader is known yet".to_owned();
        loop {
            let response = match self.leader() {
                Some((id, _)) if id == self.inner.id => {
                    match self.handle_locally(request.clone()).await {
                        // openraft refuses proposals until a majority has
                        // answered this leader within the lease. Once
                        // answered and lapsed, waiting would only hang the
                        // client (no other peer is named to try); a leader
                        // elected a moment ago is answered within a
                        // heartbeat, so the request waits for it.
                        ForwardResponse::NotLeader { leader: None } => {
                            match self.inactive_leader() {
                                Some(inactive) if !inactive.settling() => {
                                    return Err(ControlError::NoLeader(inactive.to_string()));
                                }
                                Some(inactive) => last_problem = inactive.to_string(),
                                None => {}
                            }
                            ForwardResponse::NotLeader { leader: None }
                        }
                        other => other,
                    }
                }
                Some((id, node)) => match self
                    .forward_while_leading(
                        id,
                        &node,
                        &request,
                        self.forward_deadline(started, deadline),
                    )
                    .await
                {
                    Ok(response) => response,
                    Err(Undelivered::Certainly(why)) => {
                        last_problem = format!("leader {id} at {}: {why}", node.grpc);
                        ForwardResponse::NotLeader { leader: None }
                    }
                    Err(Undelivered::Maybe(why)) => {
                        let why = format!("leader {id} at {}: {why}", node.grpc);
                        // Sending a write again after the leader may have
                        // appended it would apply it twice once it commits.
                        if let ForwardRequest::Write(_) = request {
                            return Err(ControlError::Ambiguous(why));
                        }
                        last_problem = why;
                        ForwardResponse::NotLeader { leader: None }
                    }
                },
                None => ForwardResponse::NotLeader { leader: None },
            };
            match response {
                ForwardResponse::NotLeader { .. }
                | ForwardResponse::Failed(ForwardFailure::NoLeader(_)) => {
                    if let ForwardResponse::Failed(ForwardFailure::NoLeader(why)) = &response {
                        last_problem.clone_from(why);
                    }
                    if started.elapsed() > deadline {
                        return Err(ControlError::NoLeader(format!(
                            "gave up after {:.1}s: {last_problem}",
                            started.elapsed().as_secs_f64()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                ForwardResponse::Failed(failure) => return Err(failure.into()),
                other => return Ok(other),
            }
        }
    }

    /// One forwarding attempt's deadline, never past the caller's.
    fn forward_deadline(&self, started: Instant, deadline: Duration) -> Duration {
        FORWARD_ATTEMPT
            .min(deadline.saturating_sub(started.elapsed()))
            .max(Duration::from_millis(1))
    }

    /// Forwards to leader `id`, giving up as soon as this peer sees that
    /// `id` no longer leads (it voted in an election, or learned of a new
    /// leader): a paused leader holds the request until the deadline
    /// otherwise, while the new one is already taking writes.
    async fn forward_while_leading(
        &self,
        id: u64,
        node: &PeerNode,
        request: &ForwardRequest,
        deadline: Duration,
    ) -> Result<ForwardResponse, Undelivered> {
        let mut metrics = self.inner.raft.metrics();
        let deposed = async move {
            loop {
                if metrics.borrow_watched().current_leader != Some(id) {
                    return;
                }
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            answer = self.forward_to(node, request, deadline) => answer,
            () = deposed => Err(Undelivered::Maybe(format!(
                "peer {id} stopped leading before it answered"
            ))),
        }
    }

    async fn forward_to(
        &self,
        node: &PeerNode,
        request: &ForwardRequest,
        deadline: Duration,
    ) -> Result<ForwardResponse, Undelivered> {
        let mut client = self
            .inner
            .peers
            .client(&node.grpc)
            .map_err(Undelivered::Certainly)?;
        let payload = RaftPayload {
            data: network::encode(request),
            error: String::new(),
        };
        let answer = network::with_deadline(
            deadline,
            client.forward(self.inner.peers.request(payload, deadline)),
        )
        .await
        .and_then(network::decode::<ForwardResponse>);
        if let Err(Failure::Unreachable(_) | Failure::Refused(_)) = &answer {
            self.inner.peers.forget(&node.grpc);
        }
        answer.map_err(|failure| match failure {
            Failure::Skipped(why) | Failure::Refused(why) => Undelivered::Certainly(why),
            Failure::Unreachable(why) | Failure::Network(why) => Undelivered::Maybe(why),
            Failure::Timeout => Undelivered::Maybe(format!("no answer within {deadline:?}")),
        })
    }

    /// Serves a request on this peer, which must be the leader.
    pub(crate) async fn handle_forwarded(&self, request: ForwardRequest) -> ForwardResponse {
        self.handle_locally(request).await
    }

    async fn handle_locally(&self, request: ForwardRequest) -> ForwardResponse {
        let raft = &self.inner.raft;
        match request {
            // The leader refuses a write its own disk may not hold, even
            // when the peer that took it has room.
            ForwardRequest::Write(command) => {
                // The leader's own decisions (liveness verdicts, placements)
                // may use the first half of the reserve, so that a cluster
                // whose every disk is low still tells dead nodes from live
                // ones; the other half is Raft's own.
                let room = match *command {
                    Command::Decided { .. } => self.inner.disk.check_decision(),
                    _ => self.inner.disk.check(),
                };
                if let Err(error) = room {
                    return error.into();
                }
                // An entry past the bound could make an append larger than
                // the peer transport carries: it would never replicate, and
                // every write after it would wait on it.
                let bytes = entry_bytes(&command);
                if bytes > MAX_ENTRY_BYTES {
                    return ControlError::Invalid(format!(
                        "{command} would be a log entry of {bytes} bytes, over the bound of \
                         {MAX_ENTRY_BYTES} bytes; nothing was written"
                    ))
                    .into();
                }
                // A leader cut off right after appending (its lease still
                // live) never hears a majority again and would hold the
                // write, and the loop that proposed it, until it is
                // deposed, which may be never.
                match tokio::time::timeout(COMMIT_DEADLINE, raft.client_write(*command)).await {
                    Ok(Ok(response)) => ForwardResponse::Written {
                        outcome: response.data,
                        log_index: response.log_id.index,
                    },
                    Ok(Err(error)) => write_error(error),
                    Err(_) => ForwardResponse::Failed(ForwardFailure::Ambiguous(format!(
                        "peer {} took the write but no majority acknowledged it within \
                         {COMMIT_DEADLINE:?}; it may still commit, or be lost with this \
                         leadership",
                        self.inner.id
                    ))),
                }
            }
            ForwardRequest::ReadIndex => {
                match raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
                    // Never below this leader's own last log entry: a
                    // leader that restarts resumes its term (openraft's
                    // leader restore) with the committed index it persisted
                    // without sync, which a power cut can set back, and
                    // openraft's read index is then below writes it had
                    // acknowledged. Every entry in its log is its own term's
                    // or older and will commit while it leads, so waiting
                    // for it is safe, and costs a read at most the entries
                    // in flight.
                    Ok(read_log_id) => ForwardResponse::ReadIndex(
                        read_log_id
                            .index()
                            .max(self.metrics().last_log_index.unwrap_or(0)),
                    ),
                    Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
                        ForwardResponse::NotLeader {
                            leader: forward.leader_id.zip(forward.leader_node),
                        }
                    }
                    Err(RaftError::APIError(other)) => {
                        ForwardResponse::Failed(ForwardFailure::NoLeader(other.to_string()))
                    }
                    Err(RaftError::Fatal(fatal)) => {
                        ForwardResponse::Failed(ForwardFailure::Fatal(fatal.to_string()))
                    }
                }
            }
            ForwardRequest::AddPeer { id, node } => self.add_peer_as_leader(id, node).await,
            ForwardRequest::RemovePeer { id } => self.remove_peer_as_leader(id).await,
        }
    }

    async fn add_peer_as_leader(&self, id: u64, node: PeerNode) -> ForwardResponse {
        // One membership change at a time: openraft refuses overlapping
        // joint configurations, and an operator expects them in order.
        let _serial = self.inner.membership_lock.lock().await;
        if !self.inner.raft.is_leader() {
            return ForwardResponse::NotLeader { leader: None };
        }
        if self.read(|fleet| fleet.removed_peers.contains(&id)) {
            return ControlError::Invalid(format!(
                "peer id {id} was removed from this cluster before and is never reused; \
                 give the new peer a fresh id"
            ))
            .into();
        }
        let metrics = self.metrics();
        let membership = metrics.membership_config.membership();
        if membership.voter_ids().any(|voter| voter == id) {
            return ControlError::Conflict(format!("peer {id} is already a voter")).into();
        }
        let raft = &self.inner.raft;
        let learner =
            self.within_commit_deadline("adding it as a learner", raft.add_learner(id, node, true));
        match learner.await {
            Err(timed_out) => return timed_out,
            Ok(Err(error)) => return write_error(error),
            Ok(Ok(_)) => {}
        }
        let voter = raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false);
        match self
            .within_commit_deadline("making it a voter", voter)
            .await
        {
            Err(timed_out) => timed_out,
            Ok(Ok(_)) => ForwardResponse::PeerChanged,
            Ok(Err(error)) => write_error(error),
        }
    }

    /// `change` (a membership step), answered as an unknown outcome when
    /// no majority acknowledges it within the commit deadline: a leader
    /// cut off after appending it would otherwise hold the request, and
    /// every membership change after it, until it is deposed.
    async fn within_commit_deadline<T>(
        &self,
        step: &str,
        change: impl std::future::Future<Output = T>,
    ) -> Result<T, ForwardResponse> {
        tokio::time::timeout(COMMIT_DEADLINE, change)
            .await
            .map_err(|_| {
                ForwardResponse::Failed(ForwardFailure::Ambiguous(format!(
                    "peer {} began {step} but no majority acknowledged it within \
                     {COMMIT_DEADLINE:?}; it may still complete: ask again, and the change goes \
                     on from where it stands",
                    self.inner.id
                )))
            })
    }

    async fn remove_peer_as_leader(&self, id: u64) -> ForwardResponse {
        let _serial = self.inner.membership_lock.lock().await;
        if !self.inner.raft.is_leader() {
            return ForwardResponse::NotLeader { leader: None };
        }
        let metrics = self.metrics();
        let membership = metrics.membership_config.membership();
        let is_voter = membership.voter_ids().any(|voter| voter == id);
        let is_learner = membership.learner_ids().any(|learner| learner == id);
        let retired = self.read(|fleet| fleet.removed_peers.contains(&id));
        if !is_voter && !is_learner {
            // Removing the leader itself ends its leadership once the new
            // membership commits; the request then lands here, on the
            // next leader, and is already done.
            if retired {
                return ForwardResponse::PeerChanged;
            }
            return ControlError::Invalid(format!("peer {id} is not a member of the cluster"))
                .into();
        }
        if is_voter && membership.voter_ids().count() <= 1 {
            return ControlError::Conflict(format!("peer {id} is the last voter")).into();
        }
        // Retired first: a peer that leaves the membership has left for
        // good, and a retry after any failure below finds the id retired
        // and carries on (or is done).
        if !retired {
            let retire = Command::RetirePeer {
                peer: id,
                at_ms: now_ms(),
            };
            let retiring = self.inner.raft.client_write(retire);
            match self
                .within_commit_deadline("retiring the id", retiring)
                .await
            {
                Err(timed_out) => return timed_out,
                Ok(Err(error)) => return write_error(error),
                Ok(Ok(_)) => {}
            }
        }
        let change = if is_voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        let removing = self.inner.raft.change_membership(change, false);
        match self.within_commit_deadline("removing it", removing).await {
            Err(timed_out) => timed_out,
            Ok(Ok(_)) => ForwardResponse::PeerChanged,
            Ok(Err(error)) => write_error(error),
        }
    }

    /// This peer's own status.
    pub fn local_status(&self) -> PeerStatus {
        let mut status = self.status_without_hash();
        status.state_hash = self.state_hash().to_string();
        status
    }

    /// The state hash, cached per applied entry: at thousands of nodes it
    /// takes tens of milliseconds, under the state's read lock.
    fn state_hash(&self) -> StateHash {
        let applied = self.inner.applied.read().expect("state lock poisoned");
        let mut cached = self.inner.state_hash.lock().expect("hash lock poisoned");
        match cached.as_ref() {
            Some((at, hash)) if *at == applied.last_applied => *hash,
            _ => {
                let hash = applied.fleet.hash();
                *cached = Some((applied.last_applied, hash));
                hash
            }
        }
    }

    /// This peer's own status with an empty state hash: what a peer
    /// keeping its link open is answered (see `links.rs`).
    pub(crate) fn status_without_hash(&self) -> PeerStatus {
        let metrics = self.metrics();
        let initialized = metrics.last_log_index.is_some()
            || metrics
                .membership_config
                .membership()
                .voter_ids()
                .next()
                .is_some();
        PeerStatus {
            id: self.inner.id,
            initialized: initialized || !self.inner.pristine_at_start,
            role: role_of(metrics.state),
            term: metrics.current_term,
            leader_id: metrics.current_leader,
            last_log_index: metrics.last_log_index,
            last_applied_index: metrics.last_applied.as_ref().map(|id| id.index),
            commit_index: metrics.local_committed.as_ref().map(|id| id.index),
            state_hash: String::new(),
            disk_low: self.inner.disk.check().is_err(),
            cluster_id: self.cluster_id().map(str::to_owned),
            epochs: true,
        }
    }

    /// The members (voters and learners) other than this peer whose status
    /// does not pass `check`, or that did not answer, each with why.
    pub async fn members_failing(
        &self,
        what: &str,
        check: impl Fn(&PeerStatus) -> bool,
    ) -> Vec<String> {
        let members: Vec<(u64, PeerNode)> = self
            .metrics()
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != self.inner.id)
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        let mut failing = Vec::new();
        for (id, node) in members {
            match self.remote_status(&node).await {
                Ok(status) if check(&status) => {}
                Ok(_) => failing.push(format!("peer {id} {what}")),
                Err(why) => failing.push(format!("peer {id} did not answer ({why})")),
            }
        }
        failing
    }

    /// Asks one peer for its status, under a short deadline.
    pub(crate) async fn remote_status(&self, node: &PeerNode) -> Result<PeerStatus, String> {
        crate::status::ask_status(&self.inner.peers, &node.grpc).await
    }

    /// Every member's status as this peer can see it right now.
    pub async fn cluster_view(&self) -> Vec<PeerView> {
        let metrics = self.metrics();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let mut members: BTreeMap<u64, PeerNode> = membership
            .nodes()
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        if members.is_empty() {
            members.clone_from(&self.inner.configured);
        }
        let asks = members.into_iter().map(|(id, node)| {
            let voters = &voters;
            async move {
                let status = if id == self.inner.id {
                    Ok(self.local_status())
                } else {
                    self.remote_status(&node).await
                };
                let membership = if voters.contains(&id) || voters.is_empty() {
                    Membership::Voter
                } else {
                    Membership::Learner
                };
                match status {
                    Ok(status) => PeerView {
                        id,
                        addr: node.grpc.clone(),
                        admin: node.admin.clone(),
                        membership,
                        role: status.role,
                        term: Some(status.term),
                        last_log_index: status.last_log_index,
                        last_applied_index: status.last_applied_index,
                        state_hash: Some(status.state_hash),
                        error: None,
                    },
                    Err(why) => PeerView {
                        id,
                        addr: node.grpc.clone(),
                        admin: node.admin.clone(),
                        membership,
                        role: PeerRole::Unreachable,
                        term: None,
                        last_log_index: None,
                        last_applied_index: None,
                        state_hash: None,
                        error: Some(why),
                    },
                }
            }
        });
        futures::future::join_all(asks).await
    }

    pub fn settings(&self) -> &RaftSettings {
        &self.inner.settings
    }

    /// Stops the Raft node.
    pub async fn shutdown(&self) {
        if let Err(error) = self.inner.raft.shutdown().await {
            tracing::warn!(%error, "Raft shutdown");
        }
    }
}

/// Why a forwarded request got no answer, and whether the leader may have
/// acted on it anyway.
enum Undelivered {
    /// The request never left this peer (no connection could be made).
    Certainly(String),
    /// The connection broke or timed out after the request was sent.
    Maybe(String),
}

fn unexpected(response: ForwardResponse) -> ControlError {
    ControlError::Fatal(format!("unexpected answer from the leader: {response:?}"))
}

fn write_error(error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ForwardResponse {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            ForwardResponse::NotLeader {
                leader: forward.leader_id.zip(forward.leader_node),
            }
        }
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(forward)) => {
            ForwardResponse::Failed(ForwardFailure::Ambiguous(forward.to_string()))
        }
        RaftError::APIError(other) => {
            ForwardResponse::Failed(ForwardFailure::Conflict(other.to_string()))
        }
        RaftError::Fatal(fatal) => {
            ForwardResponse::Failed(ForwardFailure::Fatal(fatal.to_string()))
        }
    }
}

pub(crate) fn role_of(state: ServerState) -> PeerRole {
    match state {
        ServerState::Leader => PeerRole::Leader,
        ServerState::Follower => PeerRole::Follower,
        ServerState::Candidate => PeerRole::Candidate,
        ServerState::Learner => PeerRole::Learner,
        ServerState::Shutdown => PeerRole::Shutdown,
    }
}

/// Wall-clock milliseconds, for the `at_ms` of commands proposed here.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn spawn_leader_watch(raft: LlmgwRaft, counters: Arc<RaftCounters>) {
    tokio::spawn(async move {
        let mut metrics = raft.metrics();
        let mut last: Option<u64> = None;
        loop {
            let leader = metrics.borrow_watched().current_leader;
            if leader.is_some() && leader != last {
                counters.leader_changed();
                tracing::info!(leader = ?leader, "Raft leader changed");
            }
            if leader.is_some() {
                last = leader;
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
}
