//! What each node should run: the shard specs agents launch, and the
//! drain and stop orders, all derived from the replicated state.

use std::collections::{BTreeMap, HashMap};

use llmgw_catalog::{Model, Profile};
use llmgw_proto::agent::ShardSpec;
use llmgw_state::{FleetState, Replica, ReplicaState, Shard, ShardState, mgmt_host};

/// What the leader wants a node to do with one shard.
#[derive(Debug, Clone, PartialEq)]
pub enum Order {
    Run(Box<ShardSpec>),
    /// Finish in-flight requests until the deadline (unix ms), then stop.
    Drain {
        deadline_ms: u64,
        reason: String,
    },
    Stop {
        reason: String,
    },
    /// Leave it as it runs: this peer cannot read its model's entry (a
    /// newer peer wrote it), so it has nothing to say about the shard.
    Keep {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub shard_id: String,
    pub order: Order,
}

/// The catalog entries the leader manages, decoded once per round.
pub fn managed_models(fleet: &FleetState) -> HashMap<String, Model> {
    fleet
        .models
        .values()
        .filter_map(|record| {
            let model = record.spec.model().ok()?;
            model.managed()?;
            Some((record.name.clone(), model.clone()))
        })
        .collect()
}

fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// The head shard's HTTP base URL: where the router sends traffic.
pub fn endpoint(fleet: &FleetState, replica: &Replica) -> Option<String> {
    let head = replica.shards.iter().find(|s| s.rank == 0)?;
    let node = fleet.nodes.get(&head.node)?;
    Some(format!(
        "http://{}:{}",
        url_host(mgmt_host(&node.mgmt_addr)),
        head.port
    ))
}

/// Where the head engine publishes KV events, as (stream, replay)
/// `host:port` addresses: what a router subscribes to.
pub fn kv_event_addresses(fleet: &FleetState, replica: &Replica) -> Option<KvEventAddresses> {
    let ports = replica.kv_event_ports?;
    let head = replica.shards.iter().find(|s| s.rank == 0)?;
    let node = fleet.nodes.get(&head.node)?;
    let host = url_host(mgmt_host(&node.mgmt_addr));
    Some(KvEventAddresses {
        stream: format!("{host}:{}", ports.stream),
        replay: format!("{host}:{}", ports.replay),
        ranks: ports.ranks,
    })
}

/// Where a head engine's rank 0 publishes its KV events, as `host:port`;
/// rank `r` of `ranks` on each port plus `r`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventAddresses {
    pub stream: String,
    pub replay: String,
    pub ranks: u16,
}

fn profile<'a>(model: &'a Model, replica: &Replica) -> Option<&'a Profile> {
    model
        .managed()?
        .profiles
        .iter()
        .find(|p| p.name == replica.profile)
}

pub fn shard_spec(
    fleet: &FleetState,
    model: &Model,
    replica: &Replica,
    shard: &Shard,
) -> Option<ShardSpec> {
    let managed = model.managed()?;
    let profile = profile(model, replica)?;
    let (master_addr, master_port) = if profile.is_multi_node() {
        let head = replica.shards.iter().find(|s| s.rank == 0)?;
        let head_node = fleet.nodes.get(&head.node)?;
        (
            mgmt_host(&head_node.mgmt_addr).to_owned(),
            u32::from(replica.rendezvous_port?),
        )
    } else {
        (String::new(), 0)
    };
    let sleep_mode = managed.autoscale.is_some_and(|a| a.sleep_after.is_some());
    let asleep = sleep_mode && fleet.wanted_asleep(replica);
    Some(ShardSpec {
        shard_id: replica.shard_id(shard.rank),
        replica_id: replica.id.clone(),
        model: model.name.clone(),
        source: managed.source.clone(),
        // The names it was launched with: an alias added since is mapped by
        // the router, so the engine need not restart for it.
        served_names: replica
            .served_names
            .clone()
            .unwrap_or_else(|| model.names().map(str::to_owned).collect()),
        engine: profile.engine.as_str().to_owned(),
        profile: profile.name.clone(),
        nodes: profile.nodes,
        rank: shard.rank,
        gpus: shard.gpus.clone(),
        port: u32::from(shard.port),
        tensor_parallel: profile.tensor_parallel,
        pipeline_parallel: profile.pipeline_parallel,
        data_parallel: profile.data_parallel,
        master_addr,
        master_port,
        fabric: replica.fabric.clone().unwrap_or_default(),
        engine_args: profile.engine_args.clone(),
        env: profile.env.clone().into_iter().collect(),
        gpus_per_node: profile.gpus_per_node,
        launch_mode: profile
            .launch_mode
            .map(|m| m.as_str().to_owned())
            .unwrap_or_default(),
        min_gpu_memory_gb: profile.min_gpu_memory_gb,
        gpu_models: profile.gpu_models.clone(),
        // Only the head runs the scheduler whose cache the events describe.
        kv_events_port: replica
            .kv_event_ports
            .filter(|_| shard.rank == 0)
            .map_or(0, |k| u32::from(k.stream)),
        kv_replay_port: replica
            .kv_event_ports
            .filter(|_| shard.rank == 0)
            .map_or(0, |k| u32::from(k.replay)),
        sleep_mode,
        asleep,
    })
}

