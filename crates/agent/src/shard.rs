//! One shard's life after launch (or adoption): readiness and health checks,
//! the startup timeout, crash reports, stop and drain. One task per shard;
//! it ends when the shard is stopped or has failed, and never restarts
//! anything: restarts are the leader's decision.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmgw_config::SupervisorConfig;
use llmgw_engines::ProcessSpec;
use llmgw_proto::agent::ShardState;
use tokio::sync::mpsc;

use crate::logfile;
use crate::probe::{self, Probe};
use crate::process::{ExitInfo, ExitNotice};
use crate::report::Reporter;
use crate::statefile::{self, ReadyRule, ShardRecord};

/// Commands the supervisor passes to a running shard.
#[derive(Debug)]
pub enum Control {
    Stop {
        reason: String,
    },
    Drain {
        deadline: Duration,
        reason: String,
    },
    /// The leader wants the engine (launched in sleep mode) asleep or awake.
    Sleep {
        asleep: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    Loading,
    Ready {
        healthy: bool,
    },
    /// Ready, then put to sleep: health is still checked, nothing served.
    Asleep {
        healthy: bool,
    },
    Draining {
        until: Instant,
    },
}

/// The longest the engine may take to offload its weights.
const SLEEP_TIMEOUT: Duration = Duration::from_secs(120);
/// Between the leader asking for sleep and the engine going to sleep:
/// routers learn within a poll or two (1 s each) that the replica is
/// wanted asleep and stop sending it requests; those in flight finish.
const SLEEP_GRACE: Duration = Duration::from_secs(3);
/// Requests still in flight this long after sleep was asked for: the
/// engine is busy after all, and stays awake.
const SLEEP_GIVE_UP: Duration = Duration::from_secs(60);

/// Consecutive failed health checks before a ready shard is reported unhealthy.
const UNHEALTHY_AFTER: u32 = 3;
/// The longest a group may take to vanish after SIGKILL (an engine's exit
/// frees GPU memory, which takes a moment).
const KILL_GRACE: Duration = Duration::from_secs(10);
/// Group membership is polled this often while stopping.
const STOP_POLL: Duration = Duration::from_millis(100);
/// Processes that outlived SIGKILL are looked for this often.
const SURVIVOR_POLL: Duration = Duration::from_secs(1);

/// A process of the plan and the file its output goes to.
#[derive(Debug, Clone)]
pub struct Launch {
    pub spec: ProcessSpec,
    pub log: PathBuf,
}

/// Processes started only once `gate` (a Ray head's GCS) accepts
/// connections.
pub struct Deferred {
    pub gate: String,
    pub launches: Vec<Launch>,
    pub exits: mpsc::UnboundedSender<ExitNotice>,
}

/// What a draining engine's metrics say about the requests it serves.
enum InFlight {
    Count(f64),
    /// No metrics endpoint, or no request series on it: nothing to wait for.
    NotReported,
    /// The metrics could not be read this time.
    Unreadable(String),
}

pub struct ShardTask {
    pub settings: Arc<SupervisorConfig>,
    /// What the state file says; its processes are the shard's processes.
    pub record: ShardRecord,
    pub deferred: Option<Deferred>,
    /// Shared with the supervisor, which lists them.
    pub pids: Arc<Mutex<Vec<i32>>>,
    pub exits: mpsc::UnboundedReceiver<ExitNotice>,
    pub control: mpsc::UnboundedReceiver<Control>,
    pub reporter: Reporter,
    /// Adopted shards begin by finding out where their engine is.
    pub adopted: bool,
    /// For an engine launched in sleep mode: whether the leader wants it
    /// asleep once it is ready; none (adopted) until the leader says.
    pub asleep: Option<bool>,
    /// Set when processes of the shard outlived SIGKILL: the shard has
    /// ended, but its GPUs and ports stay taken while they run. Shared
    /// with the supervisor, which refuses new shards on them.
    pub lingering: Arc<AtomicBool>,
}

struct Run {
    task: ShardTask,
    /// When sleep was asked for, while the engine finishes its requests.
    sleep_asked: Option<Instant>,
    exited: Vec<Option<ExitInfo>>,
    phase: Phase,
    since: Instant,
    failed_checks: u32,
    last_wait: String,
    /// Processes (pid, state) still there after SIGKILL.
    survivors: Vec<(i32, char)>,
}

/// Drives a shard to its end.
pub async fn run(task: ShardTask) {
    let n = task.record.processes.len();
    let mut run = Run {
        task,
        sleep_asked: None,
        exited: vec![None; n],
        phase: Phase::Starting,
        since: Instant::now(),
        failed_checks: 0,
        last_wait: String::new(),
        survivors: Vec::new(),
    };
    run.drive().await;
}

impl Run {
    fn work_dir(&self) -> PathBuf {
        self.task.settings.work_dir.clone()
    }

