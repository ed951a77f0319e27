//! `--kv-events-config`: whether and where the engine publishes its KV
//! events, read as the engines read the JSON, and the prefix cache built
//! from it once the load has sized the KV memory.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use llmgw_kv_events::{Publisher, PublisherConfig, WireShape};

use crate::config::ServeConfig;
use crate::failures::Failure;
use crate::persona::{Engine, Persona};
use crate::prefix_cache::{EventSink, PrefixCache};
use crate::state::DpRank;

/// The publisher settings of `--kv-events-config`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsConfig {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub buffer_steps: usize,
    pub hwm: usize,
}

/// Reads the option's JSON as `persona` does; `Ok(None)` when events are
/// off. vLLM 0.11 needs `enable_kv_cache_events` and the `zmq` publisher
/// (its default publisher is `null`); vLLM 0.34 needs only the first and
/// refuses keys it does not know; SGLang ignores the first and needs the
/// publisher.
pub fn parse(persona: Persona, json: Option<&str>) -> Result<Option<KvEventsConfig>, String> {
    let Some(json) = json else {
        return Ok(None);
    };
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| format!("argument --kv-events-config: invalid JSON: {e}"))?;
    let Some(fields) = value.as_object() else {
        return Err("argument --kv-events-config: expected a JSON object".into());
    };
    let vllm_current = persona.is_vllm() && persona.at_least((0, 34, 0));
    if vllm_current {
        const KNOWN: [&str; 8] = [
            "enable_kv_cache_events",
            "publisher",
            "endpoint",
            "replay_endpoint",
            "buffer_steps",
            "hwm",
            "max_queue_size",
            "topic",
        ];
        if let Some(unknown) = fields.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(format!(
                "argument --kv-events-config: 1 validation error for KVEventsConfig\n{unknown}\n  Extra inputs are not permitted"
            ));
        }
    }
    let enabled = fields
        .get("enable_kv_cache_events")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let default_publisher = if vllm_current && enabled {
        "zmq"
    } else {
        "null"
    };
    let publisher = fields
        .get("publisher")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(default_publisher);
    let on = match persona.engine {
        Engine::Vllm => enabled && publisher == "zmq",
        Engine::Sglang => publisher == "zmq",
    };
    if !on {
        return Ok(None);
    }
    let text = |key: &str| fields.get(key).and_then(serde_json::Value::as_str);
    let number = |key: &str, default: usize| {
        fields
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .map_or(default, |n| n as usize)
    };
    Ok(Some(KvEventsConfig {
        endpoint: text("endpoint").unwrap_or("tcp://*:5557").to_string(),
        replay_endpoint: text("replay_endpoint").map(str::to_string),
        topic: text("topic").unwrap_or("").to_string(),
        buffer_steps: number("buffer_steps", 10_000),
        hwm: number("hwm", 100_000),
    }))
}

/// The shape this engine version writes its events in.
pub fn wire_shape(persona: Persona) -> WireShape {
    match persona.engine {
        Engine::Sglang => WireShape::SglangMaps,
        Engine::Vllm if persona.at_least((0, 34, 0)) => WireShape::VllmMaps,
        Engine::Vllm => WireShape::VllmArrays,
    }
}

/// `tcp://*:5557` as an address to bind, moved up by the data-parallel rank
/// as the engines do for each rank's publisher.
fn bind_address(endpoint: &str, rank_offset: u16) -> Option<SocketAddr> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let ip: IpAddr = match host {
        "*" | "0.0.0.0" => Ipv4Addr::UNSPECIFIED.into(),
        "localhost" => Ipv4Addr::LOCALHOST.into(),
        h => h.trim_matches(['[', ']']).parse().ok()?,
    };
    Some(SocketAddr::new(ip, port.checked_add(rank_offset)?))
}

/// The engine's data-parallel ranks, each with its own prefix cache
/// sized by the KV memory of its own GPUs, publishing when the command
/// line asks: rank `r` on the configured ports plus `r`, its batches
/// naming it.
pub async fn dp_ranks(cfg: &ServeConfig, kv_tokens: u64) -> Result<Vec<DpRank>, Failure> {
    let mut ranks = Vec::new();
    for rank in 0..cfg.dp {
        let rank = u16::try_from(rank).map_err(|_| Failure::KvEventsBind {
            endpoint: format!("data-parallel rank {rank}"),
        })?;
        ranks.push(DpRank::new(prefix_cache(cfg, kv_tokens, rank).await?));
    }
    Ok(ranks)
}

