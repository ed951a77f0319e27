//! The simulated engine's live state: batch slots, the waiting queue, KV
//! usage, lifecycle phase and the signals in-flight requests watch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::config::ServeConfig;
use crate::logs::Logger;
use crate::metrics::{Gauges, Metrics};
use crate::prefix_cache::PrefixCache;
use llmgw_tokenizer::ModelTokenizer;

/// One data-parallel rank: a KV cache and the compute its prefills share.
pub struct DpRank {
    pub prefix_cache: PrefixCache,
    /// One prefill at a time: prompts not found in the prefix cache queue
    /// for the rank's compute.
    pub prefill_lane: tokio::sync::Mutex<()>,
    /// Requests given to the rank whose prefill has not finished.
    prefilling: AtomicU64,
}

impl DpRank {
    pub fn new(prefix_cache: PrefixCache) -> Self {
        DpRank {
            prefix_cache,
            prefill_lane: tokio::sync::Mutex::new(()),
            prefilling: AtomicU64::new(0),
        }
    }
}

/// A request's hold on its rank until its prefill is done.
pub struct RankGuard<'a> {
    pub rank: &'a DpRank,
}

impl Drop for RankGuard<'_> {
    fn drop(&mut self) {
        self.rank.prefilling.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// SGLang's warm-up: listening, `/health` 503.
    Starting = 0,
    Serving = 1,
    /// SIGTERM received; in-flight requests finish.
    Draining = 2,
    /// The engine died (OOM, NCCL); `/health` 503 until the process exits.
    Dead = 3,
    /// SGLang marked itself UnHealthy after a health check timed out.
    Unhealthy = 4,
}

/// What in-flight requests must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    None,
    /// Close streams at once (vLLM 0.11 shutdown, drain deadline passed).
    Abort,
    /// The engine died: streams cut, non-streamed requests get 500.
    EngineDead,
}

/// Shared state of one serving process.
pub struct EngineState {
    pub cfg: ServeConfig,
    pub log: Logger,
    pub metrics: Metrics,
    pub slots: Arc<Semaphore>,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub kv_tokens: AtomicU64,
    pub kv_capacity: u64,
    pub max_model_len: u64,
    pub eos_token_id: u64,
    /// An embedding model serves `/v1/embeddings` only, with this width.
    pub embedding_dim: Option<u64>,
    phase: AtomicU8,
    /// vLLM sleep mode: 0 awake, 1 weights offloaded, 2 all discarded.
    pub sleep_level: AtomicU8,
    pub interrupt: watch::Sender<Interrupt>,
    pub request_counter: AtomicU64,
    pub open_streams: AtomicU64,
    pub tokens_generated: AtomicU64,
    pub fatal_started: AtomicBool,
    /// The data-parallel ranks behind this server, each with its own KV
    /// cache and compute; one unless `--data-parallel-size` / `--dp-size`.
    pub ranks: Vec<DpRank>,
    rank_turn: AtomicU64,
    /// The model's own tokenizer (`--tokenizer DIR`); none: the simulated
    /// one.
    pub tokenizer: Option<Arc<ModelTokenizer>>,
    pub started: Instant,
    pub created_unix: u64,
}

/// What loading the model established.
#[derive(Debug, Clone, Copy)]
pub struct ServingFacts {
    pub kv_capacity: u64,
    pub max_model_len: u64,
    pub eos_token_id: u64,
    pub embedding_dim: Option<u64>,
}

/// Counts a streaming response body until hyper drops it.
pub struct OpenStream(Arc<EngineState>);

impl OpenStream {
    pub fn new(state: Arc<EngineState>) -> Self {
        state.open_streams.fetch_add(1, Ordering::Relaxed);
        Self(state)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.open_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Holds one batch slot; releases it and its KV tokens when dropped.
pub struct RunningGuard {
    state: Arc<EngineState>,
    kv_tokens: u64,
    _permit: OwnedSemaphorePermit,
}

impl RunningGuard {
    pub fn add_kv(&mut self, tokens: u64) {
        self.kv_tokens += tokens;
        self.state.kv_tokens.fetch_add(tokens, Ordering::Relaxed);
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.state.running.fetch_sub(1, Ordering::Relaxed);
        self.state
            .kv_tokens
            .fetch_sub(self.kv_tokens, Ordering::Relaxed);
    }
}

struct WaitingGuard<'a>(&'a AtomicU64);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl EngineState {
    pub fn new(
        cfg: ServeConfig,
        log: Logger,
        facts: ServingFacts,
        ranks: Vec<DpRank>,
        tokenizer: Option<Arc<ModelTokenizer>>,
    ) -> Arc<Self> {
        let ServingFacts {
            kv_capacity,
            max_model_len,
            eos_token_id,
            embedding_dim,
        } = facts;
        let slots = Arc::new(Semaphore::new(cfg.max_num_seqs as usize));
        let (interrupt, _) = watch::channel(Interrupt::None);
        let vllm = cfg.persona.is_vllm();
        let created_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Arc::new(Self {
            cfg,
            log,
            metrics: Metrics::new(vllm),
            slots,
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            kv_tokens: AtomicU64::new(0),
            kv_capacity: kv_capacity.max(1),
            max_model_len,
            eos_token_id,
            embedding_dim,
            phase: AtomicU8::new(Phase::Starting as u8),
            sleep_level: AtomicU8::new(0),
            interrupt,
            request_counter: AtomicU64::new(0),
            open_streams: AtomicU64::new(0),
            tokens_generated: AtomicU64::new(0),
            fatal_started: AtomicBool::new(false),
            ranks,
            rank_turn: AtomicU64::new(0),
            tokenizer,
            started: Instant::now(),
            created_unix,
        })
    }

