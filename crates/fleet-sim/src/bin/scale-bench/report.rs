//! What the run shows: a timeline per model, and the figures the
//! autoscaling targets are stated in.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::trace::Trace;

/// One request: which model, when it was sent (since the start), its TTFT
/// when it succeeded.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub model: usize,
    pub sent_s: f64,
    pub ttft: Option<Duration>,
}

/// A model's replicas once a second.
#[derive(Debug, Clone, Copy)]
pub struct FleetSample {
    pub at_s: f64,
    pub desired: u32,
    pub ready: u32,
    pub starting: u32,
}

/// What the control plane and the router each said of a model's ready
/// replicas at one moment.
#[derive(Debug, Clone, Copy)]
pub struct RoutingSample {
    pub at_s: f64,
    pub control_plane_ready: u32,
    pub router_ready: u32,
}

pub struct Run<'a> {
    pub trace: &'a Trace,
    pub models: &'a [String],
    pub outcomes: &'a [Outcome],
    /// Per model.
    pub samples: &'a [Vec<FleetSample>],
    /// Per model, sampled more often than `samples`.
    pub routing: &'a [Vec<RoutingSample>],
    pub last_decisions: &'a [String],
    pub slo: Duration,
    pub window_s: f64,
    pub max_replicas: u32,
    /// The rollout, for a rollout trace.
    pub rollout: Option<RolloutRun>,
}

/// A spec change rolled onto the model's replicas.
#[derive(Debug, Clone, Copy)]
pub struct RolloutRun {
    pub changed_s: f64,
    /// When every replica ran the new spec and was ready; none if not
    /// by the end of the run.
    pub done_s: Option<f64>,
    pub max_unavailable: u32,
    pub max_surge: u32,
}

/// Scale actions closer together than this, in opposite directions, are a
/// reversal: the fleet changed its mind.
const REVERSAL_S: f64 = 180.0;

pub fn print(run: &Run<'_>) {
    let mut gpu_s = 0.0;
    let mut static_gpu_s = 0.0;
    for (m, name) in run.models.iter().enumerate() {
        let outcomes: Vec<&Outcome> = run.outcomes.iter().filter(|o| o.model == m).collect();
        let samples = &run.samples[m];
        println!("\n== {name}");
        timeline(run, &outcomes, samples);
        summary(run, m, &outcomes, samples);
        let span = samples.last().map_or(0.0, |s| s.at_s) - samples.first().map_or(0.0, |s| s.at_s);
        gpu_s += used_gpu_s(samples);
        static_gpu_s += f64::from(samples.iter().map(|s| s.ready).max().unwrap_or(0)) * span;
    }
    let all = run.outcomes.len();
    let failed = run.outcomes.iter().filter(|o| o.ttft.is_none()).count();
    let inside = run
        .outcomes
        .iter()
        .filter(|o| o.ttft.is_some_and(|t| t <= run.slo))
        .count();
    println!("\n== all models");
    println!(
        "requests: {all} sent, {failed} failed, {:.2} % inside the {} ms TTFT SLO",
        percent(inside, all),
        run.slo.as_millis()
    );
    println!(
        "GPU time: {gpu_s:.0} GPU-s against {static_gpu_s:.0} GPU-s for each model's peak replicas \
         throughout ({:.0} % less)",
        (1.0 - gpu_s / static_gpu_s.max(1.0)) * 100.0
    );
}

fn timeline(run: &Run<'_>, outcomes: &[&Outcome], samples: &[FleetSample]) {
    let mut by_window: BTreeMap<u64, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        by_window
            .entry((o.sent_s / run.window_s) as u64)
            .or_default()
            .push(o);
    }
    println!(
        "{:>6} {:>8} {:>8} {:>6} {:>9} {:>10} {:>7}",
        "t (s)", "req/s", "wanted", "ready", "starting", "TTFT p90", "failed"
    );
    for (w, sent) in &by_window {
        let from = *w as f64 * run.window_s;
        let sample = samples
            .iter()
            .rev()
            .find(|s| s.at_s >= from && s.at_s < from + run.window_s);
        let shown = |f: fn(&FleetSample) -> u32| sample.map_or("-".into(), |s| f(s).to_string());
        println!(
            "{:>6.0} {:>8.1} {:>8} {:>6} {:>9} {:>8.0}ms {:>7}",
            from,
            sent.len() as f64 / run.window_s,
            shown(|s| s.desired),
            shown(|s| s.ready),
            shown(|s| s.starting),
            p90(sent).map_or(f64::NAN, |p| p.as_secs_f64() * 1000.0),
            sent.iter().filter(|o| o.ttft.is_none()).count()
        );
    }
}