    async fn drive(&mut self) {
        if !self.task.adopted {
            self.task.reporter.send(
                ShardState::Starting,
                format!("started {} process(es)", self.task.record.processes.len()),
            );
        }
        if let Some(why) = self.task.record.stopping.clone() {
            self.stop(format!("{why} (finished by the restarted agent)"))
                .await;
            return;
        }
        if let Some(deferred) = self.task.deferred.take()
            && !self.launch_deferred(deferred).await
        {
            return;
        }
        let mut tick = tokio::time::interval(self.task.settings.health_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                Some((index, info)) = self.task.exits.recv() => {
                    self.exited[index] = Some(info);
                    self.fail_on_exit(index).await;
                    return;
                }
                command = self.task.control.recv() => match command {
                    Some(Control::Stop { reason }) => {
                        self.stop(format!("stopped: {reason}")).await;
                        return;
                    }
                    Some(Control::Drain { deadline, reason }) => self.begin_drain(deadline, &reason),
                    Some(Control::Sleep { asleep }) => {
                        self.task.asleep = Some(asleep);
                        self.follow_sleep_wish().await;
                    }
                    // The supervisor is gone (the agent is exiting): engines
                    // keep serving and the next agent adopts them.
                    None => return,
                },
                _ = tick.tick() => {
                    if self.on_tick().await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits for the gate, then starts the deferred processes; false when
    /// the shard ended meanwhile.
    async fn launch_deferred(&mut self, deferred: Deferred) -> bool {
        let timeout = self.task.settings.startup_timeout;
        loop {
            if tokio::net::TcpStream::connect(&deferred.gate).await.is_ok() {
                break;
            }
            if self.since.elapsed() >= timeout {
                self.terminate().await;
                let msg = format!(
                    "{} never accepted connections within startup_timeout {timeout:?}; stopped it",
                    deferred.gate
                );
                self.finish(ShardState::Failed, msg, true);
                return false;
            }
            tokio::select! {
                Some((index, info)) = self.task.exits.recv() => {
                    self.exited[index] = Some(info);
                    self.fail_on_exit(index).await;
                    return false;
                }
                command = self.task.control.recv() => match command {
                    Some(Control::Stop { reason }) | Some(Control::Drain { reason, .. }) => {
                        self.stop(format!("stopped before it was ready: {reason}")).await;
                        return false;
                    }
                    // Followed once it is ready.
                    Some(Control::Sleep { asleep }) => self.task.asleep = Some(asleep),
                    None => return false,
                },
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        for launch in deferred.launches {
            let index = self.task.record.processes.len();
            match crate::process::spawn(
                &statefile::path_for(&self.work_dir(), &self.task.record.shard_id),
                &launch.spec,
                &launch.log,
                index,
                deferred.exits.clone(),
            ) {
                Ok(record) => {
                    self.task
                        .pids
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(record.pid);
                    self.task.reporter.set_pid(record.pid as u32);
                    self.task.record.processes.push(record);
                    self.exited.push(None);
                }
                Err(e) => {
                    self.terminate().await;
                    let msg = format!("could not start {}: {e}", launch.spec.program.display());
                    self.finish(ShardState::Failed, msg, false);
                    return false;
                }
            }
        }
        if let Err(e) = self.write_record().await {
            tracing::error!(shard = %self.task.reporter.shard_id, "could not write the state file: {e}");
        }
        true
    }

    /// Writes the shard's state file on a blocking thread: a durable write
    /// ends with two fsyncs, which a busy disk can stretch to seconds, and
    /// the runtime's threads carry every other shard's checks meanwhile.
    async fn write_record(&self) -> std::io::Result<()> {
        let (work_dir, record) = (self.work_dir(), self.task.record.clone());
        tokio::task::spawn_blocking(move || statefile::write(&work_dir, &record))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }

    fn begin_drain(&mut self, deadline: Duration, reason: &str) {
        if matches!(self.phase, Phase::Draining { .. }) {
            self.task.reporter.resend();
            return;
        }
        self.phase = Phase::Draining {
            until: Instant::now() + deadline,
        };
        self.task.reporter.send(
            ShardState::Draining,
            format!("draining ({reason}); waiting up to {deadline:?} for requests in flight"),
        );
    }

    /// One health interval's work; true when the shard has ended.
    async fn on_tick(&mut self) -> bool {
        for record in &self.task.record.processes {
            if let Err(e) = logfile::cap(&record.log, self.task.settings.log_max_bytes) {
                tracing::warn!(log = %record.log.display(), "could not cap engine log: {e}");
            }
        }
        match self.phase {
            Phase::Starting | Phase::Loading => self.tick_loading().await,
            Phase::Ready { healthy } => {
                self.tick_ready(healthy).await;
                self.sleep_when_quiet().await;
                false
            }
            Phase::Asleep { healthy } => {
                self.tick_asleep(healthy).await;
                false
            }
            Phase::Draining { until } => self.tick_draining(until).await,
        }
    }

    /// Until ready: reports each new reason it is not yet, and stops the
    /// engine once `startup_timeout` passes. True when the shard has ended.
    async fn tick_loading(&mut self) -> bool {
        let why = match self.check_first_ready().await {
            Ok(()) => {
                self.phase = Phase::Ready { healthy: true };
                let how = match &self.task.record.readiness {
                    ReadyRule::ProcessAlive => {
                        "ready (processes alive; this rank has no health endpoint)".to_string()
                    }
                    rule => format!("ready: {} answered 200", rule.health_url().unwrap_or("")),
                };
                let how = if self.task.adopted {
                    format!("adopted, {how}")
                } else {
                    how
                };
                if self.found_asleep().await {
                    self.phase = Phase::Asleep { healthy: true };
                    self.task
                        .reporter
                        .send(ShardState::Sleeping, format!("{how}; the engine is asleep"));
                } else {
                    self.task.reporter.send(ShardState::Ready, how);
                }
                self.follow_sleep_wish().await;
                return false;
            }
            Err(why) => why,
        };
        if self.phase == Phase::Starting || why != self.last_wait {
            self.phase = Phase::Loading;
            let msg = if self.task.adopted {
                format!("adopted, {why}")
            } else {
                why.clone()
            };
            self.task.reporter.send(ShardState::Loading, msg);
            self.last_wait = why.clone();
        }
        let timeout = self.task.settings.startup_timeout;
        if self.since.elapsed() < timeout {
            return false;
        }
        let killed = self.terminate().await;
        let msg = format!(
            "not ready within startup_timeout {timeout:?} (last check: {why}); stopped it{}",
            if killed {
                " with SIGKILL after SIGTERM was ignored"
            } else {
                ""
            }
        );
        self.finish(ShardState::Failed, msg, true);
        true
    }

    /// While ready: health is reported, not acted on; the router ejects
    /// the endpoint and the leader decides what to do.
    async fn tick_ready(&mut self, healthy: bool) {
        match self.check().await {
            Ok(()) => {
                self.failed_checks = 0;
                if !healthy {
                    self.phase = Phase::Ready { healthy: true };
                    self.task.reporter.send(ShardState::Ready, "healthy again");
                }
            }
            Err(why) => {
                self.failed_checks += 1;
                if healthy && self.failed_checks >= UNHEALTHY_AFTER {
                    self.phase = Phase::Ready { healthy: false };
                    self.task.reporter.send(
                        ShardState::Ready,
                        format!("unhealthy: {why} ({} checks in a row)", self.failed_checks),
                    );
                }
            }
        }
    }

    /// While asleep: health is reported as while ready; a wake the leader
    /// asked for and the engine refused is tried again.
    async fn tick_asleep(&mut self, healthy: bool) {
        if self.task.asleep == Some(false) {
            self.wake().await;
            return;
        }
        match self.check().await {
            Ok(()) => {
                self.failed_checks = 0;
                if !healthy {
                    self.phase = Phase::Asleep { healthy: true };
                    self.task
                        .reporter
                        .send(ShardState::Sleeping, "asleep, healthy again");
                }
            }
            Err(why) => {
                self.failed_checks += 1;
                if healthy && self.failed_checks >= UNHEALTHY_AFTER {
                    self.phase = Phase::Asleep { healthy: false };
                    self.task.reporter.send(
                        ShardState::Sleeping,
                        format!(
                            "asleep, unhealthy: {why} ({} checks in a row)",
                            self.failed_checks
                        ),
                    );
                }
            }
        }
    }

    /// Puts the engine to sleep or wakes it, as the leader last asked,
    /// when it is ready or asleep; a loading or draining engine is left
    /// as it is (one still loading is put to sleep once ready).
    async fn follow_sleep_wish(&mut self) {
        match (self.phase, self.task.asleep) {
            (Phase::Ready { .. }, Some(true)) => {
                self.sleep_asked.get_or_insert_with(Instant::now);
            }
            (Phase::Ready { .. }, _) => self.sleep_asked = None,
            (Phase::Asleep { .. }, Some(false)) => self.wake().await,
            _ => {}
        }
    }

    /// Puts the engine to sleep once the grace after the leader asked has
    /// passed and no request is in flight; gives up, awake, if requests
    /// keep coming.
    async fn sleep_when_quiet(&mut self) {
        let Some(asked) = self.sleep_asked else {
            return;
        };
        if asked.elapsed() < SLEEP_GRACE {
            return;
        }
        let quiet = match self.in_flight().await {
            InFlight::Count(n) => n <= 0.0,
            InFlight::NotReported => true,
            InFlight::Unreadable(_) => false,
        };
        if quiet {
            self.sleep_asked = None;
            self.fall_asleep().await;
        } else if asked.elapsed() >= SLEEP_GIVE_UP {
            self.sleep_asked = None;
            self.task.asleep = None;
            self.task.reporter.send(
                ShardState::Ready,
                format!(
                    "asked to sleep, but requests were still in flight {SLEEP_GIVE_UP:?} later; \
                     it stays awake and serving"
                ),
            );
        }
    }

    /// Whether an engine launched in sleep mode says it is asleep (one
    /// adopted from an earlier agent may be).
    async fn found_asleep(&self) -> bool {
        if !self.task.record.spec.sleep_mode {
            return false;
        }
        matches!(self.is_sleeping().await, Ok(true))
    }

    async fn is_sleeping(&self) -> Result<bool, String> {
        let url = self
            .task
            .record
            .readiness
            .is_sleeping_url()
            .ok_or("this engine has no sleep endpoints")?;
        match probe::get(&url, Duration::from_secs(5)).await {
            Probe::Answer { status: 200, body } => probe::is_sleeping(&body),
            Probe::Answer { status, .. } => Err(format!("/is_sleeping answered {status}")),
            Probe::Refused => Err("/is_sleeping: connection refused".into()),
            Probe::Broken(why) => Err(format!("/is_sleeping: {why}")),
        }
    }

    /// POSTs to the engine's sleep or wake endpoint (`url`), then checks
    /// with `/is_sleeping` that it is now `asleep` as asked.
    async fn switch_sleep(
        &self,
        url: Option<String>,
        timeout: Duration,
        asleep: bool,
    ) -> Result<(), String> {
        let url = url.ok_or("this engine has no sleep endpoints")?;
        let path = url.rsplit_once('/').map_or(url.as_str(), |(_, p)| p);
        match probe::post(&url, timeout).await {
            Probe::Answer { status: 200, .. } => match self.is_sleeping().await? {
                now if now == asleep => Ok(()),
                now => Err(format!(
                    "/{path} answered 200, but /is_sleeping says {}",
                    if now { "asleep" } else { "awake" }
                )),
            },
            Probe::Answer { status, body } => Err(format!(
                "/{path} answered {status}: {}",
                body.chars().take(200).collect::<String>()
            )),
            Probe::Refused => Err(format!("/{path}: connection refused")),
            Probe::Broken(why) => Err(format!("/{path}: {why}")),
        }
    }

    /// vLLM sleep mode, level 1. A refusal leaves the engine awake and
    /// serving, and says why; the leader's wish is then forgotten, so the
    /// engine is not asked again until the leader asks again.
    async fn fall_asleep(&mut self) {
        let started = Instant::now();
        let url = self.task.record.readiness.sleep_url();
        let outcome = self.switch_sleep(url, SLEEP_TIMEOUT, true).await;
        match outcome {
            Ok(()) => {
                self.phase = Phase::Asleep { healthy: true };
                self.task.reporter.send(
                    ShardState::Sleeping,
                    format!(
                        "asleep after {} ms (vLLM sleep mode level 1: weights in CPU memory, KV \
                         cache dropped); a request for the model wakes it",
                        started.elapsed().as_millis()
                    ),
                );
            }
            Err(why) => {
                self.task.asleep = None;
                self.task.reporter.send(
                    ShardState::Ready,
                    format!("asked to sleep, but it stays awake and serving: {why}"),
                );
            }
        }
    }

    /// Wakes the engine, reported as loading while it takes its weights
    /// back; ready once `/is_sleeping` says awake.
    async fn wake(&mut self) {
        let started = Instant::now();
        self.task.reporter.send(
            ShardState::Loading,
            "waking from sleep: weights back to the GPUs",
        );
        let timeout = self.task.settings.startup_timeout;
        let url = self.task.record.readiness.wake_url();
        let outcome = self.switch_sleep(url, timeout, false).await;
        match outcome {
            Ok(()) => {
                self.phase = Phase::Ready { healthy: true };
                self.task.reporter.send(
                    ShardState::Ready,
                    format!(
                        "awake: woken from sleep in {} ms",
                        started.elapsed().as_millis()
                    ),
                );
            }
            // Tried again at the next health check.
            Err(why) => self.task.reporter.send(
                ShardState::Sleeping,
                format!("asked to wake, but it is still asleep: {why}"),
            ),
        }
    }

    /// While draining: stops the engine once no request is in flight (or
    /// it reports none) or the deadline passes. True when it has ended.
    async fn tick_draining(&mut self, until: Instant) -> bool {
        let in_flight = self.in_flight().await;
        let done = match &in_flight {
            InFlight::Count(n) => *n <= 0.0,
            InFlight::NotReported => true,
            // A busy engine is exactly the one whose metrics are slow:
            // never take "could not read" for "nothing in flight".
            InFlight::Unreadable(_) => false,
        };
        if !done && Instant::now() < until {
            return false;
        }
        let why = match in_flight {
            InFlight::Count(n) if n > 0.0 => {
                format!("drain deadline passed with {n} request(s) in flight")
            }
            InFlight::Count(_) => "drained: no requests in flight".to_string(),
            InFlight::NotReported => "drained: the engine reports no request metrics".to_string(),
            InFlight::Unreadable(why) => {
                format!("drain deadline passed; the requests in flight could not be read ({why})")
            }
        };
        self.stop(why).await;
        true
    }

    /// The readiness rule, once.
    async fn check(&self) -> Result<(), String> {
        let (url, sglang) = match &self.task.record.readiness {
            ReadyRule::ProcessAlive => return Ok(()),
            ReadyRule::VllmHealth { url } => (url, false),
            ReadyRule::SglangHealth { url } => (url, true),
        };
        let timeout = self
            .task
            .settings
            .health_interval
            .max(Duration::from_secs(2));
        match probe::get(url, timeout).await {
            Probe::Answer { status: 200, .. } => Ok(()),
            Probe::Refused => Err("loading: connection refused".to_string()),
            Probe::Answer { status: 503, .. } if sglang => {
                Err("warming up: /health answers 503".to_string())
            }
            Probe::Answer { status, .. } => Err(format!("/health answered {status}")),
            Probe::Broken(why) => Err(format!("/health: {why}")),
        }
    }

    /// The readiness rule, and that the engine answering is this shard's:
    /// a port still held by another engine (one left from an earlier run,
    /// or another fleet's on a shared host) answers `/health` too, while
    /// this shard's engine has not bound it yet or failed to.
    async fn check_first_ready(&self) -> Result<(), String> {
        self.check().await?;
        let Some(url) = self.task.record.readiness.models_url() else {
            return Ok(());
        };
        let model = &self.task.record.spec.model;
        match probe::get(&url, Duration::from_secs(5)).await {
            Probe::Answer { status: 200, body } => probe::lists_model(&body, model),
            // An engine started with an API key keeps its model list to
            // itself: its answering /health is all there is to go on.
            Probe::Answer {
                status: 401 | 403, ..
            } => Ok(()),
            Probe::Answer { status, .. } => Err(format!(
                "/health answered 200 but /v1/models answered {status}"
            )),
            Probe::Refused => Err("/v1/models: connection refused".to_string()),
            Probe::Broken(why) => Err(format!("/v1/models: {why}")),
        }
    }

    async fn in_flight(&self) -> InFlight {
        let Some(url) = self.task.record.readiness.metrics_url() else {
            return InFlight::NotReported;
        };
        match probe::get(&url, Duration::from_secs(5)).await {
            Probe::Answer { status: 200, body } => {
                probe::requests_in_flight(&body).map_or(InFlight::NotReported, InFlight::Count)
            }
            Probe::Answer { status: 404, .. } => InFlight::NotReported,
            Probe::Answer { status, .. } => {
                InFlight::Unreadable(format!("/metrics answered {status}"))
            }
            Probe::Refused => InFlight::Unreadable("/metrics: connection refused".to_string()),
            Probe::Broken(why) => InFlight::Unreadable(format!("/metrics: {why}")),
        }
    }

    /// A process of the shard ended on its own: the shard has failed. The
    /// rest of its processes are stopped so that its GPUs are free.
    async fn fail_on_exit(&mut self, index: usize) {
        let record = self.task.record.processes[index].clone();
        let info = self.exited[index].unwrap_or_default();
        let when = match self.phase {
            Phase::Starting | Phase::Loading => "while loading",
            Phase::Ready { .. } => "while serving",
            Phase::Asleep { .. } => "while asleep",
            Phase::Draining { .. } => "while draining",
        };
        self.terminate().await;
        let tail = logfile::tail(&record.log, self.task.settings.log_lines);
        self.forget_record();
        self.task.reporter.send_full(
            ShardState::Failed,
            format!(
                "{} (pid {}) {} {when}{}",
                record.role,
                record.pid,
                info.describe(),
                self.survivors_note()
            ),
            tail,
            Some(info),
        );
    }

    /// SIGTERM to every group, SIGKILL after `stop_timeout`, then the final
    /// status.
    async fn stop(&mut self, why: String) {
        // Recorded first, so an agent restarted before the engine is gone
        // finishes this stop rather than adopting the engine as running.
        self.task.record.stopping = Some(why.clone());
        if let Err(e) = self.write_record().await {
            tracing::warn!(shard = %self.task.reporter.shard_id, "could not record the stop in the state file: {e}");
        }
        let killed = self.terminate().await;
        let msg = if killed {
            format!(
                "{why}; still running {:?} after SIGTERM (stop_timeout), killed with SIGKILL",
                self.task.settings.stop_timeout
            )
        } else {
            why
        };
        self.finish(ShardState::Stopped, msg, false);
    }

    /// The final status. A shard whose processes outlived SIGKILL has not
    /// stopped: it ends as failed, saying which processes hold on.
    fn finish(&mut self, state: ShardState, msg: String, with_tail: bool) {
        let (state, msg) = if self.survivors.is_empty() {
            (state, msg)
        } else {
            (
                ShardState::Failed,
                format!("{msg}{}", self.survivors_note()),
            )
        };
        let engine = self.engine_index();
        let tail = match self.task.record.processes.get(engine) {
            Some(record) if with_tail => logfile::tail(&record.log, self.task.settings.log_lines),
            _ => Vec::new(),
        };
        self.forget_record();
        let exit = self.exited.get(engine).copied().flatten();
        self.task.reporter.send_full(state, msg, tail, exit);
    }

    fn engine_index(&self) -> usize {
        self.task
            .record
            .processes
            .iter()
            .rposition(|r| r.role == "engine")
            .unwrap_or(self.task.record.processes.len().saturating_sub(1))
    }

    /// Ends every process group of the shard; true when SIGKILL was needed.
    async fn terminate(&mut self) -> bool {
        for record in self.task.record.processes.iter().rev() {
            llmgw_procfs::signal_group(record.pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + self.task.settings.stop_timeout;
        if self.wait_groups_gone(deadline).await {
            return false;
        }
        for record in &self.task.record.processes {
            let left = llmgw_procfs::group_members(record.pgid);
            if !left.is_empty() {
                tracing::warn!(
                    shard = %self.task.reporter.shard_id,
                    pgid = record.pgid,
                    ?left,
                    "still running after stop_timeout; sending SIGKILL"
                );
                llmgw_procfs::signal_group(record.pgid, libc::SIGKILL);
            }
        }
        // As patient as with SIGTERM, up to KILL_GRACE.
        let grace = self.task.settings.stop_timeout.min(KILL_GRACE);
        if !self.wait_groups_gone(Instant::now() + grace).await {
            self.survivors = self
                .task
                .record
                .processes
                .iter()
                .flat_map(|r| llmgw_procfs::group_members_with_state(r.pgid))
                .collect();
            self.task.lingering.store(true, Ordering::Relaxed);
            tracing::error!(
                shard = %self.task.reporter.shard_id,
                survivors = ?self.survivors,
                "processes survived SIGKILL; their GPUs and ports stay reserved"
            );
            // Kept, so that an agent restarted while they run knows them
            // and finishes the stop itself.
            if self.task.record.stopping.is_none() {
                self.task.record.stopping = Some("ended; its processes survived SIGKILL".into());
            }
            if let Err(e) = self.write_record().await {
                tracing::warn!(shard = %self.task.reporter.shard_id, "could not keep the state file: {e}");
            }
            self.watch_survivors();
        }
        true
    }

    /// The shard is over: its state file goes, unless processes that
    /// outlived SIGKILL still run ([`Run::watch_survivors`] removes it
    /// once they are gone).
    fn forget_record(&self) {
        if self.survivors.is_empty() {
            statefile::remove(&self.work_dir(), &self.task.reporter.shard_id);
        }
    }

    /// Waits for the processes that outlived SIGKILL to be gone, then frees
    /// what they held: the reservation of the shard's GPUs and ports, and
    /// its state file.
    fn watch_survivors(&self) {
        let groups: Vec<i32> = self.task.record.processes.iter().map(|r| r.pgid).collect();
        let work_dir = self.work_dir();
        let shard_id = self.task.reporter.shard_id.clone();
        let lingering = Arc::clone(&self.task.lingering);
        tokio::spawn(async move {
            while groups
                .iter()
                .any(|&pgid| !llmgw_procfs::group_members(pgid).is_empty())
            {
                tokio::time::sleep(SURVIVOR_POLL).await;
            }
            statefile::remove(&work_dir, &shard_id);
            lingering.store(false, Ordering::Relaxed);
            tracing::info!(
                shard = %shard_id,
                "the processes that survived SIGKILL have exited; their GPUs and ports are free"
            );
        });
    }

    /// What the final status says about processes that outlived SIGKILL;
    /// empty when there are none.
    fn survivors_note(&self) -> String {
        if self.survivors.is_empty() {
            return String::new();
        }
        let processes: Vec<String> = self
            .survivors
            .iter()
            .map(|(pid, state)| match llmgw_procfs::state_meaning(*state) {
                "" => format!("pid {pid} (state {state})"),
                meaning => format!("pid {pid} (state {state}, {meaning})"),
            })
            .collect();
        let spec = &self.task.record.spec;
        let gpus: Vec<String> = spec.gpus.iter().map(u32::to_string).collect();
        let ports = match self.task.record.port {
            Some(port) => format!(" and port {port}"),
            None => String::new(),
        };
        format!(
            "; {} survived SIGKILL: GPU(s) {}{ports} stay reserved on this node until they exit",
            processes.join(", "),
            gpus.join(", ")
        )
    }

    /// Waits until no live process is left in any of the shard's groups,
    /// collecting exit statuses of our own children on the way.
    async fn wait_groups_gone(&mut self, deadline: Instant) -> bool {
        loop {
            while let Ok((index, info)) = self.task.exits.try_recv() {
                self.exited[index] = Some(info);
            }
            let gone = self
                .task
                .record
                .processes
                .iter()
                .all(|r| llmgw_procfs::group_members(r.pgid).is_empty());
            if gone {
                // A child's exit status arrives once it is reaped, just after
                // it stopped counting as live.
                let reap_by = Instant::now() + Duration::from_secs(1);
                while self.exited.iter().any(Option::is_none) && Instant::now() < reap_by {
                    match tokio::time::timeout(STOP_POLL, self.task.exits.recv()).await {
                        Ok(Some((index, info))) => self.exited[index] = Some(info),
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(STOP_POLL).await;
        }
    }
}
