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

/// Keeps one subscription per publishing rank of each engine of the table.
pub async fn follow_loop(kv: Arc<KvState>, mut table: watch::Receiver<Arc<RoutingTable>>) {
    let mut followed: HashMap<String, (Vec<Endpoints>, Vec<JoinHandle<()>>)> = HashMap::new();
    loop {
        let wanted = publishing_engines(&table.borrow_and_update());
        followed.retain(|url, (ranks, tasks)| {
            let keep = wanted.get(url) == Some(ranks);
            if !keep {
                tasks.iter().for_each(JoinHandle::abort);
                kv.forget_engine(url);
            }
            keep
        });
        for (url, ranks) in wanted {
            if let std::collections::hash_map::Entry::Vacant(slot) = followed.entry(url) {
                let tasks = (0u32..)
                    .zip(&ranks)
                    .map(|(rank, endpoints)| {
                        tokio::spawn(follow_rank(
                            Arc::clone(&kv),
                            slot.key().clone(),
                            rank,
                            endpoints.clone(),
                        ))
                    })
                    .collect();
                slot.insert((ranks, tasks));
            }
        }
        kv.stats
            .followed_engines
            .store(followed.len() as u64, Ordering::Relaxed);
        if table.changed().await.is_err() {
            for (url, (_, tasks)) in followed {
                tasks.iter().for_each(JoinHandle::abort);
                kv.forget_engine(&url);
            }
            return;
        }
    }
}

fn publishing_engines(table: &RoutingTable) -> HashMap<String, Vec<Endpoints>> {
    table
        .models
        .iter()
        .flat_map(|m| m.endpoints.iter())
        .filter(|e| !e.kv_events.is_empty())
        .map(|e| (e.url.clone(), e.kv_events.clone()))
        .collect()
}

/// Subscribes to one rank of an engine for as long as the engine is in
/// the table. Every new connection starts that rank from an empty slate
/// and its replay: after a broken stream the router cannot tell a blip
/// from a new process. The engine's other ranks keep what they hold.
async fn follow_rank(kv: Arc<KvState>, url: String, rank: u32, endpoints: Endpoints) {
    let mut retry = Duration::from_millis(100);
    let mut warned = false;
    loop {
        match Subscriber::connect(endpoints.clone()).await {
            Ok(mut subscriber) => {
                if warned {
                    tracing::info!(engine = %url, rank, stream = %endpoints.stream, "KV events reachable again");
                }
                warned = false;
                retry = Duration::from_millis(100);
                kv.forget_rank(&url, rank);
                kv.set_unreachable(&url, rank, false);
                let mut replayed = 0;
                while let Ok(delivery) = subscriber.next().await {
                    apply(&kv, &url, rank, delivery);
                    let now = subscriber.replayed();
                    kv.stats
                        .replayed
                        .fetch_add(now - replayed, Ordering::Relaxed);
                    replayed = now;
                }
                kv.forget_rank(&url, rank);
            }
            Err(error) => {
                kv.set_unreachable(&url, rank, true);
                if !warned {
                    // An engine that should publish but cannot be heard is
                    // routed by load alone: say so once per outage.
                    tracing::warn!(engine = %url, rank, stream = %endpoints.stream, %error, "cannot subscribe to the engine's KV events; routing to it ignores its cache until it publishes");
                    warned = true;
                }
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(MAX_RETRY);
    }
}

/// `rank` is the subscription's: each rank's socket carries only its own
/// batches, whatever rank (if any) a batch names.
fn apply(kv: &KvState, url: &str, rank: u32, delivery: Delivery) {
    let stats = &kv.stats;
    match delivery {
        Delivery::Batch { payload, .. } => match decode_batch(&payload) {
            Ok(decoded) => {
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats
                    .unknown_events
                    .fetch_add(decoded.unknown_events as u64, Ordering::Relaxed);
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
            kv.forget_rank(url, rank);
        }
    }
}
