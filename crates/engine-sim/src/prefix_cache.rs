//! A real prefix cache: full blocks of `block_size` tokens keyed by a hash
//! chained over their parent, a capacity from the KV memory the load sized,
//! least-recently-used eviction, and the engine's KV events for every block
//! stored and removed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use llmgw_kv_events::{
    BlockRemoved, BlockStored, EventBatch, KvEvent, Publisher, WireShape, encode_batch,
};

/// Where the engine's KV events go, in the wire shape of its version.
pub struct EventSink {
    pub publisher: Publisher,
    pub shape: WireShape,
    pub dp_rank: Option<u32>,
}

pub struct PrefixCache {
    block_size: usize,
    capacity_blocks: usize,
    /// Seeds the hash chain; vLLM 0.11 draws it per process unless
    /// `PYTHONHASHSEED` is set, so two engines name one prefix differently.
    hash_seed: u64,
    blocks: Mutex<Blocks>,
    events: Option<EventSink>,
}

#[derive(Default)]
struct Blocks {
    stamp_of: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
    clock: u64,
}

impl Blocks {
    fn touch(&mut self, hash: u64) -> bool {
        let Some(stamp) = self.stamp_of.get_mut(&hash) else {
            return false;
        };
        self.by_stamp.remove(stamp);
        self.clock += 1;
        *stamp = self.clock;
        self.by_stamp.insert(self.clock, hash);
        true
    }

    fn insert(&mut self, hash: u64) {
        self.clock += 1;
        self.stamp_of.insert(hash, self.clock);
        self.by_stamp.insert(self.clock, hash);
    }

    fn evict_oldest(&mut self) -> Option<u64> {
        let (_, hash) = self.by_stamp.pop_first()?;
        self.stamp_of.remove(&hash);
        Some(hash)
    }
}

/// What one prompt found and left in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    pub cached_tokens: u64,
    pub prompt_tokens: u64,
}

impl PrefixCache {
    pub fn new(
        block_size: usize,
        capacity_tokens: u64,
        hash_seed: u64,
        events: Option<EventSink>,
    ) -> Self {
        let block_size = block_size.max(1);
        PrefixCache {
            block_size,
            capacity_blocks: (capacity_tokens / block_size as u64).max(1) as usize,
            hash_seed,
            blocks: Mutex::new(Blocks::default()),
            events,
        }
    }

    /// The chained hash of each full block of `tokens`.
    fn block_hashes(&self, tokens: &[u32]) -> Vec<u64> {
        let mut parent = self.hash_seed;
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                let mut hash = parent ^ 0xcbf2_9ce4_8422_2325;
                for token in block {
                    hash ^= u64::from(*token);
                    hash = hash.wrapping_mul(0x0100_0000_01b3);
                }
                // Avoid 0 and the top bit: some subscribers read hashes as
                // signed 64-bit integers.
                parent = (hash >> 1).max(1);
                parent
            })
            .collect()
    }

    /// Finds the longest cached prefix of `tokens`, then stores the rest of
    /// its full blocks, evicting the least recently used, and publishes
    /// what changed.
    pub fn admit(&self, tokens: &[u32]) -> Lookup {
        let hashes = self.block_hashes(tokens);
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let cached = hashes.iter().take_while(|h| blocks.touch(**h)).count();
        // A prompt larger than the whole cache keeps only its head.
        let storable = hashes.len().min(self.capacity_blocks);
        let stored: Vec<u64> = hashes[cached.min(storable)..storable].to_vec();
        let mut removed = Vec::new();
        for hash in &stored {
            blocks.insert(*hash);
            while blocks.stamp_of.len() > self.capacity_blocks {
                match blocks.evict_oldest() {
                    Some(old) => removed.push(old),
                    None => break,
                }
            }
        }
        if let Some(sink) = &self.events {
            let mut events = Vec::new();
            if !removed.is_empty() {
                events.push(KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: removed,
                    medium: Some("GPU".into()),
                    group_idx: (sink.shape == WireShape::VllmMaps).then_some(0),
                }));
            }
            if !stored.is_empty() {
                let first = cached;
                events.push(KvEvent::BlockStored(BlockStored {
                    block_hashes: stored.clone(),
                    parent_block_hash: first.checked_sub(1).map(|i| hashes[i]),
                    token_ids: tokens
                        [first * self.block_size..(first + stored.len()) * self.block_size]
                        .to_vec(),
                    block_size: self.block_size as u32,
                    medium: Some("GPU".into()),
                    // vLLM 0.34 names the cache group of every store.
                    group_idx: (sink.shape == WireShape::VllmMaps).then_some(0),
                    kv_cache_spec_kind: (sink.shape == WireShape::VllmMaps)
                        .then(|| "full_attention".to_string()),
                    ..BlockStored::default()
                }));
            }
            if !events.is_empty() {
                sink.publish(events);
            }
        }
        Lookup {
            cached_tokens: (cached * self.block_size) as u64,
            prompt_tokens: tokens.len() as u64,
        }
    }

    /// Drops every block (a cache reset), telling subscribers.
    pub fn clear(&self) {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        *blocks = Blocks::default();
        if let Some(sink) = &self.events {
            sink.publish(vec![KvEvent::AllBlocksCleared]);
        }
    }

    #[cfg(test)]
    fn len_blocks(&self) -> usize {
        self.blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stamp_of
            .len()
    }
}

impl EventSink {
    fn publish(&self, events: Vec<KvEvent>) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let batch = EventBatch {
            ts,
            events,
            dp_rank: self.dp_rank,
        };
        self.publisher.publish(encode_batch(&batch, self.shape));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32, salt: u32) -> Vec<u32> {
        (0..n).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn a_repeated_prefix_hits_in_whole_blocks() {
        let cache = PrefixCache::new(16, 16 * 100, 1, None);
        let mut prompt = tokens(40, 0);
        assert_eq!(cache.admit(&prompt).cached_tokens, 0);
        prompt.extend(tokens(30, 9));
        // 40 tokens left 2 full blocks.
        assert_eq!(cache.admit(&prompt).cached_tokens, 32);
        assert_eq!(cache.admit(&prompt).cached_tokens, 64);
    }

    #[test]
    fn the_least_recently_used_block_goes_first() {
        let cache = PrefixCache::new(4, 4 * 3, 1, None);
        let a = tokens(4, 1);
        let b = tokens(4, 2);
        let c = tokens(4, 3);
        cache.admit(&a);
        cache.admit(&b);
        cache.admit(&c);
        cache.admit(&a); // a is fresh again; b is the oldest
        cache.admit(&tokens(4, 4));
        assert_eq!(cache.len_blocks(), 3);
        assert_eq!(cache.admit(&a).cached_tokens, 4);
        assert_eq!(cache.admit(&b).cached_tokens, 0);
    }
}
