//! The autoscaler loop. Once a second every peer reads the load of every
//! autoscaled model from its ready engines' `/metrics` (running and waiting
//! requests and the fullest KV cache, as the router reads them, and the time
//! to first token and the queue wait since the last read) and keeps it in
//! its `LoadHistory`, the hour the console draws. The leader also asks the
//! pure `llmgw_reconcile::autoscale` whether a change is due, and commits
//! it with what it saw; the reconciler then places or drains replicas as
//! for any other change of the replica count.

use std::collections::HashMap;
use std::time::Duration;

use llmgw_api::LoadSampleView;
use llmgw_catalog::Autoscale;
use llmgw_raft::{ControlPlane, now_ms};
use llmgw_reconcile::autoscale::{LoadSample, ScaleMemory};
use llmgw_state::{Command, FleetState, Replica, ReplicaState, ScaleDecision};
use tokio::sync::watch;

use crate::latency::{LatencyWatch, QUEUE_WAIT, TIME_TO_FIRST_TOKEN};
use crate::load_history::LoadHistory;
use crate::propose::{Author, propose_all};

/// How often the load is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// An engine that does not answer its `/metrics` within this leaves the
/// sample unreadable.
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(800);

/// One autoscaled model as the replicated state has it now.
struct Scaled {
    name: String,
    policy: Autoscale,
    desired: u32,
    /// The head endpoint of each ready replica.
    endpoints: Vec<String>,
    replicas: ReplicaCounts,
    last_scale: Option<ScaleDecision>,
    /// Wanted asleep (vLLM sleep mode) now.
    asleep: bool,
    /// When a request last woke it.
    woken_at_ms: Option<u64>,
    /// Another model wants more replicas than it has placed.
    others_waiting: bool,
}

/// A model's replicas by what they are doing.
#[derive(Debug, Clone, Copy, Default)]
struct ReplicaCounts {
    ready: u32,
    starting: u32,
    draining: u32,
    sleeping: u32,
}

impl ReplicaCounts {
    fn count(&mut self, replica: &Replica) {
        match (replica.stop.is_some(), replica.state()) {
            (_, ReplicaState::Stopped) | (false, ReplicaState::Failed) => {}
            (true, _) | (_, ReplicaState::Draining | ReplicaState::Stopping) => self.draining += 1,
            (false, ReplicaState::Ready) => self.ready += 1,
            (false, ReplicaState::Sleeping) => self.sleeping += 1,
            (false, ReplicaState::Placed | ReplicaState::Starting | ReplicaState::Loading) => {
                self.starting += 1
            }
        }
    }
}

/// Samples every autoscaled model into `history`, and scales them while
/// this peer leads, until `stop` turns true.
pub async fn run_autoscaler(
    control: ControlPlane,
    history: LoadHistory,
    mut stop: watch::Receiver<bool>,
) {
    let client = match reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "autoscaler: no HTTP client; models keep their replica counts");
            return;
        }
    };
    let mut memory = ScaleMemory::default();
    let mut watches = Watches::default();
    let mut woken_at_ms: HashMap<String, Option<u64>> = HashMap::new();
    let mut led_term = None;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let leading = control.leading_term();
        if led_term != leading {
            // What an earlier term saw is not this leader's evidence.
            memory = ScaleMemory::default();
            led_term = leading;
        }
        let models = control.read(autoscaled_models);
        let autoscaled = |name: &str| models.iter().any(|m| m.name == name);
        memory.retain(autoscaled);
        history.retain(autoscaled);
        watches.retain(&models);
        woken_at_ms.retain(|name, _| autoscaled(name));
        let mut decisions = Vec::new();
        for model in models {
            let sampled = sample_load(&client, &model.name, &model.endpoints, &mut watches).await;
            history.record(
                &model.name,
                history_sample(&model, sampled.as_ref()),
                model.last_scale.as_ref(),
            );
            if led_term.is_none() {
                continue;
            }
            if woken_at_ms.insert(model.name.clone(), model.woken_at_ms) != Some(model.woken_at_ms)
            {
                // Woken by a request still on its way to the engine: the
                // idle spell before must not release or resleep it.
                memory.forget(&model.name);
            }
            let sample = sampled.map(|s| LoadSample {
                others_waiting: model.others_waiting,
                ..s.load
            });
            if let Some(decision) =
                memory.observe(&model.name, &model.policy, model.desired, sample)
            {
                tracing::info!(model = %model.name, reason = %decision.reason(), "autoscaling");
                decisions.push(Command::ScaleModel {
                    name: model.name,
                    decision,
                    at_ms: now_ms(),
                });
            } else if !model.asleep
                && model.desired > 0
                && let Some(idle_ms) = memory.due_to_sleep(&model.name, &model.policy)
            {
                tracing::info!(model = %model.name, idle_ms, "autoscaling: idle, its replicas sleep");
                decisions.push(Command::SleepModel {
                    name: model.name,
                    idle_ms,
                    at_ms: now_ms(),
                });
            }
        }
        if let Some(term) = led_term
            && !decisions.is_empty()
        {
            propose_all(&control, Author::Leader(term), decisions).await;
        }
    }
}

