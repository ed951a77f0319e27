//! The leader's live connections to agents: one session per node, the
//! commands already sent on it, heartbeats and refusals. Nothing here is
//! replicated; a new leader starts with no sessions and every agent
//! reconnects to it.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use llmgw_api::{LinkView, Refusal};
use llmgw_proto::agent::control_message::Body;
use llmgw_proto::agent::{
    ControlMessage, DrainShard, HeartbeatAck, Registered, ShardSpec, StartShard, StopShard,
};
use llmgw_reconcile::{Desired, Order};
use prost::Message;
use tokio::sync::mpsc;
use tonic::Status;

const REFUSALS_KEPT: usize = 10;
const REFUSAL_BYTES: usize = 1024;
/// More GPUs than any node has: the rest of a longer list is dropped.
const SURVIVOR_GPUS_KEPT: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Run(u64),
    Drain,
    Stop,
    /// Nothing was said: the shard is left as it runs.
    Keep,
}

pub type Outbox = mpsc::Sender<Result<ControlMessage, Status>>;

struct Session {
    id: u64,
    term: u64,
    tx: Outbox,
    opened: Instant,
    last_heard: Instant,
    sent: HashMap<String, Sent>,
    /// The agent's instance id (its work directory's), empty if unknown.
    instance: String,
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, Session>,
    /// When nodes whose stream ended were last heard: a stream cut for
    /// less than the TTL (an agent restarting, a connection reset) must
    /// not make its node unreachable, so liveness keeps counting from the
    /// last heartbeat, not from the cut.
    departed: HashMap<String, Instant>,
    refusals: HashMap<String, VecDeque<Refusal>>,
    /// Per node, GPUs its agent reports held by processes that outlived
    /// SIGKILL, from its latest heartbeat.
    survivor_gpus: HashMap<String, Vec<u32>>,
}

impl State {
    /// Removes `node`'s session, remembering when it was last heard.
    fn end_session(&mut self, node: &str) -> Option<Session> {
        let ended = self.sessions.remove(node)?;
        self.departed.insert(node.to_owned(), ended.last_heard);
        Some(ended)
    }
}

#[derive(Default)]
pub struct Hub {
    /// This peer's id: with the epoch and the term, the leadership every
    /// message carries.
    peer: u64,
    /// The cluster's epoch and id ([`Hub::set_cluster`]): they change when
    /// the cluster's first epoch begins while this peer leads (a restore
    /// restarts the peer, and with it the hub).
    epoch: AtomicU64,
    cluster_id: Mutex<String>,
    state: Mutex<State>,
    next_id: AtomicU64,
    next_command: AtomicU64,
    pub commands_sent: AtomicU64,
    pub refusals_total: AtomicU64,
}

impl Hub {
    /// The hub of peer `peer`.
    pub fn for_peer(peer: u64) -> Hub {
        Hub {
            peer,
            ..Hub::default()
        }
    }

