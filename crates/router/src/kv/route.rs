//! Cache-aware routing in the request path: the request's tokens, each
//! candidate's uncached share of them, and the decision counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use llmgw_tokenizer::PromptFields;

use super::local_tokens::{Check, LocalTokens};
use super::tokenize::tokenize;
use crate::endpoints::EndpointStats;
use crate::proxy::candidates;
use crate::service::Shared;
use crate::table::RoutedModel;

/// The prompt's token ids: the router's own where it has the model's
/// tokenizer and its tokens agreed with an engine's, else asked of the
/// least loaded ready engine of the model (`/tokenize`). None, counted as a
/// fallback to prefix affinity, when no engine of the model publishes KV
/// events or no tokens could be had in time.
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
    let Ok(request) = serde_json::from_slice::<PromptFields<'_>>(body) else {
        stats.fallback_no_tokens.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let tokenizers = &shared.settings.tokenizers;
    let local = match tokenizers.get(&model.name) {
        Some(tokenizer) => tokenizers
            .tokenize(&tokenizer, &request, body)
            .await
            .map(|tokens| (tokenizer, tokens)),
        None => None,
    };
    if let Some((_, LocalTokens { ids, check: false })) = local {
        stats.tokenized_by_router.fetch_add(1, Ordering::Relaxed);
        return Some(ids);
    }
    let engine = engine_tokens(shared, model, &request, exclude).await;
    let tokens = match (local, engine) {
        (Some((tokenizer, ours)), Some(engine)) => {
            let counter = match tokenizer.check(&model.name, &ours.ids, &engine) {
                Check::Agreed => &stats.checks_agreed,
                Check::Disagreed { .. } => &stats.checks_disagreed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            stats.tokenized_by_engine.fetch_add(1, Ordering::Relaxed);
            Some(engine)
        }
        // No engine could say: the router's tokens, unconfirmed this once.
        (Some((_, ours)), None) => {
            stats.tokenized_by_router.fetch_add(1, Ordering::Relaxed);
            Some(ours.ids)
        }
        (None, Some(engine)) => {
            stats.tokenized_by_engine.fetch_add(1, Ordering::Relaxed);
            Some(engine)
        }
        (None, None) => None,
    };
    if tokens.is_none() {
        stats.fallback_no_tokens.fetch_add(1, Ordering::Relaxed);
    }
    tokens
}

/// The least loaded candidate engine's `/tokenize` answer.
async fn engine_tokens(
    shared: &Shared,
    model: &RoutedModel,
    request: &PromptFields<'_>,
    exclude: &[String],
) -> Option<Vec<u32>> {
    let pool = candidates(shared, model, exclude);
    let engine = pool
        .iter()
        .filter(|e| e.authority.is_some())
        .min_by(|a, b| a.load_score().total_cmp(&b.load_score()))?;
    tokenize(
        &shared.upstream,
        engine.authority.as_deref()?,
        &model.name,
        request,
        shared.settings.tokenize_timeout,
    )
    .await
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
