//! vLLM sleep mode: `POST /sleep?level=N`, `POST /wake_up`, `GET
//! /is_sleeping`, registered only in the server's development mode
//! (`VLLM_SERVER_DEV_MODE=1`) as vLLM registers them, and refused unless
//! the engine was started with `--enable-sleep-mode`. Asleep, the engine
//! keeps answering health, models and metrics, and refuses generation with
//! 503; level 1 keeps the weights (in CPU memory), and both levels drop
//! the KV cache.

use std::sync::atomic::Ordering;

use crate::http::{self, SimResponse};
use crate::state::EngineState;

/// `vllm:engine_sleep_state`'s label for each level.
pub const STATES: [&str; 3] = ["awake", "weights_offloaded", "discard_all"];

pub fn is_asleep(state: &EngineState) -> bool {
    level(state) > 0
}

pub fn level(state: &EngineState) -> u8 {
    state.sleep_level.load(Ordering::Acquire)
}

fn not_enabled() -> SimResponse {
    http::json(
        400,
        "{\"error\":{\"message\":\"Sleep mode is not enabled: start the server with \
         --enable-sleep-mode\",\"type\":\"BadRequestError\",\"code\":400}}",
    )
}

/// `POST /sleep?level=N` (1 when absent).
pub async fn sleep(state: &EngineState, query: &str) -> SimResponse {
    if !state.cfg.sleep_mode {
        return not_enabled();
    }
    let level = match query_value(query, "level").map(str::parse::<u8>) {
        None => 1,
        Some(Ok(level @ (1 | 2))) => level,
        Some(_) => {
            return http::json(
                400,
                "{\"error\":{\"message\":\"level must be 1 or 2\",\"type\":\"BadRequestError\",\"code\":400}}",
            );
        }
    };
    if !is_asleep(state) {
        tokio::time::sleep(state.cfg.knobs.sleep_time).await;
        // The KV cache is discarded at every level.
        state.clear_prefix_caches();
        state.log.api(
            "INFO",
            "api_server.py:984",
            &format!("Sleep mode level {level}: model weights and KV cache released"),
        );
    }
    state.sleep_level.store(level, Ordering::Release);
    http::empty(200)
}

/// `POST /wake_up`.
pub async fn wake_up(state: &EngineState) -> SimResponse {
    if !state.cfg.sleep_mode {
        return not_enabled();
    }
    if is_asleep(state) {
        tokio::time::sleep(state.cfg.knobs.wake_time).await;
        state
            .log
            .api("INFO", "api_server.py:1001", "Woke up from sleep mode");
    }
    state.sleep_level.store(0, Ordering::Release);
    http::empty(200)
}

/// `GET /is_sleeping`.
pub fn is_sleeping(state: &EngineState) -> SimResponse {
    http::json(200, format!("{{\"is_sleeping\":{}}}", is_asleep(state)))
}

/// What a request needing the weights gets while the engine sleeps.
pub fn refused_while_asleep() -> SimResponse {
    http::json(
        503,
        "{\"error\":{\"message\":\"The model is sleeping; wake it up with /wake_up first\",\
         \"type\":\"ServiceUnavailableError\",\"code\":503}}",
    )
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_is_read_from_the_query() {
        assert_eq!(query_value("level=2", "level"), Some("2"));
        assert_eq!(query_value("a=1&level=1", "level"), Some("1"));
        assert_eq!(query_value("", "level"), None);
    }
}
