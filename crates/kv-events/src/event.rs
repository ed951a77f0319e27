//! What an engine says about its KV cache, whatever the wire shape.

/// A block hash as llmgw keeps it. Engines send 64-bit integers by default;
/// a hash sent as bytes is folded to its last eight bytes, big-endian, the
/// way vLLM itself turns its digests into integers.
pub type BlockHash = u64;

/// One published message: the events of one engine step.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Seconds since the epoch, engine clock.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The data-parallel rank that published it; none when the engine runs
    /// one rank (older versions never send it).
    pub dp_rank: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// The engine dropped its whole cache (reset, sleep, restart).
    AllBlocksCleared,
}

/// Full blocks the engine now holds: `block_hashes[i]` covers
/// `token_ids[i * block_size .. (i + 1) * block_size]`, and the first block's
/// parent is `parent_block_hash` (none for a block at the start of a
/// sequence).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    pub block_hashes: Vec<BlockHash>,
    pub parent_block_hash: Option<BlockHash>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<u64>,
    pub medium: Option<String>,
    /// Newer engines: the adapter's name (its id is per process).
    pub lora_name: Option<String>,
    /// Newer engines: the KV cache group the blocks belong to, and the kind
    /// of that group's layers (full attention, sliding window, mamba...).
    pub group_idx: Option<u32>,
    pub kv_cache_spec_kind: Option<String>,
    /// Newer engines: what besides the tokens went into the hash (a cache
    /// salt, multimodal inputs); blocks with different extra keys never
    /// share a prefix.
    pub extra_keys: Option<String>,
}

impl BlockStored {
    /// Whether these blocks hold attention KV that a later request with the
    /// same tokens reuses. Other cache groups (a hybrid model's mamba or
    /// sliding-window state) would poison a prefix index.
    pub fn is_attention(&self) -> bool {
        self.kv_cache_spec_kind.as_deref().is_none_or(|kind| {
            matches!(
                kind,
                "full_attention" | "mla_attention" | "sink_full_attention"
            )
        })
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    pub block_hashes: Vec<BlockHash>,
    pub medium: Option<String>,
    pub group_idx: Option<u32>,
}

/// The message shapes engines publish, by version. The decoder reads all of
/// them without being told which; the simulator writes the one of the
/// engine it plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireShape {
    /// vLLM 0.11: every event a positional array tagged by its first
    /// element; trailing default fields left out.
    VllmArrays,
    /// vLLM 0.34: events as maps with a `type` tag, unset fields left out.
    VllmMaps,
    /// SGLang 0.5: maps with a `type` tag, as vLLM 0.34, with its own
    /// extra fields.
    SglangMaps,
}
