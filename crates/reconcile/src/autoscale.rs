//! The leader's autoscaler as a pure function of load samples: how many
//! replicas a model wants, and when a change has been wanted long enough
//! to make.
//!
//! The signal is the requests the model's engines hold, running and
//! waiting, summed over its ready replicas. The sum does not depend on how
//! many replicas serve it, so replicas still loading after a scale-up do
//! not make the autoscaler ask for more. A change is made only once every
//! sample of a whole window wanted it (the least of them when growing, the
//! most when shrinking), and the window starts over after each change and
//! whenever the load cannot be read: a burst, a lull or a blind spot never
//! moves GPUs. A new leader starts with no history, so it waits a whole
//! window before it acts on what it sees.
//!
//! A model with a latency target (`ttft_p90_slo` for the time to first
//! token, `queue_p90_slo` for the queue wait) or a KV cache target
//! (`kv_cache_usage_percent`, the fullest engine) also grows by one replica
//! once every sample of a whole window saw its engines above a target, and
//! never shrinks while one is above: queueing and a full cache show there
//! first, before the request count reaches the target.

use std::collections::{HashMap, VecDeque};

use llmgw_catalog::Autoscale;
use llmgw_state::{ScaleDecision, ScaleSignal, SignalSeen};

/// The load of one model at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSample {
    pub at_ms: u64,
    /// Requests running or waiting on the model's ready engines.
    pub requests: u32,
    pub ready_replicas: u32,
    /// The 90th percentile of the time to first token of the requests
    /// that got their first token since the sample before; none when no
    /// request did.
    pub ttft_p90_ms: Option<u32>,
    /// The same for the time requests waited in the queue, of those
    /// scheduled since the sample before.
    pub queue_p90_ms: Option<u32>,
    /// The KV cache used on the fullest ready engine, in percent.
    pub kv_usage_percent: Option<u32>,
    /// Another model waits for GPUs that none is free for.
    pub others_waiting: bool,
}

/// Replicas that hold `requests` at the policy's target, within its bounds.
pub fn wanted_replicas(policy: &Autoscale, requests: u32) -> u32 {
    policy.clamp(requests.div_ceil(policy.target_requests_per_replica.max(1)))
}

/// Each signal the policy may set a target for: the target, and the
/// sample's value of it, in the signal's unit.
fn targets(
    policy: &Autoscale,
    sample: &LoadSample,
) -> [(ScaleSignal, Option<u32>, Option<u32>); 3] {
    let ms = |slo: Option<std::time::Duration>| {
        slo.map(|d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX))
    };
    [
        (
            ScaleSignal::TimeToFirstToken,
            ms(policy.ttft_p90_slo),
            sample.ttft_p90_ms,
        ),
        (
            ScaleSignal::QueueWait,
            ms(policy.queue_p90_slo),
            sample.queue_p90_ms,
        ),
        (
            ScaleSignal::KvCacheUsage,
            policy.kv_cache_usage_percent,
            sample.kv_usage_percent,
        ),
    ]
}

/// The signals of the sample above the policy's targets.
fn too_slow(policy: &Autoscale, sample: &LoadSample) -> Vec<ScaleSignal> {
    targets(policy, sample)
        .into_iter()
        .filter(|(_, slo, p90)| slo.zip(*p90).is_some_and(|(slo, p90)| p90 > slo))
        .map(|(signal, _, _)| signal)
        .collect()
}

/// Whether every ready replica holds what the routers send one at most,
/// so more requests may wait at the routers than the engines show.
fn saturated(policy: &Autoscale, sample: &LoadSample) -> bool {
    policy.max_requests_per_replica.is_some_and(|most| {
        sample.ready_replicas > 0 && sample.requests >= most.saturating_mul(sample.ready_replicas)
    })
}

/// Replicas the sample asks for when the model has `desired`: what its
/// requests want; one more than it has while a signal is above its
/// target; and while its replicas are saturated, one more than are ready,
/// never fewer than it has (replicas still starting will take the
/// requests waiting at the routers).
fn wanted_by(policy: &Autoscale, desired: u32, sample: &LoadSample) -> u32 {
    let by_requests = wanted_replicas(policy, sample.requests);
    if saturated(policy, sample) {
        let more = sample.ready_replicas.saturating_add(1).max(desired);
        policy.clamp(by_requests.max(more))
    } else if !too_slow(policy, sample).is_empty() {
        policy.clamp(by_requests.max(desired.saturating_add(1)))
    } else {
        by_requests
    }
}

