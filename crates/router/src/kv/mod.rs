//! Cache-aware routing: a fleet-wide index of the KV blocks each engine
//! holds, fed by the engines' own KV events, and the token ids of a request
//! to look up in it. See docs/router.md, "Cache-aware routing".

mod follow;
pub mod index;
mod local_tokens;
mod route;
mod tokenize;

use std::collections::HashSet;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

pub use follow::follow_loop;

use crate::metrics::header;
pub use index::PrefixIndex;
pub use local_tokens::LocalTokenizers;
pub use route::{count_decision, request_tokens, uncached_tokens};

pub struct KvState {
    pub index: RwLock<PrefixIndex>,
    pub stats: KvStats,
    /// (engine, data-parallel rank) publishers that cannot be reached.
    unreachable: Mutex<HashSet<(String, u32)>>,
}

/// Counters behind the router's `llmgw_router_kv_*` metrics.
#[derive(Default)]
pub struct KvStats {
    pub followed_engines: AtomicU64,
    pub batches: AtomicU64,
    pub stored: AtomicU64,
    pub removed: AtomicU64,
    pub orphaned: AtomicU64,
    pub skipped_groups: AtomicU64,
    pub evicted: AtomicU64,
    pub unknown_events: AtomicU64,
    pub decode_errors: AtomicU64,
    pub missed: AtomicU64,
    /// Batches fetched from the engines' replay sockets (at subscription,
    /// and for every gap).
    pub replayed: AtomicU64,
    pub restarts: AtomicU64,
    pub entries: AtomicU64,
    /// Routing decisions by how they were made.
    pub by_cache: AtomicU64,
    pub fallback_no_index: AtomicU64,
    pub fallback_no_tokens: AtomicU64,
    /// Requests whose tokens the router made itself, or had from an
    /// engine's `/tokenize`.
    pub tokenized_by_router: AtomicU64,
    pub tokenized_by_engine: AtomicU64,
    /// The router's tokens compared with an engine's.
    pub checks_agreed: AtomicU64,
    pub checks_disagreed: AtomicU64,
    /// Prompt tokens routed by cache, and how many of them the chosen
    /// engine held by the index.
    pub routed_prompt_tokens: AtomicU64,
    pub routed_cached_tokens: AtomicU64,
    /// Time spent deciding by cache (index lookup and cost), tokenizing
    /// excluded.
    pub decision_nanos: AtomicU64,
}

impl KvStats {
    fn record(&self, applied: index::Applied, entries: usize) {
        self.stored.fetch_add(applied.stored, Ordering::Relaxed);
        self.removed.fetch_add(applied.removed, Ordering::Relaxed);
        self.orphaned.fetch_add(applied.orphaned, Ordering::Relaxed);
        self.skipped_groups
            .fetch_add(applied.skipped_groups, Ordering::Relaxed);
        self.evicted.fetch_add(applied.evicted, Ordering::Relaxed);
        self.entries.store(entries as u64, Ordering::Relaxed);
    }
}

impl KvState {
    pub fn new(max_entries: usize) -> Self {
        KvState {
            index: RwLock::new(PrefixIndex::new(max_entries)),
            stats: KvStats::default(),
            unreachable: Mutex::new(HashSet::new()),
        }
    }

