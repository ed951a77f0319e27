//! Engine load from the engines' Prometheus `/metrics`: running and waiting
//! requests and KV cache usage, under vLLM's and SGLang's names, old and
//! new (vLLM 0.11 still has `gpu_cache_usage_perc` hidden; 0.34 only has
//! `kv_cache_usage_perc`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::endpoints::{EngineLoad, Registry};
use crate::table::RoutingTable;
use crate::upstream::Upstream;

const RUNNING: &[&str] = &["vllm:num_requests_running", "sglang:num_running_reqs"];
const WAITING: &[&str] = &["vllm:num_requests_waiting", "sglang:num_queue_reqs"];
const KV_USAGE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
];

/// Reads the load gauges from a Prometheus text page. Series of one name
/// are summed for counts (data-parallel ranks each report their own) and
/// the highest KV usage is kept (the fullest rank decides admission).
/// `None` when the page has none of the names.
pub fn parse_engine_load(text: &str) -> Option<EngineLoad> {
    let mut load = EngineLoad::default();
    for sample in llmgw_prometheus::samples(text).filter(|s| s.value.is_finite()) {
        add_sample(&mut load, sample.name, sample.value);
    }
    (load != EngineLoad::default()).then_some(load)
}

fn add_sample(load: &mut EngineLoad, name: &str, value: f64) {
    if RUNNING.contains(&name) {
        *load.running.get_or_insert(0.0) += value;
    } else if WAITING.contains(&name) {
        *load.waiting.get_or_insert(0.0) += value;
    } else if KV_USAGE.contains(&name) {
        let kv = load.kv_usage.get_or_insert(0.0);
        *kv = kv.max(value);
    }
}

/// Scrapes every endpoint in the table each `interval`. An endpoint that
/// does not answer keeps no stale figures: its load becomes unknown, and
/// only the router's own outstanding count steers it. Scrape failures
/// never eject: metrics can be off (SGLang without `--enable-metrics`).
pub async fn scrape_loop(
    upstream: Upstream,
    registry: Arc<Registry>,
    mut table: watch::Receiver<Arc<RoutingTable>>,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let urls = endpoint_urls(&table.borrow_and_update());
        let handles: Vec<_> = urls
            .into_iter()
            .map(|url| {
                tokio::spawn(scrape_endpoint(
                    upstream.clone(),
                    Arc::clone(&registry),
                    url,
                    interval,
                ))
            })
            .collect();
        for handle in handles {
            let _ = handle.await;
        }
    }
}

/// Every endpoint URL of the table once, in order.
fn endpoint_urls(table: &RoutingTable) -> Vec<String> {
    let mut urls: Vec<String> = table
        .models
        .iter()
        .flat_map(|m| m.endpoints.iter().map(|e| e.url.clone()))
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

async fn scrape_endpoint(
    upstream: Upstream,
    registry: Arc<Registry>,
    url: String,
    interval: Duration,
) {
    let stats = registry.get(&url);
    let text = upstream
        .get_text(
            &format!("{url}/metrics"),
            interval.min(Duration::from_secs(5)),
        )
        .await;
    let load = match text {
        Ok((200, body)) => parse_engine_load(&body),
        _ => None,
    };
    stats.set_engine_load(load);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_new_names() {
        let text = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
vllm:time_to_first_token_seconds_bucket{le=\"0.001\"} 5\n";
        let load = parse_engine_load(text).unwrap();
        assert_eq!(load.running, Some(3.0));
        assert_eq!(load.waiting, Some(2.0));
        assert_eq!(load.kv_usage, Some(0.25));
    }

    #[test]
    fn reads_vllm_legacy_kv_and_sglang_ranks() {
        let legacy = "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n";
        assert_eq!(parse_engine_load(legacy).unwrap().kv_usage, Some(0.5));
        let sglang = "sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"0\"} 4.0\n\
sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"1\"} 1.0\n\
sglang:num_queue_reqs{engine_type=\"unified\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"0\"} 7\n\
sglang:token_usage{engine_type=\"unified\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"0\"} 0.1\n\
sglang:token_usage{engine_type=\"unified\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"1\"} 0.3\n";
        let load = parse_engine_load(sglang).unwrap();
        assert_eq!(load.running, Some(5.0));
        assert_eq!(load.waiting, Some(7.0));
        assert_eq!(load.kv_usage, Some(0.3));
    }

    #[test]
    fn unrelated_pages_give_nothing() {
        assert_eq!(parse_engine_load("up 1\n# comment\ngarbage line\n"), None);
    }
}
