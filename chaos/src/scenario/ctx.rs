//! What a schedule drives: the cluster, the seeded generator, the log of
//! faults, the fault windows, and checks of the scenario's own promises,
//! including those that need the whole run's evidence.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use tokio::task::JoinHandle;

use super::ScenarioError;
use crate::cluster::Cluster;
use crate::fleet::{self, Fleet, FleetLog, FleetSample, RouterOp, Subject, Window};
use crate::history::{History, Outcome};
use crate::invariants::Checked;
use crate::linearizability::RegOp;
use crate::load::{self, LeaderSample};
/// Election timeouts a failover may take (see [`Ctx::failover_bound`]).
pub const FAILOVER_TIMEOUTS: u32 = 20;

/// The fault-injection side of a run: the cluster, the seeded schedule,
/// and the log of what was done.
pub struct Ctx {
    pub cluster: Cluster,
    pub(super) rng: StdRng,
    pub(super) faults: Vec<String>,
    pub(super) history: History,
    pub(super) verbose: bool,
    /// Extra load started by the scenario (a burst).
    pub(super) burst: Vec<JoinHandle<()>>,
    pub(super) burst_stop: Arc<AtomicBool>,
    pub(super) seed: u64,
    pub(super) run_id: String,
    pub(super) extra_checks: Vec<Checked>,
    /// The agents and their engines, in fleet scenarios.
    pub fleet: Option<Fleet>,
    pub(super) fleet_log: FleetLog,
    /// What each fault touched and when.
    pub(super) windows: Vec<Window>,
    /// Fleet models and their desired replica counts.
    pub(super) desired: BTreeMap<String, u64>,
    /// Models whose launch spec the schedule changed: their replicas are
    /// replaced make-before-break (a rolling update).
    pub(super) rolled_out: BTreeSet<String>,
    /// Checks of this scenario's promises that need the whole run's
    /// evidence (every peer's leader samples, every log), run after the
    /// load has stopped.
    pub(super) later: Vec<LaterCheck>,
    /// While set, the admin load sends nothing (the runner's heal clears
    /// it).
    pub(super) load_quiet: Arc<AtomicBool>,
    /// Faults whose effect was read back (a paused process's state).
    pub(super) faults_confirmed: usize,
    /// Faults that did not take effect, and what was seen instead.
    pub(super) faults_unconfirmed: Vec<String>,
}

/// A check that runs on the run's [`Evidence`] once it is collected.
pub type LaterCheck = Box<dyn FnOnce(&Evidence) -> Checked>;

/// Everything a run recorded, for the checks after it: evidence from
/// outside the control plane where it can be had (the sampled leadership
/// of every peer, the agents' own logs and files, the router requests).
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// Every peer's answer to "who leads?", every 150 ms.
    pub leader_samples: Vec<LeaderSample>,
    /// Replicas, nodes and every agent's files, every 250 ms.
    pub fleet_samples: Vec<FleetSample>,
    /// (path, text) of every peer log, one per start.
    pub peer_logs: Vec<(String, String)>,
    /// (node, text) of every agent's logs.
    pub agent_logs: Vec<(String, String)>,
    /// (node, lines) of every agent's command witness.
    pub witnesses: Vec<(String, Vec<crate::invariants::WitnessLine>)>,
    pub router_ops: Vec<RouterOp>,
    /// What each fault touched and when.
    pub windows: Vec<Window>,
    /// Unix time in microseconds at the run's time zero: log lines carry
    /// wall-clock times, samples carry run times.
    pub wall_zero_us: u64,
}

impl Ctx {
    pub(super) fn fault(&mut self, what: impl Into<String>) {
        let what = what.into();
        let line = format!("{:6.1}s {what}", self.history.elapsed().as_secs_f64());
        if self.verbose {
            println!("  {line}");
        }
        self.faults.push(line);
    }

    /// How soon a majority that lost its leader must follow a new one:
    /// [`FAILOVER_TIMEOUTS`] of the configured `raft.election_timeout_max`,
    /// for a vote's round trips, fsyncs and the sampling on a noisy 2-core
    /// machine (9 s with the defaults, shorter than every fault held, so a
    /// majority that never elects fails however the run is timed).
    pub(super) fn failover_bound(&self) -> Result<Duration, String> {
        self.cluster
            .election_timeout_max()
            .map(|timeout| timeout * FAILOVER_TIMEOUTS)
    }

