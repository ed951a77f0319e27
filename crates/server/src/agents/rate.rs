//! How fast one agent may talk. A healthy agent sends a heartbeat a second
//! and a status per shard transition; an agent that floods its stream (a
//! bug, a loop, a hostile client holding a node certificate) is cut off
//! before it can fill the leader's report queue.

use std::time::Instant;

/// Messages per second an agent may sustain.
pub const AGENT_MESSAGES_PER_SECOND: f64 = 200.0;
/// Messages an agent may send at once above the sustained rate: a node
/// whose engines all change state together reports them in one burst.
pub const AGENT_MESSAGE_BURST: f64 = 2_000.0;

/// A token bucket: `allow` spends one token, tokens come back at `rate`
/// per second up to `burst`.
#[derive(Debug)]
pub struct RateLimit {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled_at: Instant,
}

impl RateLimit {
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            refilled_at: Instant::now(),
        }
    }

    pub fn for_agent() -> Self {
        Self::new(AGENT_MESSAGES_PER_SECOND, AGENT_MESSAGE_BURST)
    }

    pub fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.refilled_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_passes_then_the_sustained_rate_holds() {
        let start = Instant::now();
        let mut limit = RateLimit::new(10.0, 5.0);
        let burst = (0..8).filter(|_| limit.allow(start)).count();
        assert_eq!(burst, 5);
        // One second later ten more tokens, capped at the burst of five.
        let later = start + Duration::from_secs(1);
        let after = (0..8).filter(|_| limit.allow(later)).count();
        assert_eq!(after, 5);
        // A tenth of a second gives one.
        let soon = later + Duration::from_millis(100);
        assert!(limit.allow(soon));
        assert!(!limit.allow(soon));
    }
}
