//! Picking an endpoint for one request.
//!
//! * Least outstanding with power of two choices: two endpoints drawn at
//!   random, the less loaded one wins. It avoids the herd that "pick the
//!   global minimum" causes when many requests arrive between load updates.
//! * Prefix affinity: endpoints ranked by rendezvous hashing of the prompt
//!   prefix (a consistent hash: adding or removing an endpoint moves only
//!   that endpoint's share), taking the first whose load stays under
//!   `load_factor` times the mean, so one hot prefix cannot swamp a replica.

use std::cell::Cell;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use llmgw_config::BalancePolicy;

use crate::endpoints::EndpointStats;

pub fn choose(
    policy: BalancePolicy,
    candidates: &[Arc<EndpointStats>],
    prefix: Option<&str>,
    load_factor: f64,
) -> Option<usize> {
    match (policy, prefix) {
        _ if candidates.len() <= 1 => candidates.first().map(|_| 0),
        (BalancePolicy::PrefixAffinity, Some(prefix)) => {
            Some(prefix_affinity(candidates, prefix, load_factor))
        }
        _ => Some(power_of_two(candidates)),
    }
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
                choose(BalancePolicy::LeastOutstanding, &list, None, 1.25),
                Some(1)
            );
        }
    }

    #[test]
    fn power_of_two_spreads_over_idle_endpoints() {
        let (_r, list) = endpoints(4);
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[choose(BalancePolicy::LeastOutstanding, &list, None, 1.25).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&c| c > 40), "uneven spread {seen:?}");
    }

    #[test]
    fn prefix_affinity_is_sticky_until_overloaded() {
        let (_r, list) = endpoints(3);
        let first = choose(
            BalancePolicy::PrefixAffinity,
            &list,
            Some("sys prompt"),
            1.25,
        )
        .unwrap();
        for _ in 0..20 {
            assert_eq!(
                choose(
                    BalancePolicy::PrefixAffinity,
                    &list,
                    Some("sys prompt"),
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
            Some("sys prompt"),
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
            seen[choose(BalancePolicy::PrefixAffinity, &list, Some(&p), 1.25).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&c| c > 50), "uneven spread {seen:?}");
    }
}
