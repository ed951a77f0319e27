//! The control-plane stream, from the agent's side: dial any peer, follow a
//! redirect to the leader at once, otherwise try the next peer after a
//! full-jitter backoff, forever. Up go registration, heartbeats, shard
//! statuses and command acks; down come commands, each fenced by the
//! leader's term.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use llmgw_config::AgentConfig;
use llmgw_discovery::Inventory;
use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_client::AgentServiceClient;
use llmgw_proto::agent::control_message::Body as Down;
use llmgw_proto::agent::{
    AgentMessage, CommandAck, ControlMessage, Heartbeat, Registered, ShardStatus,
};
use rand::Rng;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::fencing::{Leadership, TermCheck, TermStore};
use crate::register;
use crate::report::unix_ms;
use crate::spec::LaunchSpec;
use crate::supervisor::Supervisor;
use crate::witness::Witness;

/// Redirects followed back to back before backing off, so two peers that
/// name each other cannot spin the agent.
const MAX_REDIRECTS: u32 = 3;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Added to `leader_timeout` for the registration answer, which may wait
/// on a Raft commit.
const REGISTER_SLACK: Duration = Duration::from_secs(3);
/// A refused registration waits the longest backoff (`reconnect_max`).
const REFUSED_ATTEMPT: u32 = 20;

/// Why a session with one peer ended.
#[derive(Debug)]
enum SessionEnd {
    Redirect {
        leader: String,
        reason: String,
    },
    Lost {
        why: String,
        was_registered: bool,
    },
    /// The peer said nothing for `leader_timeout`: paused, cut off, or no
    /// longer leading. The agent asks the other peers first.
    Silent {
        why: String,
    },
    /// The leader refused this agent's registration because another
    /// machine holds the node id, or the leader is of another cluster than
    /// the one this agent joined: an operator must fix the config, so the
    /// agent says so loudly and retries at the longest backoff.
    Refused {
        why: String,
    },
}

/// A peer that went silent, not dialled first from the list until
/// `until`. A redirect to it is still followed: after a blip the others
/// name the healthy leader again at once, and a paused one is replaced by
/// an election well within `leader_timeout`.
struct Avoid {
    addr: String,
    until: Instant,
}

impl Avoid {
    fn covers(avoid: &Option<Avoid>, addr: &str) -> bool {
        avoid
            .as_ref()
            .is_some_and(|a| same_peer(&a.addr, addr) && Instant::now() < a.until)
    }
}

/// Whether two spellings name one peer: config lists may carry a scheme
/// (`https://host:port`), redirects name the bare `host:port`.
fn same_peer(a: &str, b: &str) -> bool {
    fn bare(addr: &str) -> &str {
        let addr = addr
            .strip_prefix("https://")
            .or_else(|| addr.strip_prefix("http://"))
            .unwrap_or(addr);
        addr.trim_end_matches('/')
    }
    bare(a) == bare(b)
}

pub struct StreamClient {
    pub config: AgentConfig,
    pub inventory: Inventory,
    pub supervisor: Supervisor,
    pub terms: TermStore,
    pub statuses: mpsc::UnboundedReceiver<ShardStatus>,
    /// Statuses taken from the supervisor but not yet sent.
    unsent: VecDeque<ShardStatus>,
    heartbeat_interval: Duration,
    /// mTLS material (reloaded when its files change); `None` with
    /// `insecure: true`.
    tls: Option<llmgw_tls::Tls>,
    /// Every command acted on or refused, with its leadership.
    witness: Witness,
    /// Commands refused because their leader had been deposed.
    refused_stale: u64,
    /// Tells the leader this machine from another with the same node id.
    instance_id: String,
}

/// Full jitter: uniform in [0, min(max, base * 2^attempt)], at least base/10
/// so that a fleet never reconnects in a tight loop.
pub fn backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    let cap = base
        .checked_mul(1u32 << attempt.min(20))
        .unwrap_or(max)
        .min(max);
    let floor = base / 10;
    let pick = rand::rng().random_range(0.0..=1.0);
    cap.mul_f64(pick).max(floor)
}

