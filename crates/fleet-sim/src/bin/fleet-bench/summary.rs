//! Figures over several runs: each as min / median / max, never the best
//! run alone, and every run that did not converge counted.

/// One run's figures, as its phases printed them.
#[derive(Debug, Clone, Default)]
pub struct RunFigures {
    pub register_s: f64,
    pub leader_cpu_percent: f64,
    pub leader_rss_mib: f64,
    pub placements_per_s: f64,
    pub new_leader_s: f64,
    pub rehomed_s: f64,
    pub failover_not_ready: usize,
    pub catch_up_s: f64,
    pub restart_s: f64,
    pub restart_lost: usize,
    pub restart_not_ready: usize,
    pub reconnects: u64,
}

/// min / median / max of `values` (the median of an even count is the
/// mean of the middle two).
fn spread(values: &mut [f64]) -> Option<(f64, f64, f64)> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    Some((values[0], median, values[n - 1]))
}

/// A figure's name, its unit, and how to read it from a run.
type Row = (&'static str, &'static str, fn(&RunFigures) -> f64);

/// The table over every run; runs that failed are listed with why.
pub fn print(runs: &[Result<RunFigures, String>]) {
    let done: Vec<&RunFigures> = runs.iter().filter_map(|r| r.as_ref().ok()).collect();
    println!(
        "\nsummary: {} runs, {} converged, {} failed",
        runs.len(),
        done.len(),
        runs.len() - done.len()
    );
    for (i, run) in runs.iter().enumerate() {
        if let Err(why) = run {
            println!("  run {}: FAILED: {why}", i + 1);
        }
    }
    let rows: [Row; 12] = [
        ("register", "s", |f| f.register_s),
        ("leader CPU at steady state", "% of a core", |f| {
            f.leader_cpu_percent
        }),
        ("leader RSS at steady state", "MiB", |f| f.leader_rss_mib),
        ("placement", "shard placements/s", |f| f.placements_per_s),
        ("new leader after leader SIGKILL", "s", |f| f.new_leader_s),
        ("every stream re-homed", "s", |f| f.rehomed_s),
        ("nodes not ready after failover", "nodes", |f| {
            f.failover_not_ready as f64
        }),
        ("catch-up by snapshot", "s", |f| f.catch_up_s),
        ("whole-cluster restart, fleet back", "s", |f| f.restart_s),
        ("nodes lost after restart", "nodes", |f| {
            f.restart_lost as f64
        }),
        ("nodes not ready after restart", "nodes", |f| {
            f.restart_not_ready as f64
        }),
        ("agent reconnects", "per run", |f| f.reconnects as f64),
    ];
    println!("| figure | unit | min | median | max |");
    println!("|---|---|---|---|---|");
    for (name, unit, value) in rows {
        let mut values: Vec<f64> = done.iter().map(|f| value(f)).collect();
        if let Some((min, median, max)) = spread(&mut values) {
            println!(
                "| {name} | {unit} | {} | {} | {} |",
                show(min),
                show(median),
                show(max)
            );
        }
    }
}

/// Whole numbers as such, the rest with two decimals.
fn show(value: f64) -> String {
    if value.fract() == 0.0 || value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(spread(&mut [3.0, 1.0, 2.0]), Some((1.0, 2.0, 3.0)));
        assert_eq!(spread(&mut [4.0, 1.0, 2.0, 3.0]), Some((1.0, 2.5, 4.0)));
        assert_eq!(spread(&mut []), None);
    }
}