    /// The cluster and epoch every message is sent under from now on. Only
    /// ever raised: a registration that read the state before the epoch
    /// began must not set it back, or agents that saw the epoch would take
    /// this leader for a deposed one.
    pub fn set_cluster(&self, cluster_id: &str, epoch: u64) {
        let mut id = self.cluster_id.lock().unwrap_or_else(|p| p.into_inner());
        if epoch > self.epoch.load(Ordering::Relaxed) || id.is_empty() {
            self.epoch.fetch_max(epoch, Ordering::Relaxed);
            cluster_id.clone_into(&mut id);
        }
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn command_id(&self) -> u64 {
        self.next_command.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Opens a node's session and sends `Registered` with the shards it
    /// should run. A previous session of the same node is closed: its
    /// agent reconnected.
    pub fn open(
        &self,
        node: &str,
        term: u64,
        tx: Outbox,
        desired: &[Desired],
        report_seqs: HashMap<String, u64>,
        heartbeat_interval: Duration,
    ) -> Result<u64, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut sent = HashMap::new();
        let mut shards = Vec::new();
        let mut drains = Vec::new();
        let mut keep = Vec::new();
        for want in desired {
            match &want.order {
                Order::Run(spec) => {
                    sent.insert(want.shard_id.clone(), Sent::Run(fingerprint(spec)));
                    shards.push(spec.as_ref().clone());
                }
                // A drain survives the reconnect: the agent keeps draining
                // with the deadline left instead of stopping the engine.
                Order::Drain {
                    deadline_ms,
                    reason,
                } => {
                    sent.insert(want.shard_id.clone(), Sent::Drain);
                    drains.push(drain_order(&want.shard_id, *deadline_ms, reason));
                }
                Order::Stop { .. } => {}
                Order::Keep { .. } => {
                    sent.insert(want.shard_id.clone(), Sent::Keep);
                    keep.push(want.shard_id.clone());
                }
            }
        }
        let cluster_id = self
            .cluster_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let registered = ControlMessage {
            term,
            epoch: self.epoch(),
            command_id: self.command_id(),
            leader_id: self.peer,
            body: Some(Body::Registered(Registered {
                cluster_id,
                shards,
                heartbeat_interval_ms: u64::try_from(heartbeat_interval.as_millis()).unwrap_or(0),
                drains,
                keep,
                report_seqs,
            })),
        };
        tx.try_send(Ok(registered))
            .map_err(|e| format!("cannot answer node {node}: {e}"))?;
        let now = Instant::now();
        let mut state = self.lock();
        state.departed.remove(node);
        state.sessions.insert(
            node.to_owned(),
            Session {
                id,
                term,
                tx,
                opened: now,
                last_heard: now,
                sent,
                instance: String::new(),
            },
        );
        drop(state);
        self.sync(node, desired);
        Ok(id)
    }

    /// Whether an agent with `instance` may take over `node`'s session.
    /// Another instance may not while the session was heard within
    /// `window`: two machines are configured with the same node id, and
    /// letting each replace the other would flap the node between two
    /// inventories forever. The same instance (an agent restarting, a cut
    /// stream) always may, and so may anyone once the session has gone
    /// silent, or when either side sent no instance id.
    pub fn claim(&self, node: &str, instance: &str, window: Duration) -> Result<(), String> {
        let state = self.lock();
        let Some(session) = state.sessions.get(node) else {
            return Ok(());
        };
        let silent_for = session.last_heard.elapsed();
        if instance.is_empty()
            || session.instance.is_empty()
            || session.instance == instance
            || silent_for >= window
        {
            return Ok(());
        }
        Err(format!(
            "node {node} is already connected from agent instance {} (heard {:.1}s ago); \
             this agent is instance {instance}: two machines are configured with node_id \
             {node}. Give each machine its own node_id (a cloned disk image keeps the \
             instance-id file in the agent's work_dir: delete it on the clone).",
            session.instance,
            silent_for.as_secs_f64()
        ))
    }

    /// Records which agent instance holds `session`.
    pub fn set_instance(&self, node: &str, session: u64, instance: &str) {
        let mut state = self.lock();
        if let Some(s) = state.sessions.get_mut(node)
            && s.id == session
        {
            s.instance = instance.to_owned();
        }
    }

    /// Ends a session, unless the node has opened a newer one since.
    pub fn close(&self, node: &str, session: u64) {
        let mut state = self.lock();
        if state.sessions.get(node).is_some_and(|s| s.id == session) {
            state.end_session(node);
        }
    }

    /// Ends a session with a status that tells the agent why, unless the
    /// node has opened a newer one since.
    pub fn close_with(&self, node: &str, session: u64, why: Status) {
        let mut state = self.lock();
        if state.sessions.get(node).is_some_and(|s| s.id == session)
            && let Some(closed) = state.end_session(node)
        {
            let _ = closed.tx.try_send(Err(why));
        }
    }

    /// Closes every stream: this peer stopped leading, and the agents must
    /// find the new leader.
    pub fn close_all(&self) -> usize {
        let mut state = self.lock();
        let count = state.sessions.len();
        state.sessions.clear();
        // Heartbeats this peer received say nothing once another leads.
        state.departed.clear();
        count
    }

    pub fn heard(&self, node: &str, session: u64) {
        let mut state = self.lock();
        if let Some(s) = state.sessions.get_mut(node)
            && s.id == session
        {
            s.last_heard = Instant::now();
        }
    }

    /// Answers a heartbeat on the node's session, if it is still the one
    /// open and belongs to `term`. The agent leaves a peer that stops
    /// answering.
    pub fn answer_heartbeat(&self, node: &str, session: u64, term: u64, seq: u64) {
        let mut state = self.lock();
        let Some(s) = state.sessions.get_mut(node) else {
            return;
        };
        if s.id != session || s.term > term {
            return;
        }
        // This peer lost its lease for a moment and was elected again: the
        // streams it kept meanwhile go on under the new term (an unanswered
        // heartbeat would send every agent away, the reconnect storm that
        // keeping them avoids).
        s.term = term;
        // A full outbox means the agent is not reading; `sync` closes such
        // a session when it next has something to say.
        let _ = s.tx.try_send(Ok(ControlMessage {
            term,
            epoch: self.epoch(),
            command_id: 0,
            leader_id: self.peer,
            body: Some(Body::HeartbeatAck(HeartbeatAck { seq })),
        }));
    }

    /// Keeps what the node's latest heartbeat says about GPUs held by
    /// processes that outlived SIGKILL. An agent is outside input: a list
    /// longer than any node's GPUs is cut.
    pub fn note_survivor_gpus(&self, node: &str, mut gpus: Vec<u32>) {
        let mut state = self.lock();
        if gpus.is_empty() {
            state.survivor_gpus.remove(node);
        } else {
            gpus.truncate(SURVIVOR_GPUS_KEPT);
            state.survivor_gpus.insert(node.to_owned(), gpus);
        }
    }

    /// GPUs held by processes that outlived SIGKILL, per node, as agents
    /// last reported them to this peer.
    pub fn survivor_gpus(&self) -> HashMap<String, Vec<u32>> {
        self.lock().survivor_gpus.clone()
    }

    pub fn refused(&self, node: &str, mut refusal: Refusal) {
        self.refusals_total.fetch_add(1, Ordering::Relaxed);
        // An agent writes the message: keep what a person reads.
        if refusal.message.len() > REFUSAL_BYTES {
            let mut end = REFUSAL_BYTES;
            while !refusal.message.is_char_boundary(end) {
                end -= 1;
            }
            refusal.message.truncate(end);
            refusal.message.push_str("...");
        }
        let mut state = self.lock();
        let list = state.refusals.entry(node.to_owned()).or_default();
        list.push_back(refusal);
        while list.len() > REFUSALS_KEPT {
            list.pop_front();
        }
    }

    /// When the node was last heard from on an open stream.
    /// When each node this peer has heard from while leading was last
    /// heard, stream open or not.
    pub fn heard_times(&self) -> HashMap<String, Instant> {
        let state = self.lock();
        let mut heard = state.departed.clone();
        for (node, session) in &state.sessions {
            heard.insert(node.clone(), session.last_heard);
        }
        heard
    }

    pub fn connected(&self) -> usize {
        self.lock().sessions.len()
    }

    pub fn view(&self, node: &str) -> LinkView {
        let state = self.lock();
        let session = state.sessions.get(node);
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        LinkView {
            connected: session.is_some(),
            last_heartbeat_ms_ago: session.map(|s| ms(s.last_heard.elapsed())),
            connected_for_ms: session.map(|s| ms(s.opened.elapsed())),
            refusals: state
                .refusals
                .get(node)
                .map(|r| r.iter().cloned().collect())
                .unwrap_or_default(),
            survivor_gpus: state.survivor_gpus.get(node).cloned().unwrap_or_default(),
        }
    }

    /// Sends what changed between the desired orders and what this session
    /// was already told. Level-triggered: calling it again with the same
    /// input sends nothing. A shard that is no longer desired at all is
    /// told to stop.
    pub fn sync(&self, node: &str, desired: &[Desired]) {
        let mut state = self.lock();
        let Some(session) = state.sessions.get_mut(node) else {
            return;
        };
        let mut messages = Vec::new();
        for want in desired {
            let (mark, body) = match &want.order {
                Order::Run(spec) => (
                    Sent::Run(fingerprint(spec)),
                    Body::Start(StartShard {
                        spec: Some(spec.as_ref().clone()),
                    }),
                ),
                Order::Drain {
                    deadline_ms,
                    reason,
                } => (
                    Sent::Drain,
                    Body::Drain(drain_order(&want.shard_id, *deadline_ms, reason)),
                ),
                Order::Stop { reason } => (
                    Sent::Stop,
                    Body::Stop(StopShard {
                        shard_id: want.shard_id.clone(),
                        reason: reason.clone(),
                    }),
                ),
                Order::Keep { .. } => {
                    session.sent.insert(want.shard_id.clone(), Sent::Keep);
                    continue;
                }
            };
            if session.sent.get(&want.shard_id) != Some(&mark) {
                session.sent.insert(want.shard_id.clone(), mark);
                messages.push(body);
            }
        }
        let forgotten: Vec<String> = session
            .sent
            .iter()
            .filter(|(id, sent)| {
                matches!(sent, Sent::Run(_) | Sent::Drain | Sent::Keep)
                    && !desired.iter().any(|d| &d.shard_id == *id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for shard_id in forgotten {
            messages.push(Body::Stop(StopShard {
                shard_id,
                reason: "no longer assigned to this node".into(),
            }));
        }
        // A stop is sent once; a shard gone from the orders needs no mark,
        // so a long session does not keep one per shard it ever saw.
        session
            .sent
            .retain(|id, _| desired.iter().any(|d| &d.shard_id == id));
        for body in messages {
            let message = ControlMessage {
                term: session.term,
                epoch: self.epoch(),
                command_id: self.command_id(),
                leader_id: self.peer,
                body: Some(body),
            };
            self.commands_sent.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = session.tx.try_send(Ok(message)) {
                // An agent this far behind gets a fresh start: it reconnects
                // and `Registered` tells it everything again.
                tracing::warn!(node, %error, "agent stream is not keeping up; closing it");
                state.end_session(node);
                return;
            }
        }
    }

    /// Nodes with an open session.
    pub fn nodes(&self) -> Vec<String> {
        self.lock().sessions.keys().cloned().collect()
    }
}

/// A drain order with the time left until the replicated deadline (unix
/// ms), at least a second so that in-flight requests get a chance.
fn drain_order(shard_id: &str, deadline_ms: u64, reason: &str) -> DrainShard {
    DrainShard {
        shard_id: shard_id.to_owned(),
        deadline_ms: deadline_ms.saturating_sub(llmgw_raft::now_ms()).max(1_000),
        reason: reason.to_owned(),
    }
}

fn fingerprint(spec: &ShardSpec) -> u64 {
    let mut hasher = DefaultHasher::new();
    spec.encode_to_vec().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, port: u32) -> Desired {
        Desired {
            shard_id: id.into(),
            order: Order::Run(Box::new(ShardSpec {
                shard_id: id.into(),
                port,
                ..ShardSpec::default()
            })),
        }
    }

    fn drain(rx: &mut mpsc::Receiver<Result<ControlMessage, Status>>) -> Vec<Body> {
        let mut out = Vec::new();
        while let Ok(message) = rx.try_recv() {
            out.push(message.unwrap().body.unwrap());
        }
        out
    }

    #[test]
    fn registered_carries_the_whole_set_and_sync_sends_only_changes() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::channel(16);
        let applied = HashMap::from([("a-r0".to_owned(), 1_700_000_000_000_000)]);
        let session = hub
            .open(
                "n1",
                7,
                tx,
                &[spec("a-r0", 20000)],
                applied.clone(),
                Duration::ZERO,
            )
            .unwrap();
        let sent = drain(&mut rx);
        assert!(
            matches!(&sent[..], [Body::Registered(r)] if r.shards.len() == 1 && r.report_seqs == applied)
        );

        hub.sync("n1", &[spec("a-r0", 20000)]);
        assert!(drain(&mut rx).is_empty(), "nothing changed, nothing sent");

        hub.sync("n1", &[spec("a-r0", 20000), spec("b-r0", 20001)]);
        assert!(
            matches!(&drain(&mut rx)[..], [Body::Start(s)] if s.spec.as_ref().unwrap().shard_id == "b-r0")
        );

        let stop_a = Desired {
            shard_id: "a-r0".into(),
            order: Order::Stop {
                reason: "scaled down".into(),
            },
        };
        hub.sync("n1", &[stop_a.clone(), spec("b-r0", 20001)]);
        assert!(matches!(&drain(&mut rx)[..], [Body::Stop(s)] if s.shard_id == "a-r0"));
        hub.sync("n1", std::slice::from_ref(&stop_a));
        assert!(
            matches!(&drain(&mut rx)[..], [Body::Stop(s)] if s.shard_id == "b-r0"),
            "a shard no longer desired is stopped"
        );
        hub.sync("n1", &[stop_a]);
        hub.sync("n1", &[]);
        assert!(drain(&mut rx).is_empty(), "a stop is sent once");
        assert!(hub.lock().sessions["n1"].sent.is_empty(), "marks kept");
        hub.close("n1", session);
        assert!(!hub.view("n1").connected);
    }

    #[test]
    fn registered_keeps_a_drain_running_across_a_reconnect() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::channel(16);
        let draining = Desired {
            shard_id: "a-r0".into(),
            order: Order::Drain {
                deadline_ms: llmgw_raft::now_ms() + 30_000,
                reason: "node drain".into(),
            },
        };
        hub.open(
            "n1",
            7,
            tx,
            &[draining.clone(), spec("b-r0", 20001)],
            HashMap::new(),
            Duration::ZERO,
        )
        .unwrap();
        let sent = drain(&mut rx);
        let [Body::Registered(registered)] = &sent[..] else {
            panic!("only Registered is sent: {sent:?}");
        };
        assert_eq!(registered.shards.len(), 1);
        assert_eq!(registered.drains.len(), 1);
        assert_eq!(registered.drains[0].shard_id, "a-r0");
        assert!(registered.drains[0].deadline_ms > 25_000);
        hub.sync("n1", &[draining, spec("b-r0", 20001)]);
        assert!(drain(&mut rx).is_empty(), "the drain is not sent twice");
    }

    #[test]
    fn every_message_carries_the_session_term_and_the_cluster_epoch() {
        let hub = Hub::default();
        hub.set_cluster("prod-a", 1_700);
        // A registration that read the state before the epoch began.
        hub.set_cluster("", 0);
        let (tx, mut rx) = mpsc::channel(16);
        hub.open("n1", 42, tx, &[], HashMap::new(), Duration::ZERO)
            .unwrap();
        hub.sync("n1", &[spec("a-r0", 1)]);
        let mut seen = 0;
        while let Ok(message) = rx.try_recv() {
            let message = message.unwrap();
            assert_eq!((message.epoch, message.term), (1_700, 42));
            if let Some(Body::Registered(registered)) = &message.body {
                assert_eq!(registered.cluster_id, "prod-a");
            }
            seen += 1;
        }
        assert_eq!(seen, 2, "Registered and the start");
    }

    #[test]
    fn a_newer_session_survives_the_close_of_an_older_one() {
        let hub = Hub::default();
        let (tx1, _rx1) = mpsc::channel(16);
        let (tx2, _rx2) = mpsc::channel(16);
        let old = hub
            .open("n1", 1, tx1, &[], HashMap::new(), Duration::ZERO)
            .unwrap();
        hub.open("n1", 1, tx2, &[], HashMap::new(), Duration::ZERO)
            .unwrap();
        hub.close("n1", old);
        assert!(hub.view("n1").connected);
    }

    #[test]
    fn another_machine_cannot_take_a_live_node_but_the_same_one_can() {
        let hub = Hub::default();
        let (tx, _rx) = mpsc::channel(16);
        let window = Duration::from_secs(60);
        assert_eq!(hub.claim("n1", "aaaa", window), Ok(()), "no session yet");
        let session = hub
            .open("n1", 1, tx, &[], HashMap::new(), Duration::ZERO)
            .unwrap();
        hub.set_instance("n1", session, "aaaa");
        assert_eq!(hub.claim("n1", "aaaa", window), Ok(()), "its own restart");
        assert_eq!(
            hub.claim("n1", "", window),
            Ok(()),
            "an agent without an id"
        );
        let refused = hub.claim("n1", "bbbb", window).unwrap_err();
        assert!(
            refused.contains("node_id n1") && refused.contains("aaaa") && refused.contains("bbbb"),
            "{refused}"
        );
        assert_eq!(
            hub.claim("n1", "bbbb", Duration::ZERO),
            Ok(()),
            "a session silent past the window is anyone's"
        );
        hub.close("n1", session);
        assert_eq!(hub.claim("n1", "bbbb", window), Ok(()), "a closed session");
    }

    #[test]
    fn a_shard_whose_model_this_leader_cannot_read_is_left_as_it_runs() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::channel(16);
        hub.open(
            "n1",
            1,
            tx,
            &[spec("s1", 9000)],
            HashMap::new(),
            Duration::ZERO,
        )
        .unwrap();
        drain(&mut rx);
        let keep = Desired {
            shard_id: "s1".into(),
            order: Order::Keep {
                reason: "a newer peer wrote its model".into(),
            },
        };
        hub.sync("n1", std::slice::from_ref(&keep));
        assert!(drain(&mut rx).is_empty(), "the shard was told something");
        // A reconnect names it as kept, so the agent does not stop it...
        let (tx, mut rx) = mpsc::channel(16);
        hub.open("n1", 1, tx, &[keep], HashMap::new(), Duration::ZERO)
            .unwrap();
        match &drain(&mut rx)[..] {
            [Body::Registered(r)] => {
                assert_eq!(r.keep, ["s1"]);
                assert!(r.shards.is_empty() && r.drains.is_empty());
            }
            other => panic!("{other:?}"),
        }
        // ...and once its replica is gone from the state, it is stopped.
        hub.sync("n1", &[]);
        assert!(
            matches!(&drain(&mut rx)[..], [Body::Stop(s)] if s.shard_id == "s1"),
            "not stopped"
        );
    }

