//! Active health probes: an ejected endpoint comes back only after its
//! `/health` answers 200, so a crashed engine is not re-admitted by time
//! alone and a recovered one does not wait for client traffic to prove it.

use std::sync::Arc;
use std::time::Duration;

use crate::endpoints::Registry;
use crate::upstream::Upstream;

pub async fn probe_loop(upstream: Upstream, registry: Arc<Registry>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        for stats in registry.all().into_iter().filter(|s| s.is_ejected()) {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let url = format!("{}/health", stats.url);
                match upstream
                    .get_text(&url, interval.max(Duration::from_secs(1)))
                    .await
                {
                    Ok((200, _)) => {
                        tracing::info!(endpoint = %stats.url, "health probe passed; endpoint re-admitted");
                        stats.readmit();
                    }
                    Ok((status, _)) => {
                        tracing::debug!(endpoint = %stats.url, status, "health probe failed")
                    }
                    Err(e) => {
                        tracing::debug!(endpoint = %stats.url, error = %e, "health probe failed")
                    }
                }
            });
        }
    }
}
