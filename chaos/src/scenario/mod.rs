//! The scenario catalogue: every entry names a fault schedule and carries
//! it (a function pointer), so the runner never dispatches on names.
//!
//! The module is split by job:
//!
//! * `mod.rs`: the [`Scenario`] type, the [`CATALOGUE`], [`find`], and the
//!   run's options and report;
//! * `ctx.rs`: [`Ctx`], what a schedule drives (the cluster, the seeded
//!   generator, the fault log, fault windows) and its fault helpers;
//! * `run.rs`: the runner, in named phases (set up, start load, inject,
//!   heal, settle, collect, check, tear down, report);
//! * `setup.rs`: the fleet's setup, convergence, the final reads;
//! * `record.rs`: history files and the test-only forgeries;
//! * `control_plane.rs`: schedules without a fleet;
//! * `fleet_faults.rs`: schedules of agent, drain and engine faults;
//! * `leadership.rs`: who may command the fleet: a deposed leader waking
//!   with orders in flight, a reconnect during a drain, a leader killed
//!   right after a placement;
//! * `silent_peers.rs`: peers that go silent (paused, cut off, partitioned
//!   one way, restarted) under a fleet;
//! * `power_cut.rs`: power cuts of peers on lazy disks;
//! * `disk_full.rs`: data disks filling up under a fleet;
//! * `slow_links.rs`: peers far apart, idle and under load;
//! * `report_burst.rs`: a burst of maximum-size agent registrations;
//! * `restore.rs`: every peer restored from a backup after elections;
//! * `lifecycle.rs`: a model's rolling update, and its autoscaled
//!   scale-up, across a leader failover.
//!
//! Adding a scenario is one entry in [`CATALOGUE`] plus its schedule: an
//! `async fn(&mut Ctx) -> Result<(), ScenarioError>` in the module of its
//! kind, wrapped as `|ctx| Box::pin(the_fn(ctx))`.

mod control_plane;
mod ctx;
mod disk_full;
mod fleet_faults;
mod leadership;
mod lifecycle;
mod power_cut;
mod record;
mod report_burst;
mod restore;
mod run;
mod setup;
mod silent_peers;
mod slow_links;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

pub use ctx::{Ctx, Evidence};
pub use run::run;

use crate::cluster::ClusterError;
use crate::fleet;
use crate::invariants::Checked;
use crate::netns::NetError;

/// What a schedule returns: the fault schedule as one future borrowing the
/// run's [`Ctx`].
pub type ScheduleFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ScenarioError>> + 'a>>;

/// A scenario's fault schedule. Every choice (which follower, how long)
/// comes from `ctx`'s seeded generator; "the leader" is whichever peer
/// leads at that moment.
pub type Schedule = for<'a> fn(&'a mut Ctx) -> ScheduleFuture<'a>;

/// What the peers' data directories sit on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disks {
    /// The run directory's own filesystem.
    Host,
    /// Lazy disks that a power cut rolls back to what was synced
    /// (`crate::powercut`).
    Lazy,
    /// A small tmpfs each, which a schedule can fill (`crate::small_disks`).
    Small,
}

/// How the peers reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Straight across the run's bridge.
    Direct,
    /// Through a delaying proxy in front of every peer
    /// (`crate::slow_links`), with no delay until a schedule sets one.
    Delayed,
}

/// One entry of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// Appended to every peer's server.yaml.
    pub extra_yaml: &'static str,
    /// Whether the run has a fleet: agents, engines, models, routers.
    pub fleet: bool,
    /// What the peers' data directories sit on.
    pub disks: Disks,
    /// How the peers reach each other.
    pub links: Links,
    /// The faults, injected once the load runs; the runner heals whatever
    /// the schedule leaves behind.
    pub schedule: Schedule,
}

const SMALL_SNAPSHOTS: &str = "raft:\n  snapshot_after_logs: 20\n  keep_logs_after_snapshot: 5\n";