    /// How soon an agent that lost its stream must be registered with a
    /// leader again: the failover bound and two of its longest reconnect
    /// backoffs (`reconnect_max`, from the first agent's config file).
    pub(super) fn agent_reconnect_bound(&self) -> Result<Duration, String> {
        let failover = self.failover_bound()?;
        let agent = self
            .fleet
            .as_ref()
            .and_then(|fleet| fleet.agents.values().next())
            .ok_or("the run has no agents")?;
        let path = &agent.layout.config;
        let config = llmgw_config::AgentConfig::load(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(failover + config.reconnect_max * 2)
    }

    /// Waits a seeded time in `[min_ms, max_ms)`.
    pub(super) async fn hold(&mut self, min_ms: u64, max_ms: u64) {
        let ms = self.rng.random_range(min_ms..max_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    pub(super) async fn leader(&self) -> Result<u64, ScenarioError> {
        Ok(self.cluster.wait_leader(Duration::from_secs(60)).await?)
    }

    pub(super) fn followers(&self, leader: u64) -> Vec<u64> {
        self.cluster
            .member_ids()
            .into_iter()
            .filter(|id| *id != leader)
            .collect()
    }

    pub(super) fn pick(&mut self, from: &[u64]) -> u64 {
        from[self.rng.random_range(0..from.len())]
    }

    pub(super) fn kill(&mut self, id: u64) {
        // Opened before the signal: a request cut by the kill completes
        // before `kill` returns.
        self.open_window(Subject::Peer(id), true);
        self.cluster.kill(id);
        self.fault(format!("SIGKILL peer {id}"));
    }

    pub(super) fn restart(&mut self, id: u64) -> Result<(), ScenarioError> {
        self.cluster.spawn(id)?;
        self.close_window(&Subject::Peer(id));
        self.fault(format!("restart peer {id}"));
        Ok(())
    }

    /// SIGSTOP to peer `id`, with a fault window on it (its router stops
    /// answering; no node is touched).
    pub(super) fn pause(&mut self, id: u64) {
        self.open_window(Subject::Peer(id), true);
        let proof = self.cluster.pause(id);
        self.confirmed(format!("SIGSTOP peer {id}"), proof);
    }

    /// SIGCONT to peer `id`; closes its window.
    pub(super) fn resume(&mut self, id: u64) {
        let proof = self.cluster.resume(id);
        self.close_window(&Subject::Peer(id));
        self.confirmed(format!("SIGCONT peer {id}"), proof);
    }

    /// Logs fault `what` with the proof that it took effect, or records
    /// that it did not: a fault that never happened must not pass as one
    /// the cluster survived.
    pub(super) fn confirmed(&mut self, what: String, proof: Result<String, String>) {
        match proof {
            Ok(proof) => {
                self.faults_confirmed += 1;
                self.fault(format!("{what}: {proof}"));
            }
            Err(why) => {
                self.fault(format!("{what}: did NOT take effect: {why}"));
                self.faults_unconfirmed.push(format!("{what}: {why}"));
            }
        }
    }

    pub(super) fn heal(&mut self) -> Result<(), ScenarioError> {
        self.cluster.net.heal()?;
        let now = self.history.now_us();
        for window in &mut self.windows {
            if !matches!(window.subject, Subject::Peer(_)) {
                window.to_us.get_or_insert(now);
            }
        }
        self.fault("heal the network");
        Ok(())
    }

    /// Runs `check` on the whole run's evidence once the load stopped.
    pub(super) fn check_later(&mut self, check: impl FnOnce(&Evidence) -> Checked + 'static) {
        self.later.push(Box::new(check));
    }

    pub(super) fn open_window(&mut self, subject: Subject, data_plane: bool) {
        self.windows.push(Window {
            subject,
            from_us: self.history.now_us(),
            to_us: None,
            data_plane,
        });
    }

    pub(super) fn close_window(&mut self, subject: &Subject) {
        let now = self.history.now_us();
        for window in &mut self.windows {
            if &window.subject == subject {
                window.to_us.get_or_insert(now);
            }
        }
    }

    pub(super) fn work_dirs(&self) -> Vec<(String, PathBuf)> {
        self.fleet
            .as_ref()
            .map(Fleet::work_dirs)
            .unwrap_or_default()
    }

    /// A fresh fleet sample that passes `check`, within `within`.
    pub(super) async fn wait_fleet<F>(
        &self,
        within: Duration,
        check: F,
    ) -> Result<FleetSample, String>
    where
        F: FnMut(&FleetSample) -> Result<(), String>,
    {
        fleet::wait_sample(
            &self.cluster.admin_client(Duration::from_millis(1500)),
            &self.cluster.members,
            &self.work_dirs(),
            &self.history,
            within,
            check,
        )
        .await
    }

    /// Starts `n` extra workers with no pause between requests.
    pub(super) fn start_burst(&mut self, n: usize) {
        self.start_burst_avoiding(n, None);
    }

    /// Like `start_burst`, with workers that never send to `avoid`.
    pub(super) fn start_burst_avoiding(&mut self, n: usize, avoid: Option<u64>) {
        self.start_writers_avoiding(n, avoid, Duration::ZERO);
    }

    /// `n` extra workers that never send to `avoid`, `pause` between
    /// requests; stopped with the burst.
    pub(super) fn start_writers_avoiding(&mut self, n: usize, avoid: Option<u64>, pause: Duration) {
        let targets = crate::cluster::Members::default();
        {
            let members = self
                .cluster
                .members
                .read()
                .unwrap_or_else(|p| p.into_inner());
            let mut targets = targets.write().unwrap_or_else(|p| p.into_inner());
            targets.extend(
                members
                    .iter()
                    .filter(|(id, _)| Some(**id) != avoid)
                    .map(|(id, url)| (*id, url.clone())),
            );
        }
        for i in 0..n {
            self.burst.push(tokio::spawn(load::worker(
                load::client(&self.cluster),
                100 + i,
                self.seed,
                self.run_id.clone(),
                targets.clone(),
                self.history.clone(),
                self.burst_stop.clone(),
                self.load_quiet.clone(),
                pause,
            )));
        }
        let paced = if pause.is_zero() {
            String::new()
        } else {
            format!(" ({pause:?} apart)")
        };
        match avoid {
            Some(peer) => self.fault(format!(
                "start a burst of {n} writers{paced}, none to peer {peer}"
            )),
            None => self.fault(format!("start a burst of {n} writers{paced}")),
        }
    }

    /// Stops the admin load from sending, so the cluster idles: only
    /// heartbeats keep its leader's lease.
    pub(super) fn quiet_load(&mut self) {
        self.load_quiet.store(true, Ordering::Relaxed);
        self.fault("the admin load pauses: the cluster idles");
    }

    pub(super) fn resume_load(&mut self) {
        self.load_quiet.store(false, Ordering::Relaxed);
        self.fault("the admin load resumes");
    }

    pub(super) async fn stop_burst(&mut self) {
        self.burst_stop.store(true, Ordering::Relaxed);
        for handle in self.burst.drain(..) {
            let _ = handle.await;
        }
    }
}

/// A write through `peer`, tried every 500 ms until one is taken or
/// `within` passes: how long it took, or why none was taken (the last
/// answer). Keys start with `key_prefix`.
pub(super) async fn write_through(
    ctx: &Ctx,
    peer: u64,
    key_prefix: &str,
    within: Duration,
) -> Result<Duration, String> {
    let started = std::time::Instant::now();
    let base = ctx.cluster.admin(peer);
    let mut last = String::new();
    let mut tries = 0;
    while started.elapsed() < within {
        tries += 1;
        let key = format!("{key_prefix}-{tries}");
        let write = RegOp::Write("1".into());
        match load::perform(&ctx.cluster.http, &base, &key, &write).await {
            Outcome::Ok(_) => return Ok(started.elapsed()),
            other => last = format!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!(
        "no write through peer {peer} succeeded within {within:?} ({tries} tries); the last: {last}"
    ))
}

/// Scales the small model up by one replica through the leader, and makes
/// that the desired count; the new count.
pub(super) async fn scale_small_up(ctx: &mut Ctx) -> Result<u64, String> {
    let want = ctx.desired.get(fleet::SMALL).copied().unwrap_or(0) + 1;
    let model = fleet::small_model(u32::try_from(want).expect("a handful of replicas"));
    fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::PUT,
        &llmgw_api::paths::model(fleet::SMALL),
        Some(&model),
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| format!("scale {} up: {why}", fleet::SMALL))?;
    ctx.desired.insert(fleet::SMALL.to_owned(), want);
    ctx.fault(format!("scale {} to {want} replicas", fleet::SMALL));
    Ok(want)
}

/// A check of this scenario's own promise.
pub(super) fn promise(
    ctx: &mut Ctx,
    name: &'static str,
    scope: String,
    result: Result<(), String>,
) {
    ctx.extra_checks.push(Checked::new(
        name,
        scope,
        result.err().into_iter().collect(),
    ));
}

/// The latest fleet sample; an error when the sampler has none yet.
pub(super) fn latest(ctx: &Ctx) -> Result<FleetSample, ScenarioError> {
    fleet::latest(&ctx.fleet_log)
        .ok_or_else(|| ScenarioError::Setup("the fleet sampler has no sample yet".into()))
}

/// A seeded node among those that hold a shard of the small model.
pub(super) fn pick_small_node(
    ctx: &mut Ctx,
    sample: &FleetSample,
) -> Result<String, ScenarioError> {
    let nodes = fleet::nodes_of(sample, fleet::SMALL);
    if nodes.is_empty() {
        return Err(ScenarioError::Setup(format!(
            "no node holds a shard of {}",
            fleet::SMALL
        )));
    }
    Ok(nodes[ctx.rng.random_range(0..nodes.len())].clone())
}

pub(super) fn node_addr(ctx: &Ctx, node: &str) -> u64 {
    ctx.fleet.as_ref().expect("a fleet scenario").agents[node].addr
}
