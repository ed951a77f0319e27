//! The engines' periodic load lines while serving: vLLM's
//! `Engine 000: Avg prompt throughput ...` every 10 s (off with
//! `--disable-log-stats`) and SGLang's `Decode batch. ...`. Both are
//! written only when something happened since the last line, as the
//! engines do when idle.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::persona::Engine;
use crate::state::{EngineState, Phase};

/// The interval of vLLM's stat logger.
const INTERVAL: Duration = Duration::from_secs(10);

/// Runs until the engine stops serving.
pub async fn run(state: Arc<EngineState>) {
    let mut last_prompt = 0;
    let mut last_gen = 0;
    let mut last_hits = (0, 0);
    loop {
        tokio::time::sleep(INTERVAL).await;
        if matches!(state.phase(), Phase::Dead) {
            return;
        }
        let m = &state.metrics;
        let prompt = m.prompt_tokens.load(Ordering::Relaxed);
        let generated = m.generation_tokens.load(Ordering::Relaxed);
        let hits = (
            m.prefix_hits.load(Ordering::Relaxed),
            m.prefix_queries.load(Ordering::Relaxed),
        );
        let g = state.gauges();
        if prompt == last_prompt && generated == last_gen && g.running == 0 && g.waiting == 0 {
            continue;
        }
        let secs = INTERVAL.as_secs_f64();
        let prompt_rate = (prompt - last_prompt) as f64 / secs;
        let gen_rate = (generated - last_gen) as f64 / secs;
        let queried = hits.1 - last_hits.1;
        let hit_rate = if queried == 0 {
            0.0
        } else {
            100.0 * (hits.0 - last_hits.0) as f64 / queried as f64
        };
        match state.cfg.persona.engine {
            Engine::Vllm => state.log.api(
                "INFO",
                "loggers.py:123",
                &format!(
                    "Engine 000: Avg prompt throughput: {prompt_rate:.1} tokens/s, Avg generation throughput: {gen_rate:.1} tokens/s, Running: {} reqs, Waiting: {} reqs, GPU KV cache usage: {:.1}%, Prefix cache hit rate: {hit_rate:.1}%",
                    g.running,
                    g.waiting,
                    100.0 * g.kv_usage
                ),
            ),
            Engine::Sglang => state.log.sglang(
                Some(0),
                &format!(
                    "Decode batch, #running-req: {}, #token: {}, token usage: {:.2}, cuda graph: True, gen throughput (token/s): {gen_rate:.2}, #queue-req: {}, ",
                    g.running, g.kv_tokens_used, g.kv_usage, g.waiting
                ),
            ),
        }
        last_prompt = prompt;
        last_gen = generated;
        last_hits = hits;
    }
}
