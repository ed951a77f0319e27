//! Arrival traces: how many requests a second each model gets, over time.

use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The shapes the benchmark can replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shape {
    /// `base_rate`, then `base_rate * step`, then `base_rate` again.
    Step,
    /// `base_rate` throughout, with noise: a fleet that should hold still.
    Steady,
    /// A day compressed into `day_s`: from `low_rate` at midnight to
    /// `peak_rate` at noon and back, with noise.
    Diurnal,
    /// Two models on one pool, each a diurnal day, their peaks half a day
    /// apart.
    TwoModels,
    /// `base_rate` throughout, with noise, for `during_s`; at `before_s`
    /// the model's launch spec changes and rolls onto its replicas.
    Rollout,
    /// Nothing for `before_s` (long enough for a model with
    /// `min_replicas: 0` to scale to zero), then `base_rate` for
    /// `during_s`, then nothing for `after_s`.
    FromZero,
}

/// One run's arrivals, per model.
#[derive(Debug, Clone)]
pub struct Trace {
    pub shape: Shape,
    phases: Phases,
    /// Multipliers of the rate, one per model per `NOISE_SEGMENT_S`.
    noise: Vec<Vec<f64>>,
}

#[derive(Debug, Clone, Copy)]
pub struct Phases {
    pub base_rate: f64,
    pub step: f64,
    pub before_s: f64,
    pub during_s: f64,
    pub after_s: f64,
    pub low_rate: f64,
    pub peak_rate: f64,
    pub day_s: f64,
    /// The trace runs this long before its measured start, from where its
    /// shape is at that time before it (for a day, the evening before).
    pub warm_up_s: f64,
}

/// The noise holds for this long, then changes: load that wanders, not
/// jitter between single requests.
const NOISE_SEGMENT_S: f64 = 10.0;

impl Trace {
    /// `noise` is the most a segment's rate departs from the shape, as a
    /// fraction (0.2: ±20 %); `seed` replays the same noise.
    pub fn new(shape: Shape, phases: Phases, noise: f64, seed: u64) -> Trace {
        let mut trace = Trace {
            shape,
            phases,
            noise: Vec::new(),
        };
        let mut random = StdRng::seed_from_u64(seed);
        let segments = (trace.duration_s() / NOISE_SEGMENT_S).ceil() as usize + 1;
        let noisy = !matches!(shape, Shape::Step);
        trace.noise = (0..trace.models())
            .map(|_| {
                (0..segments)
                    .map(|_| match noisy {
                        true => 1.0 + random.random_range(-noise..=noise),
                        false => 1.0,
                    })
                    .collect()
            })
            .collect();
        trace
    }

    pub fn models(&self) -> usize {
        match self.shape {
            Shape::TwoModels => 2,
            _ => 1,
        }
    }

    pub fn duration_s(&self) -> f64 {
        let p = &self.phases;
        match self.shape {
            Shape::Step | Shape::FromZero => p.before_s + p.during_s + p.after_s,
            Shape::Steady | Shape::Rollout => p.during_s,
            Shape::Diurnal | Shape::TwoModels => p.day_s,
        }
    }

    /// After `t_s`, where the trace has no load, the next time it has
    /// some (the run's end when none is left).
    fn next_load_s(&self, t_s: f64) -> f64 {
        let p = &self.phases;
        match self.shape {
            Shape::FromZero if t_s < p.before_s => p.before_s,
            _ => self.duration_s(),
        }
    }

    /// When the step comes, for a step trace.
    pub fn step_at_s(&self) -> Option<f64> {
        (self.shape == Shape::Step).then_some(self.phases.before_s)
    }

    /// When the first requests come to a model scaled to zero, for a
    /// from-zero trace.
    pub fn wake_at_s(&self) -> Option<f64> {
        (self.shape == Shape::FromZero).then_some(self.phases.before_s)
    }

    /// When the model's spec changes, for a rollout trace.
    pub fn rollout_at_s(&self) -> Option<f64> {
        (self.shape == Shape::Rollout).then_some(self.phases.before_s)
    }