    /// Forgets an engine that left the table: what it held, and that it
    /// could not be reached.
    pub fn forget_engine(&self, url: &str) {
        self.unreachable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(engine, _)| engine != url);
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        index.forget_engine(url);
        self.stats
            .entries
            .store(index.entries() as u64, Ordering::Relaxed);
    }

    /// Forgets what one data-parallel rank of an engine holds: it broke
    /// off, restarted or cleared its cache; the other ranks are unchanged.
    pub fn forget_rank(&self, url: &str, rank: u32) {
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        index.forget_rank(url, rank);
        self.stats
            .entries
            .store(index.entries() as u64, Ordering::Relaxed);
    }

    fn set_unreachable(&self, url: &str, rank: u32, unreachable: bool) {
        let mut set = self.unreachable.lock().unwrap_or_else(|p| p.into_inner());
        if unreachable {
            set.insert((url.to_string(), rank));
        } else {
            set.remove(&(url.to_string(), rank));
        }
    }

    /// For each of `urls`, the tokens of `tokens` it holds as a prefix.
    pub fn cached_tokens(&self, urls: &[&str], tokens: &[u32]) -> Vec<u64> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index.cached_tokens(urls, tokens, None)
    }

    /// Appends the `llmgw_router_kv_*` series; `tokenizers` gives the
    /// router's own tokenizers.
    pub fn render(&self, out: &mut String, tokenizers: &LocalTokenizers) {
        let s = &self.stats;
        let unreachable: HashSet<String> = self
            .unreachable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(url, _)| url.clone())
            .collect();
        let unreachable = unreachable.len();
        let gauges: [(&str, &str, u64); 3] = [
            (
                "llmgw_router_kv_engines_followed",
                "Engines whose KV events this router subscribes to.",
                s.followed_engines.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_engines_unreachable",
                "Engines with a rank that should publish KV events but cannot be subscribed to: routed by what the other ranks hold, or by load alone.",
                unreachable as u64,
            ),
            (
                "llmgw_router_kv_index_entries",
                "(block, engine) pairs in the prefix index; bounded by kv_index_max_entries.",
                s.entries.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in gauges {
            header(out, name, "gauge", help);
            let _ = writeln!(out, "{name} {value}");
        }
        let counters: [(&str, &str, u64); 13] = [
            (
                "llmgw_router_kv_event_batches_total",
                "KV event batches applied.",
                s.batches.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_blocks_stored_total",
                "Blocks added to the index.",
                s.stored.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_blocks_removed_total",
                "Blocks the engines removed.",
                s.removed.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_blocks_orphaned_total",
                "Blocks whose parent the index never saw: not indexed.",
                s.orphaned.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_blocks_skipped_total",
                "Blocks of non-attention cache groups: never indexed.",
                s.skipped_groups.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_blocks_evicted_total",
                "Blocks dropped to hold the index memory cap.",
                s.evicted.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_unknown_events_total",
                "Events of a type this router does not know, skipped.",
                s.unknown_events.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_decode_errors_total",
                "Event batches that could not be decoded.",
                s.decode_errors.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_batches_replayed_total",
                "Event batches fetched from the engines' replay sockets, at subscription and for every gap.",
                s.replayed.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_batches_missed_total",
                "Event batches lost beyond the engines' replay buffers.",
                s.missed.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_engine_restarts_total",
                "Engines whose event sequence started over (their blocks forgotten).",
                s.restarts.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_routed_prompt_tokens_total",
                "Prompt tokens of requests routed by cache.",
                s.routed_prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "llmgw_router_kv_routed_cached_tokens_total",
                "Of those, tokens the chosen engine held, by the index.",
                s.routed_cached_tokens.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            header(out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
        let name = "llmgw_router_kv_decision_seconds_total";
        header(
            out,
            name,
            "counter",
            "Time spent on routing decisions by cache: the index lookup and the cost, tokenizing excluded.",
        );
        let seconds = s.decision_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name} {seconds:.9}");
        let name = "llmgw_router_kv_decisions_total";
        header(
            out,
            name,
            "counter",
            "Routing decisions under the cache_aware policy, by how they were made: by cache, or falling back to prompt-prefix affinity because no engine of the model publishes KV events (no_index) or the request's tokens were not available (no_tokens).",
        );
        for (how, counter) in [
            ("cache", &s.by_cache),
            ("no_index", &s.fallback_no_index),
            ("no_tokens", &s.fallback_no_tokens),
        ] {
            let _ = writeln!(
                out,
                "{name}{{how=\"{how}\"}} {}",
                counter.load(Ordering::Relaxed)
            );
        }
        render_tokenizing(out, s, tokenizers);
    }
}

/// One labelled metric family of two series.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    label: &'static str,
    values: [(&'static str, u64); 2],
}

fn render_tokenizing(out: &mut String, s: &KvStats, tokenizers: &LocalTokenizers) {
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let (in_use, stopped) = tokenizers.counts();
    let families = [
        Family {
            name: "llmgw_router_kv_tokenized_total",
            kind: "counter",
            help: "Requests whose prompt tokens the router made itself with the model's tokenizer (router), or had from an engine's /tokenize (engine).",
            label: "by",
            values: [
                ("router", load(&s.tokenized_by_router)),
                ("engine", load(&s.tokenized_by_engine)),
            ],
        },
        Family {
            name: "llmgw_router_kv_tokenizer_checks_total",
            kind: "counter",
            help: "The router's own tokens compared with an engine's /tokenize, by result; a disagreement stops the router tokenizing that model.",
            label: "result",
            values: [
                ("agreed", load(&s.checks_agreed)),
                ("disagreed", load(&s.checks_disagreed)),
            ],
        },
        Family {
            name: "llmgw_router_kv_local_tokenizers",
            kind: "gauge",
            help: "Models the router has a tokenizer for (balancing.tokenizers), by state: in use, or stopped after disagreeing with the engines.",
            label: "state",
            values: [("in_use", in_use), ("disagreed", stopped)],
        },
    ];
    for family in families {
        let Family { name, label, .. } = family;
        header(out, name, family.kind, family.help);
        for (value, count) in family.values {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {count}");
        }
    }
}
