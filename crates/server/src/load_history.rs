//! The last hour of each autoscaled model's load on this peer: what the
//! autoscaler loop sampled once a second, and the scaling decisions it saw
//! committed. Every peer samples, leader or not, so the history a console
//! draws survives a failover. It lives in memory only: it is evidence for
//! an operator, not state.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use llmgw_api::{LoadSampleView, ScaleMark};
use llmgw_state::ScaleDecision;

/// How far back the history reaches.
pub const KEPT_MS: u64 = 60 * 60 * 1000;
/// A bound on samples per model however the clock moves: an hour of one a
/// second, and some slack for a loop that ran fast.
const MAX_SAMPLES: usize = 4_000;
/// A bound on decisions per model: a stabilisation window of a few seconds
/// allows hundreds an hour at most.
const MAX_DECISIONS: usize = 1_000;

#[derive(Debug, Clone, Default)]
pub struct LoadHistory {
    models: Arc<Mutex<HashMap<String, ModelHistory>>>,
}

#[derive(Debug, Default)]
struct ModelHistory {
    samples: VecDeque<LoadSampleView>,
    decisions: VecDeque<ScaleMark>,
}

impl LoadHistory {
    /// Adds a sample of `model`, and the last scaling decision the state
    /// holds when it is one not seen yet; forgets what is older than an
    /// hour before this sample.
    pub fn record(&self, model: &str, sample: LoadSampleView, last_scale: Option<&ScaleDecision>) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let history = models.entry(model.to_owned()).or_default();
        let horizon = sample.at_ms.saturating_sub(KEPT_MS);
        if let Some(decision) = last_scale.filter(|d| d.at_ms >= horizon) {
            let seen = history.decisions.iter().any(|m| m.at_ms == decision.at_ms);
            if !seen {
                history.decisions.push_back(ScaleMark {
                    at_ms: decision.at_ms,
                    from: decision.from,
                    to: decision.to,
                    reason: decision.reason(),
                });
            }
        }
        history.samples.push_back(sample);
        while history.samples.len() > MAX_SAMPLES
            || history.samples.front().is_some_and(|s| s.at_ms < horizon)
        {
            history.samples.pop_front();
        }
        while history.decisions.len() > MAX_DECISIONS
            || history.decisions.front().is_some_and(|m| m.at_ms < horizon)
        {
            history.decisions.pop_front();
        }
    }

    /// Forgets models no longer autoscaled (or no longer in the catalog).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        models.retain(|name, _| keep(name));
    }

    /// A model's samples and decisions, oldest first; empty when it was not
    /// sampled.
    pub fn read(&self, model: &str) -> (Vec<LoadSampleView>, Vec<ScaleMark>) {
        let models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        models.get(model).map_or_else(Default::default, |history| {
            (
                history.samples.iter().cloned().collect(),
                history.decisions.iter().cloned().collect(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: u64, ready: u32) -> LoadSampleView {
        LoadSampleView {
            at_ms: at_s * 1000,
            requests_per_s: Some(2.5),
            outstanding: Some(3),
            ttft_p90_ms: Some(120),
            queue_p90_ms: None,
            kv_cache_usage_percent: Some(10),
            desired: ready,
            ready,
            starting: 0,
            draining: 0,
            sleeping: 0,
        }
    }

    fn decision(at_s: u64, from: u32, to: u32) -> ScaleDecision {
        ScaleDecision {
            from,
            to,
            requests_low: 9,
            requests_high: 12,
            ready_replicas: from,
            target_per_replica: 4,
            window_ms: 10_000,
            at_ms: at_s * 1000,
            woken_by_request: false,
            yielded_to: None,
            above_target: None,
            saturated: false,
            released_for_waiting: false,
        }
    }

    #[test]
    fn a_decision_is_marked_once_with_its_reason() {
        let history = LoadHistory::default();
        let up = decision(100, 1, 3);
        history.record("m", sample(100, 1), None);
        history.record("m", sample(101, 1), Some(&up));
        history.record("m", sample(102, 1), Some(&up));
        history.record("m", sample(130, 3), Some(&up));
        let (samples, decisions) = history.read("m");
        assert_eq!(samples.len(), 4);
        assert_eq!(
            decisions,
            vec![ScaleMark {
                at_ms: 100_000,
                from: 1,
                to: 3,
                reason: up.reason(),
            }]
        );
        assert!(
            decisions[0].reason.contains("9 to 12 requests"),
            "{}",
            decisions[0].reason
        );
        assert_eq!(history.read("other"), (vec![], vec![]));
    }

    #[test]
    fn only_the_last_hour_is_kept() {
        let history = LoadHistory::default();
        // A decision older than the hour when the peer first sees it (it
        // was committed before this peer started) is not drawn.
        history.record("m", sample(5_000, 1), Some(&decision(1_000, 2, 1)));
        history.record("m", sample(5_001, 1), Some(&decision(5_001, 1, 2)));
        for at_s in (5_002..8_602).step_by(10) {
            history.record("m", sample(at_s, 2), None);
        }
        history.record("m", sample(8_602, 2), None);
        let (samples, decisions) = history.read("m");
        let oldest = samples.first().expect("samples").at_ms;
        let newest = samples.last().expect("samples").at_ms;
        assert!(newest - oldest <= KEPT_MS, "{oldest}..{newest}");
        assert_eq!(
            oldest, 5_002_000,
            "the two first samples are over an hour old"
        );
        assert!(decisions.is_empty(), "{decisions:?}");
    }

    #[test]
    fn samples_are_bounded_whatever_the_clock_says() {
        let history = LoadHistory::default();
        for _ in 0..(MAX_SAMPLES + 50) {
            history.record("m", sample(7, 1), None);
        }
        assert_eq!(history.read("m").0.len(), MAX_SAMPLES);
        history.retain(|name| name != "m");
        assert!(history.read("m").0.is_empty());
    }
}