pub const CATALOGUE: &[Scenario] = &[
    Scenario {
        name: "leader-sigkill",
        about: "SIGKILL the leader, restart it; twice",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::leader_sigkill(ctx)),
    },
    Scenario {
        name: "follower-kill-restart",
        about: "SIGKILL a follower, restart it; twice",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::follower_kill_restart(ctx)),
    },
    Scenario {
        name: "leader-isolated-minority",
        about: "cut the leader off from both followers (clients still reach it), then heal",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::leader_isolated_minority(ctx)),
    },
    Scenario {
        name: "one-way-partition",
        about: "drop everything the leader sends to the followers, heal; then everything one follower sends",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::one_way_partition(ctx)),
    },
    Scenario {
        name: "lossy-links",
        about: "10-30% packet loss (and delay where the kernel has netem) on every peer",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::lossy_links(ctx)),
    },
    Scenario {
        name: "leader-sigstop",
        about: "SIGSTOP the leader past the election timeout, then SIGCONT",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::leader_sigstop(ctx)),
    },
    Scenario {
        name: "write-burst-crash",
        about: "a burst of concurrent writes, SIGKILL the leader in the middle of it, restart",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::write_burst_crash(ctx)),
    },
    Scenario {
        name: "whole-cluster-restart",
        about: "SIGKILL all three peers, restart them spread out",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::whole_cluster_restart(ctx)),
    },
    Scenario {
        name: "follower-lag-snapshot",
        about: "isolate a follower while writes purge the log (tiny snapshot thresholds), heal: it must catch up by snapshot",
        extra_yaml: SMALL_SNAPSHOTS,
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::follower_lag_snapshot(ctx)),
    },
    Scenario {
        name: "agent-cut-below-ttl",
        about: "cut one agent's control stream for less than node_ttl: the node never goes unreachable, its replicas are untouched",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(fleet_faults::agent_cut_below_ttl(ctx)),
    },
    Scenario {
        name: "agent-cut-past-lost",
        about: "cut one agent's control stream past lost_after, heal: its replicas are re-placed, the returning node stops its old shards",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(fleet_faults::agent_cut_past_lost(ctx)),
    },
    Scenario {
        name: "leader-failover-during-drain",
        about: "drain a node, SIGKILL the leader mid-drain, restart it: the drain completes with exactly one replacement",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(fleet_faults::failover_during_drain(ctx)),
    },
    Scenario {
        name: "engine-crash-loop",
        about: "add a model whose engine crashes while loading: it is retried with backoff while the other models keep serving",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(fleet_faults::engine_crash_loop(ctx)),
    },
    Scenario {
        name: "peer-replacement-with-leader-killed",
        about: "add peer 4 and SIGKILL the leader while the change is in flight, then remove a follower",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(control_plane::peer_replacement(ctx)),
    },
    Scenario {
        name: "leader-sigstop-10s-fleet",
        about: "SIGSTOP the leader for 10 s under a fleet: agents re-home, no node is marked down, no replica moves",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::leader_sigstop_10s(ctx)),
    },
    Scenario {
        name: "leader-sigstop-30s-fleet",
        about: "SIGSTOP the leader for 30 s under a fleet (five times lost_after): agents re-home, no node is marked down",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::leader_sigstop_30s(ctx)),
    },
    Scenario {
        name: "follower-sigstop-10s-fleet",
        about: "SIGSTOP a follower for 10 s under a fleet: no term change, the leader keeps its agent streams",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::follower_sigstop_10s(ctx)),
    },
    Scenario {
        name: "leader-cut-from-peers-fleet",
        about: "cut the leader off from both peers (agents and clients still reach it) for 2 x lost_after",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::leader_cut_from_peers(ctx)),
    },
    Scenario {
        name: "one-way-leader-to-peers-fleet",
        about: "drop everything the leader sends to both peers (agents and clients untouched) for 2 x lost_after",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::one_way_leader_to_peers(ctx)),
    },
    Scenario {
        name: "one-way-peers-to-leader-fleet",
        about: "drop everything both peers send to the leader (agents and clients untouched) for 2 x lost_after",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::one_way_peers_to_leader(ctx)),
    },
    Scenario {
        name: "partition-60s-fleet",
        about: "the leader in a minority of one for 60 s (agents and clients reach every peer), then heal",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::partition_60s(ctx)),
    },
    Scenario {
        name: "leader-disk-full-fleet",
        about: "fill the leader's data disk below raft.min_free_disk_mb for 2 x lost_after under a fleet, then free it: writes refused there, leadership handed over, nothing moves, writes taken again",
        extra_yaml: disk_full::YAML,
        fleet: true,
        disks: Disks::Small,
        links: Links::Direct,
        schedule: |ctx| Box::pin(disk_full::leader_disk_full(ctx)),
    },
    Scenario {
        name: "slow-peer-links-fleet",
        about: "every peer link 60 ms + up to 10 ms each way for a minute under a fleet, idle then under load: one leadership, writes taken",
        extra_yaml: slow_links::YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Delayed,
        schedule: |ctx| Box::pin(slow_links::peers_far_apart(ctx)),
    },
    Scenario {
        name: "every-disk-full-fleet",
        about: "fill every peer's data disk below raft.min_free_disk_mb under a fleet and kill an agent: writes refused, at most one leadership change, the node still goes unreachable then lost",
        extra_yaml: disk_full::YAML,
        fleet: true,
        disks: Disks::Small,
        links: Links::Direct,
        schedule: |ctx| Box::pin(disk_full::every_disk_full(ctx)),
    },
    Scenario {
        name: "max-size-reports-burst-fleet",
        about: "pause a follower; 24 registrations just under the 256 KiB bound and 24 at the 4 MiB message cap at once to the leader under a fleet: each answered by its size, writes keep flowing, the follower catches up",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(report_burst::max_size_reports(ctx)),
    },
    Scenario {
        name: "restore-after-elections-fleet",
        about: "save a backup, elect twice (the agents obey both), stop every peer, restore each from the backup, start them: a later epoch, and the agents obey the restored cluster",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(restore::restore_after_elections(ctx)),
    },
    Scenario {
        name: "rolling-restart-fleet",
        about: "restart all three peers one after another (SIGTERM, start, caught up) under router and admin load",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(silent_peers::rolling_restart(ctx)),
    },
    Scenario {
        name: "deposed-leader-during-drain-fleet",
        about: "drain a node, SIGSTOP the leader with the drain's orders in flight until a follower leads, SIGCONT: no agent executes the deposed leader's commands, the drain completes",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(leadership::deposed_leader_during_drain(ctx)),
    },
    Scenario {
        name: "reconnect-during-drain-fleet",
        about: "drain a node; while a replica drains, cut the node's control stream below node_ttl: the drain keeps running, no request fails",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(leadership::reconnect_during_drain(ctx)),
    },
    Scenario {
        name: "leader-kill-after-placement-fleet",
        about: "scale a model up, SIGKILL the leader the moment the placement is committed: the new leader carries the same replica to ready",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(leadership::leader_kill_after_placement(ctx)),
    },
    Scenario {
        name: "leader-failover-during-rollout-fleet",
        about: "change a model's engine environment, SIGKILL the leader with a replacement in flight, restart it: the rollout completes, one replacement per old replica, never fewer ready than wanted",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(lifecycle::failover_during_rollout(ctx)),
    },
    Scenario {
        name: "leader-failover-during-scale-up-fleet",
        about: "autoscale a model, load it past its target, SIGKILL the leader right after it places the new replica, restart it: that replica becomes ready, no second one is placed, every long chat is answered",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Host,
        links: Links::Direct,
        schedule: |ctx| Box::pin(lifecycle::failover_during_scale_up(ctx)),
    },
    Scenario {
        name: "power-cut-one-peer",
        about: "lazy disks: cut the power of the leader or a follower under load (unsynced writes dropped, sometimes torn), restart; twice",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Lazy,
        links: Links::Direct,
        schedule: |ctx| Box::pin(power_cut::one_peer(ctx)),
    },
    Scenario {
        name: "power-cut-all-peers",
        about: "lazy disks: cut the power of all three peers at once during a write burst, restart them",
        extra_yaml: "",
        fleet: false,
        disks: Disks::Lazy,
        links: Links::Direct,
        schedule: |ctx| Box::pin(power_cut::all_peers(ctx)),
    },
    Scenario {
        name: "power-cut-one-peer-fleet",
        about: "power-cut-one-peer with agents, engines and router traffic attached: the data plane serves through both cuts, agents re-home",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Lazy,
        links: Links::Direct,
        schedule: |ctx| Box::pin(power_cut::one_peer(ctx)),
    },
    Scenario {
        name: "power-cut-all-peers-fleet",
        about: "power-cut-all-peers with agents, engines and router traffic attached: engines serve on, every agent registers again once a majority is back",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
        disks: Disks::Lazy,
        links: Links::Direct,
        schedule: |ctx| Box::pin(power_cut::all_peers(ctx)),
    },
    Scenario {
        name: "power-cut-during-snapshot-install",
        about: "lazy disks, tiny snapshot thresholds: isolate a follower until the log is purged past it, heal, cut its power while the snapshot arrives, restart",
        extra_yaml: SMALL_SNAPSHOTS,
        fleet: false,
        disks: Disks::Lazy,
        links: Links::Direct,
        schedule: |ctx| Box::pin(power_cut::during_snapshot_install(ctx)),
    },
];

