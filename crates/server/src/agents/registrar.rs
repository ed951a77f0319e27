//! Registrations committed in groups. A fleet reconnecting at once (a new
//! leader, a whole-cluster restart) would otherwise cost one Raft entry
//! and one synced write per node; here every registration that arrives
//! while one group commits joins the next group, so ten thousand nodes
//! are a few dozen entries and one entry never grows large enough to
//! delay Raft heartbeats past an election timeout.

use llmgw_raft::{ControlPlane, entry_bytes};
use llmgw_state::Command;
use tokio::sync::{mpsc, oneshot};

use crate::propose::{BATCH_BYTES, runs};

/// Registrations per log entry (a full inventory is a few kilobytes).
const GROUP: usize = 256;
/// Registrations waiting for a group before new ones are pushed back.
const QUEUE: usize = 16_384;

struct Pending {
    term: u64,
    command: Command,
    done: oneshot::Sender<Result<(), String>>,
}

/// The handle connects use; cheap to clone.
#[derive(Clone)]
pub struct Registrar {
    queue: mpsc::Sender<Pending>,
}

impl Registrar {
    /// Starts the task that commits groups; it ends when every handle is
    /// dropped.
    pub fn spawn(control: ControlPlane) -> Registrar {
        let (queue, pending) = mpsc::channel(QUEUE);
        tokio::spawn(commit_groups(control, pending));
        Registrar { queue }
    }

    /// Commits `command` (a `RegisterNode`) as a decision of the leader of
    /// `term`, together with whatever other registrations are waiting.
    pub async fn register(&self, term: u64, command: Command) -> Result<(), String> {
        let (done, answer) = oneshot::channel();
        let pending = Pending {
            term,
            command,
            done,
        };
        self.queue
            .send(pending)
            .await
            .map_err(|_| "the peer is shutting down".to_owned())?;
        answer
            .await
            .map_err(|_| "the peer is shutting down".to_owned())?
    }
}

/// One group at a time, in arrival order: two registrations of one node
/// (a quick reconnect) are applied in the order they came.
async fn commit_groups(control: ControlPlane, mut pending: mpsc::Receiver<Pending>) {
    let mut group = Vec::with_capacity(GROUP);
    while pending.recv_many(&mut group, GROUP).await > 0 {
        // A group normally shares one term; a leader change in between
        // splits it, and each part is that leadership's own decision.
        while !group.is_empty() {
            let term = group[0].term;
            let split = group
                .iter()
                .position(|p| p.term != term)
                .unwrap_or(group.len());
            let part: Vec<Pending> = group.drain(..split).collect();
            // Inventories differ in size: a group is cut by bytes too, so
            // no entry passes the log's bound.
            for entry in runs(part, GROUP, BATCH_BYTES, |p| entry_bytes(&p.command)) {
                commit_group(&control, term, entry).await;
            }
        }
    }
}

/// Commits one group as one log entry and answers each of its
/// registrations.
async fn commit_group(control: &ControlPlane, term: u64, group: Vec<Pending>) {
    let (commands, answers): (Vec<Command>, Vec<_>) =
        group.into_iter().map(|p| (p.command, p.done)).unzip();
    let count = commands.len();
    let result = control
        .propose_as_leader(term, commands)
        .await
        .map(|_| ())
        .map_err(|error| error.to_string());
    if let Err(error) = &result {
        tracing::warn!(count, %error, "a group of registrations was not committed");
    } else {
        tracing::debug!(count, "registrations committed");
    }
    for answer in answers {
        let _ = answer.send(result.clone());
    }
}
