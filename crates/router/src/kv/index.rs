//! The fleet-wide prefix index: which engine holds which token block.
//!
//! Blocks are keyed by llmgw's own hash chain over their tokens (seeded by
//! the LoRA adapter and any extra hash inputs such as a cache salt), never
//! by the engines' hashes: those differ between engines (vLLM 0.11 seeds
//! its chain per process) and between hash algorithms. Each engine's
//! hashes map to llmgw keys so its removals can be applied. A request's
//! tokens go through the same chain, so a lookup is one hash per block and
//! one map probe per block.

use std::collections::{HashMap, VecDeque};

use llmgw_kv_events::{BlockHash, BlockRemoved, BlockStored, KvEvent};

/// An engine as the index knows it: its base URL.
pub type EngineUrl = str;

/// The chain key of a block.
type BlockKey = u64;

/// Counts of what applying events did, for metrics and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub stored: u64,
    pub removed: u64,
    /// Blocks whose parent the index never saw (published before it
    /// subscribed, or lost): they cannot be placed in a chain.
    pub orphaned: u64,
    /// Blocks of a non-attention cache group (a hybrid model's state):
    /// never indexed.
    pub skipped_groups: u64,
    pub evicted: u64,
}

impl std::ops::AddAssign for Applied {
    fn add_assign(&mut self, o: Applied) {
        self.stored += o.stored;
        self.removed += o.removed;
        self.orphaned += o.orphaned;
        self.skipped_groups += o.skipped_groups;
        self.evicted += o.evicted;
    }
}

struct EngineBlocks {
    slot: u32,
    block_size: u32,
    /// (data-parallel rank, engine hash) → key.
    keys: HashMap<(u32, BlockHash), BlockKey>,
    /// Insertion order, oldest first, for the memory cap; entries removed
    /// since are skipped when met.
    order: VecDeque<(u32, BlockHash)>,
}

/// The engines holding one block, each with how many of its hashes name
/// the block. Almost always one engine, kept inline: a block's entry costs
/// no allocation of its own.
enum Holders {
    One {
        slot: u32,
        count: u32,
    },
    /// A boxed slice, not a `Vec`: two words in the map, not three.
    Many(Box<[(u32, u32)]>),
}

impl Holders {
    fn add(&mut self, slot: u32) {
        match self {
            Holders::One { slot: s, count } if *s == slot => *count += 1,
            Holders::One { slot: s, count } => {
                *self = Holders::Many(Box::new([(*s, *count), (slot, 1)]));
            }
            Holders::Many(list) => match list.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, count)) => *count += 1,
                None => {
                    let mut grown = list.to_vec();
                    grown.push((slot, 1));
                    *list = grown.into_boxed_slice();
                }
            },
        }
    }

    /// Takes one of `slot`'s hashes away; true when no engine is left.
    fn remove(&mut self, slot: u32) -> bool {
        match self {
            Holders::One { slot: s, count } if *s == slot => {
                *count -= 1;
                *count == 0
            }
            Holders::One { .. } => false,
            Holders::Many(list) => {
                if let Some(i) = list.iter().position(|(s, _)| *s == slot) {
                    list[i].1 -= 1;
                    if list[i].1 == 0 {
                        let mut shrunk = list.to_vec();
                        shrunk.swap_remove(i);
                        *list = shrunk.into_boxed_slice();
                    }
                }
                list.is_empty()
            }
        }
    }

    fn contains(&self, slot: u32) -> bool {
        match self {
            Holders::One { slot: s, .. } => *s == slot,
            Holders::Many(list) => list.iter().any(|(s, _)| *s == slot),
        }
    }
}

pub struct PrefixIndex {
    /// Key → engine slots holding it, each with how many of the engine's
    /// hashes name it (two cache groups of one engine can store the same
    /// tokens). Few per key: a block is on a handful of engines at most.
    holders: HashMap<BlockKey, Holders>,
    engines: HashMap<String, EngineBlocks>,
    next_slot: u32,
    /// (block, engine) entries at most; the oldest of the largest engine go
    /// first beyond it.
    max_entries: usize,
    entries: usize,
}