/// Each model's recent samples, while this peer leads.
#[derive(Debug, Default)]
pub struct ScaleMemory {
    samples: HashMap<String, VecDeque<LoadSample>>,
}

impl ScaleMemory {
    /// Records the model's load now (none: it could not be read, and the
    /// window starts over) and returns the change that is due, if any.
    pub fn observe(
        &mut self,
        model: &str,
        policy: &Autoscale,
        desired: u32,
        sample: Option<LoadSample>,
    ) -> Option<ScaleDecision> {
        let Some(sample) = sample else {
            self.samples.remove(model);
            return None;
        };
        let history = self.samples.entry(model.to_owned()).or_default();
        if history.back().is_some_and(|last| last.at_ms > sample.at_ms) {
            // A clock that went back: what came before cannot be ordered.
            history.clear();
        }
        history.push_back(sample);
        let longest = policy
            .scale_up_window
            .max(policy.scale_down_window)
            .max(policy.sleep_after.unwrap_or_default());
        let horizon = sample.at_ms.saturating_sub(longest.as_millis() as u64);
        // Keep one sample at or before the horizon: it shows the history
        // covers the whole window.
        while history.get(1).is_some_and(|next| next.at_ms <= horizon) {
            history.pop_front();
        }
        let wanted_now = wanted_by(policy, desired, &sample);
        // A GPU another model waits for is given up on the evidence a model
        // needs to ask for one: the shrink window protects a model from
        // its own lulls, not from a neighbour that needs the GPU now.
        let released_for_waiting =
            sample.others_waiting && policy.scale_up_window < policy.scale_down_window;
        let (window, growing) = match wanted_now.cmp(&desired) {
            std::cmp::Ordering::Greater => (policy.scale_up_window, true),
            std::cmp::Ordering::Less if released_for_waiting => (policy.scale_up_window, false),
            std::cmp::Ordering::Less => (policy.scale_down_window, false),
            std::cmp::Ordering::Equal => return None,
        };
        let window_ms = window.as_millis() as u64;
        let start = sample.at_ms.checked_sub(window_ms)?;
        let covered = history.front().is_some_and(|first| first.at_ms <= start);
        if !covered {
            return None;
        }
        let in_window: Vec<&LoadSample> = history.iter().filter(|s| s.at_ms >= start).collect();
        let wanted: Vec<u32> = in_window
            .iter()
            .map(|s| wanted_by(policy, desired, s))
            .collect();
        let to = if growing {
            let least = wanted.iter().copied().min()?;
            (least > desired).then_some(least)?
        } else {
            let most = wanted.iter().copied().max()?;
            (most < desired).then_some(most)?
        };
        // Growing further than the requests alone asked for: a signal
        // above its target decided it.
        let by_requests = in_window
            .iter()
            .map(|s| wanted_replicas(policy, s.requests))
            .min()?;
        let above_target = (growing && to > by_requests)
            .then(|| signal_seen(policy, &in_window))
            .flatten();
        let decision = ScaleDecision {
            from: desired,
            to,
            requests_low: in_window.iter().map(|s| s.requests).min()?,
            requests_high: in_window.iter().map(|s| s.requests).max()?,
            ready_replicas: sample.ready_replicas,
            target_per_replica: policy.target_requests_per_replica,
            window_ms,
            at_ms: sample.at_ms,
            woken_by_request: false,
            yielded_to: None,
            above_target,
            saturated: growing && in_window.iter().all(|s| saturated(policy, s)),
            released_for_waiting: !growing && released_for_waiting,
        };
        history.clear();
        Some(decision)
    }

    /// Drops the history of models no longer autoscaled.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.samples.retain(|model, _| keep(model));
    }

    /// Drops one model's history: a request woke it, and what came before
    /// (the idle spell that put it to sleep) must not decide its next step
    /// while that request is still on its way to the engine.
    pub fn forget(&mut self, model: &str) {
        self.samples.remove(model);
    }

    /// Whether an awake model in sleep mode has been idle for its whole
    /// `sleep_after`: every sample of that span (after `observe` recorded
    /// the latest) saw no request on its engines and no first token since
    /// the sample before. Returns how long it was idle.
    pub fn due_to_sleep(&self, model: &str, policy: &Autoscale) -> Option<u64> {
        let idle_ms = policy.sleep_after?.as_millis() as u64;
        let history = self.samples.get(model)?;
        let now = history.back()?.at_ms;
        let start = now.checked_sub(idle_ms)?;
        let covered = history.front().is_some_and(|first| first.at_ms <= start);
        let idle = history
            .iter()
            .filter(|s| s.at_ms >= start)
            .all(|s| s.requests == 0 && s.ttft_p90_ms.is_none());
        (covered && idle).then_some(idle_ms)
    }
}

