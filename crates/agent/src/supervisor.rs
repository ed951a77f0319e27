//! The supervisor: which shards run on this node, and the start, stop and
//! drain commands on them. Commands are idempotent: starting a shard that
//! already runs with the same spec, or stopping one that is not running,
//! succeeds and repeats the current status.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_config::SupervisorConfig;
use llmgw_engines::{LaunchPlan, ProcessRole};
use llmgw_proto::agent::{RunningShard, ShardState, ShardStatus};
use tokio::sync::mpsc;

use crate::logfile;
use crate::process::{self, ExitNotice};
use crate::report::{Reporter, is_terminal, unix_ms};
use crate::shard::{self, Control, Deferred, Launch, ShardTask};
use crate::spec::LaunchSpec;
use crate::statefile::{self, ProcessRecord, ReadyRule, ShardRecord};
use crate::validate::{self, Held, NodeFacts};

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot create work_dir {path}: {source}")]
    WorkDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The answer to a command, sent up as a `CommandAck`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub accepted: bool,
    pub message: String,
}

impl Outcome {
    fn accepted(message: impl Into<String>) -> Self {
        Outcome {
            accepted: true,
            message: message.into(),
        }
    }

    fn refused(message: impl Into<String>) -> Self {
        Outcome {
            accepted: false,
            message: message.into(),
        }
    }
}

/// What happened to each state file found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    Adopted { shard_id: String, pids: Vec<i32> },
    Stale { file: String, why: String },
}

struct Entry {
    spec: LaunchSpec,
    spec_hash: String,
    ports: Vec<u16>,
    pids: Arc<Mutex<Vec<i32>>>,
    reporter: Reporter,
    control: mpsc::UnboundedSender<Control>,
    /// The shard ended, but processes of it outlived SIGKILL.
    lingering: Arc<AtomicBool>,
}

impl Entry {
    fn live(&self) -> bool {
        !is_terminal(self.reporter.state()) && !self.control.is_closed()
    }

    /// Processes of this ended shard that outlived SIGKILL and still run:
    /// they hold its GPUs and ports as long as they do.
    fn survivors(&self) -> Vec<i32> {
        if !self.lingering.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let pids = self.pids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        pids.iter()
            .flat_map(|&pgid| llmgw_procfs::group_members(pgid))
            .collect()
    }
}

struct Inner {
    settings: Arc<SupervisorConfig>,
    node: NodeFacts,
    events: mpsc::UnboundedSender<ShardStatus>,
    shards: Mutex<BTreeMap<String, Entry>>,
}

/// Cheap to clone; every clone drives the same shards.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

/// The answer to a start for a shard that already runs: accepted (its
/// status sent again, and the engine put to sleep or woken as the leader
/// wants) when the spec is the same, refused when it differs.
fn already_running(entry: &Entry, shard_id: &str, hash: &str, asleep: bool) -> Outcome {
    if entry.spec_hash == hash {
        if entry.spec.sleep_mode {
            let _ = entry.control.send(Control::Sleep { asleep });
        }
        entry.reporter.resend();
        return Outcome::accepted(format!(
            "shard {shard_id} already runs with this spec ({}){}",
            entry.reporter.state().as_str_name(),
            match (entry.spec.sleep_mode, asleep) {
                (true, true) => "; wanted asleep",
                (true, false) => "; wanted awake",
                (false, _) => "",
            }
        ));
    }
    Outcome::refused(format!(
        "shard {shard_id} already runs with a different spec (hash {} here, {hash} asked); stop it first",
        entry.spec_hash
    ))
}

/// The answer to a start for a shard that already ended here: a shard id
/// runs once (the leader replaces a failed or stopped replica as a whole,
/// under new ids), so a leader asking again never heard how it ended. It
/// hears now: the last status goes again, output tail and all.
fn already_ended(entry: &Entry, shard_id: &str) -> Outcome {
    entry.reporter.resend();
    Outcome::refused(format!(
        "shard {shard_id} already ended on this node ({}: {}); a shard runs once, and its \
         last status was sent again",
        entry.reporter.state().as_str_name(),
        entry.reporter.last().message
    ))
}

