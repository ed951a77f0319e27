//! Shard statuses from agents become replicated shard states. Only the
//! node a shard is assigned to may report on it, and only changes are
//! written.

use std::collections::HashMap;

use llmgw_raft::{ControlPlane, now_ms};
use llmgw_state::{Command, FleetState};
use tokio::sync::mpsc;

use super::service::Report;
use llmgw_agent_wire::{failure, shard_state};

/// Runs until the channel closes. Reports that arrive while this peer does
/// not lead are dropped: agents report to the leader only, and the next
/// leader learns the current state from the next transitions and
/// registrations.
pub async fn write_reports(control: ControlPlane, mut reports: mpsc::UnboundedReceiver<Report>) {
    let mut batch = Vec::new();
    while reports.recv_many(&mut batch, 4096).await > 0 {
        // The latest report per shard wins.
        let mut latest: HashMap<String, Report> = HashMap::new();
        for report in batch.drain(..) {
            latest.insert(report.status.shard_id.clone(), report);
        }
        let commands: Vec<Command> = control.read(|fleet| {
            latest
                .into_values()
                .filter_map(|report| to_command(fleet, report))
                .collect()
        });
        let _ =
            crate::propose::propose_all(&control, crate::propose::Author::Agent, commands).await;
    }
}

fn to_command(fleet: &FleetState, report: Report) -> Option<Command> {
    let status = &report.status;
    let state = shard_state(status.state)?;
    let Some(replica) = fleet.replicas.get(&status.replica_id) else {
        tracing::debug!(shard = %status.shard_id, "status for a replica that no longer exists");
        return None;
    };
    let shard = replica
        .shards
        .iter()
        .find(|s| replica.shard_id(s.rank) == status.shard_id)?;
    if shard.node != report.node {
        tracing::warn!(
            node = %report.node,
            shard = %status.shard_id,
            owner = %shard.node,
            "ignoring a status about a shard assigned to another node"
        );
        return None;
    }
    if status.seq != 0 && status.seq <= shard.report_seq {
        tracing::debug!(shard = %status.shard_id, seq = status.seq, applied = shard.report_seq, "dropping a stale shard report");
        return None;
    }
    let pid = (status.pid != 0).then_some(status.pid);
    let at_ms = now_ms();
    let failure = failure(status, at_ms);
    if shard.state == state && shard.pid == pid && failure.is_none() {
        return None;
    }
    if let Some(failure) = &failure {
        tracing::warn!(shard = %status.shard_id, node = %report.node, "shard failed: {}", failure.message);
    }
    Some(Command::SetShardState {
        replica: replica.id.clone(),
        rank: shard.rank,
        state,
        pid,
        failure,
        seq: status.seq,
        at_ms,
    })
}
