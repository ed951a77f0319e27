//! Cache-aware routing in the request path: the request's tokens, each
//! candidate's uncached share of them, and the decision counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::tokenize::{TokenizeRequest, tokenize};
use crate::endpoints::EndpointStats;
use crate::proxy::candidates;
use crate::service::Shared;
use crate::table::RoutedModel;

/// The prompt's token ids, asked of the least loaded ready engine of the
/// model; none, counted as a fallback to prefix affinity, when no engine of
/// the model publishes KV events or no engine could tokenize in time.
pub async fn request_tokens(
    shared: &Shared,
    model: &RoutedModel,
    body: &[u8],
    exclude: &[String],
) -> Option<Vec<u32>> {
    let stats = &shared.kv.stats;
    if !model.ready_endpoints().any(|e| !e.kv_events.is_empty()) {
        stats.fallback_no_index.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let tokens = async {
        let request: TokenizeRequest<'_> = serde_json::from_slice(body).ok()?;
        let pool = candidates(shared, model, exclude);
        let engine = pool
            .iter()
            .filter(|e| e.authority.is_some())
            .min_by(|a, b| a.load_score().total_cmp(&b.load_score()))?;
        let authority = engine.authority.as_deref()?;
        tokenize(
            &shared.upstream,
            authority,
            &model.name,
            &request,
            shared.settings.tokenize_timeout,
        )
        .await
    }
    .await;
    if tokens.is_none() {
        stats.fallback_no_tokens.fetch_add(1, Ordering::Relaxed);
    }
    tokens
}

/// Per candidate, the prompt tokens its cache lacks.
pub fn uncached_tokens(
    shared: &Shared,
    pool: &[Arc<EndpointStats>],
    tokens: &[u32],
) -> Option<Vec<u64>> {
    if pool.is_empty() {
        return None;
    }
    let urls: Vec<&str> = pool.iter().map(|e| e.url.as_str()).collect();
    let total = tokens.len() as u64;
    let cached = shared.kv.cached_tokens(&urls, tokens);
    Some(cached.into_iter().map(|c| total - c.min(total)).collect())
}

/// Counts a decision made by cache: the prompt's tokens and those the
/// chosen engine holds.
pub fn count_decision(
    shared: &Shared,
    prompt_tokens: u64,
    uncached_on_chosen: u64,
    took: std::time::Duration,
) {
    let stats = &shared.kv.stats;
    stats.by_cache.fetch_add(1, Ordering::Relaxed);
    stats
        .decision_nanos
        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    stats
        .routed_prompt_tokens
        .fetch_add(prompt_tokens, Ordering::Relaxed);
    stats.routed_cached_tokens.fetch_add(
        prompt_tokens.saturating_sub(uncached_on_chosen),
        Ordering::Relaxed,
    );
}