fn summary(run: &Run<'_>, model: usize, outcomes: &[&Outcome], samples: &[FleetSample]) {
    let failed = outcomes.iter().filter(|o| o.ttft.is_none()).count();
    let inside = outcomes
        .iter()
        .filter(|o| o.ttft.is_some_and(|t| t <= run.slo))
        .count();
    println!(
        "requests: {} sent, {failed} failed, {:.2} % inside the {} ms TTFT SLO",
        outcomes.len(),
        percent(inside, outcomes.len()),
        run.slo.as_millis()
    );
    let actions = scale_actions(samples);
    let busiest = actions
        .iter()
        .map(|(at, _)| {
            actions
                .iter()
                .filter(|(other, _)| *other >= *at && *other < at + REVERSAL_S)
                .count()
        })
        .max()
        .unwrap_or(0);
    let reversals = actions
        .windows(2)
        .filter(|w| w[0].1 != w[1].1 && w[1].0 - w[0].0 < REVERSAL_S)
        .count();
    println!(
        "scale actions: {} ({} up, {} down); at most {busiest} in any 3 minutes; {reversals} \
         reversal(s) within 3 minutes",
        actions.len(),
        actions.iter().filter(|(_, up)| *up).count(),
        actions.iter().filter(|(_, up)| !*up).count(),
    );
    if let Some(step_at) = run.trace.step_at_s() {
        step_figures(run, outcomes, samples, step_at);
    }
    if let Some(wake_at) = run.trace.wake_at_s() {
        wake_figures(outcomes, samples, wake_at);
    }
    if let Some(rollout) = &run.rollout {
        rollout_figures(run, outcomes, samples, rollout);
    }
    if let Some(routing) = run.routing.get(model) {
        routing_figures(routing);
    }
    if !run.last_decisions[model].is_empty() {
        println!("last decision: {}", run.last_decisions[model]);
    }
}

/// How the fleet followed a step: when it decided, when the replicas were
/// ready, when the TTFT p90 was back under the SLO.
fn step_figures(run: &Run<'_>, outcomes: &[&Outcome], samples: &[FleetSample], step_at: f64) {
    let first_up = samples
        .iter()
        .find(|s| s.at_s >= step_at && s.desired > samples[0].desired)
        .map(|s| s.at_s - step_at);
    let peak_ready = samples
        .iter()
        .find(|s| s.at_s >= step_at && s.ready >= run.max_replicas)
        .map(|s| s.at_s - step_at);
    let mut last_over_slo = None;
    let mut by_window: BTreeMap<u64, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.sent_s >= step_at) {
        by_window
            .entry(((o.sent_s - step_at) / run.window_s) as u64)
            .or_default()
            .push(o);
    }
    for (w, sent) in &by_window {
        if p90(sent).is_some_and(|p| p > run.slo) {
            last_over_slo = Some((*w + 1) as f64 * run.window_s);
        }
    }
    let after = |s: Option<f64>| s.map_or("never".into(), |s| format!("{s:.0}s after the step"));
    println!(
        "scale-up decided (sampled each second): {}",
        after(first_up)
    );
    println!(
        "all {} replicas ready: {}",
        run.max_replicas,
        after(peak_ready)
    );
    println!(
        "TTFT p90 over the SLO last in the window ending {}",
        last_over_slo.map_or("never (after the step)".into(), |t| format!(
            "{t:.0}s after the step"
        ))
    );
}

/// How a model scaled to zero took its first requests: how many replicas
/// were ready when the first was sent, and how long it waited for its first
/// token.
fn wake_figures(outcomes: &[&Outcome], samples: &[FleetSample], wake_at: f64) {
    let ready_before = samples
        .iter()
        .rev()
        .find(|s| s.at_s <= wake_at)
        .map_or("not sampled".into(), |s| s.ready.to_string());
    let first = outcomes
        .iter()
        .filter(|o| o.sent_s >= wake_at)
        .min_by(|a, b| a.sent_s.total_cmp(&b.sent_s));
    let ready_again = samples
        .iter()
        .find(|s| s.at_s >= wake_at && s.ready > 0)
        .map(|s| s.at_s - wake_at);
    println!(
        "from zero: {ready_before} replica(s) ready when the first request was sent at {wake_at:.0}s; \
         a replica ready {} later; the first request {}",
        ready_again.map_or("never".into(), |s| format!("{s:.0}s")),
        match first.map(|o| o.ttft) {
            Some(Some(ttft)) => format!(
                "held and answered, its first token after {:.1}s",
                ttft.as_secs_f64()
            ),
            Some(None) => "failed".into(),
            None => "was never sent".into(),
        }
    );
}