/// The pause before asking the next peer: up to a tenth of the base,
/// jittered so that a fleet does not move in step.
pub fn next_peer_pause(base: Duration) -> Duration {
    (base / 10).mul_f64(rand::rng().random_range(0.0..=1.0))
}

impl StreamClient {
    pub fn new(
        config: AgentConfig,
        inventory: Inventory,
        supervisor: Supervisor,
        terms: TermStore,
        statuses: mpsc::UnboundedReceiver<ShardStatus>,
    ) -> Self {
        let heartbeat_interval = config.heartbeat_interval;
        let witness = Witness::open(&config.supervisor.work_dir);
        let instance_id = crate::instance::load_or_create(&config.supervisor.work_dir);
        StreamClient {
            config,
            inventory,
            supervisor,
            terms,
            statuses,
            unsent: VecDeque::new(),
            heartbeat_interval,
            tls: None,
            witness,
            refused_stale: 0,
            instance_id,
        }
    }

    /// Dials with mTLS from `tls`; without it the stream is plaintext.
    pub fn with_tls(mut self, tls: Option<llmgw_tls::Tls>) -> Self {
        self.tls = tls;
        self
    }

    /// How long the peer may stay silent before the agent leaves it.
    fn leader_timeout(&self) -> Duration {
        self.config
            .leader_timeout
            .unwrap_or_else(|| (self.heartbeat_interval * 2).max(Duration::from_secs(2)))
    }

    /// Runs forever.
    pub async fn run(mut self) {
        let peers = self.config.servers.clone();
        let mut next_peer = 0usize;
        let mut redirect: Option<String> = None;
        let mut redirects = 0u32;
        let mut attempt = 0u32;
        let mut avoid: Option<Avoid> = None;
        // Peers that failed or knew no leader since the last backoff.
        let mut failed_peers = 0usize;
        loop {
            let via_redirect = redirect.is_some();
            let target = match redirect.take() {
                Some(leader) => leader,
                None => {
                    let mut peer = peers[next_peer % peers.len()].clone();
                    next_peer += 1;
                    if peers.len() > 1 && Avoid::covers(&avoid, &peer) {
                        peer = peers[next_peer % peers.len()].clone();
                        next_peer += 1;
                    }
                    peer
                }
            };
            let mut escalate = true;
            let mut ask_next = !via_redirect;
            match self.session(&target).await {
                SessionEnd::Redirect { leader, reason } if !leader.is_empty() => {
                    tracing::info!(peer = %target, %leader, %reason, "redirected to the leader");
                    redirects += 1;
                    if redirects <= MAX_REDIRECTS {
                        redirect = Some(leader);
                        continue;
                    }
                    tracing::warn!(%leader, "too many redirects in a row; backing off");
                }
                SessionEnd::Redirect { reason, .. } => {
                    tracing::info!(peer = %target, %reason, "peer knows no leader; trying the next peer");
                }
                SessionEnd::Lost {
                    why,
                    was_registered,
                } => {
                    tracing::warn!(
                        peer = %target,
                        %why,
                        "{}",
                        llmgw_runtime::log_events::CONTROL_PLANE_STREAM_LOST
                    );
                    if was_registered {
                        // A stream that worked: back off a little before
                        // dialing again, as the whole fleet does now.
                        attempt = 0;
                        failed_peers = 0;
                        ask_next = false;
                    } else if via_redirect {
                        // The leader a peer named does not answer: it has
                        // most likely just died, and the peers name its
                        // successor within an election. Not another failed
                        // try: ask them again without a longer backoff.
                        avoid = Some(Avoid {
                            addr: target.clone(),
                            until: Instant::now() + self.leader_timeout(),
                        });
                        escalate = false;
                    }
                }
                SessionEnd::Refused { why } => {
                    tracing::error!(peer = %target, %why, "registration refused (by the leader, or of the leader); retrying at the longest backoff");
                    ask_next = false;
                    attempt = attempt.max(REFUSED_ATTEMPT);
                }
                SessionEnd::Silent { why } => {
                    tracing::warn!(
                        peer = %target,
                        %why,
                        "{}",
                        llmgw_runtime::log_events::CONTROL_PLANE_PEER_SILENT
                    );
                    avoid = Some(Avoid {
                        addr: target.clone(),
                        until: Instant::now() + self.leader_timeout(),
                    });
                    // Straight to the next peer: the node's grace period on
                    // the new leader is running.
                    redirects = 0;
                    attempt = 0;
                    continue;
                }
            }
            redirects = 0;
            if ask_next {
                failed_peers += 1;
                if failed_peers < peers.len() {
                    // One peer down, or one that knows no leader yet, is no
                    // reason to wait: the next is asked after a moment. The
                    // backoff grows once every peer has been asked.
                    tokio::time::sleep(next_peer_pause(self.config.reconnect_base)).await;
                    continue;
                }
            }
            failed_peers = 0;
            let wait = backoff(
                self.config.reconnect_base,
                self.config.reconnect_max,
                attempt,
            );
            if escalate {
                attempt = attempt.saturating_add(1);
            }
            tokio::time::sleep(wait).await;
        }
    }