/// The chain seed of a sequence: blocks under another adapter or salt
/// never share a prefix.
fn seed(lora: Option<&str>, extra_keys: Option<&str>) -> BlockKey {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for part in [lora.unwrap_or(""), "\u{1f}", extra_keys.unwrap_or("")] {
        for b in part.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn chain(parent: BlockKey, tokens: &[u32]) -> BlockKey {
    // A multiply-xorshift per token: fast, and well mixed enough that 64
    // bits do not collide at a router's scale.
    let mut h = parent ^ 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        h = (h ^ u64::from(*t)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    h
}

/// The keys of a request's full blocks.
pub fn request_keys(tokens: &[u32], block_size: u32, lora: Option<&str>) -> Vec<BlockKey> {
    let mut parent = seed(lora, None);
    tokens
        .chunks_exact(block_size.max(1) as usize)
        .map(|block| {
            parent = chain(parent, block);
            parent
        })
        .collect()
}

impl PrefixIndex {
    pub fn new(max_entries: usize) -> Self {
        PrefixIndex {
            holders: HashMap::new(),
            engines: HashMap::new(),
            next_slot: 0,
            max_entries: max_entries.max(1),
            entries: 0,
        }
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Blocks indexed for one engine.
    #[cfg(test)]
    fn engine_blocks(&self, url: &EngineUrl) -> usize {
        self.engines.get(url).map_or(0, |e| e.keys.len())
    }

    fn engine(&mut self, url: &EngineUrl) -> &mut EngineBlocks {
        if !self.engines.contains_key(url) {
            let slot = self.next_slot;
            self.next_slot = self.next_slot.wrapping_add(1);
            self.engines.insert(
                url.to_string(),
                EngineBlocks {
                    slot,
                    block_size: 0,
                    keys: HashMap::new(),
                    order: VecDeque::new(),
                },
            );
        }
        self.engines.get_mut(url).expect("inserted above")
    }

    /// Applies one event from `url`'s data-parallel rank `rank`.
    pub fn apply(&mut self, url: &EngineUrl, rank: u32, event: &KvEvent) -> Applied {
        let mut applied = match event {
            KvEvent::BlockStored(stored) => self.store(url, rank, stored),
            KvEvent::BlockRemoved(removed) => self.remove(url, rank, removed),
            KvEvent::AllBlocksCleared => {
                self.forget_rank(url, rank);
                Applied::default()
            }
        };
        applied.evicted += self.enforce_cap();
        applied
    }

    fn store(&mut self, url: &EngineUrl, rank: u32, stored: &BlockStored) -> Applied {
        let mut applied = Applied::default();
        if !stored.is_attention() {
            applied.skipped_groups = stored.block_hashes.len() as u64;
            return applied;
        }
        let block_size = stored.block_size.max(1);
        let engine = self.engine(url);
        engine.block_size = block_size;
        let slot = engine.slot;
        // An adapter known only by its per-process id (older engines)
        // gets a seed no request can produce: never credited, never wrong.
        let lora = match (&stored.lora_name, stored.lora_id) {
            (Some(name), _) => Some(name.clone()),
            (None, Some(id)) => Some(format!("\u{0}lora-id-{id}")),
            (None, None) => None,
        };
        let mut parent = match stored.parent_block_hash {
            None => seed(lora.as_deref(), stored.extra_keys.as_deref()),
            Some(hash) => match engine.keys.get(&(rank, hash)) {
                Some(key) => *key,
                None => {
                    applied.orphaned = stored.block_hashes.len() as u64;
                    return applied;
                }
            },
        };
        let blocks = stored.token_ids.chunks_exact(block_size as usize);
        let mut new_keys = Vec::with_capacity(stored.block_hashes.len());
        for (hash, tokens) in stored.block_hashes.iter().zip(blocks) {
            parent = chain(parent, tokens);
            if engine.keys.insert((rank, *hash), parent).is_none() {
                engine.order.push_back((rank, *hash));
                new_keys.push(parent);
            }
        }
        for key in new_keys {
            match self.holders.get_mut(&key) {
                Some(holders) => holders.add(slot),
                None => {
                    self.holders.insert(key, Holders::One { slot, count: 1 });
                }
            }
            self.entries += 1;
            applied.stored += 1;
        }
        applied
    }

    fn remove(&mut self, url: &EngineUrl, rank: u32, removed: &BlockRemoved) -> Applied {
        let mut applied = Applied::default();
        let Some(engine) = self.engines.get_mut(url) else {
            return applied;
        };
        let slot = engine.slot;
        let mut gone = Vec::new();
        for hash in &removed.block_hashes {
            if let Some(key) = engine.keys.remove(&(rank, *hash)) {
                gone.push(key);
            }
        }
        for key in gone {
            self.release(key, slot);
            applied.removed += 1;
        }
        applied
    }

    fn release(&mut self, key: BlockKey, slot: u32) {
        if let Some(holders) = self.holders.get_mut(&key)
            && holders.remove(slot)
        {
            self.holders.remove(&key);
        }
        self.entries = self.entries.saturating_sub(1);
    }

    pub fn forget_rank(&mut self, url: &EngineUrl, rank: u32) {
        let Some(engine) = self.engines.get_mut(url) else {
            return;
        };
        let slot = engine.slot;
        let gone: Vec<BlockKey> = engine
            .keys
            .iter()
            .filter(|((r, _), _)| *r == rank)
            .map(|(_, key)| *key)
            .collect();
        engine.keys.retain(|(r, _), _| *r != rank);
        engine.order.retain(|(r, _)| *r != rank);
        for key in gone {
            self.release(key, slot);
        }
    }

    /// Forgets everything `url` held: a restarted engine, a removed
    /// replica, a lost event stream.
    pub fn forget_engine(&mut self, url: &EngineUrl) {
        let Some(engine) = self.engines.remove(url) else {
            return;
        };
        for key in engine.keys.into_values() {
            self.release(key, engine.slot);
        }
    }

    fn enforce_cap(&mut self) -> u64 {
        let mut evicted = 0;
        while self.entries > self.max_entries {
            let Some(url) = self
                .engines
                .iter()
                .max_by_key(|(_, e)| e.keys.len())
                .map(|(u, _)| u.clone())
            else {
                break;
            };
            let engine = self.engines.get_mut(&url).expect("found above");
            let slot = engine.slot;
            let mut victim = None;
            while let Some(id) = engine.order.pop_front() {
                if let Some(key) = engine.keys.remove(&id) {
                    victim = Some(key);
                    break;
                }
            }
            match victim {
                Some(key) => {
                    self.release(key, slot);
                    evicted += 1;
                }
                None => break,
            }
        }
        evicted
    }

    /// For each engine in `urls`, how many tokens of `tokens` lead with
    /// blocks it holds (0 for an engine the index does not know).
    pub fn cached_tokens(
        &self,
        urls: &[&EngineUrl],
        tokens: &[u32],
        lora: Option<&str>,
    ) -> Vec<u64> {
        let mut cached = vec![0u64; urls.len()];
        let mut by_block_size: HashMap<u32, Vec<(usize, u32)>> = HashMap::new();
        for (i, url) in urls.iter().enumerate() {
            if let Some(engine) = self.engines.get(*url)
                && engine.block_size > 0
            {
                by_block_size
                    .entry(engine.block_size)
                    .or_default()
                    .push((i, engine.slot));
            }
        }
        for (block_size, mut alive) in by_block_size {
            let keys = request_keys(tokens, block_size, lora);
            for (depth, key) in keys.iter().enumerate() {
                let Some(holders) = self.holders.get(key) else {
                    break;
                };
                alive.retain(|(_, slot)| holders.contains(*slot));
                if alive.is_empty() {
                    break;
                }
                for (i, _) in &alive {
                    cached[*i] = (depth as u64 + 1) * u64::from(block_size);
                }
            }
        }
        cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> KvEvent {
        KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: tokens,
            block_size: 4,
            ..BlockStored::default()
        })
    }

    fn removed(hashes: &[u64]) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.to_vec(),
            ..BlockRemoved::default()
        })
    }

    const A: &str = "http://a";
    const B: &str = "http://b";

    #[test]
    fn an_engine_that_stored_a_prefix_is_credited_with_it_whatever_its_hashes() {
        let mut index = PrefixIndex::new(1000);
        let prompt: Vec<u32> = (0..12).collect();
        // Two engines, two hash schemes, the same tokens.
        index.apply(A, 0, &stored(&[11, 12], None, prompt[..8].to_vec()));
        index.apply(A, 0, &stored(&[13], Some(12), prompt[8..12].to_vec()));
        index.apply(B, 0, &stored(&[901], None, prompt[..4].to_vec()));
        let mut asked = prompt.clone();
        asked.extend([99, 98, 97, 96, 95]);
        assert_eq!(
            index.cached_tokens(&[A, B, "http://c"], &asked, None),
            vec![12, 4, 0]
        );
        // Another prompt sharing only the first block.
        let other: Vec<u32> = (0..4).chain(50..60).collect();
        assert_eq!(index.cached_tokens(&[A, B], &other, None), vec![4, 4]);
    }

    #[test]
    fn removal_clear_and_forget_take_blocks_away() {
        let mut index = PrefixIndex::new(1000);
        let prompt: Vec<u32> = (0..8).collect();
        index.apply(A, 0, &stored(&[1, 2], None, prompt.clone()));
        index.apply(B, 0, &stored(&[7, 8], None, prompt.clone()));
        index.apply(A, 0, &removed(&[2]));
        assert_eq!(index.cached_tokens(&[A, B], &prompt, None), vec![4, 8]);
        index.apply(B, 0, &KvEvent::AllBlocksCleared);
        assert_eq!(index.cached_tokens(&[A, B], &prompt, None), vec![4, 0]);
        index.forget_engine(A);
        assert_eq!(index.cached_tokens(&[A, B], &prompt, None), vec![0, 0]);
        assert_eq!(index.entries(), 0);
    }

    #[test]
    fn a_block_whose_parent_was_never_seen_is_not_indexed() {
        let mut index = PrefixIndex::new(1000);
        let applied = index.apply(A, 0, &stored(&[5], Some(4), (0..4).collect()));
        assert_eq!(applied.orphaned, 1);
        assert_eq!(index.entries(), 0);
    }

    #[test]
    fn non_attention_groups_and_other_salts_never_match() {
        let mut index = PrefixIndex::new(1000);
        let prompt: Vec<u32> = (0..4).collect();
        let mut mamba = BlockStored {
            block_hashes: vec![1],
            token_ids: prompt.clone(),
            block_size: 4,
            kv_cache_spec_kind: Some("mamba".into()),
            ..BlockStored::default()
        };
        assert_eq!(
            index
                .apply(A, 0, &KvEvent::BlockStored(mamba.clone()))
                .skipped_groups,
            1
        );
        mamba.kv_cache_spec_kind = None;
        mamba.extra_keys = Some("salt-1".into());
        index.apply(A, 0, &KvEvent::BlockStored(mamba));
        assert_eq!(index.cached_tokens(&[A], &prompt, None), vec![0]);
    }

    #[test]
    fn the_memory_cap_holds_by_evicting_the_oldest_of_the_largest_engine() {
        let mut index = PrefixIndex::new(3);
        index.apply(A, 0, &stored(&[1, 2, 3], None, (0..12).collect()));
        let applied = index.apply(B, 0, &stored(&[9], None, (100..104).collect()));
        assert_eq!(applied.evicted, 1);
        assert_eq!(index.entries(), 3);
        // A lost its oldest block, so its chain no longer starts.
        assert_eq!(
            index.cached_tokens(&[A], &(0..12).collect::<Vec<_>>(), None),
            vec![0]
        );
        assert_eq!(index.engine_blocks(B), 1);
    }

    #[test]
    fn a_block_two_cache_groups_hold_stays_until_both_remove_it() {
        let mut index = PrefixIndex::new(1000);
        let prompt: Vec<u32> = (0..4).collect();
        index.apply(A, 0, &stored(&[1], None, prompt.clone()));
        index.apply(A, 0, &stored(&[2], None, prompt.clone()));
        index.apply(A, 0, &removed(&[1]));
        assert_eq!(index.cached_tokens(&[A], &prompt, None), vec![4]);
        index.apply(A, 0, &removed(&[2]));
        assert_eq!(index.cached_tokens(&[A], &prompt, None), vec![0]);
        assert_eq!(index.entries(), 0);
    }
}
