//! The engines' own bytes: batches encoded by the event classes of the
//! real vLLM 0.11, vLLM 0.34 and SGLang 0.5.23 wheels
//! (scripts/kv-events/encode_fixtures.py) must decode to what the classes
//! were given, and llmgw's encoder must write the same bytes back.

use llmgw_kv_events::{EventBatch, KvEvent, WireShape, decode_batch, encode_batch};
use serde_json::Value;

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn cases(file: &str) -> Vec<Value> {
    let path = format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str::<Vec<Value>>(&text).expect("fixture JSON")
}

/// A hash as the fixtures write it: an integer (signed for SGLang) or
/// `{"$bytes": hex}`, folded the way vLLM folds digests.
fn hash(value: &Value) -> u64 {
    match value {
        Value::Number(n) => n
            .as_u64()
            .unwrap_or_else(|| n.as_i64().expect("int") as u64),
        Value::Object(o) => {
            let bytes = hex(o["$bytes"].as_str().expect("$bytes"));
            bytes[bytes.len() - 8..]
                .iter()
                .fold(0, |acc, b| (acc << 8) | u64::from(*b))
        }
        other => panic!("not a hash: {other}"),
    }
}

fn hashes(value: &Value) -> Vec<u64> {
    value
        .as_array()
        .expect("hash list")
        .iter()
        .map(hash)
        .collect()
}

fn text(value: &Value) -> Option<String> {
    value.as_str().map(str::to_string)
}

fn small(value: &Value) -> Option<u32> {
    value.as_u64().map(|n| n as u32)
}

fn check_event(case: &str, got: &KvEvent, want: &Value) {
    match (got, want["type"].as_str().expect("type")) {
        (KvEvent::BlockStored(s), "BlockStored") => {
            assert_eq!(s.block_hashes, hashes(&want["block_hashes"]), "{case}");
            let parent = &want["parent_block_hash"];
            assert_eq!(
                s.parent_block_hash,
                (!parent.is_null()).then(|| hash(parent)),
                "{case}"
            );
            let tokens: Vec<u32> = want["token_ids"]
                .as_array()
                .expect("token_ids")
                .iter()
                .map(|t| match t {
                    Value::Array(pair) => pair[0].as_u64().expect("token") as u32,
                    t => t.as_u64().expect("token") as u32,
                })
                .collect();
            assert_eq!(s.token_ids, tokens, "{case}");
            assert_eq!(Some(s.block_size), small(&want["block_size"]), "{case}");
            assert_eq!(s.lora_id, want["lora_id"].as_u64(), "{case}");
            assert_eq!(s.medium, text(&want["medium"]), "{case}");
            assert_eq!(s.lora_name, text(&want["lora_name"]), "{case}");
            assert_eq!(s.group_idx, small(&want["group_idx"]), "{case}");
            assert_eq!(
                s.kv_cache_spec_kind,
                text(&want["kv_cache_spec_kind"]),
                "{case}"
            );
            let salted = [&want["extra_keys"], &want["cache_salt"]]
                .iter()
                .any(|v| match v {
                    Value::Array(items) => items.iter().any(|i| !i.is_null()),
                    Value::Null => false,
                    _ => true,
                });
            assert_eq!(
                s.extra_keys.is_some(),
                salted,
                "{case}: extra keys {:?}",
                s.extra_keys
            );
        }
        (KvEvent::BlockRemoved(r), "BlockRemoved") => {
            assert_eq!(r.block_hashes, hashes(&want["block_hashes"]), "{case}");
            assert_eq!(r.medium, text(&want["medium"]), "{case}");
            assert_eq!(r.group_idx, small(&want["group_idx"]), "{case}");
        }
        (KvEvent::AllBlocksCleared, "AllBlocksCleared") => {}
        (got, want) => panic!("{case}: decoded {got:?}, the engine sent {want}"),
    }
}

fn check_file(file: &str, shape: WireShape) {
    let cases = cases(file);
    assert!(cases.len() >= 8, "{file}: only {} cases", cases.len());
    for case in cases {
        let name = format!("{file} {}", case["name"].as_str().expect("name"));
        let payload = hex(case["payload_hex"].as_str().expect("payload_hex"));
        let decoded = decode_batch(&payload).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded.unknown_events, 0, "{name}");
        let want = &case["expect"];
        let batch = &decoded.batch;
        assert_eq!(batch.ts, want["ts"].as_f64().expect("ts"), "{name}");
        assert_eq!(batch.dp_rank, small(&want["dp_rank"]), "{name}");
        let events = want["events"].as_array().expect("events");
        assert_eq!(batch.events.len(), events.len(), "{name}");
        for (got, want) in batch.events.iter().zip(events) {
            check_event(&name, got, want);
        }
        // What llmgw writes decodes to the same batch.
        let again = decode_batch(&encode_batch(batch, shape)).expect("re-decode");
        assert_eq!(&again.batch, batch, "{name}: round trip");
    }
}

#[test]
fn vllm_0_11_arrays_decode_as_the_engine_meant_them() {
    check_file("vllm-0.11.json", WireShape::VllmArrays);
}

#[test]
fn vllm_0_34_maps_decode_as_the_engine_meant_them() {
    check_file("vllm-0.34.json", WireShape::VllmMaps);
}

#[test]
fn sglang_0_5_maps_decode_as_the_engine_meant_them() {
    check_file("sglang-0.5.23.json", WireShape::SglangMaps);
}

/// The simulator's events are the engines' bytes, not merely readable:
/// batches of the fields the simulator sets re-encode identically.
#[test]
fn the_simulators_encoding_is_byte_identical_to_the_engines() {
    let plain = |batch: &EventBatch| {
        batch.events.iter().all(|e| match e {
            KvEvent::BlockStored(s) => {
                s.lora_id.is_none() && s.lora_name.is_none() && s.extra_keys.is_none()
            }
            _ => true,
        })
    };
    let mut compared = 0;
    for (file, shape) in [
        ("vllm-0.11.json", WireShape::VllmArrays),
        ("vllm-0.34.json", WireShape::VllmMaps),
        ("sglang-0.5.23.json", WireShape::SglangMaps),
    ] {
        for case in cases(file) {
            let name = case["name"].as_str().expect("name");
            if name.contains("bytes") || name.contains("all_fields") || name.contains("bigram") {
                continue;
            }
            let payload = hex(case["payload_hex"].as_str().expect("payload_hex"));
            let batch = decode_batch(&payload).expect("decode").batch;
            if !plain(&batch) {
                continue;
            }
            assert_eq!(
                encode_batch(&batch, shape),
                payload,
                "{file} {name}: llmgw's bytes differ from the engine's"
            );
            compared += 1;
        }
    }
    assert!(compared >= 15, "only {compared} batches compared");
}
