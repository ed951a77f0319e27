//! One simulated agent: the same protocol as `llmgw agent`, without
//! discovery or engines.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_client::AgentServiceClient;
use llmgw_proto::agent::control_message::Body as Down;
use llmgw_proto::agent::{
    AgentMessage, CommandAck, FabricStatus, Gpu, GpuLink, Heartbeat, Inventory, LinkKind, Register,
    ShardState, ShardStatus,
};
use rand::Rng;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[derive(Clone)]
pub struct NodeSpec {
    pub id: String,
    pub servers: Vec<String>,
    pub heartbeat: Duration,
    pub fabric: String,
    pub rack: String,
    /// The node's own certificate (`llmgw://node/<ID>`) for mTLS; plaintext
    /// without.
    pub tls: Option<llmgw_tls::Tls>,
}

#[derive(Debug, Default)]
pub struct NodeStats {
    pub registered: AtomicBool,
    pub reconnects: AtomicU64,
    pub commands: AtomicU64,
    pub refused: AtomicU64,
}

fn register(spec: &NodeSpec, highest_term: u64) -> Register {
    let gpus = (0..8)
        .map(|index| Gpu {
            index,
            uuid: format!("GPU-{}-{index}", spec.id),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_mib: 81_559,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            numa_node: -1,
        })
        .collect();
    let links = (0..8u32)
        .flat_map(|a| (a + 1..8).map(move |b| (a, b)))
        .map(|(a, b)| GpuLink {
            a,
            b,
            kind: LinkKind::Nvlink as i32,
            nvlinks: 18,
        })
        .collect();
    Register {
        node_id: spec.id.clone(),
        inventory: Some(Inventory {
            gpu_source: "fixture".into(),
            gpus,
            links,
            hostname: spec.id.clone(),
            ..Inventory::default()
        }),
        fabrics: vec![FabricStatus {
            name: spec.fabric.clone(),
            hcas: vec!["mlx5_0".into()],
            rate_gbps: 400,
            active_hcas: vec!["mlx5_0".into()],
            problems: vec![],
        }],
        labels: [("rack".to_owned(), spec.rack.clone())].into(),
        engines: vec![llmgw_proto::agent::EngineAvailable {
            engine: "vllm".into(),
            version: "0.11.1".into(),
            launch_mode: "mp".into(),
        }],
        mgmt_addr: mgmt_addr(&spec.id),
        mgmt_interface: "eth0".into(),
        running: vec![],
        highest_term,
        agent_version: "fleet-sim".into(),
        // One instance per simulated node, the same on every reconnect.
        instance_id: format!("{:032x}", fnv1a(&spec.id)),
        ..Register::default()
    }
}

fn fnv1a(text: &str) -> u128 {
    text.bytes()
        .fold(0x6c62272e07bb014262b821756295c58d, |hash, byte| {
            (hash ^ u128::from(byte)).wrapping_mul(0x0000000001000000000000000000013b)
        })
}

/// A distinct address per node index, as on a real fleet.
fn mgmt_addr(id: &str) -> String {
    let n: u32 = id
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    format!("10.{}.{}.{}", 100 + n / 65_536, (n / 256) % 256, n % 256)
}

/// The agent's reconnect law with its defaults: full jitter over
/// `min(30 s, 1 s * 2^attempt)`, at least a tenth of the base.
fn backoff(attempt: u32) -> Duration {
    const BASE: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);
    let cap = BASE.saturating_mul(1u32 << attempt.min(20)).min(MAX);
    cap.mul_f64(rand::rng().random_range(0.0..=1.0))
        .max(BASE / 10)
}

/// Runs the node forever.
pub async fn run_node(spec: NodeSpec, stats: Arc<NodeStats>) {
    let mut highest_term = 0u64;
    let mut next = 0usize;
    let mut redirect: Option<String> = None;
    let mut attempt = 0u32;
    let mut failed_peers = 0usize;
    loop {
        let via_redirect = redirect.is_some();
        let target = redirect.take().unwrap_or_else(|| {
            let peer = spec.servers[next % spec.servers.len()].clone();
            next += 1;
            peer
        });
        let ended = session(&spec, &target, &stats, &mut highest_term).await;
        let was_registered = stats.registered.swap(false, Ordering::Relaxed);
        // As the agent does: only a stream that was registered starts the
        // backoff over; "no leader" answers and refused dials make it grow,
        // so a fleet cannot hold a busy control plane down by retrying.
        let escalate = match ended {
            Ok(Some(leader)) if !leader.is_empty() => {
                redirect = Some(leader);
                continue;
            }
            _ if was_registered => {
                attempt = 0;
                true
            }
            // A leader a peer named that does not answer has most likely
            // just died; the peers name the next one within an election.
            Err(_) if via_redirect => false,
            _ => true,
        };
        stats.reconnects.fetch_add(1, Ordering::Relaxed);
        if escalate && !was_registered {
            // As the agent does: the next peer is asked after a moment; the
            // backoff grows once every peer has been asked.
            failed_peers += 1;
            if failed_peers < spec.servers.len() {
                let pause = Duration::from_millis(100).mul_f64(rand::rng().random_range(0.0..=1.0));
                tokio::time::sleep(pause).await;
                continue;
            }
        }
        failed_peers = 0;
        let wait = backoff(attempt);
        if escalate {
            attempt = attempt.saturating_add(1);
        }
        tokio::time::sleep(wait).await;
    }
}

