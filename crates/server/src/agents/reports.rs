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
    // An agent answering for a shard it does not know (its engine gone
    // with the agent's own restart) cannot name the replica; the shard id
    // does.
    let replica_id = match status.replica_id.as_str() {
        "" => replica_of_shard(&status.shard_id).unwrap_or_default(),
        named => named,
    };
    let Some(replica) = fleet.replicas.get(replica_id) else {
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

/// The replica a shard id (`<replica>-r<rank>`) belongs to.
fn replica_of_shard(shard_id: &str) -> Option<&str> {
    let (replica, rank) = shard_id.rsplit_once("-r")?;
    rank.parse::<u32>().ok().map(|_| replica)
}

#[cfg(test)]
mod tests {
    use super::replica_of_shard;

    #[test]
    fn a_shard_id_names_its_replica() {
        assert_eq!(
            replica_of_shard("llama-3-8b-7f3a-r0"),
            Some("llama-3-8b-7f3a")
        );
        assert_eq!(replica_of_shard("m-r1-r12"), Some("m-r1"));
        assert_eq!(replica_of_shard("m-rx"), None);
        assert_eq!(replica_of_shard("plain"), None);
    }
}