    async fn channel(&self, addr: &str) -> Result<Channel, String> {
        let endpoint = llmgw_tls::endpoint(addr)?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10));
        llmgw_tls::connect(&endpoint, self.tls.as_ref())
            .await
            .map_err(|e| format!("connect {addr}: {}", error_chain(&e)))
    }

    /// Connects, sends the registration and opens the stream.
    async fn open_stream(
        &mut self,
        addr: &str,
    ) -> Result<(mpsc::Sender<AgentMessage>, tonic::Streaming<ControlMessage>), SessionEnd> {
        let lost = |why: String| SessionEnd::Lost {
            why,
            was_registered: false,
        };
        // A paused peer accepts TCP connections in its kernel and then
        // never answers: every step up to the stream is bounded.
        let setup_limit = self.leader_timeout();
        let channel = match tokio::time::timeout(setup_limit, self.channel(addr)).await {
            Ok(Ok(c)) => c,
            Ok(Err(why)) => return Err(lost(why)),
            Err(_) => {
                return Err(SessionEnd::Silent {
                    why: format!("{addr} did not complete a connection within {setup_limit:?}"),
                });
            }
        };
        let (tx, rx) = mpsc::channel::<AgentMessage>(1024);
        let register = register::register(
            &self.config,
            &self.inventory,
            self.supervisor.running(),
            &self.terms,
            &self.instance_id,
        );
        let _ = tx.try_send(AgentMessage {
            body: Some(Up::Register(register)),
        });
        let mut client = AgentServiceClient::new(channel);
        // Registration may wait for a Raft write; give it the same bound
        // plus the time a commit can take on a busy leader.
        let register_limit = setup_limit + REGISTER_SLACK;
        let inbound =
            match tokio::time::timeout(register_limit, client.connect(ReceiverStream::new(rx)))
                .await
            {
                Ok(Ok(r)) => r.into_inner(),
                // Another machine holds the node id, or the leader is of
                // another cluster than the one this agent joined.
                Ok(Err(status))
                    if matches!(
                        status.code(),
                        tonic::Code::AlreadyExists | tonic::Code::FailedPrecondition
                    ) =>
                {
                    return Err(SessionEnd::Refused {
                        why: format!("{addr}: {}", status.message()),
                    });
                }
                Ok(Err(status)) => {
                    return Err(lost(format!("{addr} refused the stream: {status}")));
                }
                Err(_) => {
                    return Err(SessionEnd::Silent {
                        why: format!(
                            "{addr} did not answer the registration within {register_limit:?}"
                        ),
                    });
                }
            };
        Ok((tx, inbound))
    }

    async fn session(&mut self, addr: &str) -> SessionEnd {
        let (tx, mut inbound) = match self.open_stream(addr).await {
            Ok(stream) => stream,
            Err(end) => return end,
        };
        tracing::info!(
            peer = %addr,
            node = %self.config.node_id,
            "{}",
            llmgw_runtime::log_events::AGENT_REGISTERED
        );
        let mut seq = 0u64;
        let mut heartbeat = tokio::time::interval(self.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut registered = false;
        let mut last_heard = Instant::now();
        loop {
            let silence_limit = self.leader_timeout();
            // Statuses from an earlier session go first, in order.
            while let Some(status) = self.unsent.pop_front() {
                if let Err(e) = tx.try_send(up_status(status)) {
                    if let Some(Up::ShardStatus(s)) = e.into_inner().body {
                        self.unsent.push_front(s);
                    }
                    break;
                }
            }
            tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(message)) => {
                        last_heard = Instant::now();
                        match self.handle(message, &tx) {
                            Some(end) => {
                                // An ack (a refusal) may be the last word:
                                // let it reach the transport first.
                                flush(&tx).await;
                                return end;
                            }
                            None => registered = true,
                        }
                        if self.heartbeat_interval != heartbeat.period() {
                            heartbeat = tokio::time::interval(self.heartbeat_interval);
                        }
                    }
                    Ok(None) => return SessionEnd::Lost { why: format!("{addr} closed the stream"), was_registered: registered },
                    Err(status) => return SessionEnd::Lost { why: format!("{addr}: {status}"), was_registered: registered },
                },
                _ = heartbeat.tick() => {
                    seq += 1;
                    let survivor_gpus = self.supervisor.survivor_gpus();
                    let beat = AgentMessage { body: Some(Up::Heartbeat(Heartbeat { seq, sent_unix_ms: unix_ms(), survivor_gpus })) };
                    // Never wait on a stuck stream here: the silence check
                    // below must keep running.
                    match tx.try_send(beat) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            tracing::warn!(peer = %addr, "the stream is not draining; heartbeat skipped");
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            return SessionEnd::Lost { why: "stream closed".into(), was_registered: registered };
                        }
                    }
                }
                _ = tokio::time::sleep_until((last_heard + silence_limit).into()) => {
                    return SessionEnd::Silent {
                        why: format!("{addr} sent nothing for {:.1}s (leader_timeout {silence_limit:?})", last_heard.elapsed().as_secs_f64()),
                    };
                }
                Some(status) = self.statuses.recv() => queue_status(&mut self.unsent, status),
            }
        }
    }

    /// Acts on one message; `Some` ends the session.
    fn handle(
        &mut self,
        message: ControlMessage,
        tx: &mpsc::Sender<AgentMessage>,
    ) -> Option<SessionEnd> {
        let body = message.body?;
        if let Down::Redirect(r) = body {
            return Some(SessionEnd::Redirect {
                leader: r.leader_addr,
                reason: r.reason,
            });
        }
        let leadership = Leadership {
            epoch: message.epoch,
            term: message.term,
            leader: message.leader_id,
        };
        if let Down::HeartbeatAck(_) = body {
            return match self.terms.check(leadership) {
                Ok(TermCheck::Stale { command, highest }) => Some(SessionEnd::Lost {
                    why: format!(
                        "the peer answers for leader {command}, but {highest} has been seen: it was deposed"
                    ),
                    was_registered: true,
                }),
                _ => None,
            };
        }
        let id = message.command_id;
        let ack = |accepted: bool, text: String| send_ack(tx, id, accepted, text);
        if let Err(end) = self.fence(id, leadership, &body, &ack) {
            return end;
        }
        // After the fence: a deposed leader's `Registered` joins nothing.
        if let Down::Registered(registered) = &body
            && let Err(why) = self.join(&registered.cluster_id)
        {
            return Some(SessionEnd::Refused { why });
        }
        let term = message.term;
        if !matches!(body, Down::Registered(_)) {
            self.witness
                .record(leadership, body_kind(&body), body_shard(&body), true);
        }
        match body {
            Down::Redirect(_) => unreachable!("handled above"),
            Down::HeartbeatAck(_) => unreachable!("handled above"),
            Down::Registered(registered) => self.reconcile(registered, leadership),
            Down::Start(start) => {
                let asleep = start.spec.as_ref().is_some_and(|s| s.asleep);
                let outcome = match start.spec.as_ref().map(LaunchSpec::from_proto) {
                    Some(Ok(spec)) => self.supervisor.start(spec, asleep, term),
                    Some(Err(e)) => crate::supervisor::Outcome {
                        accepted: false,
                        message: format!("refused: {e}"),
                    },
                    None => crate::supervisor::Outcome {
                        accepted: false,
                        message: "refused: StartShard without a spec".into(),
                    },
                };
                ack(outcome.accepted, outcome.message);
            }
            Down::Stop(stop) => {
                let o = self.supervisor.stop(&stop.shard_id, &stop.reason);
                ack(o.accepted, o.message);
            }
            Down::Drain(drain) => {
                let o = self.supervisor.drain(
                    &drain.shard_id,
                    Duration::from_millis(drain.deadline_ms),
                    &drain.reason,
                );
                ack(o.accepted, o.message);
            }
        }
        None
    }

    /// Fences a command on the leadership it carries: `Ok` when it is the
    /// newest seen (persisted first), else `Err` with whether the session
    /// ends. A refused command is acked as refused and witnessed.
    fn fence(
        &mut self,
        id: u64,
        leadership: Leadership,
        body: &Down,
        ack: &impl Fn(bool, String),
    ) -> Result<(), Option<SessionEnd>> {
        match self.terms.check(leadership) {
            Ok(TermCheck::Current) => Ok(()),
            Ok(TermCheck::Stale { command, highest }) => {
                self.refused_stale += 1;
                self.witness
                    .record(command, body_kind(body), body_shard(body), false);
                let text = format!(
                    "refused: command {id} carries leader {command}, but this agent has already seen {highest}"
                );
                tracing::warn!(
                    command_id = id,
                    epoch = command.epoch,
                    term = command.term,
                    leader = command.leader,
                    highest_epoch = highest.epoch,
                    highest_term = highest.term,
                    highest_leader = highest.leader,
                    refused_total = self.refused_stale,
                    "{text}"
                );
                ack(false, text);
                // A deposed leader has nothing more to say to this node.
                Err(Some(SessionEnd::Lost {
                    why: format!(
                        "the peer sent a command as leader {command}, deposed by {highest}; leaving it"
                    ),
                    was_registered: true,
                }))
            }
            Err(e) => {
                let text = format!("refused: cannot persist leader {leadership}: {e}");
                tracing::error!("{text}");
                ack(false, text);
                Err(None)
            }
        }
    }

    /// Takes the cluster a leader names in `Registered`: the one this agent
    /// joined (or the first it hears of). Another is refused with the
    /// reason, which ends the session.
    fn join(&mut self, cluster: &str) -> Result<(), String> {
        let why = match self.terms.join(cluster) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(why)) => why,
            Err(e) => format!("cannot record cluster {cluster}: {e}"),
        };
        Err(why)
    }

    /// `Registered` names every shard this node should run: start what is
    /// missing (idempotent for adopted ones), keep draining what drains
    /// (a reconnect never cuts a drain short), leave alone what the leader
    /// cannot judge, stop the rest.
    fn reconcile(&mut self, registered: Registered, leadership: Leadership) {
        let term = leadership.term;
        if registered.heartbeat_interval_ms > 0 {
            self.heartbeat_interval = Duration::from_millis(registered.heartbeat_interval_ms);
        }
        // First, so that what is sent again below is numbered above what
        // the control plane already holds.
        for (shard_id, applied) in &registered.report_seqs {
            self.supervisor.raise_report_floor(shard_id, *applied);
        }
        let mut wanted = Vec::new();
        for wire in &registered.shards {
            match LaunchSpec::from_proto(wire) {
                Ok(spec) => {
                    wanted.push(spec.shard_id.clone());
                    self.witness
                        .record(leadership, "start", &spec.shard_id, true);
                    let outcome = self.supervisor.start(spec, wire.asleep, term);
                    tracing::info!(accepted = outcome.accepted, "{}", outcome.message);
                }
                Err(e) => tracing::warn!("registered shard refused: {e}"),
            }
        }
        for drain in &registered.drains {
            self.witness
                .record(leadership, "drain", &drain.shard_id, true);
            let outcome = self.supervisor.drain(
                &drain.shard_id,
                Duration::from_millis(drain.deadline_ms),
                &drain.reason,
            );
            tracing::info!(accepted = outcome.accepted, "{}", outcome.message);
            wanted.push(drain.shard_id.clone());
        }
        // Shards whose model this leader cannot read: left as they run.
        wanted.extend(registered.keep.iter().cloned());
        for running in self.supervisor.running() {
            if !wanted.contains(&running.shard_id) {
                self.witness
                    .record(leadership, "stop", &running.shard_id, true);
                self.supervisor
                    .stop(&running.shard_id, "not assigned to this node by the leader");
            }
        }
    }
}

