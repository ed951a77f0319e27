//! One reconciliation round as a pure function: the replicated state and
//! the leader's short memory in, the commands to propose out. The leader
//! proposes them in order; the next round sees their effect.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::RangeInclusive;

use llmgw_catalog::Model;
use llmgw_scheduler::{NodeHealth, Placement, Placer, Request, Siblings, Strategy};
use llmgw_state::{
    Command, FleetState, KvEventPorts, NodeStatus, Replica, ReplicaFailure, ReplicaState, Shard,
    ShardFailure, ShardState,
};

use crate::fleet_view::{node_views, take_survivor_gpus};
use crate::specs::managed_models;

mod preempt;
mod rollout;

/// How the leader places and retries.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub strategy: Strategy,
    /// Engine HTTP and rendezvous ports are taken from this range, unique
    /// per host.
    pub ports: RangeInclusive<u16>,
    /// Failures of one model on one node before placement avoids the node.
    pub avoid_after_failures: u32,
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// How long a scaled-down replica finishes in-flight requests.
    pub scale_down_drain_ms: u64,
    /// Replicas of one model replaced at a time during drains.
    pub moves_per_model: usize,
}

impl Default for PlanSettings {
    fn default() -> Self {
        PlanSettings {
            strategy: Strategy::Spread,
            ports: 20000..=29999,
            avoid_after_failures: 2,
            retry_base_ms: 1_000,
            retry_max_ms: 60_000,
            scale_down_drain_ms: 30_000,
            moves_per_model: 1,
        }
    }
}

/// What the leader remembers between rounds and forgets on failover: it
/// only shapes retries, never correctness.
#[derive(Debug, Default)]
pub struct Memory {
    /// Consecutive failures per (model, node).
    pub failures: HashMap<(String, String), u32>,
    /// Per model: no new placement before this time (unix ms).
    pub retry_at: HashMap<String, u64>,
    /// Consecutive failed rounds per model, for the backoff.
    pub retries: HashMap<String, u32>,
    /// Per model whose backoff began because nothing fit: the free GPUs the
    /// fleet had then. Once more are free (a replica stopped, a node
    /// joined), it tries again at once instead of waiting out the backoff.
    /// A backoff after a failure is not cut short: a crashing engine frees
    /// its own GPUs.
    pub free_gpus_when_unplaced: HashMap<String, usize>,
    /// (host, port) pairs an engine failed on; not reused for a while.
    pub bad_ports: HashSet<(String, u16)>,
    /// Per model: why the last placement attempt found no fit.
    pub unplaced: BTreeMap<String, String>,
    /// Failed replicas already counted, so one failure counts once.
    pub counted: HashSet<String>,
    /// Per host, the last port handed out. Ports rotate through the range
    /// rather than being reused at once: an engine left running on a lost
    /// node may still hold its old port.
    pub port_cursor: HashMap<String, u16>,
    /// Replicas placed by this leader, for unique ids within one ms.
    pub placed: u32,
    /// Per node, GPUs held by processes that outlived SIGKILL, as agents
    /// report them (set by the caller before each round): not free, though
    /// the replicated state may hold nothing on them.
    pub survivor_gpus: HashMap<String, Vec<u32>>,
    /// Per model that had no room: the lower-priority replica yielding its
    /// GPUs to it, until that replica is gone.
    pub yielding: HashMap<String, String>,
}

impl Memory {
    /// Backs off after a failure: the full delay, whatever frees up.
    fn backoff(&mut self, model: &str, now_ms: u64, settings: &PlanSettings) {
        self.free_gpus_when_unplaced.remove(model);
        self.delay_retry(model, now_ms, settings);
    }

    /// Backs off after finding no room, with `free_gpus` free in the fleet.
    fn backoff_for_room(
        &mut self,
        model: &str,
        now_ms: u64,
        settings: &PlanSettings,
        free_gpus: usize,
    ) {
        self.free_gpus_when_unplaced
            .insert(model.to_owned(), free_gpus);
        self.delay_retry(model, now_ms, settings);
    }

    fn delay_retry(&mut self, model: &str, now_ms: u64, settings: &PlanSettings) {
        let tries = self.retries.entry(model.to_owned()).or_default();
        *tries = tries.saturating_add(1);
        let delay = settings
            .retry_base_ms
            .saturating_mul(1u64 << (*tries - 1).min(16))
            .min(settings.retry_max_ms);
        self.retry_at.insert(model.to_owned(), now_ms + delay);
    }
}