/// One stream; `Ok(Some(addr))` is a redirect.
async fn session(
    spec: &NodeSpec,
    addr: &str,
    stats: &NodeStats,
    highest_term: &mut u64,
) -> Result<Option<String>, String> {
    let endpoint = llmgw_tls::endpoint(addr)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let channel = llmgw_tls::connect(&endpoint, spec.tls.as_ref())
        .await
        .map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel::<AgentMessage>(64);
    let _ = tx
        .send(AgentMessage {
            body: Some(Up::Register(register(spec, *highest_term))),
        })
        .await;
    let mut inbound = AgentServiceClient::new(channel)
        .connect(ReceiverStream::new(rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    // Heartbeats start at a random offset so the fleet does not beat in step.
    let offset = spec.heartbeat.mul_f64(rand::rng().random_range(0.0..1.0));
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + offset, spec.heartbeat);
    let mut seq = 0;
    loop {
        tokio::select! {
            message = inbound.message() => {
                let Some(message) = message.map_err(|e| e.to_string())? else {
                    return Ok(None);
                };
                let Some(body) = message.body else { continue };
                if let Down::Redirect(r) = body {
                    return Ok(Some(r.leader_addr));
                }
                // Only a sign of life; the simulated node never leaves.
                if let Down::HeartbeatAck(_) = body {
                    continue;
                }
                if message.term < *highest_term {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                    let _ = tx.try_send(ack(message.command_id, false, "stale term".into()));
                    continue;
                }
                *highest_term = message.term;
                stats.commands.fetch_add(1, Ordering::Relaxed);
                for reply in answer(body) {
                    let _ = tx.try_send(reply);
                }
                let _ = tx.try_send(ack(message.command_id, true, String::new()));
                stats.registered.store(true, Ordering::Relaxed);
            }
            _ = beat.tick() => {
                seq += 1;
                let heartbeat = AgentMessage {
                    body: Some(Up::Heartbeat(Heartbeat {
                        seq,
                        sent_unix_ms: 0,
                        survivor_gpus: Vec::new(),
                    })),
                };
                if tx.send(heartbeat).await.is_err() {
                    return Ok(None);
                }
            }
        }
    }
}

fn ack(command_id: u64, accepted: bool, message: String) -> AgentMessage {
    AgentMessage {
        body: Some(Up::Ack(CommandAck {
            command_id,
            accepted,
            message,
        })),
    }
}

fn status(shard_id: &str, replica_id: &str, state: ShardState, port: u32) -> AgentMessage {
    AgentMessage {
        body: Some(Up::ShardStatus(ShardStatus {
            shard_id: shard_id.into(),
            replica_id: replica_id.into(),
            state: state as i32,
            pid: 1,
            port,
            ..ShardStatus::default()
        })),
    }
}

/// Engines "start" at once: every start is reported ready, every stop and
/// drain stopped.
fn answer(body: Down) -> Vec<AgentMessage> {
    match body {
        Down::Registered(registered) => registered
            .shards
            .iter()
            .map(|s| status(&s.shard_id, &s.replica_id, ShardState::Ready, s.port))
            .collect(),
        Down::Start(start) => start
            .spec
            .map(|s| {
                vec![status(
                    &s.shard_id,
                    &s.replica_id,
                    ShardState::Ready,
                    s.port,
                )]
            })
            .unwrap_or_default(),
        Down::Stop(stop) => vec![status(
            &stop.shard_id,
            &replica_of(&stop.shard_id),
            ShardState::Stopped,
            0,
        )],
        Down::Drain(drain) => vec![status(
            &drain.shard_id,
            &replica_of(&drain.shard_id),
            ShardState::Stopped,
            0,
        )],
        Down::Redirect(_) | Down::HeartbeatAck(_) => vec![],
    }
}

/// Shard ids are `{replica}-r{rank}`.
fn replica_of(shard_id: &str) -> String {
    shard_id
        .rsplit_once("-r")
        .map_or(shard_id, |(replica, _)| replica)
        .to_owned()
}