fn autoscaled_models(fleet: &FleetState) -> Vec<Scaled> {
    let waiting = models_waiting_for_gpus(fleet);
    fleet
        .models
        .values()
        .filter_map(|record| {
            let policy = record.spec.model().ok()?.managed()?.autoscale?;
            let mut replicas = ReplicaCounts::default();
            let mut endpoints = Vec::new();
            for replica in fleet.replicas.values().filter(|r| r.model == record.name) {
                replicas.count(replica);
                // A sleeping engine still serves its metrics: the idle
                // spell that releases its GPUs goes on counting.
                if replica.stop.is_none() && replica.state().is_up() {
                    endpoints.extend(llmgw_reconcile::endpoint(fleet, replica));
                }
            }
            Some(Scaled {
                name: record.name.clone(),
                policy,
                desired: record.desired_replicas,
                endpoints,
                replicas,
                last_scale: record.last_scale.clone(),
                asleep: record.asleep_since_ms.is_some(),
                woken_at_ms: record.woken_at_ms,
                others_waiting: waiting.iter().any(|name| *name != record.name),
            })
        })
        .collect()
}

/// Models that want more replicas than they have placed: the reconciler
/// found no GPUs for the rest (or is about to place them).
fn models_waiting_for_gpus(fleet: &FleetState) -> Vec<&str> {
    fleet
        .models
        .values()
        .filter(|record| {
            let placed = fleet
                .replicas
                .values()
                .filter(|r| r.model == record.name && r.stop.is_none())
                .count();
            placed < record.desired_replicas as usize
        })
        .map(|record| record.name.as_str())
        .collect()
}

/// What the console draws of one sample.
fn history_sample(model: &Scaled, sampled: Option<&Sampled>) -> LoadSampleView {
    let load = sampled.map(|s| s.load);
    LoadSampleView {
        at_ms: load.map_or_else(now_ms, |l| l.at_ms),
        requests_per_s: sampled.and_then(|s| s.first_tokens_per_s),
        outstanding: load.map(|l| l.requests),
        ttft_p90_ms: load.and_then(|l| l.ttft_p90_ms),
        queue_p90_ms: load.and_then(|l| l.queue_p90_ms),
        kv_cache_usage_percent: load.and_then(|l| l.kv_usage_percent),
        desired: model.desired,
        ready: model.replicas.ready,
        starting: model.replicas.starting,
        draining: model.replicas.draining,
        sleeping: model.replicas.sleeping,
    }
}

/// The engines' latency histograms as last read, one watch per signal, and
/// when each model was last read whole.
#[derive(Debug, Default)]
struct Watches {
    first_token: LatencyWatch,
    queue: LatencyWatch,
    sampled_at_ms: HashMap<String, u64>,
}

impl Watches {
    /// Keeps what was read of these models' ready engines.
    fn retain(&mut self, models: &[Scaled]) {
        let mut scraped = |endpoint: &str| {
            models
                .iter()
                .any(|m| m.endpoints.iter().any(|e| e == endpoint))
        };
        self.first_token.retain(&mut scraped);
        self.queue.retain(scraped);
        self.sampled_at_ms
            .retain(|name, _| models.iter().any(|m| &m.name == name));
    }
}

/// One reading of a model's engines.
#[derive(Debug, Clone, Copy)]
struct Sampled {
    load: LoadSample,
    /// Requests that got their first token since the model's last reading,
    /// a second; none on the first reading.
    first_tokens_per_s: Option<f64>,
}

/// The requests the engines hold now, and their latencies since the last
/// sample; none when there is no ready engine or one of them cannot say
/// (a decision needs the whole picture).
async fn sample_load(
    client: &reqwest::Client,
    model: &str,
    endpoints: &[String],
    watches: &mut Watches,
) -> Option<Sampled> {
    if endpoints.is_empty() {
        return None;
    }
    let pages = futures::future::join_all(endpoints.iter().map(|url| async move {
        let response = client.get(format!("{url}/metrics")).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.text().await.ok()
    }))
    .await;
    let mut requests = 0.0;
    let mut kv_usage: Option<f64> = None;
    let (mut first_tokens, mut queued) = (Vec::new(), Vec::new());
    for (endpoint, page) in endpoints.iter().zip(pages) {
        let page = page?;
        let load = llmgw_router::parse_engine_load(&page)?;
        requests += load.running? + load.waiting.unwrap_or(0.0);
        if let Some(usage) = load.kv_usage {
            kv_usage = Some(kv_usage.map_or(usage, |most| most.max(usage)));
        }
        let buckets = |series: &[&str]| crate::latency::buckets(&page, series);
        first_tokens.push((endpoint.clone(), buckets(&TIME_TO_FIRST_TOKEN)));
        queued.push((endpoint.clone(), buckets(&QUEUE_WAIT)));
    }
    let at_ms = now_ms();
    let first_tokens = watches.first_token.since_last(first_tokens);
    let first_tokens_per_s = watches
        .sampled_at_ms
        .insert(model.to_owned(), at_ms)
        .map(|before| at_ms.saturating_sub(before))
        .filter(|elapsed_ms| *elapsed_ms > 0)
        .map(|elapsed_ms| first_tokens.count() * 1000.0 / elapsed_ms as f64);
    Some(Sampled {
        load: LoadSample {
            at_ms,
            requests: requests.round() as u32,
            ready_replicas: endpoints.len() as u32,
            ttft_p90_ms: first_tokens.p90_ms(),
            queue_p90_ms: watches.queue.since_last(queued).p90_ms(),
            kv_usage_percent: kv_usage
                .map(|usage| (usage * 100.0).round().clamp(0.0, 100.0) as u32),
            others_waiting: false,
        },
        first_tokens_per_s,
    })
}
