//! Writing a batch byte for byte as a given engine version does (the
//! simulator plays each of them): the batch a 3-element array, events as
//! tagged arrays (vLLM 0.11) or tagged maps with unset optional fields left
//! out (vLLM 0.34, SGLang).

use rmpv::Value;

use crate::event::{BlockStored, EventBatch, KvEvent, WireShape};

pub fn encode_batch(batch: &EventBatch, shape: WireShape) -> Vec<u8> {
    let mut out = Vec::new();
    rmp::encode::write_array_len(&mut out, 3).expect("writing to a Vec cannot fail");
    rmp::encode::write_f64(&mut out, batch.ts).expect("writing to a Vec cannot fail");
    rmp::encode::write_array_len(&mut out, batch.events.len() as u32)
        .expect("writing to a Vec cannot fail");
    for event in &batch.events {
        write_event(&mut out, event, shape);
    }
    write(&mut out, &optional(&batch.dp_rank));
    out
}

fn write(out: &mut Vec<u8>, value: &Value) {
    rmpv::encode::write_value(out, value).expect("writing to a Vec cannot fail");
}

fn hashes(list: &[u64]) -> Value {
    Value::Array(list.iter().map(|h| Value::from(*h)).collect())
}

/// SGLang's hashes are signed 64-bit integers.
fn signed_hashes(list: &[u64]) -> Value {
    Value::Array(list.iter().map(|h| Value::from(*h as i64)).collect())
}

fn optional<T: Into<Value> + Clone>(value: &Option<T>) -> Value {
    value.clone().map_or(Value::Nil, Into::into)
}

/// A map event: `type` first, then the required fields (nil included),
/// then the optional ones that are set. msgspec sizes the map header by
/// the number of fields the class could have, so a class of 16 or more
/// fields gets a map16 header even when few are sent.
struct MapEvent<'a> {
    kind: &'a str,
    required: Vec<(&'a str, Value)>,
    optional: Vec<(&'a str, Value)>,
    possible_fields: usize,
}

impl MapEvent<'_> {
    fn write(self, out: &mut Vec<u8>) {
        let optional: Vec<_> = self
            .optional
            .into_iter()
            .filter(|(_, v)| !v.is_nil())
            .collect();
        let len = 1 + self.required.len() + optional.len();
        if self.possible_fields >= 16 {
            out.push(0xde);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            rmp::encode::write_map_len(out, len as u32).expect("writing to a Vec cannot fail");
        }
        write(out, &Value::from("type"));
        write(out, &Value::from(self.kind));
        for (key, value) in self.required.into_iter().chain(optional) {
            write(out, &Value::from(key));
            write(out, &value);
        }
    }
}

fn write_event(out: &mut Vec<u8>, event: &KvEvent, shape: WireShape) {
    match (event, shape) {
        (KvEvent::BlockStored(stored), WireShape::VllmArrays) => write(
            out,
            &Value::Array(vec![
                Value::from("BlockStored"),
                hashes(&stored.block_hashes),
                optional(&stored.parent_block_hash),
                tokens(stored),
                Value::from(stored.block_size),
                optional(&stored.lora_id),
                optional(&stored.medium),
            ]),
        ),
        (KvEvent::BlockRemoved(removed), WireShape::VllmArrays) => write(
            out,
            &Value::Array(vec![
                Value::from("BlockRemoved"),
                hashes(&removed.block_hashes),
                optional(&removed.medium),
            ]),
        ),
        (KvEvent::AllBlocksCleared, WireShape::VllmArrays) => {
            write(out, &Value::Array(vec![Value::from("AllBlocksCleared")]))
        }
        (KvEvent::BlockStored(stored), WireShape::VllmMaps) => MapEvent {
            kind: "BlockStored",
            required: stored_head(stored)
                .into_iter()
                .chain([
                    ("medium", optional(&stored.medium)),
                    ("lora_name", optional(&stored.lora_name)),
                ])
                .collect(),
            optional: vec![
                ("extra_keys", optional(&stored.extra_keys)),
                ("group_idx", optional(&stored.group_idx)),
                ("kv_cache_spec_kind", optional(&stored.kv_cache_spec_kind)),
            ],
            possible_fields: 16,
        }
        .write(out),
        (KvEvent::BlockStored(stored), WireShape::SglangMaps) => MapEvent {
            kind: "BlockStored",
            required: {
                let mut head = stored_head(stored);
                head[0].1 = signed_hashes(&stored.block_hashes);
                head[1].1 = stored
                    .parent_block_hash
                    .map_or(Value::Nil, |h| Value::from(h as i64));
                head
            },
            optional: vec![
                ("medium", optional(&stored.medium)),
                ("cache_salt", optional(&stored.extra_keys)),
                ("lora_name", optional(&stored.lora_name)),
            ],
            possible_fields: 10,
        }
        .write(out),
        (KvEvent::BlockRemoved(removed), WireShape::VllmMaps) => MapEvent {
            kind: "BlockRemoved",
            required: vec![
                ("block_hashes", hashes(&removed.block_hashes)),
                ("medium", optional(&removed.medium)),
            ],
            optional: vec![("group_idx", optional(&removed.group_idx))],
            possible_fields: 6,
        }
        .write(out),
        (KvEvent::BlockRemoved(removed), WireShape::SglangMaps) => MapEvent {
            kind: "BlockRemoved",
            required: vec![("block_hashes", signed_hashes(&removed.block_hashes))],
            optional: vec![("medium", optional(&removed.medium))],
            possible_fields: 3,
        }
        .write(out),
        (KvEvent::AllBlocksCleared, WireShape::VllmMaps | WireShape::SglangMaps) => MapEvent {
            kind: "AllBlocksCleared",
            required: Vec::new(),
            optional: Vec::new(),
            possible_fields: 1,
        }
        .write(out),
    }
}

fn tokens(stored: &BlockStored) -> Value {
    Value::Array(stored.token_ids.iter().map(|t| Value::from(*t)).collect())
}

/// The fields every engine's BlockStored starts with.
fn stored_head(stored: &BlockStored) -> Vec<(&'static str, Value)> {
    vec![
        ("block_hashes", hashes(&stored.block_hashes)),
        ("parent_block_hash", optional(&stored.parent_block_hash)),
        ("token_ids", tokens(stored)),
        ("block_size", Value::from(stored.block_size)),
        ("lora_id", optional(&stored.lora_id)),
    ]
}
