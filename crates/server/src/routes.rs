//! The router inside `llmgw server`: its routing table comes from this
//! peer's own applied state, so it keeps serving whichever peer leads, and
//! follows changes within a fraction of a second.

use std::sync::Arc;
use std::time::Duration;

use llmgw_raft::ControlPlane;
use llmgw_router::{Endpoint, EndpointState, RoutedModel, RoutingTable};
use llmgw_state::{FleetState, ReplicaState};
use tokio::sync::watch;

use llmgw_reconcile::{endpoint, kv_event_addresses};

/// How often the applied index is checked for changes.
const REFRESH: Duration = Duration::from_millis(100);

pub fn routing_table(fleet: &FleetState) -> RoutingTable {
    let mut models = Vec::new();
    for record in fleet.models.values() {
        let Ok(model) = record.spec.model() else {
            continue;
        };
        let mut endpoints: Vec<Endpoint> = model
            .static_endpoints()
            .iter()
            .map(|url| Endpoint::ready(url.as_str()))
            .collect();
        let mut served_names = Vec::new();
        let mut counts: std::collections::BTreeMap<&str, u32> = Default::default();
        for replica in fleet.replicas.values().filter(|r| r.model == model.name) {
            let state = replica.state();
            *counts.entry(state.as_str()).or_default() += 1;
            let endpoint_state = match state {
                // Going to sleep: nothing new is sent to it.
                _ if fleet.wanted_asleep(replica) => continue,
                ReplicaState::Ready => EndpointState::Ready,
                ReplicaState::Draining => EndpointState::Draining,
                _ => continue,
            };
            if let Some(url) = endpoint(fleet, replica) {
                served_names.push(replica.served_names.as_deref());
                endpoints.push(Endpoint {
                    url: normalize(&url),
                    state: endpoint_state,
                    kv_events: kv_event_addresses(fleet, replica)
                        .map(|kv| {
                            llmgw_router::KvEventEndpoints {
                                stream: kv.stream,
                                replay: Some(kv.replay),
                                topic: String::new(),
                            }
                            .ranks(kv.ranks)
                        })
                        .unwrap_or_default(),
                });
            }
        }
        let unavailable_reason = model.managed().map(|_| {
            let mut why = format!(
                "no replica of {} is ready ({} desired",
                model.name, record.desired_replicas
            );
            for (state, n) in &counts {
                why.push_str(&format!(", {n} {state}"));
            }
            why.push(')');
            // Nothing placed at all: say why, as `explain` would.
            if counts.is_empty()
                && let Ok(explained) = crate::api::explain_model(
                    fleet,
                    &model.name,
                    Default::default(),
                    &std::collections::HashMap::new(),
                )
                && let Some(text) = explained.explanation
            {
                why.push_str(&format!("; {text}"));
            }
            if let Some(failure) = &record.last_failure {
                why.push_str(&format!(
                    "; last failure on node {}: {}",
                    failure.node, failure.failure.message
                ));
            }
            why
        });
        let mut routed = RoutedModel {
            name: model.name.clone(),
            aliases: model.aliases.clone(),
            mapped_aliases: Vec::new(),
            endpoints,
            unavailable_reason,
            wakes_on_request: model
                .managed()
                .and_then(|m| m.autoscale)
                .is_some_and(|a| a.wakes_on_request()),
            max_requests_per_replica: model
                .managed()
                .and_then(|m| m.autoscale)
                .and_then(|a| a.max_requests_per_replica),
        };
        for served in served_names {
            routed.note_served_names(served);
        }
        models.push(routed);
    }
    RoutingTable {
        models,
        keys: {
            let now_ms = llmgw_raft::now_ms();
            llmgw_router::KeyRing::build(fleet.api_keys.values().map(|k| {
                (
                    k,
                    fleet.usage.spent(&k.name, now_ms),
                    fleet.usage.shares(&k.name, now_ms),
                )
            }))
        },
    }
}

fn normalize(url: &str) -> String {
    Endpoint::ready(url).url
}

/// Publishes a new table whenever the applied state changes it.
pub fn publish(control: ControlPlane) -> watch::Receiver<Arc<RoutingTable>> {
    let first = control.read(routing_table);
    let (tx, rx) = watch::channel(Arc::new(first));
    tokio::spawn(async move {
        let mut applied = None;
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.is_closed() {
                return;
            }
            let now = control.metrics().last_applied;
            if now == applied {
                continue;
            }
            applied = now;
            let table = control.read(routing_table);
            tx.send_if_modified(|current| {
                if **current == table {
                    false
                } else {
                    *current = Arc::new(table);
                    true
                }
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmgw_state::{Command, Gpu, NodeInventory};

    #[test]
    fn a_model_with_nothing_placed_says_why_in_its_503() {
        let mut fleet = FleetState::default();
        fleet.apply(&Command::RegisterNode {
            id: "n1".into(),
            mgmt_addr: "10.0.0.1".into(),
            inventory: NodeInventory {
                gpus: vec![Gpu {
                    index: 0,
                    model: "NVIDIA L40S".into(),
                    memory_mb: 46_068,
                    ..Gpu::default()
                }],
                ..NodeInventory::default()
            },
            fabrics: vec![],
            labels: Default::default(),
            at_ms: 1,
        });
        fleet.apply(&Command::PutModel {
            name: "big".into(),
            spec: llmgw_state::ModelSpec::from_stored(
                serde_json::json!({"name": "big", "source": "org/big", "replicas": 1,
                "profiles": [{"name": "p", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                              "tensor_parallel": 1, "pipeline_parallel": 1,
                              "min_gpu_memory_gb": 0, "gpu_models": ["B200"]}]}),
            ),
            replicas: 1,
            at_ms: 1,
        });
        let table = routing_table(&fleet);
        let why = table.models[0].unavailable_reason.clone().unwrap();
        assert!(
            why.contains("0/1 nodes fit big profile p: 1 have no allowed GPU model"),
            "{why}"
        );
    }

    #[test]
    fn the_in_peer_router_sees_the_replicated_keys() {
        let mut fleet = FleetState::default();
        assert!(!routing_table(&fleet).keys.enforced());
        let key = llmgw_state::ApiKeyRecord {
            name: "ci".into(),
            settings: Default::default(),
            secret_sha256: llmgw_api::keys::secret_digest("sk-llmgw-test"),
            secret_prefix: "sk-llmgw-test".into(),
            created_at_ms: 1,
            rotated_at_ms: None,
            revoked_at_ms: None,
        };
        fleet.apply(&Command::CreateApiKey { key, at_ms: 1 });
        let table = routing_table(&fleet);
        assert!(table.keys.enforced());
        assert_eq!(table.keys.len(), 1);
    }
}