/// Queues a status for the leader, replacing one of the same shard not yet
/// sent: the leader keeps only a shard's latest state, and a node cut off
/// for hours must not pile up every transition it went through.
fn queue_status(unsent: &mut VecDeque<ShardStatus>, status: ShardStatus) {
    match unsent.iter_mut().find(|s| s.shard_id == status.shard_id) {
        Some(older) => *older = status,
        None => unsent.push_back(status),
    }
}

/// Waits (at most a second) until the transport has taken everything
/// queued on the stream.
async fn flush(tx: &mpsc::Sender<AgentMessage>) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while tx.capacity() < tx.max_capacity() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The command's kind as the witness records it.
fn body_kind(body: &Down) -> &'static str {
    match body {
        Down::Registered(_) => "registered",
        Down::Start(_) => "start",
        Down::Stop(_) => "stop",
        Down::Drain(_) => "drain",
        Down::Redirect(_) => "redirect",
        Down::HeartbeatAck(_) => "heartbeat_ack",
    }
}

/// The shard a command names; empty for `Registered`.
fn body_shard(body: &Down) -> &str {
    match body {
        Down::Start(start) => start
            .spec
            .as_ref()
            .map_or("", |spec| spec.shard_id.as_str()),
        Down::Stop(stop) => &stop.shard_id,
        Down::Drain(drain) => &drain.shard_id,
        _ => "",
    }
}