/// The replicas of `model` that count toward its desired number: not
/// ordered away, and not already replaced by a live replica.
fn serving<'a>(fleet: &'a FleetState, model: &str) -> Vec<&'a Replica> {
    let replaced: HashSet<&str> = fleet
        .replicas
        .values()
        .filter(|r| r.stop.is_none())
        .filter_map(|r| r.replaces.as_deref())
        .collect();
    fleet
        .replicas
        .values()
        .filter(|r| r.model == model && r.stop.is_none() && !replaced.contains(r.id.as_str()))
        .collect()
}

/// The live replica placed to replace `old` (a drain or a rolling update).
fn replacement_of<'a>(fleet: &'a FleetState, old: &Replica) -> Option<&'a Replica> {
    fleet
        .replicas
        .values()
        .find(|r| r.replaces.as_deref() == Some(old.id.as_str()) && r.stop.is_none())
}

fn first_failure(replica: &Replica) -> Option<(&Shard, &ShardFailure)> {
    replica
        .shards
        .iter()
        .filter(|s| s.state == ShardState::Failed)
        .find_map(|s| s.last_failure.as_ref().map(|f| (s, f)))
}

/// Where the serving replicas of `model` are.
fn serving_siblings(fleet: &FleetState, model: &str) -> Siblings {
    let mut siblings = Siblings::default();
    for replica in serving(fleet, model) {
        for shard in &replica.shards {
            if let Some(node) = fleet.nodes.get(&shard.node) {
                siblings.add_on(&node.id, node.labels.get("rack").map(String::as_str));
            }
        }
    }
    siblings
}

/// Ports in use per host: engine ports and rendezvous ports.
fn used_ports(fleet: &FleetState) -> HashMap<String, BTreeSet<u16>> {
    let mut used: HashMap<String, BTreeSet<u16>> = HashMap::new();
    for (host, port, _) in fleet.ports_held() {
        used.entry(host.to_owned()).or_default().insert(port);
    }
    used
}

struct Round<'a> {
    fleet: &'a FleetState,
    memory: &'a mut Memory,
    settings: &'a PlanSettings,
    now_ms: u64,
    /// The fleet as the scheduler sees it, updated as this round places:
    /// later placements see earlier ones' GPUs taken and their siblings.
    /// Built on the first placement: most rounds place nothing.
    placer: Option<Placer>,
    ports: HashMap<String, BTreeSet<u16>>,
    commands: Vec<Command>,
    /// A replica was told to yield its GPUs this round: at most one.
    yielded_this_round: bool,
    /// GPUs free on ready nodes as this round began; counted when first
    /// asked.
    free_gpus: Option<usize>,
}

/// Decides one round.
pub fn decide(
    fleet: &FleetState,
    memory: &mut Memory,
    settings: &PlanSettings,
    now_ms: u64,
) -> Vec<Command> {
    let models = managed_models(fleet);
    let mut round = Round {
        fleet,
        memory,
        settings,
        now_ms,
        placer: None,
        ports: used_ports(fleet),
        commands: Vec::new(),
        yielded_this_round: false,
        free_gpus: None,
    };
    round.retire_replicas(&models);
    round.drain_nodes(&models);
    round.roll_out(&models);
    round.scale_models(&models);
    round.commands
}

