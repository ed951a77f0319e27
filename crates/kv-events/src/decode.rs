//! Reading a published batch, whichever engine and version wrote it.
//!
//! Unknown fields are ignored and unknown event types skipped (counted),
//! so a newer engine that adds either keeps being read.

use rmpv::Value;

use crate::event::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("not msgpack: {0}")]
    Msgpack(String),
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
    #[error("batch: {0}")]
    Batch(&'static str),
    #[error("event {index} ({kind}): field {field}: {problem}")]
    Field {
        index: usize,
        kind: String,
        field: &'static str,
        problem: &'static str,
    },
}

/// A batch and how many of its events were of a type llmgw does not know.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub batch: EventBatch,
    pub unknown_events: usize,
}

pub fn decode_batch(mut bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let total = bytes.len();
    let value =
        rmpv::decode::read_value(&mut bytes).map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !bytes.is_empty() {
        return Err(DecodeError::Trailing(bytes.len().min(total)));
    }
    let (ts, events, dp_rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(_) => (
            map_get(&value, "ts"),
            map_get(&value, "events"),
            map_get(&value, "data_parallel_rank").or_else(|| map_get(&value, "dp_rank")),
        ),
        _ => return Err(DecodeError::Batch("neither an array nor a map")),
    };
    let ts = ts
        .and_then(number)
        .ok_or(DecodeError::Batch("ts is missing or not a number"))?;
    let Some(Value::Array(raw_events)) = events else {
        return Err(DecodeError::Batch("events is missing or not an array"));
    };
    let dp_rank = match dp_rank {
        None | Some(Value::Nil) => None,
        Some(v) => Some(v.as_u64().and_then(|r| u32::try_from(r).ok()).ok_or(
            DecodeError::Batch("data_parallel_rank is not a small integer"),
        )?),
    };
    let mut decoded = Vec::with_capacity(raw_events.len());
    let mut unknown_events = 0;
    for (index, raw) in raw_events.iter().enumerate() {
        match decode_event(index, raw)? {
            Some(event) => decoded.push(event),
            None => unknown_events += 1,
        }
    }
    Ok(Decoded {
        batch: EventBatch {
            ts,
            events: decoded,
            dp_rank,
        },
        unknown_events,
    })
}

/// Positional field names of the array shape, after the tag.
const STORED_FIELDS: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
];
const REMOVED_FIELDS: &[&str] = &["block_hashes", "medium"];

/// One event's fields, positional or named.
struct Fields<'a> {
    index: usize,
    kind: &'a str,
    body: Body<'a>,
}

