//! The leader's reconciler loop: each round asks `llmgw_reconcile::decide`
//! (pure) for commands, proposes them, and then tells every connected agent
//! what it should run (`llmgw_reconcile::desired_by_node`).

use std::sync::Arc;
use std::time::Duration;

use llmgw_raft::{ControlPlane, WatchReceiver, now_ms};
use tokio::sync::watch;

pub use llmgw_reconcile::{Memory, PlanSettings, decide, node_views, take_survivor_gpus};

use crate::agents::Hub;

const ROUND: Duration = Duration::from_millis(100);
/// A round whose input did not change still runs this often: retries and
/// drain deadlines fall due with time, not with the log.
const IDLE_ROUND: Duration = Duration::from_secs(1);

/// Runs rounds while this peer leads, until `stop` turns true.
pub async fn run_reconciler(
    control: ControlPlane,
    hub: Arc<Hub>,
    settings: PlanSettings,
    mut stop: watch::Receiver<bool>,
) {
    let mut memory = Memory::default();
    let mut led_term = None;
    // The applied index the last round decided from, and when it ran: on a
    // large fleet a round is tens of milliseconds, and most find nothing.
    let mut last_round: Option<(Option<llmgw_store::LogId>, tokio::time::Instant)> = None;
    let mut tick = tokio::time::interval(ROUND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut metrics = control.raft().metrics();
    loop {
        // A round starts on the tick, or as soon as something is applied
        // (a new model, a failed shard): placement does not wait a tick.
        tokio::select! {
            _ = tick.tick() => {}
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
                let applied = metrics.borrow_watched().last_applied;
                if last_round.as_ref().is_some_and(|(at, _)| *at == applied) {
                    continue;
                }
            }
            _ = stop.changed() => return,
        }
        let Some(term) = control.leading_term() else {
            led_term = None;
            continue;
        };
        if led_term != Some(term) {
            // Retry memory belongs to one term; the replicated state carries
            // everything that matters.
            memory = Memory::default();
            led_term = Some(term);
            last_round = None;
        }
        let applied = control.metrics().last_applied;
        if last_round
            .as_ref()
            .is_some_and(|(at, ran)| *at == applied && ran.elapsed() < IDLE_ROUND)
        {
            continue;
        }
        last_round = Some((applied, tokio::time::Instant::now()));
        memory.survivor_gpus = hub.survivor_gpus();
        let commands = control.read(|fleet| decide(fleet, &mut memory, &settings, now_ms()));
        let _ =
            crate::propose::propose_all(&control, crate::propose::Author::Leader(term), commands)
                .await;
        dispatch(&control, &hub);
    }
}

/// Tells every connected agent what it should run now.
pub fn dispatch(control: &ControlPlane, hub: &Hub) {
    let desired = control.read(|fleet| {
        let models = llmgw_reconcile::managed_models(fleet);
        llmgw_reconcile::desired_by_node(fleet, &models)
    });
    for node in hub.nodes() {
        hub.sync(&node, desired.get(&node).map_or(&[][..], Vec::as_slice));
    }
}