/// How a rollout went: how long, the fewest replicas ready meanwhile, and
/// the requests sent while it ran that failed.
fn rollout_figures(
    run: &Run<'_>,
    outcomes: &[&Outcome],
    samples: &[FleetSample],
    rollout: &RolloutRun,
) {
    let end = rollout.done_s.unwrap_or(f64::INFINITY);
    let during = |at_s: f64| at_s >= rollout.changed_s && at_s <= end;
    let fewest_ready = samples
        .iter()
        .filter(|s| during(s.at_s))
        .map(|s| s.ready)
        .min();
    let sent: Vec<&&Outcome> = outcomes.iter().filter(|o| during(o.sent_s)).collect();
    let failed = sent.iter().filter(|o| o.ttft.is_none()).count();
    println!(
        "rollout (max_surge {}, max_unavailable {}): spec changed at {:.0}s, {}",
        rollout.max_surge,
        rollout.max_unavailable,
        rollout.changed_s,
        rollout
            .done_s
            .map_or("not complete by the end of the run".into(), |done| format!(
                "every replica on it and ready {:.0}s later",
                done - rollout.changed_s
            ))
    );
    println!(
        "fewest replicas ready during the rollout: {} of {}; {} requests sent during it, {} failed",
        fewest_ready.map_or("none sampled".into(), |n| n.to_string()),
        run.max_replicas,
        sent.len(),
        failed
    );
}

/// How long after the control plane called a new replica ready the router
/// routed to it: for each rise of the ready count, until the router's
/// ready endpoints reached it.
fn routing_figures(samples: &[RoutingSample]) {
    let lags = routing_lags(samples);
    if lags.is_empty() {
        return;
    }
    let most = lags.iter().map(|(_, lag)| *lag).fold(0.0, f64::max);
    println!(
        "the router routed each newly ready replica within {most:.1}s of the control plane \
         calling it ready (sampled every 100 ms): {}",
        lags.iter()
            .map(|(at, lag)| format!("{lag:.1}s at {at:.0}s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// For each sample where the control plane's ready count rose, when it
/// did and how long until the router's count was as high; rises the run
/// ended before the router caught up with are left out.
fn routing_lags(samples: &[RoutingSample]) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .filter(|w| w[1].control_plane_ready > w[0].control_plane_ready)
        .filter_map(|w| {
            let (rose, wanted) = (w[1].at_s, w[1].control_plane_ready);
            samples
                .iter()
                .find(|s| s.at_s >= rose && s.router_ready >= wanted)
                .map(|s| (rose, s.at_s - rose))
        })
        .collect()
}

/// Each change of the wanted count: when, and whether it grew.
fn scale_actions(samples: &[FleetSample]) -> Vec<(f64, bool)> {
    samples
        .windows(2)
        .filter(|w| w[0].desired != w[1].desired)
        .map(|w| (w[1].at_s, w[1].desired > w[0].desired))
        .collect()
}

/// GPU-seconds held by ready and starting replicas (one GPU each).
fn used_gpu_s(samples: &[FleetSample]) -> f64 {
    samples
        .windows(2)
        .map(|w| f64::from(w[0].ready + w[0].starting) * (w[1].at_s - w[0].at_s))
        .sum()
}

fn p90(outcomes: &[&Outcome]) -> Option<Duration> {
    let mut ttfts: Vec<Duration> = outcomes.iter().filter_map(|o| o.ttft).collect();
    if ttfts.is_empty() {
        return None;
    }
    ttfts.sort();
    Some(ttfts[((ttfts.len() - 1) as f64 * 0.9).round() as usize])
}

fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        return 100.0;
    }
    part as f64 * 100.0 / whole as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: f64, desired: u32) -> FleetSample {
        FleetSample {
            at_s,
            desired,
            ready: desired,
            starting: 0,
        }
    }

    #[test]
    fn routing_lag_runs_from_ready_in_the_control_plane_to_routed() {
        let at = |at_s, control_plane_ready, router_ready| RoutingSample {
            at_s,
            control_plane_ready,
            router_ready,
        };
        let samples = [
            at(0.0, 1, 1),
            at(0.1, 3, 1),
            at(0.2, 3, 2),
            at(0.9, 3, 3),
            at(1.0, 4, 3),
        ];
        let lags = routing_lags(&samples);
        assert_eq!(lags.len(), 1, "the rise to 4 never reached the router");
        assert_eq!(lags[0].0, 0.1);
        assert!((lags[0].1 - 0.8).abs() < 1e-9, "{lags:?}");
    }

    #[test]
    fn actions_are_changes_of_the_wanted_count() {
        let samples = [
            sample(0.0, 1),
            sample(1.0, 2),
            sample(2.0, 2),
            sample(100.0, 1),
            sample(400.0, 2),
        ];
        assert_eq!(
            scale_actions(&samples),
            vec![(1.0, true), (100.0, false), (400.0, true)]
        );
        // Two ready replicas for 98 s, one for 300 s, and so on.
        assert_eq!(used_gpu_s(&samples), 1.0 + 2.0 + 2.0 * 98.0 + 300.0);
    }
}