pub fn find(name: &str) -> Option<&'static Scenario> {
    CATALOGUE.iter().find(|s| s.name == name)
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("{0}")]
    Setup(String),
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The `llmgw` binary the peers run.
    pub bin: PathBuf,
    /// Runs' logs and data go under here; a run without violations is
    /// removed, a failed one kept.
    pub work_dir: PathBuf,
    pub keep: bool,
    /// Load workers.
    pub workers: usize,
    /// Prints faults as they happen.
    pub verbose: bool,
    /// Test-only: adds one fabricated leader sample (a peer naming the
    /// term before the newest leadership), to show the checks can fail.
    pub forge_leader_sample: bool,
    /// Test-only: adds one fabricated replica sample in which a second
    /// replica holds a GPU a live shard holds, to show the GPU check fails.
    pub forge_gpu_double: bool,
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub scenario: &'static str,
    pub seed: u64,
    pub run_id: String,
    pub faults: Vec<String>,
    pub ops: usize,
    pub ops_ok: usize,
    pub ops_failed: usize,
    pub ops_unknown: usize,
    /// Chat completions through the routers, and how many succeeded.
    pub router_ops: usize,
    pub router_ok: usize,
    pub checked: Vec<Checked>,
    pub seconds: f64,
    /// Where logs were kept, if they were.
    pub kept: Option<PathBuf>,
}

impl RunReport {
    pub fn violations(&self) -> usize {
        self.checked.iter().map(|c| c.violations.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_fleet_scenarios_have_short_liveness() {
        let mut names: Vec<&str> = CATALOGUE.iter().map(|s| s.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a scenario name appears twice");
        for s in CATALOGUE.iter().filter(|s| s.fleet) {
            assert!(
                s.extra_yaml.contains("lost_after"),
                "{} runs a fleet without the short liveness settings",
                s.name
            );
        }
    }
}