impl Round<'_> {
    /// Deleted, or now served by static endpoints. An entry this peer
    /// cannot read (written by a newer peer) has not left: its replicas
    /// are left alone until a peer that reads it leads.
    fn left_the_catalog(&self, model: &str) -> bool {
        self.fleet
            .models
            .get(model)
            .is_none_or(|record| record.spec.model().is_ok())
    }

    fn node_status(&self, node: &str) -> Option<NodeStatus> {
        self.fleet.nodes.get(node).map(|n| n.status)
    }

    /// Stops failed replicas and replicas of deleted models; removes the
    /// ones that are gone (every shard stopped, or a node lost).
    fn retire_replicas(&mut self, models: &HashMap<String, Model>) {
        for replica in self.fleet.replicas.values() {
            let lost = replica.shards.iter().find(|s| {
                self.node_status(&s.node)
                    .is_none_or(|st| st == NodeStatus::Lost)
            });
            if let Some(shard) = lost {
                let failure = ReplicaFailure {
                    replica: replica.id.clone(),
                    node: shard.node.clone(),
                    failure: ShardFailure {
                        message: format!("node {} was lost", shard.node),
                        output_tail: Vec::new(),
                        at_ms: self.now_ms,
                    },
                };
                self.commands.push(Command::RemoveReplica {
                    id: replica.id.clone(),
                    failure: Some(failure),
                    at_ms: self.now_ms,
                });
                continue;
            }
            let failed = first_failure(replica);
            if let Some(stop) = &replica.stop {
                let done = replica.shards.iter().all(|s| {
                    matches!(
                        s.state,
                        ShardState::Stopped | ShardState::Failed | ShardState::Pending
                    )
                });
                if done {
                    let failure = failed.map(|(shard, failure)| ReplicaFailure {
                        replica: replica.id.clone(),
                        node: shard.node.clone(),
                        failure: failure.clone(),
                    });
                    tracing::info!(replica = %replica.id, reason = %stop.reason, "replica stopped; removing it");
                    self.commands.push(Command::RemoveReplica {
                        id: replica.id.clone(),
                        failure,
                        at_ms: self.now_ms,
                    });
                }
                continue;
            }
            if !models.contains_key(&replica.model) && self.left_the_catalog(&replica.model) {
                self.stop(
                    replica,
                    format!("model {} left the catalog", replica.model),
                    None,
                );
            } else if replica.state() == ReplicaState::Failed
                || replica
                    .shards
                    .iter()
                    .any(|s| s.state == ShardState::Stopped)
            {
                // A shard that stopped without being told to is as broken as
                // one that failed: the replica restarts as a whole.
                let (shard, failure) = failed.map_or_else(
                    || {
                        let stopped = replica
                            .shards
                            .iter()
                            .find(|s| s.state == ShardState::Stopped)
                            .unwrap_or(&replica.shards[0]);
                        (
                            stopped.node.clone(),
                            "a shard stopped on its own".to_owned(),
                        )
                    },
                    |(s, f)| (s.node.clone(), f.message.clone()),
                );
                if self.memory.counted.insert(replica.id.clone()) {
                    let key = (replica.model.clone(), shard.clone());
                    *self.memory.failures.entry(key).or_default() += 1;
                    self.memory
                        .backoff(&replica.model, self.now_ms, self.settings);
                    for s in &replica.shards {
                        if self.fleet.nodes.contains_key(&s.node) {
                            let host = self.fleet.host_of(&s.node).to_owned();
                            self.memory.bad_ports.insert((host, s.port));
                        }
                    }
                }
                self.stop(
                    replica,
                    format!("shard on node {shard} failed: {failure}"),
                    None,
                );
            }
        }
    }

    fn stop(&mut self, replica: &Replica, reason: String, drain_deadline_ms: Option<u64>) {
        tracing::info!(replica = %replica.id, %reason, "stopping replica");
        self.commands.push(Command::StopReplica {
            id: replica.id.clone(),
            reason,
            drain_deadline_ms,
            at_ms: self.now_ms,
        });
    }

    /// Make-before-break: a replacement is placed first; the replica on the
    /// draining node drains once the replacement is ready (or the drain
    /// deadline passes without one).
    fn drain_nodes(&mut self, models: &HashMap<String, Model>) {
        for drain in self.fleet.drains.values() {
            let on_node: Vec<&Replica> = self
                .fleet
                .replicas
                .values()
                .filter(|r| r.shards.iter().any(|s| s.node == drain.node))
                .collect();
            if on_node.is_empty() {
                tracing::info!(node = %drain.node, "drain finished: no replica left on the node");
                self.commands.push(Command::FinishDrain {
                    id: drain.node.clone(),
                    at_ms: self.now_ms,
                });
                continue;
            }
            let mut moving: HashMap<&str, usize> = HashMap::new();
            for replica in self.fleet.replicas.values() {
                if replica.replaces.is_some() && !replica.state().is_up() {
                    *moving.entry(replica.model.as_str()).or_default() += 1;
                }
            }
            let past_deadline = self.now_ms >= drain.deadline_ms;
            for old in on_node.into_iter().filter(|r| r.stop.is_none()) {
                match replacement_of(self.fleet, old) {
                    Some(new) if new.state().is_up() => self.stop(
                        old,
                        format!("node {} drains; replica {} took over", drain.node, new.id),
                        Some(drain.deadline_ms),
                    ),
                    _ if past_deadline => self.stop(
                        old,
                        format!(
                            "node {} drains and its deadline passed before a replacement was ready",
                            drain.node
                        ),
                        None,
                    ),
                    Some(_) => {}
                    None => {
                        let Some(model) = models.get(&old.model) else {
                            continue;
                        };
                        let in_flight = moving.entry(old.model.as_str()).or_default();
                        if *in_flight >= self.settings.moves_per_model {
                            continue;
                        }
                        if self.place(model, Some(old.id.clone())) {
                            *in_flight += 1;
                        }
                    }
                }
            }
        }
    }

    fn scale_models(&mut self, models: &HashMap<String, Model>) {
        // The biggest replicas first: a two-node model placed after small
        // ones have spread over its nodes might never fit.
        let mut names: Vec<&String> = models.keys().collect();
        let size = |name: &String| {
            models[name]
                .managed()
                .and_then(|m| m.profiles.first())
                .map_or(0, |p| p.total_gpus())
        };
        names.sort_by_key(|name| (std::cmp::Reverse(size(name)), *name));
        for name in names {
            let model = &models[name];
            let Some(record) = self.fleet.models.get(name) else {
                continue;
            };
            let want = record.desired_replicas as usize;
            let mut serving = serving(self.fleet, name);
            if serving.len() > want {
                // The least useful go first: not ready, then the newest.
                serving.sort_by_key(|r| (r.state().is_up(), std::cmp::Reverse(r.created_at_ms)));
                let extra = serving.len() - want;
                for replica in serving.into_iter().take(extra) {
                    self.stop(
                        replica,
                        format!("model {name} scaled down to {want}"),
                        Some(self.now_ms + self.settings.scale_down_drain_ms),
                    );
                }
                continue;
            }
            if serving.len() == want {
                self.memory.unplaced.remove(name);
                if serving.iter().all(|r| r.state().is_up()) {
                    self.memory.retries.remove(name);
                }
                continue;
            }
            if self.held_back(name) {
                continue;
            }
            for _ in serving.len()..want {
                if !self.place(model, None) {
                    // Room being made for it: placed as soon as there is,
                    // without waiting out a backoff.
                    if !self.take_gpus_for(model) {
                        self.back_off_for_room(name);
                    }
                    break;
                }
            }
        }
    }

    /// Whether `model` waits out a backoff before placing again: not once
    /// more GPUs are free than when it last found no room.
    fn held_back(&mut self, model: &str) -> bool {
        let Some(&retry_at) = self.memory.retry_at.get(model) else {
            return false;
        };
        if retry_at <= self.now_ms {
            return false;
        }
        match self.memory.free_gpus_when_unplaced.get(model).copied() {
            Some(then) => self.free_gpus() <= then,
            None => true,
        }
    }

    fn back_off_for_room(&mut self, model: &str) {
        let free = self.free_gpus();
        self.memory
            .backoff_for_room(model, self.now_ms, self.settings, free);
    }

    /// The fleet as the scheduler sees it, GPUs held by processes that
    /// outlived their shard taken.
    fn node_views(&self) -> Vec<llmgw_scheduler::NodeView> {
        let mut views = node_views(self.fleet);
        take_survivor_gpus(&mut views, &self.memory.survivor_gpus);
        views
    }

    /// GPUs on ready nodes that no shard (nor a process that outlived its
    /// shard) holds, as the round began.
    fn free_gpus(&mut self) -> usize {
        if let Some(free) = self.free_gpus {
            return free;
        }
        let free = self
            .node_views()
            .iter()
            .filter(|n| n.health == NodeHealth::Ready && !n.cordoned && !n.draining)
            .flat_map(|n| &n.gpus)
            .filter(|g| g.free)
            .count();
        *self.free_gpus.get_or_insert(free)
    }

    /// Places one replica of `model`; `false` when nothing fits (the
    /// explanation is remembered and logged).
    fn place(&mut self, model: &Model, replaces: Option<String>) -> bool {
        let Some(managed) = model.managed() else {
            return false;
        };
        if self.placer.is_none() {
            self.placer = Some(Placer::new(self.node_views()));
        }
        let fleet = self.fleet;
        let placer = self.placer.as_mut().expect("built above");
        let siblings = if placer.tracks(&model.name) {
            Siblings::default()
        } else {
            serving_siblings(fleet, &model.name)
        };
        let avoid = self
            .memory
            .failures
            .iter()
            .filter(|((m, _), count)| {
                *m == model.name && **count >= self.settings.avoid_after_failures
            })
            .map(|((_, node), _)| node.clone())
            .collect();
        let request = Request {
            model: &model.name,
            profiles: &managed.profiles,
            siblings,
            avoid,
            strategy: self.settings.strategy,
        };
        match placer.place(&request) {
            Ok(placement) => match self.commit_placement(model, placement, replaces) {
                Some(command) => {
                    self.memory.unplaced.remove(&model.name);
                    self.commands.push(command);
                    true
                }
                None => false,
            },
            Err(explanation) => {
                let text = explanation.to_string();
                if self.memory.unplaced.get(&model.name) != Some(&text) {
                    tracing::warn!(model = %model.name, "cannot place a replica: {text}");
                }
                self.memory.unplaced.insert(model.name.clone(), text);
                false
            }
        }
    }

    fn host(&self, node: &str) -> String {
        self.fleet.host_of(node).to_owned()
    }

    fn take_port(&mut self, host: &str) -> Option<u16> {
        self.take_ports(host, 1)
    }

    /// `count` consecutive free ports on `host` (a data-parallel engine's
    /// ranks offset one configured port), the first of them; searched from
    /// after the last port taken there, so a port just freed is not reused
    /// at once.
    fn take_ports(&mut self, host: &str, count: u16) -> Option<u16> {
        let used = self.ports.entry(host.to_owned()).or_default();
        let (first, last) = (*self.settings.ports.start(), *self.settings.ports.end());
        let cursor = self
            .memory
            .port_cursor
            .get(host)
            .copied()
            .or_else(|| used.iter().next_back().copied())
            .unwrap_or(last);
        let after = (cursor.saturating_add(1)..=last).chain(first..=cursor);
        let bad = &self.memory.bad_ports;
        let free = |p: u16| !used.contains(&p) && !bad.contains(&(host.to_owned(), p));
        let start = after.filter(|p| *p >= first).find(|&start| {
            (0..count).all(|i| start.checked_add(i).is_some_and(|p| p <= last && free(p)))
        })?;
        let end = start + (count - 1);
        used.extend(start..=end);
        self.memory.port_cursor.insert(host.to_owned(), end);
        Some(start)
    }

    fn commit_placement(
        &mut self,
        model: &Model,
        placement: Placement,
        replaces: Option<String>,
    ) -> Option<Command> {
        let mut shards = Vec::new();
        for shard in &placement.shards {
            let host = self.host(&shard.node);
            let Some(port) = self.take_port(&host) else {
                tracing::warn!(
                    host,
                    "no free engine port left in {:?}",
                    self.settings.ports
                );
                return None;
            };
            shards.push(Shard {
                node: shard.node.clone(),
                gpus: shard.gpus.clone(),
                port,
                rank: shard.rank,
                state: ShardState::Pending,
                pid: None,
                last_failure: None,
                state_changed_at_ms: self.now_ms,
                report_seq: 0,
            });
        }
        let rendezvous_port = if shards.len() > 1 {
            let host = self.host(&shards[0].node);
            Some(self.take_port(&host)?)
        } else {
            None
        };
        // Every engine publishes its KV cache events for the routers, one
        // publisher per data-parallel rank.
        let kv_event_ports = {
            let host = self.host(&shards[0].node);
            let ranks = model
                .managed()
                .and_then(|m| m.profiles.iter().find(|p| p.name == placement.profile))
                .map_or(1, |p| u16::try_from(p.data_parallel).unwrap_or(u16::MAX));
            Some(KvEventPorts {
                stream: self.take_ports(&host, ranks)?,
                replay: self.take_ports(&host, ranks)?,
                ranks,
            })
        };
        // Later placements of this round see these GPUs as taken, and this
        // replica as a sibling.
        if let Some(placer) = &mut self.placer {
            placer.commit(&model.name, &placement);
        }
        self.memory.placed = self.memory.placed.wrapping_add(1);
        let id = replica_id(&model.name, self.now_ms, self.memory.placed);
        tracing::info!(
            replica = %id,
            profile = %placement.profile,
            nodes = ?shards.iter().map(|s| &s.node).collect::<Vec<_>>(),
            replaces = ?replaces,
            "placing replica"
        );
        // The replica launches the entry as this round sees it; were the
        // entry to change before this applies, the replica is outdated at
        // once and replaced like any other.
        let entry = self.fleet.models.get(&model.name);
        Some(Command::PlaceReplica {
            id,
            model: model.name.clone(),
            profile: placement.profile,
            shards,
            fabric: placement.fabric,
            rendezvous_port,
            replaces,
            spec_fingerprint: entry.map(|e| e.spec.launch_fingerprint().to_owned()),
            served_names: entry.map(|e| e.spec.served_names(&model.name)),
            kv_event_ports,
            at_ms: self.now_ms,
        })
    }
}

/// Unique across leaders in practice (time and a counter); a collision is
/// refused by `apply` and the next round tries again.
fn replica_id(model: &str, now_ms: u64, seq: u32) -> String {
    let mut name: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(80)
        .collect();
    name = name.trim_start_matches(['.', '-']).to_owned();
    format!("{name}-{now_ms:x}{seq:02x}")
}
