//! Picking an endpoint for one request.
//!
//! * Least outstanding with power of two choices: two endpoints drawn at
//!   random, the less loaded one wins. It avoids the herd that "pick the
//!   global minimum" causes when many requests arrive between load updates.
//! * Prefix affinity: endpoints ranked by rendezvous hashing of the prompt
//!   prefix (a consistent hash: adding or removing an endpoint moves only
//!   that endpoint's share), taking the first whose load stays under
//!   `load_factor` times the mean, so one hot prefix cannot swamp a replica.
//! * Cache-aware: the endpoint with the lowest cost, the prompt tokens it
//!   would have to prefill (those its KV cache lacks, by the prefix index)
//!   plus its load weighed in tokens. A hot prefix stays on its engine only
//!   while the queue there costs less than prefilling elsewhere, so load
//!   spreads it before it becomes a pile-up; with nothing cached anywhere
//!   the cost is load alone.

use std::cell::Cell;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use llmgw_config::BalancePolicy;

use crate::endpoints::EndpointStats;

/// What a request offers to pick its endpoint by, besides load.
#[derive(Debug, Clone, Copy)]
pub enum Affinity<'a> {
    None,
    /// The first bytes of the prompt.
    Prefix(&'a str),
    /// Per candidate, in order: the prompt tokens its cache lacks.
    Cache {
        uncached: &'a [u64],
        load_weight_tokens: f64,
    },
}

pub fn choose(
    policy: BalancePolicy,
    candidates: &[Arc<EndpointStats>],
    affinity: Affinity<'_>,
    load_factor: f64,
) -> Option<usize> {
    match (policy, affinity) {
        _ if candidates.len() <= 1 => candidates.first().map(|_| 0),
        (
            BalancePolicy::CacheAware,
            Affinity::Cache {
                uncached,
                load_weight_tokens,
            },
        ) if uncached.len() == candidates.len() => {
            Some(cheapest(candidates, uncached, load_weight_tokens))
        }
        (BalancePolicy::PrefixAffinity | BalancePolicy::CacheAware, Affinity::Prefix(prefix)) => {
            Some(prefix_affinity(candidates, prefix, load_factor))
        }
        _ => Some(power_of_two(candidates)),
    }
}

/// The candidate of lowest cost; ties go to a random one among them.
fn cheapest(candidates: &[Arc<EndpointStats>], uncached: &[u64], load_weight_tokens: f64) -> usize {
    let n = candidates.len();
    let start = (next_random() % n as u64) as usize;
    let mut best = start;
    let mut best_cost = f64::INFINITY;
    for offset in 0..n {
        let i = (start + offset) % n;
        let cost = uncached[i] as f64 + load_weight_tokens * candidates[i].load_score();
        if cost < best_cost {
            best = i;
            best_cost = cost;
        }
    }
    best
}

fn power_of_two(candidates: &[Arc<EndpointStats>]) -> usize {
    let n = candidates.len() as u64;
    let r = next_random();
    let a = (r % n) as usize;
    // A second index different from the first, uniformly.
    let b = ((a as u64 + 1 + (r >> 32) % (n - 1)) % n) as usize;
    if candidates[b].load_score() < candidates[a].load_score() {
        b
    } else {
        a
    }
}

fn prefix_affinity(candidates: &[Arc<EndpointStats>], prefix: &str, load_factor: f64) -> usize {
    let mut ranked: Vec<(u64, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(i, e)| (rendezvous_weight(prefix, &e.url), i))
        .collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    let total: f64 = candidates.iter().map(|e| e.load_score()).sum();
    // Capacity after placing this request, as in bounded-load consistent
    // hashing: no endpoint goes above load_factor × the mean.
    let capacity = (load_factor * (total + 1.0) / candidates.len() as f64).ceil();
    ranked
        .iter()
        .find(|(_, i)| candidates[*i].load_score() + 1.0 <= capacity)
        .map_or(ranked[0].1, |(_, i)| *i)
}

fn rendezvous_weight(prefix: &str, url: &str) -> u64 {
    let mut h = DefaultHasher::new();
    prefix.hash(&mut h);
    url.hash(&mut h);
    h.finish()
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut h = DefaultHasher::new();
    std::time::SystemTime::now().hash(&mut h);
    std::thread::current().id().hash(&mut h);
    h.finish() | 1
}