/// Ended shards kept so that a start naming one is answered with how it
/// ended; past this many the oldest are forgotten, so a node that has run
/// shards for months does not keep them all.
const KEEP_ENDED: usize = 256;

fn forget_oldest_ended(shards: &mut BTreeMap<String, Entry>) {
    let mut ended: Vec<(u64, String)> = shards
        .iter()
        // One whose processes outlived SIGKILL is kept: it holds GPUs.
        .filter(|(_, e)| !e.live() && !e.lingering.load(Ordering::Relaxed))
        .map(|(id, e)| (e.reporter.last().at_unix_ms, id.clone()))
        .collect();
    if ended.len() < KEEP_ENDED {
        return;
    }
    ended.sort_unstable();
    for (_, id) in &ended[..=ended.len() - KEEP_ENDED] {
        shards.remove(id);
    }
}

/// What the other live shards hold, and ended ones whose processes
/// outlived SIGKILL: GPUs and ports a new one must not take.
fn held_by_others(shards: &BTreeMap<String, Entry>, shard_id: &str) -> Vec<Held> {
    shards
        .values()
        .filter(|e| e.spec.shard_id != shard_id)
        .filter_map(|e| {
            let holder = if e.live() {
                e.spec.shard_id.clone()
            } else {
                let survivors = e.survivors();
                if survivors.is_empty() {
                    return None;
                }
                format!(
                    "{}, which ended but whose processes {survivors:?} survived SIGKILL",
                    e.spec.shard_id
                )
            };
            Some(Held {
                shard_id: holder,
                gpus: e.spec.gpus.clone(),
                ports: e.ports.clone(),
            })
        })
        .collect()
}

impl Supervisor {
    /// Creates the supervisor and adopts the engines an earlier agent left
    /// running (state files whose processes are alive with the recorded
    /// start time); stale state files are removed. Must run inside a tokio
    /// runtime.
    pub fn new(
        settings: SupervisorConfig,
        node: NodeFacts,
        events: mpsc::UnboundedSender<ShardStatus>,
    ) -> Result<(Self, Vec<Adoption>), SupervisorError> {
        for dir in [
            settings.work_dir.clone(),
            statefile::shards_dir(&settings.work_dir),
            logs_dir(&settings.work_dir),
        ] {
            std::fs::create_dir_all(&dir).map_err(|source| SupervisorError::WorkDir {
                path: dir.clone(),
                source,
            })?;
        }
        let supervisor = Supervisor {
            inner: Arc::new(Inner {
                settings: Arc::new(settings),
                node,
                events,
                shards: Mutex::new(BTreeMap::new()),
            }),
        };
        let adoptions = supervisor.adopt_all();
        Ok((supervisor, adoptions))
    }

    pub fn node(&self) -> &NodeFacts {
        &self.inner.node
    }