    pub fn embedding_only(&self) -> bool {
        self.embedding_dim.is_some()
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Starting,
            1 => Phase::Serving,
            2 => Phase::Draining,
            3 => Phase::Dead,
            _ => Phase::Unhealthy,
        }
    }

    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// Requests admitted and not yet finished (running plus waiting).
    pub fn in_flight(&self) -> u64 {
        self.running.load(Ordering::Relaxed) + self.waiting.load(Ordering::Relaxed)
    }

    /// In flight, or a stream whose last chunks are still being written.
    pub fn busy(&self) -> u64 {
        self.in_flight() + self.open_streams.load(Ordering::Relaxed)
    }

    /// Waits for a batch slot, counting the request as waiting meanwhile.
    pub async fn admit(self: &Arc<Self>) -> (RunningGuard, Duration) {
        let queued_at = Instant::now();
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                self.waiting.fetch_add(1, Ordering::Relaxed);
                let _waiting = WaitingGuard(&self.waiting);
                match self.slots.clone().acquire_owned().await {
                    Ok(permit) => permit,
                    // The semaphore is never closed; wait forever rather than
                    // over-admit if that ever changes.
                    Err(_) => std::future::pending().await,
                }
            }
        };
        self.running.fetch_add(1, Ordering::Relaxed);
        (
            RunningGuard {
                state: self.clone(),
                kv_tokens: 0,
                _permit: permit,
            },
            queued_at.elapsed(),
        )
    }

    pub fn gauges(&self) -> Gauges {
        let used = self.kv_tokens.load(Ordering::Relaxed);
        let uptime = self.started.elapsed().as_secs_f64().max(1.0);
        Gauges {
            running: self.running.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            kv_usage: (used as f64 / self.kv_capacity as f64).min(1.0),
            kv_tokens_used: used,
            kv_capacity: self.kv_capacity,
            gen_throughput: self.metrics.generation_tokens.load(Ordering::Relaxed) as f64 / uptime,
            sleep_level: self
                .cfg
                .sleep_mode
                .then(|| self.sleep_level.load(Ordering::Acquire)),
        }
    }

    /// The rank a new request goes to, as the engines' own data-parallel
    /// balancing does: the one with the fewest requests not yet past
    /// prefill, taking turns on a tie.
    pub fn pick_rank(&self) -> RankGuard<'_> {
        let turn = self.rank_turn.fetch_add(1, Ordering::Relaxed) as usize;
        let count = self.ranks.len();
        let rank = (0..count)
            .map(|i| &self.ranks[(turn + i) % count])
            .min_by_key(|r| r.prefilling.load(Ordering::Relaxed))
            .expect("an engine has at least one rank");
        rank.prefilling.fetch_add(1, Ordering::Relaxed);
        RankGuard { rank }
    }

    /// Empties every rank's prefix cache.
    pub fn clear_prefix_caches(&self) {
        for rank in &self.ranks {
            rank.prefix_cache.clear();
        }
    }

    /// Looks the prompt up in `rank`'s prefix cache (storing what it
    /// lacked) and counts the queried and hit tokens as the engines do;
    /// returns the tokens not cached.
    pub fn record_prefix(&self, rank: &DpRank, token_ids: &[u32]) -> u64 {
        let lookup = rank.prefix_cache.admit(token_ids);
        self.metrics
            .prefix_queries
            .fetch_add(lookup.prompt_tokens, Ordering::Relaxed);
        self.metrics
            .prefix_hits
            .fetch_add(lookup.cached_tokens, Ordering::Relaxed);
        lookup.prompt_tokens - lookup.cached_tokens
    }
}
