//! What the router knows about each engine endpoint: requests it has in
//! flight there, consecutive failures and ejection, and the engine's own
//! load as last read from its `/metrics`. Shared by every request, so it is
//! all atomics behind one read-mostly map.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

/// A value the engine has not reported (no metrics, or scraping is off).
const UNKNOWN: u32 = u32::MAX;

pub struct EndpointStats {
    pub url: String,
    /// `host:port` of a plain http URL, parsed once; None for anything
    /// the router cannot reach.
    pub authority: Option<String>,
    outstanding: AtomicU32,
    failures: AtomicU32,
    ejected: AtomicBool,
    engine_waiting: AtomicU32,
    engine_running: AtomicU32,
    /// KV cache usage in parts per thousand.
    engine_kv_permille: AtomicU32,
}

impl EndpointStats {
    fn new(url: &str) -> Self {
        let authority = crate::upstream::split_http_url(url).map(|(authority, _)| authority);
        EndpointStats {
            url: url.to_string(),
            authority,
            outstanding: AtomicU32::new(0),
            failures: AtomicU32::new(0),
            ejected: AtomicBool::new(false),
            engine_waiting: AtomicU32::new(UNKNOWN),
            engine_running: AtomicU32::new(UNKNOWN),
            engine_kv_permille: AtomicU32::new(UNKNOWN),
        }
    }

    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Relaxed)
    }

    pub fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Counts a request against this endpoint until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> InFlight {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// The balancing score: the router's own outstanding requests, plus the
    /// engine's queue (work other routers gave it), plus KV pressure as a
    /// tie-breaker below one request.
    pub fn load_score(&self) -> f64 {
        let mut score = f64::from(self.outstanding());
        let waiting = self.engine_waiting.load(Ordering::Relaxed);
        if waiting != UNKNOWN {
            score += f64::from(waiting);
        }
        let kv = self.engine_kv_permille.load(Ordering::Relaxed);
        if kv != UNKNOWN {
            score += f64::from(kv.min(1000)) / 1001.0;
        }
        score
    }

    /// Records a connection failure or 5xx. Returns true when this failure
    /// ejects the endpoint.
    pub fn record_failure(&self, threshold: u32) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        failures >= threshold && !self.ejected.swap(true, Ordering::Relaxed)
    }

    pub fn record_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// A passed health probe puts an ejected endpoint back in rotation.
    pub fn readmit(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.ejected.store(false, Ordering::Relaxed);
    }

    pub fn set_engine_load(&self, load: Option<EngineLoad>) {
        let (running, waiting, kv) = match load {
            Some(l) => (
                l.running
                    .map_or(UNKNOWN, |v| v.round().clamp(0.0, 1e9) as u32),
                l.waiting
                    .map_or(UNKNOWN, |v| v.round().clamp(0.0, 1e9) as u32),
                l.kv_usage
                    .map_or(UNKNOWN, |v| (v * 1000.0).round().clamp(0.0, 1000.0) as u32),
            ),
            None => (UNKNOWN, UNKNOWN, UNKNOWN),
        };
        self.engine_running.store(running, Ordering::Relaxed);
        self.engine_waiting.store(waiting, Ordering::Relaxed);
        self.engine_kv_permille.store(kv, Ordering::Relaxed);
    }

    pub fn engine_load(&self) -> EngineLoad {
        let get = |a: &AtomicU32| match a.load(Ordering::Relaxed) {
            UNKNOWN => None,
            v => Some(f64::from(v)),
        };
        EngineLoad {
            running: get(&self.engine_running),
            waiting: get(&self.engine_waiting),
            kv_usage: get(&self.engine_kv_permille).map(|v| v / 1000.0),
        }
    }
}

/// The engine's load as its `/metrics` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// 0..=1.
    pub kv_usage: Option<f64>,
}

pub struct InFlight(Arc<EndpointStats>);

impl InFlight {
    pub fn endpoint(&self) -> &Arc<EndpointStats> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Every endpoint the router has seen, keyed by normalized URL.
#[derive(Default)]
pub struct Registry {
    map: RwLock<HashMap<String, Arc<EndpointStats>>>,
}

impl Registry {
    pub fn get(&self, url: &str) -> Arc<EndpointStats> {
        if let Some(stats) = self.map.read().expect("registry lock").get(url) {
            return Arc::clone(stats);
        }
        let mut map = self.map.write().expect("registry lock");
        Arc::clone(
            map.entry(url.to_string())
                .or_insert_with(|| Arc::new(EndpointStats::new(url))),
        )
    }

    pub fn all(&self) -> Vec<Arc<EndpointStats>> {
        self.map
            .read()
            .expect("registry lock")
            .values()
            .cloned()
            .collect()
    }

    /// Forgets endpoints no longer in the table and idle, so a fleet that
    /// churns replicas does not grow the map forever.
    pub fn retain(&self, live: &HashSet<&str>) {
        self.map
            .write()
            .expect("registry lock")
            .retain(|url, stats| live.contains(url.as_str()) || stats.outstanding() > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejects_once_at_threshold_and_readmits() {
        let registry = Registry::default();
        let e = registry.get("http://127.0.0.1:1");
        assert!(!e.record_failure(3));
        assert!(!e.record_failure(3));
        assert!(e.record_failure(3));
        assert!(!e.record_failure(3), "already ejected: not counted twice");
        assert!(e.is_ejected());
        e.readmit();
        assert!(!e.is_ejected());
        e.record_failure(3);
        e.record_success();
        e.record_failure(3);
        e.record_failure(3);
        assert!(!e.is_ejected(), "a success resets the count");
    }

    #[test]
    fn outstanding_follows_guards() {
        let registry = Registry::default();
        let e = registry.get("http://127.0.0.1:1");
        let a = e.start_request();
        let b = e.start_request();
        assert_eq!(e.outstanding(), 2);
        drop(a);
        drop(b);
        assert_eq!(e.outstanding(), 0);
        assert_eq!(e.authority.as_deref(), Some("127.0.0.1:1"));
    }
}