enum Body<'a> {
    Positional(&'a [Value], &'static [&'static str]),
    Named(&'a Value),
}

impl<'a> Fields<'a> {
    fn get(&self, name: &'static str) -> Option<&'a Value> {
        let value = match self.body {
            Body::Positional(values, names) => names
                .iter()
                .position(|n| *n == name)
                .and_then(|i| values.get(i)),
            Body::Named(map) => map_get(map, name),
        };
        value.filter(|v| !v.is_nil())
    }

    fn error(&self, field: &'static str, problem: &'static str) -> DecodeError {
        DecodeError::Field {
            index: self.index,
            kind: self.kind.to_string(),
            field,
            problem,
        }
    }

    fn hashes(&self, field: &'static str) -> Result<Vec<BlockHash>, DecodeError> {
        match self.get(field) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| block_hash(v).ok_or_else(|| self.error(field, "not a block hash")))
                .collect(),
            Some(_) => Err(self.error(field, "not an array")),
            None => Err(self.error(field, "missing")),
        }
    }

    fn optional_hash(&self, field: &'static str) -> Result<Option<BlockHash>, DecodeError> {
        self.get(field)
            .map(|v| block_hash(v).ok_or_else(|| self.error(field, "not a block hash")))
            .transpose()
    }

    fn optional_u64(&self, field: &'static str) -> Result<Option<u64>, DecodeError> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.error(field, "not an unsigned integer"))
            })
            .transpose()
    }

    fn optional_u32(&self, field: &'static str) -> Result<Option<u32>, DecodeError> {
        self.optional_u64(field)?
            .map(|v| u32::try_from(v).map_err(|_| self.error(field, "too large")))
            .transpose()
    }

    fn optional_text(&self, field: &'static str) -> Result<Option<String>, DecodeError> {
        self.get(field)
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.error(field, "not a string"))
            })
            .transpose()
    }

    /// Token ids; SGLang's bigram (EAGLE) cache sends each position as a
    /// pair, whose first element is the position's token.
    fn token_ids(&self) -> Result<Vec<u32>, DecodeError> {
        let token = |v: &Value| match v {
            Value::Array(pair) => pair.first().and_then(Value::as_u64),
            v => v.as_u64(),
        };
        match self.get("token_ids") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    token(v)
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(|| self.error("token_ids", "not a token id"))
                })
                .collect(),
            Some(_) => Err(self.error("token_ids", "not an array")),
            None => Ok(Vec::new()),
        }
    }

    /// Extra hash inputs, in one canonical text so equal keys compare equal.
    fn extra_keys(&self) -> Option<String> {
        ["extra_keys", "cache_salt"]
            .iter()
            .find_map(|name| self.get(name))
            // vLLM sends one entry per block, nil where a block has none.
            .filter(|v| !matches!(v, Value::Array(a) if a.iter().all(Value::is_nil)))
            .map(|v| match v.as_str() {
                Some(s) => s.to_string(),
                None => v.to_string(),
            })
    }
}

fn decode_event(index: usize, raw: &Value) -> Result<Option<KvEvent>, DecodeError> {
    let (kind, positional) = match raw {
        Value::Array(items) => match items.split_first() {
            Some((tag, rest)) => (tag.as_str(), Some(rest)),
            None => (None, None),
        },
        Value::Map(_) => (map_get(raw, "type").and_then(Value::as_str), None),
        _ => (None, None),
    };
    let Some(kind) = kind else {
        return Err(DecodeError::Field {
            index,
            kind: "?".into(),
            field: "type",
            problem: "the event carries no type tag",
        });
    };
    let fields = |names: &'static [&'static str]| Fields {
        index,
        kind,
        body: match positional {
            Some(values) => Body::Positional(values, names),
            None => Body::Named(raw),
        },
    };
    let event = match kind {
        "BlockStored" => {
            let f = fields(STORED_FIELDS);
            KvEvent::BlockStored(BlockStored {
                block_hashes: f.hashes("block_hashes")?,
                parent_block_hash: f.optional_hash("parent_block_hash")?,
                token_ids: f.token_ids()?,
                block_size: f
                    .optional_u32("block_size")?
                    .ok_or_else(|| f.error("block_size", "missing"))?,
                lora_id: f.optional_u64("lora_id")?,
                medium: f.optional_text("medium")?,
                lora_name: f.optional_text("lora_name")?,
                group_idx: f.optional_u32("group_idx")?,
                kv_cache_spec_kind: f.optional_text("kv_cache_spec_kind")?,
                extra_keys: f.extra_keys(),
            })
        }
        "BlockRemoved" => {
            let f = fields(REMOVED_FIELDS);
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: f.hashes("block_hashes")?,
                medium: f.optional_text("medium")?,
                group_idx: f.optional_u32("group_idx")?,
            })
        }
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    };
    Ok(Some(event))
}

fn map_get<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    match map {
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn number(value: &Value) -> Option<f64> {
    value
        .as_f64()
        .or_else(|| value.as_i64().map(|v| v as f64))
        .or_else(|| value.as_u64().map(|v| v as f64))
}

fn block_hash(value: &Value) -> Option<BlockHash> {
    match value {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|v| v as u64)),
        Value::Binary(bytes) if !bytes.is_empty() => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
        }
        _ => None,
    }
}