/// An error with its causes, since transport errors say little on their own.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Answers command `command_id`; a full or closed stream drops the ack
/// (the leader re-sends what it still wants).
fn send_ack(tx: &mpsc::Sender<AgentMessage>, command_id: u64, accepted: bool, message: String) {
    let _ = tx.try_send(AgentMessage {
        body: Some(Up::Ack(CommandAck {
            command_id,
            accepted,
            message,
        })),
    });
}

fn up_status(status: ShardStatus) -> AgentMessage {
    AgentMessage {
        body: Some(Up::ShardStatus(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_the_same_with_or_without_a_scheme() {
        assert!(same_peer("https://10.0.0.1:7443", "10.0.0.1:7443"));
        assert!(same_peer("http://10.0.0.1:7443/", "10.0.0.1:7443"));
        assert!(!same_peer("10.0.0.1:7443", "10.0.0.2:7443"));
    }

    #[test]
    fn backoff_stays_within_base_tenth_and_cap() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(3);
        for attempt in 0..40 {
            let d = backoff(base, max, attempt);
            assert!(d >= base / 10 && d <= max, "{attempt}: {d:?}");
        }
        assert!(backoff(base, max, 0) <= base);
    }

    #[test]
    fn queued_statuses_keep_the_latest_of_each_shard_in_first_seen_order() {
        use llmgw_proto::agent::ShardState;
        let status = |shard: &str, state: ShardState| ShardStatus {
            shard_id: shard.into(),
            state: state as i32,
            ..Default::default()
        };
        let mut unsent = VecDeque::new();
        for (shard, state) in [
            ("a", ShardState::Starting),
            ("b", ShardState::Starting),
            ("a", ShardState::Loading),
            ("a", ShardState::Ready),
            ("b", ShardState::Failed),
        ] {
            queue_status(&mut unsent, status(shard, state));
        }
        let queued: Vec<(&str, i32)> = unsent
            .iter()
            .map(|s| (s.shard_id.as_str(), s.state))
            .collect();
        assert_eq!(
            queued,
            [
                ("a", ShardState::Ready as i32),
                ("b", ShardState::Failed as i32)
            ]
        );
    }
}
