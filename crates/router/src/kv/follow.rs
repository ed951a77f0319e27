//! Following every engine's KV events: one subscription per engine that
//! publishes, started and stopped as the routing table changes, each
//! feeding the shared index.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use llmgw_kv_events::{Delivery, Endpoints, Subscriber, decode_batch};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::KvState;
use crate::table::RoutingTable;

/// The longest wait between attempts to reach an engine's publisher.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Keeps one subscription per publishing engine of the table.
pub async fn follow_loop(kv: Arc<KvState>, mut table: watch::Receiver<Arc<RoutingTable>>) {
    let mut followed: HashMap<String, (Endpoints, JoinHandle<()>)> = HashMap::new();
    loop {
        let wanted = publishing_engines(&table.borrow_and_update());
        followed.retain(|url, (endpoints, task)| {
            let keep = wanted.get(url) == Some(endpoints);
            if !keep {
                task.abort();
                kv.forget_engine(url);
            }
            keep
        });
        for (url, endpoints) in wanted {
            if let std::collections::hash_map::Entry::Vacant(slot) = followed.entry(url) {
                let task = tokio::spawn(follow_engine(
                    Arc::clone(&kv),
                    slot.key().clone(),
                    endpoints.clone(),
                ));
                slot.insert((endpoints, task));
            }
        }
        kv.stats
            .followed_engines
            .store(followed.len() as u64, Ordering::Relaxed);
        if table.changed().await.is_err() {
            for (url, (_, task)) in followed {
                task.abort();
                kv.forget_engine(&url);
            }
            return;
        }
    }
}

fn publishing_engines(table: &RoutingTable) -> HashMap<String, Endpoints> {
    table
        .models
        .iter()
        .flat_map(|m| m.endpoints.iter())
        .filter_map(|e| Some((e.url.clone(), e.kv_events.clone()?)))
        .collect()
}

/// Subscribes to one engine for as long as it is in the table. Every new
/// connection starts from an empty slate and the engine's replay: after a
/// broken stream the router cannot tell a blip from a new process.
async fn follow_engine(kv: Arc<KvState>, url: String, endpoints: Endpoints) {
    let mut retry = Duration::from_millis(100);
    let mut warned = false;
    loop {
        match Subscriber::connect(endpoints.clone()).await {
            Ok(mut subscriber) => {
                if warned {
                    tracing::info!(engine = %url, stream = %endpoints.stream, "KV events reachable again");
                }
                warned = false;
                retry = Duration::from_millis(100);
                kv.forget_engine(&url);
                kv.set_unreachable(&url, false);
                let mut replayed = 0;
                while let Ok(delivery) = subscriber.next().await {
                    apply(&kv, &url, delivery);
                    let now = subscriber.replayed();
                    kv.stats
                        .replayed
                        .fetch_add(now - replayed, Ordering::Relaxed);
                    replayed = now;
                }
                kv.forget_engine(&url);
            }
            Err(error) => {
                kv.set_unreachable(&url, true);
                if !warned {
                    // An engine that should publish but cannot be heard is
                    // routed by load alone: say so once per outage.
                    tracing::warn!(engine = %url, stream = %endpoints.stream, %error, "cannot subscribe to the engine's KV events; routing to it ignores its cache until it publishes");
                    warned = true;
                }
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(MAX_RETRY);
    }
}

fn apply(kv: &KvState, url: &str, delivery: Delivery) {
    let stats = &kv.stats;
    match delivery {
        Delivery::Batch { payload, .. } => match decode_batch(&payload) {
            Ok(decoded) => {
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats
                    .unknown_events
                    .fetch_add(decoded.unknown_events as u64, Ordering::Relaxed);
                let rank = decoded.batch.dp_rank.unwrap_or(0);
                let mut index = kv.index.write().unwrap_or_else(|p| p.into_inner());
                let mut applied = super::index::Applied::default();
                for event in &decoded.batch.events {
                    applied += index.apply(url, rank, event);
                }
                stats.record(applied, index.entries());
            }
            Err(error) => {
                stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(engine = %url, %error, "undecodable KV event batch");
            }
        },
        Delivery::Missed { from, to } => {
            stats.missed.fetch_add(to - from + 1, Ordering::Relaxed);
            tracing::debug!(engine = %url, from, to, "KV event batches lost beyond the replay buffer");
        }
        Delivery::Restarted => {
            stats.restarts.fetch_add(1, Ordering::Relaxed);
            kv.forget_engine(url);
        }
    }
}
