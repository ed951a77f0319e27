//! `llmgw chaos soak`: crash cycles as a soak, a program rather than a
//! test. One three-peer cluster on lazy disks; each cycle runs client
//! writes, cuts the power of (or SIGKILLs) a random peer in the middle of
//! them, restarts it, and checks that every write acknowledged so far is
//! on every peer with its value, that the state hashes agree, and that no
//! peer refused to start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmgw_api::{Model, paths};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, Members};
use crate::load;
use crate::netns::Net;

/// `llmgw chaos soak`.
#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Crash cycles to run.
    #[arg(long, default_value_t = 100)]
    pub cycles: u64,
    /// Fixes the schedule (which peer, which fault, how long); random and
    /// printed when left out.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The llmgw binary the peers run; this binary by default.
    #[arg(long, value_name = "PATH")]
    pub llmgw_bin: Option<PathBuf>,
    /// Where the run keeps logs and data (kept when something was lost).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

/// What the soak found.
#[derive(Debug, Default)]
pub struct SoakReport {
    pub cycles: u64,
    pub power_cuts: u64,
    pub torn_cuts: u64,
    pub sigkills: u64,
    pub acknowledged: usize,
    pub lost: usize,
    pub refused_to_start: u64,
    pub diverged: u64,
    pub bytes_dropped: u64,
    pub seconds: f64,
}

type Acked = Arc<Mutex<BTreeMap<String, String>>>;

async fn writer(
    http: reqwest::Client,
    worker: usize,
    cycle: u64,
    members: Members,
    acked: Acked,
    stop: Arc<AtomicBool>,
) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let targets = crate::cluster::snapshot(&members);
        if targets.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let (_, base) = &targets[(i as usize + worker) % targets.len()];
        let key = format!("soak-{cycle}-{worker}-{i}");
        let value = format!("{cycle}.{worker}.{i}");
        let answer = http
            .put(format!("{base}{}", paths::model(&key)))
            .header("content-type", "application/json")
            .body(load::model_body(&key, &value))
            .send()
            .await;
        if answer.is_ok_and(|r| r.status().as_u16() == 200) {
            acked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, value);
        }
        i += 1;
    }
}

/// Every acknowledged key must be in `id`'s catalog with its value.
async fn missing_on(
    cluster: &Cluster,
    id: u64,
    acked: &BTreeMap<String, String>,
) -> Result<Vec<String>, String> {
    let models: Vec<Model> = cluster
        .get(id, &format!("{}?consistent=true", paths::MODELS))
        .await?;
    let have: BTreeMap<String, Option<String>> = models
        .iter()
        .map(|m| (m.name.clone(), load::value_of(m)))
        .collect();
    Ok(acked
        .iter()
        .filter(|(key, value)| have.get(*key) != Some(&Some((*value).clone())))
        .map(|(key, _)| key.clone())
        .collect())
}

