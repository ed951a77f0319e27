//! The leader's autoscaler loop: once a second it reads the load of every
//! autoscaled model from its ready engines' `/metrics` (running and waiting
//! requests and the fullest KV cache, as the router reads them, and the time
//! to first token and the queue wait since the last read), asks the pure
//! `llmgw_reconcile::autoscale` whether a change is due, and commits it
//! with what it saw. The reconciler then places or drains replicas as for
//! any other change of the replica count.

use std::time::Duration;

use llmgw_catalog::Autoscale;
use llmgw_raft::{ControlPlane, now_ms};
use llmgw_reconcile::autoscale::{LoadSample, ScaleMemory};
use llmgw_state::{Command, FleetState, ReplicaState};
use tokio::sync::watch;

use crate::latency::{LatencyWatch, QUEUE_WAIT, TIME_TO_FIRST_TOKEN};
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
}

/// Samples and scales while this peer leads, until `stop` turns true.
pub async fn run_autoscaler(control: ControlPlane, mut stop: watch::Receiver<bool>) {
    let client = match reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "autoscaler: no HTTP client; models keep their replica counts");
            return;
        }
    };
    let mut memory = ScaleMemory::default();
    let mut watches = Watches::default();
    let mut led_term = None;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let Some(term) = control.leading_term() else {
            led_term = None;
            continue;
        };
        if led_term != Some(term) {
            // What an earlier term saw is not this leader's evidence.
            memory = ScaleMemory::default();
            watches = Watches::default();
            led_term = Some(term);
        }
        let models = control.read(autoscaled_models);
        memory.retain(|name| models.iter().any(|m| m.name == name));
        watches.retain(|endpoint| {
            models
                .iter()
                .any(|m| m.endpoints.iter().any(|e| e == endpoint))
        });
        let mut decisions = Vec::new();
        for model in models {
            let sample = sample_load(&client, &model.endpoints, &mut watches).await;
            if let Some(decision) =
                memory.observe(&model.name, &model.policy, model.desired, sample)
            {
                tracing::info!(model = %model.name, reason = %decision.reason(), "autoscaling");
                decisions.push(Command::ScaleModel {
                    name: model.name,
                    decision,
                    at_ms: now_ms(),
                });
            }
        }
        if !decisions.is_empty() {
            propose_all(&control, Author::Leader(term), decisions).await;
        }
    }
}

fn autoscaled_models(fleet: &FleetState) -> Vec<Scaled> {
    fleet
        .models
        .values()
        .filter_map(|record| {
            let policy = record.spec.model().ok()?.managed()?.autoscale?;
            let endpoints = fleet
                .replicas
                .values()
                .filter(|r| r.model == record.name && r.stop.is_none())
                .filter(|r| r.state() == ReplicaState::Ready)
                .filter_map(|r| llmgw_reconcile::endpoint(fleet, r))
                .collect();
            Some(Scaled {
                name: record.name.clone(),
                policy,
                desired: record.desired_replicas,
                endpoints,
            })
        })
        .collect()
}

/// The engines' latency histograms as last read, one watch per signal.
#[derive(Debug, Default)]
struct Watches {
    first_token: LatencyWatch,
    queue: LatencyWatch,
}

impl Watches {
    fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.first_token.retain(&mut keep);
        self.queue.retain(keep);
    }
}

/// The requests the engines hold now, and their latencies since the last
/// sample; none when there is no ready engine or one of them cannot say
/// (a decision needs the whole picture).
async fn sample_load(
    client: &reqwest::Client,
    endpoints: &[String],
    watches: &mut Watches,
) -> Option<LoadSample> {
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
    Some(LoadSample {
        at_ms: now_ms(),
        requests: requests.round() as u32,
        ready_replicas: endpoints.len() as u32,
        ttft_p90_ms: watches.first_token.p90_since_last(first_tokens),
        queue_p90_ms: watches.queue.p90_since_last(queued),
        kv_usage_percent: kv_usage.map(|usage| (usage * 100.0).round().clamp(0.0, 100.0) as u32),
    })
}