    fn shards(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.inner.shards.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Validates and launches a shard. A refusal starts nothing and is also
    /// reported as a `Failed` status carrying the reason.
    /// Starts a shard, or for one that runs with the same spec, puts it to
    /// sleep or wakes it (`asleep`, for a spec in sleep mode).
    pub fn start(&self, spec: LaunchSpec, asleep: bool, term: u64) -> Outcome {
        let hash = spec.hash();
        let mut shards = self.shards();
        match shards.get(&spec.shard_id) {
            Some(entry) if entry.live() => {
                return already_running(entry, &spec.shard_id, &hash, asleep);
            }
            Some(entry) => return already_ended(entry, &spec.shard_id),
            None => {}
        }
        forget_oldest_ended(&mut shards);
        let held = held_by_others(&shards, &spec.shard_id);
        let reporter = Reporter::new(
            &spec.shard_id,
            &spec.replica_id,
            u32::from(spec.port),
            self.inner.events.clone(),
        );
        let plan = match validate::validate(&spec, &self.inner.node, &held) {
            Ok(plan) => plan,
            Err(refusal) => {
                let msg = format!("refused before launch: {refusal}");
                reporter.send(ShardState::Failed, msg.clone());
                return Outcome::refused(msg);
            }
        };
        let ports = validate::ports_of(&spec, &plan);
        let (exit_tx, exit_rx) = mpsc::unbounded_channel::<ExitNotice>();
        let launches = self.launches(&spec, &plan);
        let (split, gate) = self.deferral(&spec, &plan);
        let (now, deferred) = launches.split_at(split);
        let records = match self.spawn_all(&spec.shard_id, now, &exit_tx) {
            Ok(records) => records,
            Err(msg) => {
                reporter.send(ShardState::Failed, msg.clone());
                return Outcome::refused(msg);
            }
        };
        let gate = (!deferred.is_empty()).then_some(gate);
        let readiness = ReadyRule::from(&plan.readiness);
        let record = ShardRecord {
            format: statefile::FORMAT_VERSION,
            shard_id: spec.shard_id.clone(),
            spec_hash: hash.clone(),
            port: plan.port,
            term,
            started_unix_ms: unix_ms(),
            processes: records.clone(),
            readiness,
            spec: spec.clone(),
            stopping: None,
        };
        reporter.set_pid(records.last().map_or(0, |r| r.pid as u32));
        if let Err(e) = statefile::write(&self.inner.settings.work_dir, &record) {
            // Without its record a restarted agent would neither adopt nor
            // stop this engine, and would start it a second time on the
            // same GPUs: it does not run at all.
            for process in &records {
                llmgw_procfs::signal_group(process.pgid, libc::SIGKILL);
            }
            let msg = format!(
                "refused: the state file could not be written ({e}); an engine a restarted \
                 agent could not find is not started"
            );
            reporter.send(ShardState::Failed, msg.clone());
            return Outcome::refused(msg);
        }
        let pids = Arc::new(Mutex::new(records.iter().map(|r| r.pid).collect()));
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let lingering = Arc::new(AtomicBool::new(false));
        tokio::spawn(shard::run(ShardTask {
            settings: self.inner.settings.clone(),
            record,
            deferred: gate.map(|gate| Deferred {
                gate,
                launches: deferred.to_vec(),
                exits: exit_tx,
            }),
            pids: pids.clone(),
            exits: exit_rx,
            control: control_rx,
            reporter: reporter.clone(),
            adopted: false,
            asleep: spec.sleep_mode.then_some(asleep),
            lingering: lingering.clone(),
        }));
        let shard_id = spec.shard_id.clone();
        shards.insert(
            shard_id.clone(),
            Entry {
                spec,
                spec_hash: hash,
                ports,
                pids,
                reporter,
                control: control_tx,
                lingering,
            },
        );
        Outcome::accepted(format!("shard {shard_id} launched"))
    }

    /// Each process of the plan with the log file it writes to.
    fn launches(&self, spec: &LaunchSpec, plan: &LaunchPlan) -> Vec<Launch> {
        let logs = logs_dir(&self.inner.settings.work_dir);
        plan.processes
            .iter()
            .map(|process| Launch {
                log: logs.join(format!(
                    "{}.{}.log",
                    spec.shard_id,
                    process::role_name(process.role)
                )),
                spec: process.clone(),
            })
            .collect()
    }

    /// How many processes start at once, and the address the rest wait
    /// for. Processes after a Ray head start once the head listens (a vLLM
    /// that finds no cluster starts a local one of its own), and a Ray
    /// worker once the head it joins listens (it gives up at once).
    fn deferral(&self, spec: &LaunchSpec, plan: &LaunchPlan) -> (usize, String) {
        let roles: Vec<ProcessRole> = plan.processes.iter().map(|p| p.role).collect();
        if roles.first() == Some(&ProcessRole::RayWorker) {
            return (0, format!("{}:{}", spec.master_addr, spec.master_port));
        }
        match roles.iter().position(|role| *role == ProcessRole::RayHead) {
            Some(i) => (
                i + 1,
                format!("{}:{}", self.inner.node.context.mgmt_addr, spec.master_port),
            ),
            None => (roles.len(), String::new()),
        }
    }

    /// Starts `launches` in order; when one cannot start, kills those that
    /// did and says why.
    fn spawn_all(
        &self,
        shard_id: &str,
        launches: &[Launch],
        exits: &mpsc::UnboundedSender<ExitNotice>,
    ) -> Result<Vec<ProcessRecord>, String> {
        let state_file = statefile::path_for(&self.inner.settings.work_dir, shard_id);
        let mut records = Vec::new();
        for (index, launch) in launches.iter().enumerate() {
            match process::spawn(&state_file, &launch.spec, &launch.log, index, exits.clone()) {
                Ok(record) => records.push(record),
                Err(e) => {
                    for r in &records {
                        llmgw_procfs::signal_group(r.pgid, libc::SIGKILL);
                    }
                    return Err(format!(
                        "could not start {}: {e}",
                        launch.spec.program.display()
                    ));
                }
            }
        }
        Ok(records)
    }

    /// SIGTERM, then SIGKILL after `stop_timeout`; `Stopped` follows.
    pub fn stop(&self, shard_id: &str, reason: &str) -> Outcome {
        self.command(
            shard_id,
            Control::Stop {
                reason: if reason.is_empty() {
                    "asked by the control plane".into()
                } else {
                    reason.into()
                },
            },
        )
    }

    /// `Draining`, then stop once nothing is in flight or at the deadline.
    pub fn drain(&self, shard_id: &str, deadline: Duration, reason: &str) -> Outcome {
        self.command(
            shard_id,
            Control::Drain {
                deadline,
                reason: if reason.is_empty() {
                    "asked by the control plane".into()
                } else {
                    reason.into()
                },
            },
        )
    }

    fn command(&self, shard_id: &str, control: Control) -> Outcome {
        let shards = self.shards();
        match shards.get(shard_id) {
            Some(entry) if entry.live() => {
                let what = match &control {
                    Control::Stop { .. } => "stopping",
                    Control::Drain { .. } => "draining",
                    Control::Sleep { asleep: true } => "going to sleep",
                    Control::Sleep { asleep: false } => "waking",
                };
                if entry.control.send(control).is_ok() {
                    return Outcome::accepted(format!("shard {shard_id} {what}"));
                }
                entry.reporter.resend();
                Outcome::accepted(format!("shard {shard_id} is not running"))
            }
            Some(entry) => {
                entry.reporter.resend();
                Outcome::accepted(format!(
                    "shard {shard_id} is not running ({})",
                    entry.reporter.state().as_str_name()
                ))
            }
            None => {
                // Unknown here: tell the leader it is stopped, so that its
                // view converges whatever it believed.
                let _ = self.inner.events.send(ShardStatus {
                    shard_id: shard_id.to_string(),
                    state: ShardState::Stopped as i32,
                    message: "not running on this node".into(),
                    at_unix_ms: unix_ms(),
                    seq: crate::report::next_seq(0),
                    ..Default::default()
                });
                Outcome::accepted(format!("shard {shard_id} is not running on this node"))
            }
        }
    }

    /// Tells a shard's reporter the number of the last report the control
    /// plane applied for it (see [`Reporter::raise_floor`]).
    pub fn raise_report_floor(&self, shard_id: &str, applied: u64) {
        if let Some(entry) = self.shards().get(shard_id) {
            entry.reporter.raise_floor(applied);
        }
    }

    /// The latest status of every shard the supervisor knows.
    pub fn statuses(&self) -> Vec<ShardStatus> {
        self.shards().values().map(|e| e.reporter.last()).collect()
    }

    pub fn status(&self, shard_id: &str) -> Option<ShardStatus> {
        self.shards().get(shard_id).map(|e| e.reporter.last())
    }

    /// Shards whose processes run now, for `Register.running`.
    pub fn running(&self) -> Vec<RunningShard> {
        self.shards()
            .values()
            .filter(|e| e.live())
            .map(|e| {
                let last = e.reporter.last();
                RunningShard {
                    shard_id: e.spec.shard_id.clone(),
                    replica_id: e.spec.replica_id.clone(),
                    pid: last.pid,
                    port: u32::from(e.spec.port),
                    spec_hash: e.spec_hash.clone(),
                    state: last.state,
                }
            })
            .collect()
    }

    /// GPUs held by processes of ended shards that outlived SIGKILL, for
    /// the heartbeat: the leader must not place on them while they run.
    pub fn survivor_gpus(&self) -> Vec<u32> {
        let mut gpus: Vec<u32> = self
            .shards()
            .values()
            .filter(|e| !e.live() && !e.survivors().is_empty())
            .flat_map(|e| e.spec.gpus.iter().copied())
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// Every pid of every live shard (tests and diagnostics).
    pub fn pids(&self, shard_id: &str) -> Vec<i32> {
        self.shards()
            .get(shard_id)
            .map(|e| e.pids.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }

    fn adopt_all(&self) -> Vec<Adoption> {
        let work_dir = self.inner.settings.work_dir.clone();
        let mut out = Vec::new();
        for (path, read) in statefile::read_all(&work_dir) {
            let file = path.display().to_string();
            let record = match read {
                Ok(r) => r,
                Err(why) => {
                    let why = self.stop_untracked(&path, &why);
                    tracing::warn!(%file, "removing unreadable state file: {why}");
                    statefile::remove_path(&path);
                    out.push(Adoption::Stale { file, why });
                    continue;
                }
            };
            let alive = record
                .processes
                .iter()
                .any(|p| llmgw_procfs::is_same_process(p.pid, p.start_time));
            if !alive {
                // The recorded processes are gone, but workers they started
                // (same environment) may still hold GPUs and ports.
                let leftovers = self.stop_tagged(&path);
                let why = match leftovers.as_slice() {
                    [] => "no process of the shard is alive".to_string(),
                    groups => format!(
                        "no recorded process of the shard is alive; processes it left \
                         (process groups {groups:?}) were stopped"
                    ),
                };
                tracing::info!(%file, shard = %record.shard_id, "removing stale state file: {why}");
                let _ = std::fs::remove_file(&path);
                self.ended_while_away(record);
                out.push(Adoption::Stale { file, why });
                continue;
            }
            let pids: Vec<i32> = record.processes.iter().map(|p| p.pid).collect();
            self.adopt(record);
            tracing::info!(%file, ?pids, "adopted running shard");
            out.push(Adoption::Adopted {
                shard_id: path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                pids,
            });
        }
        out
    }

    /// A state file that cannot be read, and has no good copy, may belong
    /// to an engine that still runs: find its processes by the shard id in
    /// their environment and stop their groups, so no engine holds GPUs and
    /// a port that the agent does not know about. The leader then sees the
    /// shard is not running and starts it again.
    fn stop_untracked(&self, path: &std::path::Path, why: &str) -> String {
        let groups = self.stop_tagged(path);
        if groups.is_empty() {
            return format!("{why}; no process of this shard runs");
        }
        format!(
            "{why}; its engine (process groups {groups:?}, found by {} in their \
             environment) cannot be adopted without its record and was stopped",
            process::SHARD_ENV
        )
    }

    /// Stops the process groups of every process that carries `path` as
    /// its state file (SIGTERM, then SIGKILL after `stop_timeout`); the
    /// groups it found.
    fn stop_tagged(&self, path: &std::path::Path) -> Vec<i32> {
        let groups = llmgw_procfs::groups_tagged(process::SHARD_ENV, &path.to_string_lossy());
        if groups.is_empty() {
            return groups;
        }
        for &pgid in &groups {
            llmgw_procfs::signal_group(pgid, libc::SIGTERM);
        }
        let stop_timeout = self.inner.settings.stop_timeout;
        let kill = groups.clone();
        tokio::spawn(async move {
            tokio::time::sleep(stop_timeout).await;
            for pgid in kill {
                llmgw_procfs::signal_group(pgid, libc::SIGKILL);
            }
        });
        groups
    }

    /// The reporter of a shard known from its state file, with its engine's
    /// pid.
    fn recorded_reporter(&self, record: &ShardRecord) -> Reporter {
        let reporter = Reporter::new(
            &record.shard_id,
            &record.spec.replica_id,
            u32::from(record.spec.port),
            self.inner.events.clone(),
        );
        reporter.set_pid(engine_of(record).map_or(0, |p| p.pid as u32));
        reporter
    }

    /// A shard whose engine exited while no agent watched it: the leader
    /// still counts it as running, so it is reported failed, with what the
    /// engine last wrote, and kept as ended. One whose stop had begun
    /// ended as asked: it is reported stopped.
    fn ended_while_away(&self, record: ShardRecord) {
        let reporter = self.recorded_reporter(&record);
        match &record.stopping {
            Some(why) => reporter.send(
                ShardState::Stopped,
                format!("{why}; the engine ended while the agent was restarting"),
            ),
            None => {
                let tail = engine_of(&record).map_or_else(Vec::new, |p| {
                    logfile::tail(&p.log, self.inner.settings.log_lines)
                });
                reporter.send_full(
                    ShardState::Failed,
                    "the engine exited while the agent was not running; its exit status is unknown",
                    tail,
                    None,
                );
            }
        }
        let (closed, _) = mpsc::unbounded_channel();
        // This build's hash of the spec as recorded: the record's own may
        // be an older agent's.
        let spec_hash = record.spec.hash();
        self.shards().insert(
            record.shard_id.clone(),
            Entry {
                spec: record.spec,
                spec_hash,
                ports: Vec::new(),
                pids: Arc::new(Mutex::new(Vec::new())),
                reporter,
                control: closed,
                lingering: Arc::default(),
            },
        );
    }

    fn adopt(&self, record: ShardRecord) {
        let (exit_tx, exit_rx) = mpsc::unbounded_channel();
        for (index, process) in record.processes.iter().enumerate() {
            process::watch_adopted(process, index, exit_tx.clone());
        }
        let reporter = self.recorded_reporter(&record);
        if record.stopping.is_none() {
            // Until the first check says otherwise.
            reporter.send(
                ShardState::Loading,
                "adopted from an earlier agent; checking health",
            );
        }
        let ports = record
            .port
            .into_iter()
            .chain(
                (record.spec.nodes > 1 && record.spec.rank == 0).then_some(record.spec.master_port),
            )
            .collect();
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let pids = Arc::new(Mutex::new(record.processes.iter().map(|p| p.pid).collect()));
        let lingering = Arc::new(AtomicBool::new(false));
        tokio::spawn(shard::run(ShardTask {
            settings: self.inner.settings.clone(),
            record: record.clone(),
            deferred: None,
            pids: pids.clone(),
            exits: exit_rx,
            control: control_rx,
            reporter: reporter.clone(),
            adopted: true,
            // As found, until the leader says.
            asleep: None,
            lingering: lingering.clone(),
        }));
        let spec_hash = record.spec.hash();
        self.shards().insert(
            record.shard_id.clone(),
            Entry {
                spec: record.spec,
                spec_hash,
                ports,
                pids,
                reporter,
                control: control_tx,
                lingering,
            },
        );
    }
}

/// A record's engine process (the last one when none is named so).
fn engine_of(record: &ShardRecord) -> Option<&ProcessRecord> {
    record
        .processes
        .iter()
        .rev()
        .find(|p| p.role == "engine")
        .or(record.processes.last())
}

pub fn logs_dir(work_dir: &std::path::Path) -> std::path::PathBuf {
    work_dir.join("logs")
}
