//! The leader begins the cluster's epoch: once for a cluster that has none
//! (formed now, or before epochs existed) and once after each restore.
//!
//! After a restore no agent is commanded until the epoch has begun (the
//! agent service redirects them meanwhile), so every command a restored
//! cluster sends outranks what the cluster before the restore sent, however
//! high its terms went. A cluster that has no epoch yet commands agents
//! under epoch 0 meanwhile, as before epochs existed: an upgrade never
//! locks agents out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llmgw_raft::{ControlPlane, now_ms};
use llmgw_state::Command;
use rand::Rng;
use tokio::sync::watch;

use crate::agents::Hub;
use crate::propose::{Author, propose_all};

/// How often the leader looks for a due epoch.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// How often a wait for older peers is logged again.
const REPEAT_LOG: Duration = Duration::from_secs(60);

/// Runs until `stop`: whenever this peer leads and the applied state has
/// an epoch due, proposes [`Command::BeginEpoch`] as the leader's decision
/// (dropped if its leadership is superseded meanwhile; the next leader
/// proposes again), then sends every agent message under it.
/// `configured_id` (server.yaml `cluster_id`) names a cluster that has no
/// id yet; otherwise a random one is made.
pub async fn run_epoch_keeper(
    control: ControlPlane,
    hub: Arc<Hub>,
    configured_id: Option<String>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut logged: Option<Instant> = None;
    // Made once: a retry after an ambiguous answer proposes the same id.
    let new_id = configured_id.unwrap_or_else(new_cluster_id);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let Some(term) = control.leading_term() else {
            continue;
        };
        let (due, first) = control.read(|fleet| (fleet.epoch_due(), fleet.cluster.is_none()));
        if !due {
            continue;
        }
        // A restored cluster runs one release on every peer; an upgraded
        // one may still have older peers, which would apply the epoch as a
        // no-op and hold a different state.
        if first {
            let older = control
                .members_failing("runs a release without cluster epochs", |status| {
                    status.epochs
                })
                .await;
            if !older.is_empty() {
                if logged.is_none_or(|at| at.elapsed() >= REPEAT_LOG) {
                    tracing::info!(
                        waiting_for = %older.join("; "),
                        "the cluster's first epoch begins once every peer can apply it; agents are commanded under epoch 0 meanwhile"
                    );
                    logged = Some(Instant::now());
                }
                continue;
            }
        }
        let command = control.read(|fleet| {
            let cluster_id = fleet
                .cluster
                .as_ref()
                .map_or_else(|| new_id.clone(), |identity| identity.id.clone());
            let at_ms = now_ms();
            Command::BeginEpoch {
                cluster_id,
                epoch: fleet.next_epoch(at_ms),
                at_ms,
            }
        });
        let what = command.to_string();
        if propose_all(&control, Author::Leader(term), vec![command]).await {
            if let Some((id, epoch)) = control.read(|fleet| {
                fleet
                    .settled_epoch()
                    .map(|(id, epoch)| (id.to_owned(), epoch))
            }) {
                hub.set_cluster(&id, epoch);
            }
            tracing::info!(term, "{what}: agents are commanded under it from now on");
        }
    }
}

/// 32 random hex digits.
fn new_cluster_id() -> String {
    let bits: u128 = rand::rng().random();
    format!("{bits:032x}")
}