pub fn main(args: SoakArgs) -> std::process::ExitCode {
    if let Err(why) = crate::preflight() {
        eprintln!("llmgw chaos soak: cannot run: {why}");
        return std::process::ExitCode::FAILURE;
    }
    let bin = match args
        .llmgw_bin
        .clone()
        .or_else(|| std::env::current_exe().ok())
    {
        Some(bin) => bin,
        None => {
            eprintln!("llmgw chaos soak: pass --llmgw-bin");
            return std::process::ExitCode::FAILURE;
        }
    };
    let seed = args.seed.unwrap_or_else(|| rand::random::<u32>() as u64);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("llmgw chaos soak: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let work_dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("llmgw-chaos"));
    match runtime.block_on(soak(args.cycles, seed, &bin, &work_dir)) {
        Ok(report) => {
            println!("\n{}", summary(&report, seed));
            if report.lost == 0 && report.refused_to_start == 0 && report.diverged == 0 {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(why) => {
            eprintln!("llmgw chaos soak: {why}");
            std::process::ExitCode::FAILURE
        }
    }
}

pub fn summary(r: &SoakReport, seed: u64) -> String {
    format!(
        "soak seed {seed}: {} cycles in {:.0}s: {} power cuts ({} torn), {} SIGKILLs; \
         {} acknowledged writes, {} lost; {} unsynced bytes dropped by cuts; \
         {} peers refused to start; {} cycles with diverging state hashes",
        r.cycles,
        r.seconds,
        r.power_cuts,
        r.torn_cuts,
        r.sigkills,
        r.acknowledged,
        r.lost,
        r.bytes_dropped,
        r.refused_to_start,
        r.diverged
    )
}

/// Runs `cycles` crash cycles against a fresh cluster.
pub async fn soak(
    cycles: u64,
    seed: u64,
    bin: &std::path::Path,
    work_dir: &std::path::Path,
) -> Result<SoakReport, String> {
    let started = Instant::now();
    let run_id = format!("{:06x}", rand::random::<u32>() & 0x00ff_ffff);
    let dir = work_dir.join(format!("soak-seed{seed}-{run_id}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let net = Net::create(&run_id).map_err(|e| e.to_string())?;
    let mut cluster = Cluster::create(net, &dir, bin, 3, "", false).map_err(|e| e.to_string())?;
    cluster.mount_lazy_disks().map_err(|e| e.to_string())?;
    let result = cycles_on(&mut cluster, cycles, seed, &dir).await;
    let leftovers = cluster.shutdown();
    let mut leftovers_net = cluster.net.destroy();
    drop(cluster);
    let mut report = result?;
    report.seconds = started.elapsed().as_secs_f64();
    leftovers_net.extend(leftovers);
    if !leftovers_net.is_empty() {
        println!("left behind: {leftovers_net:?}");
    }
    if report.lost == 0 && report.refused_to_start == 0 && report.diverged == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("logs and data kept in {}", dir.display());
    }
    Ok(report)
}

/// A power cut (torn or not) or a SIGKILL of peer `victim`, chosen by
/// `rng` and counted in `report`; returns what was done, for the log.
fn crash(
    cluster: &mut Cluster,
    victim: u64,
    rng: &mut StdRng,
    report: &mut SoakReport,
) -> Result<String, String> {
    let power = rng.random_bool(0.5);
    let tear = power && rng.random_bool(0.5);
    if !power {
        cluster.kill(victim);
        report.sigkills += 1;
        return Ok(format!("SIGKILL peer {victim}"));
    }
    report.power_cuts += 1;
    let cut = cluster.power_cut(victim, if tear { Some(rng) } else { None })?;
    report.bytes_dropped += cut.bytes_dropped;
    if tear {
        report.torn_cuts += 1;
    }
    Ok(super::describe(victim, &cut))
}

/// Acknowledged writes that some peer's consistent read no longer has
/// (or peers that never answered one within 60 s).
async fn lost_writes(cluster: &Cluster, acknowledged: &BTreeMap<String, String>) -> Vec<String> {
    let mut lost = Vec::new();
    for id in 1..=3 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match missing_on(cluster, id, acknowledged).await {
                Ok(missing) => {
                    lost.extend(missing.into_iter().map(|k| format!("{k} on peer {id}")));
                    break;
                }
                Err(why) if Instant::now() > deadline => {
                    lost.push(format!("peer {id} never answered a consistent read: {why}"));
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    lost
}

/// Whether the three peers report the same state hash, waiting up to 60 s
/// for them to converge.
async fn state_hashes_agree(cluster: &Cluster) -> bool {
    let mut hashes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        hashes.clear();
        for id in 1..=3 {
            hashes.push(cluster.own_state(id).await);
        }
        let equal = hashes.iter().all(|h| h.is_some() && *h == hashes[0]);
        if equal || Instant::now() > deadline {
            return equal;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn cycles_on(
    cluster: &mut Cluster,
    cycles: u64,
    seed: u64,
    dir: &std::path::Path,
) -> Result<SoakReport, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut report = SoakReport::default();
    for id in 1..=3 {
        cluster.spawn(id).map_err(|e| e.to_string())?;
    }
    cluster
        .wait_leader(Duration::from_secs(90))
        .await
        .map_err(|e| e.to_string())?;
    println!("soak seed {seed}: cluster up, logs in {}", dir.display());
    let acked: Acked = Arc::default();
    for cycle in 1..=cycles {
        let cycle_started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..3)
            .map(|w| {
                tokio::spawn(writer(
                    load::client(cluster),
                    w,
                    cycle,
                    cluster.members.clone(),
                    acked.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
        let victim = rng.random_range(1..=3u64);
        let what = crash(cluster, victim, &mut rng, &mut report)?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        cluster.spawn(victim).map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(800)).await;
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            let _ = w.await;
        }
        // The restarted peer must be up: one that refused to start exits.
        let leader = cluster.wait_leader(Duration::from_secs(60)).await;
        if !cluster.is_running(victim) || leader.is_err() {
            report.refused_to_start += 1;
            println!(
                "cycle {cycle}: peer {victim} did not come back: {:?}\n{}",
                leader.err().map(|e| e.to_string()),
                cluster.log_tails()
            );
            report.cycles = cycle;
            return Ok(report);
        }
        let snapshot = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let lost = lost_writes(cluster, &snapshot).await;
        let equal = state_hashes_agree(cluster).await;
        if !equal {
            report.diverged += 1;
        }
        report.lost += lost.len();
        report.acknowledged = snapshot.len();
        report.cycles = cycle;
        println!(
            "cycle {cycle:3}: {what}; {} acknowledged so far, {} lost, hashes {}, {:.1}s",
            snapshot.len(),
            lost.len(),
            if equal { "equal" } else { "DIFFER" },
            cycle_started.elapsed().as_secs_f64()
        );
        for line in lost.iter().take(10) {
            println!("    lost: {line}");
        }
    }
    Ok(report)
}