/// The signal that kept the window above its target: the one above it in
/// the most samples (every sample was above one target or another).
fn signal_seen(policy: &Autoscale, window: &[&LoadSample]) -> Option<SignalSeen> {
    let first = window.first()?;
    targets(policy, first)
        .into_iter()
        .filter_map(|(signal, slo, _)| {
            let slo = slo?;
            let p90s: Vec<u32> = window
                .iter()
                .filter_map(|s| {
                    targets(policy, s)
                        .into_iter()
                        .find(|(this, _, _)| *this == signal)?
                        .2
                })
                .collect();
            let above = p90s.iter().filter(|p90| **p90 > slo).count();
            let seen = SignalSeen {
                signal,
                low: *p90s.iter().min()?,
                high: *p90s.iter().max()?,
                target: slo,
            };
            Some((above, seen))
        })
        .max_by_key(|(above, _)| *above)
        .map(|(_, seen)| seen)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn policy() -> Autoscale {
        Autoscale {
            min_replicas: 1,
            max_replicas: 4,
            target_requests_per_replica: 8,
            scale_up_window: Duration::from_secs(10),
            scale_down_window: Duration::from_secs(60),
            ttft_p90_slo: None,
            queue_p90_slo: None,
            kv_cache_usage_percent: None,
            sleep_after: None,
            max_requests_per_replica: None,
        }
    }

    fn sample(second: u64, requests: u32) -> Option<LoadSample> {
        timed(second, requests, None)
    }

    fn timed(second: u64, requests: u32, ttft_p90_ms: Option<u32>) -> Option<LoadSample> {
        Some(LoadSample {
            at_ms: second * 1000,
            requests,
            ready_replicas: 1,
            ttft_p90_ms,
            queue_p90_ms: None,
            kv_usage_percent: None,
            others_waiting: false,
        })
    }

    #[test]
    fn a_model_in_sleep_mode_is_due_to_sleep_after_a_whole_idle_spell() {
        let policy = Autoscale {
            min_replicas: 0,
            sleep_after: Some(Duration::from_secs(5)),
            ..policy()
        };
        let mut memory = ScaleMemory::default();
        // A request at second 2 (running), a first token at 4 (finished
        // between two samples): the idle spell starts after it.
        let load = [(0, 0, None), (2, 1, None), (3, 0, None), (4, 0, Some(80))];
        for (second, requests, ttft) in load {
            memory.observe("m", &policy, 1, timed(second, requests, ttft));
        }
        for second in 5..=9 {
            memory.observe("m", &policy, 1, sample(second, 0));
            assert_eq!(memory.due_to_sleep("m", &policy), None, "at {second}s");
        }
        memory.observe("m", &policy, 1, sample(10, 0));
        assert_eq!(memory.due_to_sleep("m", &policy), Some(5_000));
        // Woken: the spell starts over.
        memory.forget("m");
        memory.observe("m", &policy, 1, sample(11, 0));
        assert_eq!(memory.due_to_sleep("m", &policy), None);
        // Without sleep mode, never.
        assert_eq!(memory.due_to_sleep("m", &self::policy()), None);
    }

    #[test]
    fn first_tokens_later_than_the_target_for_a_whole_window_add_one_replica() {
        let policy = Autoscale {
            ttft_p90_slo: Some(Duration::from_millis(300)),
            ..policy()
        };
        let mut memory = ScaleMemory::default();
        // Two requests want one replica; their first tokens come late,
        // except at second 5 (and at 7 no request got one).
        let p90 = |second: u64| match second {
            5 => Some(250),
            7 => None,
            _ => Some(800 + second as u32),
        };
        let decision = (0..40).find_map(|second| {
            memory
                .observe("m", &policy, 1, timed(second, 2, p90(second)))
                .map(|d| (second, d))
        });
        let (at, decision) = decision.expect("a scale-up");
        assert_eq!(at, 18, "a whole window of late first tokens after second 7");
        assert_eq!((decision.from, decision.to), (1, 2));
        assert_eq!(
            decision.above_target,
            Some(SignalSeen {
                signal: ScaleSignal::TimeToFirstToken,
                low: 808,
                high: 818,
                target: 300
            })
        );
        assert!(
            decision.reason().contains(
                "the time to first token (p90) was 808 to 818 ms, above the 300 ms target"
            ),
            "{}",
            decision.reason()
        );
        // Slow first tokens at the most replicas: no change, and no shrink
        // though the requests alone would want one replica.
        let mut memory = ScaleMemory::default();
        let none = (0..200)
            .find_map(|second| memory.observe("m", &policy, 4, timed(second, 0, Some(900))));
        assert_eq!(none, None);
        // Requests that ask for more than the time to first token: theirs
        // is the reason.
        let mut memory = ScaleMemory::default();
        let (_, decision) = (0..40)
            .find_map(|second| {
                memory
                    .observe("m", &policy, 1, timed(second, 30, Some(900)))
                    .map(|d| (second, d))
            })
            .expect("a scale-up");
        assert_eq!((decision.to, decision.above_target), (4, None));
        // A queue-wait target works the same way, and says so.
        let queue_policy = Autoscale {
            queue_p90_slo: Some(Duration::from_millis(200)),
            ..self::policy()
        };
        let mut memory = ScaleMemory::default();
        let (_, decision) = (0..40)
            .find_map(|second| {
                let sample = LoadSample {
                    queue_p90_ms: Some(450),
                    ..timed(second, 2, Some(100))?
                };
                memory
                    .observe("m", &queue_policy, 1, Some(sample))
                    .map(|d| (second, d))
            })
            .expect("a scale-up");
        assert_eq!(decision.to, 2);
        assert!(
            decision
                .reason()
                .contains("the queue wait (p90) was 450 to 450 ms, above the 200 ms target"),
            "{}",
            decision.reason()
        );
        // And a KV cache target, in percent of the fullest engine's cache.
        let kv_policy = Autoscale {
            kv_cache_usage_percent: Some(80),
            ..self::policy()
        };
        let mut memory = ScaleMemory::default();
        let (_, decision) = (0..40)
            .find_map(|second| {
                let sample = LoadSample {
                    kv_usage_percent: Some(if second % 2 == 0 { 91 } else { 97 }),
                    ..timed(second, 2, None)?
                };
                memory
                    .observe("m", &kv_policy, 1, Some(sample))
                    .map(|d| (second, d))
            })
            .expect("a scale-up");
        assert!(
            decision.reason().contains(
                "the KV cache usage (fullest engine) was 91 to 97 %, above the 80 % target"
            ),
            "{}",
            decision.reason()
        );
    }

    /// Feeds one sample a second from `from` to `to` (exclusive), returning
    /// the first decision and the second it came at.
    fn feed(
        memory: &mut ScaleMemory,
        desired: u32,
        seconds: std::ops::Range<u64>,
        requests: impl Fn(u64) -> u32,
    ) -> Option<(u64, ScaleDecision)> {
        for second in seconds {
            if let Some(d) =
                memory.observe("m", &policy(), desired, sample(second, requests(second)))
            {
                return Some((second, d));
            }
        }
        None
    }

    #[test]
    fn saturated_replicas_grow_the_model_though_their_count_sits_at_the_target() {
        // Sized for 8 a replica, and the routers send one at most 8: the
        // engines show 8 whatever waits at the routers.
        let policy = Autoscale {
            max_requests_per_replica: Some(8),
            ..policy()
        };
        let mut memory = ScaleMemory::default();
        let (at, decision) = (0..30)
            .find_map(|s| {
                memory
                    .observe("m", &policy, 1, sample(s, 8))
                    .map(|d| (s, d))
            })
            .expect("a scale-up");
        assert_eq!((at, decision.from, decision.to), (10, 1, 2));
        assert!(decision.saturated);
        assert!(
            decision
                .reason()
                .contains("every ready replica had as many as the routers send one"),
            "{}",
            decision.reason()
        );
        // Without the limit, 8 on a replica sized for 8 is just right.
        let mut memory = ScaleMemory::default();
        assert_eq!(feed(&mut memory, 1, 0..60, |_| 8), None);
    }

    #[test]
    fn saturated_replicas_keep_the_count_while_the_others_start() {
        // Three wanted, one ready and saturated: the two starting will take
        // what waits at the routers, so the model neither shrinks to what
        // the one engine shows nor asks for a fourth.
        let policy = Autoscale {
            max_requests_per_replica: Some(8),
            ..policy()
        };
        let mut memory = ScaleMemory::default();
        for second in 0..200 {
            assert_eq!(
                memory.observe("m", &policy, 3, sample(second, 8)),
                None,
                "at {second}s"
            );
        }
    }

    #[test]
    fn a_model_waiting_for_gpus_shortens_the_shrink_window_to_the_grow_window() {
        let mut memory = ScaleMemory::default();
        let idle_beside_a_waiting_model = |second| {
            Some(LoadSample {
                others_waiting: true,
                ..sample(second, 0)?
            })
        };
        let (at, decision) = (0..100)
            .find_map(|s| {
                memory
                    .observe("m", &policy(), 3, idle_beside_a_waiting_model(s))
                    .map(|d| (s, d))
            })
            .expect("a scale-down");
        assert_eq!((at, decision.to), (10, 1), "after the 10 s grow window");
        assert!(decision.released_for_waiting);
        assert!(
            decision.reason().contains("another model waited for GPUs"),
            "{}",
            decision.reason()
        );
        // Alone, the same lull waits out the 60 s shrink window.
        let mut memory = ScaleMemory::default();
        let (at, decision) = feed(&mut memory, 3, 0..100, |_| 0).expect("a scale-down");
        assert_eq!(at, 60);
        assert!(!decision.released_for_waiting);
    }

    #[test]
    fn load_above_target_for_a_whole_window_adds_replicas() {
        let mut memory = ScaleMemory::default();
        let (at, decision) = feed(&mut memory, 1, 0..30, |_| 20).expect("a scale-up");
        assert_eq!(at, 10, "only once the window is covered");
        assert_eq!((decision.from, decision.to), (1, 3));
        assert_eq!((decision.requests_low, decision.requests_high), (20, 20));
        assert!(
            decision.reason().contains("1 -> 3 replicas"),
            "{}",
            decision.reason()
        );
    }

    #[test]
    fn a_burst_shorter_than_the_window_changes_nothing() {
        let mut memory = ScaleMemory::default();
        let burst = |s: u64| if (20..25).contains(&s) { 40 } else { 6 };
        assert_eq!(feed(&mut memory, 1, 0..120, burst), None);
    }

    #[test]
    fn growing_takes_the_least_the_window_wanted_and_shrinking_the_most() {
        let mut memory = ScaleMemory::default();
        let rising = |s: u64| 9 + s as u32;
        let (_, up) = feed(&mut memory, 1, 0..30, rising).expect("a scale-up");
        assert_eq!(
            up.to, 2,
            "9 requests at the window's start want 2, not more"
        );
        let mut memory = ScaleMemory::default();
        let falling = |s: u64| 30u32.saturating_sub(s as u32 / 4);
        let (at, down) = feed(&mut memory, 4, 0..200, falling).expect("a scale-down");
        assert_eq!(down.to, 3, "at {at}: the most the last minute wanted");
    }

    #[test]
    fn bounds_hold_and_a_decision_restarts_the_window() {
        let mut memory = ScaleMemory::default();
        let (at, decision) = feed(&mut memory, 1, 0..30, |_| 1000).unwrap();
        assert_eq!((at, decision.to), (10, 4), "max_replicas");
        assert_eq!(
            feed(&mut memory, 4, 11..200, |_| 1000),
            None,
            "already at max"
        );
        let mut memory = ScaleMemory::default();
        let (at, decision) = feed(&mut memory, 3, 0..100, |_| 0).unwrap();
        assert_eq!((at, decision.to), (60, 1), "min_replicas");
        let (again, _) = feed(&mut memory, 1, 61..200, |_| 100).unwrap();
        assert_eq!(again, 71, "a fresh window after a change");
    }

    #[test]
    fn unreadable_load_starts_the_window_over() {
        let mut memory = ScaleMemory::default();
        for second in 0..8 {
            assert_eq!(memory.observe("m", &policy(), 1, sample(second, 20)), None);
        }
        assert_eq!(memory.observe("m", &policy(), 1, None), None);
        let (at, _) = feed(&mut memory, 1, 9..40, |_| 20).unwrap();
        assert_eq!(at, 19, "a whole window after the blind spot");
    }

    #[test]
    fn noise_around_the_target_never_moves_replicas() {
        let mut memory = ScaleMemory::default();
        // Two replicas sized for 16 requests; the load wanders ±20 % around
        // 14 for an hour, one sample a second.
        let mut state = 7u64;
        let noisy = |_: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let offset = (state >> 33) % 7; // 0..=6
            11 + offset as u32 // 11..=17, 14 ± 3
        };
        let mut changes = 0;
        let mut desired = 2;
        let mut noisy = noisy;
        for second in 0..3600 {
            if let Some(d) = memory.observe("m", &policy(), desired, sample(second, noisy(second)))
            {
                changes += 1;
                desired = d.to;
            }
        }
        assert_eq!(changes, 0, "ended at {desired}");
    }
}