/// Every node's orders, from the replicated state alone, so a new leader
/// derives exactly what the old one was sending.
/// The model's entry exists but this peer cannot read it (a newer peer
/// wrote it): its shards are told nothing new, so they keep running as
/// they are.
fn unreadable(fleet: &FleetState, model: &str) -> bool {
    fleet
        .models
        .get(model)
        .is_some_and(|record| record.spec.model().is_err())
}

/// Whether the replica was launched from another entry of its model than
/// the one in the catalog now.
pub fn outdated(fleet: &FleetState, replica: &Replica) -> bool {
    let Some(record) = fleet.models.get(&replica.model) else {
        return false;
    };
    replica
        .spec_fingerprint
        .as_deref()
        .is_some_and(|launched| launched != record.spec.launch_fingerprint())
}

pub fn desired_by_node(
    fleet: &FleetState,
    models: &HashMap<String, Model>,
) -> BTreeMap<String, Vec<Desired>> {
    desired_where(fleet, models, |_| true)
}

/// One node's orders, for its `Registered`: a fleet reconnecting after a
/// failover must not cost a whole-fleet computation per node.
pub fn desired_for_node(
    fleet: &FleetState,
    models: &HashMap<String, Model>,
    node: &str,
) -> Vec<Desired> {
    desired_where(fleet, models, |n| n == node)
        .remove(node)
        .unwrap_or_default()
}

fn desired_where(
    fleet: &FleetState,
    models: &HashMap<String, Model>,
    wanted: impl Fn(&str) -> bool,
) -> BTreeMap<String, Vec<Desired>> {
    let mut out: BTreeMap<String, Vec<Desired>> = BTreeMap::new();
    for replica in fleet.replicas.values() {
        if !replica.shards.iter().any(|s| wanted(&s.node)) {
            continue;
        }
        let unreadable = unreadable(fleet, &replica.model);
        let outdated = outdated(fleet, replica);
        let failed = replica.state() == ReplicaState::Failed;
        for shard in &replica.shards {
            if shard.state == ShardState::Stopped || !wanted(&shard.node) {
                continue;
            }
            let shard_id = replica.shard_id(shard.rank);
            let order = match (&replica.stop, failed) {
                // A stop or drain this leader decided needs no model spec;
                // only running is the model's to describe.
                (None, false) if unreadable => Order::Keep {
                    reason: format!(
                        "this peer cannot read model {} (written by a newer version)",
                        replica.model
                    ),
                },
                (Some(stop), false) if stop.drain_deadline_ms.is_some() => Order::Drain {
                    deadline_ms: stop.drain_deadline_ms.unwrap_or_default(),
                    reason: stop.reason.clone(),
                },
                (Some(stop), _) => Order::Stop {
                    reason: stop.reason.clone(),
                },
                (None, true) => Order::Stop {
                    reason: format!("replica {} failed; it restarts as a whole", replica.id),
                },
                // It runs an earlier entry of its model: its agent keeps it
                // as launched until a rolling update replaces it.
                (None, false) if outdated => Order::Keep {
                    reason: format!(
                        "replica {} runs an earlier launch spec of model {}; a rolling update \
                         replaces it",
                        replica.id, replica.model
                    ),
                },
                (None, false) => match models
                    .get(&replica.model)
                    .and_then(|model| shard_spec(fleet, model, replica, shard))
                {
                    Some(spec) => Order::Run(Box::new(spec)),
                    None => Order::Stop {
                        reason: format!(
                            "model {} or its profile {} is no longer in the catalog",
                            replica.model, replica.profile
                        ),
                    },
                },
            };
            out.entry(shard.node.clone())
                .or_default()
                .push(Desired { shard_id, order });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_are_bracketed_in_urls() {
        assert_eq!(url_host("fd00::5"), "[fd00::5]");
    }
}
