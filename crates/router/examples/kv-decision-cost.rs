//! What a cache-aware routing decision costs, and what the prefix index
//! weighs: the index filled as engines' KV events fill it, then the lookup
//! a request makes (its ~2,200 tokens hashed into blocks, each block probed
//! for the candidates holding it) and the cheapest-candidate choice, timed
//! alone, away from the noise of a loaded fleet.
//!
//!     cargo run --release -p llmgw-router --example kv-decision-cost
//!
//! Prints nanoseconds per decision (the best of `ROUNDS` rounds) for 8 and
//! 64 candidate engines, and the index's resident memory per entry, read
//! from /proc before and after filling it with two million entries.

use std::time::Instant;

use llmgw_kv_events::{BlockStored, KvEvent};
use llmgw_router::PrefixIndex;

const BLOCK: u32 = 16;
const CONTEXT_TOKENS: u32 = 2000;
const QUERY_TOKENS: u32 = 200;
const ROUNDS: usize = 5;
const DECISIONS: usize = 20_000;

fn tokens(seed: u32, n: u32) -> Vec<u32> {
    (0..n)
        .map(|i| 1000 + (seed.wrapping_mul(2_654_435_761) ^ i.wrapping_mul(40_503)) % 150_000)
        .collect()
}

/// One engine storing `prompt` from scratch, as a BlockStored would say.
fn store(index: &mut PrefixIndex, url: &str, prompt: &[u32], first_hash: u64) {
    let blocks = prompt.len() as u32 / BLOCK;
    index.apply(
        url,
        0,
        &KvEvent::BlockStored(BlockStored {
            block_hashes: (0..u64::from(blocks)).map(|b| first_hash + b).collect(),
            parent_block_hash: None,
            token_ids: prompt[..(blocks * BLOCK) as usize].to_vec(),
            block_size: BLOCK,
            ..BlockStored::default()
        }),
    );
}

fn decision_cost(engines: usize) -> (f64, usize) {
    let urls: Vec<String> = (0..engines)
        .map(|i| format!("http://10.0.0.{i}:8000"))
        .collect();
    let mut index = PrefixIndex::new(usize::MAX);
    let contexts: Vec<Vec<u32>> = (0..16).map(|c| tokens(c, CONTEXT_TOKENS)).collect();
    // Two contexts an engine, each with a few questions after it.
    let mut hash = 1u64;
    for (c, context) in contexts.iter().enumerate() {
        for q in 0..8 {
            let mut prompt = context.clone();
            prompt.extend(tokens(10_000 + (c * 8 + q) as u32, QUERY_TOKENS));
            store(&mut index, &urls[c % engines], &prompt, hash);
            hash += 1_000;
        }
    }
    let candidates: Vec<&str> = urls.iter().map(String::as_str).collect();
    let requests: Vec<Vec<u32>> = (0..64)
        .map(|r| {
            let mut prompt = contexts[r % 16].clone();
            prompt.extend(tokens(90_000 + r as u32, QUERY_TOKENS));
            prompt
        })
        .collect();
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for d in 0..DECISIONS {
            let prompt = &requests[d % requests.len()];
            let cached = index.cached_tokens(&candidates, prompt, None);
            let total = prompt.len() as u64;
            // The cost: uncached tokens plus load (zero here), cheapest wins.
            let (chosen, _) = cached
                .iter()
                .enumerate()
                .map(|(i, c)| (i, total - (*c).min(total)))
                .min_by_key(|(_, cost)| *cost)
                .expect("candidates");
            sink = sink.wrapping_add(chosen as u64);
        }
        best = best.min(started.elapsed().as_nanos() as f64 / DECISIONS as f64);
    }
    std::hint::black_box(sink);
    (best, index.entries())
}

fn memory_per_entry() -> (usize, f64) {
    let pid = std::process::id() as i32;
    let before = llmgw_procfs::rss_kib(pid).unwrap_or(0);
    let mut index = PrefixIndex::new(usize::MAX);
    let urls: Vec<String> = (0..8).map(|i| format!("http://10.0.0.{i}:8000")).collect();
    let mut hash = 1u64;
    // Two million (block, engine) entries: 8 engines, distinct 4,096-token
    // prompts of 256 blocks.
    for p in 0..(2_000_000 / 256) {
        store(&mut index, &urls[p % 8], &tokens(p as u32, 4096), hash);
        hash += 256;
    }
    let after = llmgw_procfs::rss_kib(pid).unwrap_or(0);
    let entries = index.entries();
    std::hint::black_box(&index);
    (
        entries,
        (after.saturating_sub(before) as f64 * 1024.0) / entries as f64,
    )
}

fn main() {
    for engines in [8, 64] {
        let (ns, entries) = decision_cost(engines);
        println!(
            "decision over {engines} engines, a {}-token prompt, index of {entries} entries: {:.1} us",
            CONTEXT_TOKENS + QUERY_TOKENS,
            ns / 1000.0
        );
    }
    let (entries, bytes) = memory_per_entry();
    println!("index memory: {bytes:.0} bytes per entry ({entries} entries)");
}