    #[test]
    fn a_session_kept_across_a_new_term_of_this_peer_goes_on_under_it() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::channel(16);
        let session = hub
            .open("n1", 7, tx, &[], HashMap::new(), Duration::ZERO)
            .unwrap();
        drain(&mut rx);
        hub.answer_heartbeat("n1", session, 8, 1);
        let ack = rx
            .try_recv()
            .expect("the heartbeat was not answered")
            .unwrap();
        assert_eq!(ack.term, 8);
        hub.sync("n1", &[spec("a-r0", 1)]);
        assert_eq!(rx.try_recv().unwrap().unwrap().term, 8, "commands too");
        // A heartbeat judged under an older term than the session's is not.
        hub.answer_heartbeat("n1", session, 7, 2);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_node_whose_stream_ended_is_still_heard_when_it_last_was() {
        let hub = Hub::default();
        let (tx, _rx) = mpsc::channel(16);
        let session = hub
            .open("n1", 1, tx, &[], HashMap::new(), Duration::ZERO)
            .unwrap();
        let heard = hub.heard_times()["n1"];
        hub.close("n1", session);
        assert!(!hub.view("n1").connected);
        assert_eq!(hub.heard_times().get("n1"), Some(&heard));
        // A new stream counts from its own opening.
        let (tx, _rx) = mpsc::channel(16);
        hub.open("n1", 1, tx, &[], HashMap::new(), Duration::ZERO)
            .unwrap();
        assert!(hub.heard_times()["n1"] >= heard);
        // A peer that stops leading forgets every node.
        hub.close_all();
        assert!(hub.heard_times().is_empty());
    }
}