    /// Requests a second for `model` at `t_s` seconds into the run (before
    /// it, in the warm-up, when negative).
    pub fn rate(&self, model: usize, t_s: f64) -> f64 {
        let p = &self.phases;
        let shaped = match self.shape {
            Shape::Step if t_s >= p.before_s && t_s < p.before_s + p.during_s => {
                p.base_rate * p.step
            }
            Shape::Step | Shape::Steady | Shape::Rollout => p.base_rate,
            Shape::FromZero if t_s >= p.before_s && t_s < p.before_s + p.during_s => p.base_rate,
            Shape::FromZero => 0.0,
            Shape::Diurnal | Shape::TwoModels => {
                // The second model's day starts at its noon.
                let phase = t_s / p.day_s + model as f64 * 0.5;
                let daylight = (1.0 - (std::f64::consts::TAU * phase).cos()) / 2.0;
                p.low_rate + (p.peak_rate - p.low_rate) * daylight
            }
        };
        let segment = (t_s / NOISE_SEGMENT_S) as usize;
        let noise = self.noise[model]
            .get(segment)
            .or(self.noise[model].last())
            .copied()
            .unwrap_or(1.0);
        shaped * noise
    }

    /// The send times of every request of `model`, in seconds from the
    /// measured start (negative in the warm-up): evenly spaced at the rate
    /// of the moment.
    pub fn arrivals(&self, model: usize) -> Vec<f64> {
        let mut at = -self.phases.warm_up_s;
        let mut times = Vec::new();
        while at < self.duration_s() {
            let rate = self.rate(model, at);
            if rate <= 0.0 {
                at = self.next_load_s(at);
                continue;
            }
            times.push(at);
            at += 1.0 / rate.max(0.01);
        }
        times
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases() -> Phases {
        Phases {
            base_rate: 2.0,
            step: 5.0,
            before_s: 60.0,
            during_s: 120.0,
            after_s: 150.0,
            low_rate: 0.5,
            peak_rate: 6.0,
            day_s: 600.0,
            warm_up_s: 0.0,
        }
    }

    #[test]
    fn a_step_multiplies_the_rate_while_it_lasts() {
        let trace = Trace::new(Shape::Step, phases(), 0.2, 1);
        assert_eq!(trace.rate(0, 10.0), 2.0);
        assert_eq!(trace.rate(0, 100.0), 10.0);
        assert_eq!(trace.rate(0, 200.0), 2.0);
        let sent = trace.arrivals(0);
        // 60 s and 150 s at 2/s, 120 s at 10/s.
        assert!(
            (sent.len() as i64 - (120 + 1200 + 300)).abs() <= 2,
            "{}",
            sent.len()
        );
    }

    #[test]
    fn two_days_peak_half_a_day_apart_with_bounded_noise() {
        let trace = Trace::new(Shape::TwoModels, phases(), 0.2, 7);
        let noon = 300.0;
        assert!(trace.rate(0, noon) > 4.8 && trace.rate(0, noon) < 7.2);
        assert!(trace.rate(1, noon) < 0.61, "the second model's midnight");
        assert!(trace.rate(1, 1.0) > 4.8, "the second model's noon");
        for t in 0..600 {
            let rate = trace.rate(0, f64::from(t));
            assert!((0.4..=7.2).contains(&rate), "{rate} at {t}s");
        }
        // The same seed, the same noise.
        let again = Trace::new(Shape::TwoModels, phases(), 0.2, 7);
        assert_eq!(trace.arrivals(1), again.arrivals(1));
    }

    #[test]
    fn from_zero_sends_nothing_before_and_after_its_burst() {
        let trace = Trace::new(Shape::FromZero, phases(), 0.0, 1);
        let sent = trace.arrivals(0);
        assert_eq!(sent[0], 60.0, "the first request comes at before_s");
        assert!(sent.iter().all(|at| (60.0..180.0).contains(at)));
        // 120 s at 2/s.
        assert!((sent.len() as i64 - 240).abs() <= 1, "{}", sent.len());
    }

    #[test]
    fn a_warm_up_runs_the_day_from_the_evening_before() {
        let warm = Trace::new(
            Shape::TwoModels,
            Phases {
                warm_up_s: 120.0,
                ..phases()
            },
            0.0,
            7,
        );
        let sent = warm.arrivals(1);
        assert!(sent[0] == -120.0, "{}", sent[0]);
        // 120 s before the day starts is the day's 480 s.
        let cold = Trace::new(Shape::TwoModels, phases(), 0.0, 7);
        assert!((warm.rate(1, -120.0) - cold.rate(1, 480.0)).abs() < 1e-9);
        let measured = sent.iter().filter(|at| **at >= 0.0).count();
        assert!(
            (measured as i64 - cold.arrivals(1).len() as i64).abs() <= 1,
            "the measured part is the day itself"
        );
    }
}