async fn prefix_cache(
    cfg: &ServeConfig,
    kv_tokens: u64,
    rank: u16,
) -> Result<PrefixCache, Failure> {
    let capacity = cfg
        .knobs
        .prefix_cache_tokens
        .map_or(kv_tokens, |cap| cap.min(kv_tokens));
    let events = match &cfg.kv_events {
        None => None,
        Some(kv) => {
            let bind_failure = |endpoint: &str| Failure::KvEventsBind {
                endpoint: endpoint.to_string(),
            };
            let stream =
                bind_address(&kv.endpoint, rank).ok_or_else(|| bind_failure(&kv.endpoint))?;
            let replay = match &kv.replay_endpoint {
                Some(r) => Some(bind_address(r, rank).ok_or_else(|| bind_failure(r))?),
                None => None,
            };
            let publisher = Publisher::bind(
                stream,
                replay,
                PublisherConfig {
                    topic: kv.topic.clone(),
                    buffer_steps: kv.buffer_steps,
                    hwm: kv.hwm,
                    replay_topic_frame: wire_shape(cfg.persona) != WireShape::VllmArrays,
                },
            )
            .await
            .map_err(|_| bind_failure(&kv.endpoint))?;
            Some(EventSink {
                publisher,
                shape: wire_shape(cfg.persona),
                // The publishers always fill the batch's rank in, 0 included.
                dp_rank: Some(u32::from(rank)),
            })
        }
    };
    Ok(PrefixCache::new(
        cfg.block_size,
        capacity,
        cfg.hash_seed,
        events,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V011: Persona = Persona {
        engine: Engine::Vllm,
        version: (0, 11, 0),
    };
    const V034: Persona = Persona {
        engine: Engine::Vllm,
        version: (0, 34, 0),
    };
    const SGLANG: Persona = Persona {
        engine: Engine::Sglang,
        version: (0, 5, 23),
    };

    #[test]
    fn each_engine_turns_events_on_its_own_way() {
        let enabled_only = Some(r#"{"enable_kv_cache_events": true}"#);
        assert_eq!(parse(V011, enabled_only), Ok(None));
        assert!(parse(V034, enabled_only).unwrap().is_some());
        assert_eq!(parse(SGLANG, enabled_only), Ok(None));
        let publisher_only = Some(r#"{"publisher": "zmq"}"#);
        assert_eq!(parse(V011, publisher_only), Ok(None));
        assert!(parse(SGLANG, publisher_only).unwrap().is_some());
        // What the agent passes works on all three.
        let agent = r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:7001", "replay_endpoint": "tcp://*:7002", "topic": ""}"#;
        for persona in [V011, V034, SGLANG] {
            let on = parse(persona, Some(agent)).unwrap().unwrap();
            assert_eq!(on.endpoint, "tcp://*:7001");
            assert_eq!(on.replay_endpoint.as_deref(), Some("tcp://*:7002"));
            assert_eq!(on.buffer_steps, 10_000);
        }
        assert_eq!(parse(V011, None), Ok(None));
        assert!(
            parse(V011, Some("{not json"))
                .unwrap_err()
                .contains("--kv-events-config")
        );
        let unknown = Some(r#"{"enable_kv_cache_events": true, "bind": true}"#);
        assert!(
            parse(V034, unknown)
                .unwrap_err()
                .contains("Extra inputs are not permitted")
        );
        assert!(parse(SGLANG, Some(r#"{"publisher": "zmq", "bind": true}"#)).is_ok());
    }

    #[test]
    fn endpoints_bind_where_the_engines_would() {
        assert_eq!(
            bind_address("tcp://*:5557", 0),
            Some("0.0.0.0:5557".parse().unwrap())
        );
        assert_eq!(
            bind_address("tcp://127.0.0.1:5557", 2),
            Some("127.0.0.1:5559".parse().unwrap())
        );
        assert_eq!(bind_address("ipc:///tmp/kv", 0), None);
    }
}