/// xorshift64*: balancing needs speed and spread, not secrecy.
fn next_random() -> u64 {
    RNG.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::Registry;

    fn endpoints(n: usize) -> (Registry, Vec<Arc<EndpointStats>>) {
        let registry = Registry::default();
        let list = (0..n)
            .map(|i| registry.get(&format!("http://127.0.0.1:{}", 9000 + i)))
            .collect();
        (registry, list)
    }

    #[test]
    fn power_of_two_never_picks_the_busiest_of_two() {
        let (_r, list) = endpoints(2);
        let _busy: Vec<_> = (0..5).map(|_| list[0].start_request()).collect();
        for _ in 0..100 {
            assert_eq!(
                choose(BalancePolicy::LeastOutstanding, &list, Affinity::None, 1.25),
                Some(1)
            );
        }
    }

    #[test]
    fn power_of_two_spreads_over_idle_endpoints() {
        let (_r, list) = endpoints(4);
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[choose(BalancePolicy::LeastOutstanding, &list, Affinity::None, 1.25).unwrap()] +=
                1;
        }
        assert!(seen.iter().all(|&c| c > 40), "uneven spread {seen:?}");
    }

    #[test]
    fn prefix_affinity_is_sticky_until_overloaded() {
        let (_r, list) = endpoints(3);
        let first = choose(
            BalancePolicy::PrefixAffinity,
            &list,
            Affinity::Prefix("sys prompt"),
            1.25,
        )
        .unwrap();
        for _ in 0..20 {
            assert_eq!(
                choose(
                    BalancePolicy::PrefixAffinity,
                    &list,
                    Affinity::Prefix("sys prompt"),
                    1.25
                ),
                Some(first)
            );
        }
        // Load the preferred endpoint well past the bound: the prefix spills.
        let _held: Vec<_> = (0..10).map(|_| list[first].start_request()).collect();
        let spill = choose(
            BalancePolicy::PrefixAffinity,
            &list,
            Affinity::Prefix("sys prompt"),
            1.25,
        )
        .unwrap();
        assert_ne!(spill, first);
    }

    #[test]
    fn prefixes_spread_over_endpoints() {
        let (_r, list) = endpoints(3);
        let mut seen = [0usize; 3];
        for i in 0..300 {
            let p = format!("prompt {i}");
            seen[choose(
                BalancePolicy::PrefixAffinity,
                &list,
                Affinity::Prefix(&p),
                1.25,
            )
            .unwrap()] += 1;
        }
        assert!(seen.iter().all(|&c| c > 50), "uneven spread {seen:?}");
    }

    fn by_cache(list: &[Arc<EndpointStats>], uncached: &[u64]) -> usize {
        choose(
            BalancePolicy::CacheAware,
            list,
            Affinity::Cache {
                uncached,
                load_weight_tokens: 1000.0,
            },
            1.25,
        )
        .unwrap()
    }

    #[test]
    fn cache_aware_prefers_the_engine_holding_the_prompt_until_its_queue_costs_more() {
        let (_r, list) = endpoints(3);
        // 7,000-token prompt: endpoint 2 holds 6,000 of it.
        let uncached = [7000, 7000, 1000];
        assert_eq!(by_cache(&list, &uncached), 2);
        // Five requests queued there still cost less than 6,000 tokens.
        let mut held: Vec<_> = (0..5).map(|_| list[2].start_request()).collect();
        assert_eq!(by_cache(&list, &uncached), 2);
        // Seven cost more: the hot prefix spreads instead of piling up.
        held.extend((0..2).map(|_| list[2].start_request()));
        assert_ne!(by_cache(&list, &uncached), 2);
    }

    #[test]
    fn with_nothing_cached_cache_aware_is_least_loaded_and_spreads_ties() {
        let (_r, list) = endpoints(4);
        let uncached = [500; 4];
        let _busy = list[1].start_request();
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[by_cache(&list, &uncached)] += 1;
        }
        assert_eq!(seen[1], 0, "the loaded endpoint was picked: {seen:?}");
        assert!(
            seen.iter().enumerate().all(|(i, &c)| i == 1 || c > 60),
            "uneven spread {seen:?}"
        );
    }
}
