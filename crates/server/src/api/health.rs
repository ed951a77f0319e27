//! Liveness, readiness and Prometheus metrics.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use llmgw_api::Readiness;
use llmgw_store::ApplyStats;

use super::ApiState;
use crate::agents::Hub;

/// `ok` while this peer's Raft core runs; 503 with the reason once it has
/// stopped (the peer is exiting: see `serve::shutdown_or_core_stopped`).
pub async fn healthz(State(state): State<ApiState>) -> (StatusCode, String) {
    match state.control.core_failure() {
        None => (StatusCode::OK, "ok\n".to_owned()),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the Raft core stopped: {why}\n"),
        ),
    }
}

/// Ready once this peer knows a leader: writes can be accepted through it
/// and its reads follow the cluster.
pub async fn readyz(State(state): State<ApiState>) -> impl IntoResponse {
    let metrics = state.control.metrics();
    match metrics.current_leader {
        Some(leader) => (
            StatusCode::OK,
            Json(Readiness {
                ready: true,
                leader_id: Some(leader),
                reason: None,
            }),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Readiness {
                ready: false,
                leader_id: None,
                reason: Some("no Raft leader is known yet".to_owned()),
            }),
        ),
    }
}

/// The Prometheus text page: this peer's Raft state and apply path, its
/// agent streams, then the fleet as applied here.
pub async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    let raft = state.control.metrics();
    let apply = state.control.apply_stats();
    let mut out = String::new();
    let is_leader = raft.current_leader == Some(state.control.id());
    write_raft_role(&mut out, &state, raft.current_term, is_leader);
    write_raft_log(
        &mut out,
        LogPositions {
            last_log: raft.last_log_index,
            committed: raft.local_committed.as_ref().map(|id| id.index),
            applied: raft.last_applied.as_ref().map(|id| id.index),
            snapshot: raft.snapshot.as_ref().map(|id| id.index),
            purged: raft.purged.as_ref().map(|id| id.index),
        },
    );
    write_apply_and_snapshots(&mut out, apply);
    write_agent_streams(&mut out, &state.hub);
    write_raft_latency(&mut out, &state, apply);
    write_fleet(&mut out, &state);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

/// One unlabelled family: its help, its type (`gauge`, `counter`), its value.
fn metric(out: &mut String, name: &str, help: &str, kind: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

fn write_raft_role(out: &mut String, state: &ApiState, term: u64, is_leader: bool) {
    metric(
        out,
        "llmgw_raft_term",
        "Current Raft term.",
        "gauge",
        term as f64,
    );
    metric(
        out,
        "llmgw_raft_is_leader",
        "1 when this peer is the Raft leader.",
        "gauge",
        f64::from(u8::from(is_leader)),
    );
    metric(
        out,
        "llmgw_raft_leader_changes_total",
        "Leader changes this peer observed.",
        "counter",
        state
            .control
            .counters()
            .leader_changes
            .load(Ordering::Relaxed) as f64,
    );
}

/// Indexes in this peer's Raft log; `None` for one it does not have yet.
struct LogPositions {
    last_log: Option<u64>,
    committed: Option<u64>,
    applied: Option<u64>,
    snapshot: Option<u64>,
    purged: Option<u64>,
}

/// The log positions, -1 for those this peer does not have yet.
fn write_raft_log(out: &mut String, positions: LogPositions) {
    let index = |id: Option<u64>| id.map_or(-1.0, |i| i as f64);
    metric(
        out,
        "llmgw_raft_last_log_index",
        "Index of the last entry in this peer's log.",
        "gauge",
        index(positions.last_log),
    );
    metric(
        out,
        "llmgw_raft_commit_index",
        "Highest log index known committed.",
        "gauge",
        index(positions.committed),
    );
    metric(
        out,
        "llmgw_raft_apply_index",
        "Highest log index applied to the state machine.",
        "gauge",
        index(positions.applied),
    );
    metric(
        out,
        "llmgw_raft_snapshot_index",
        "Last log index covered by the latest snapshot.",
        "gauge",
        index(positions.snapshot),
    );
    metric(
        out,
        "llmgw_raft_purged_index",
        "Last log index removed from this peer's log (a follower further behind needs a snapshot).",
        "gauge",
        index(positions.purged),
    );
}

fn write_apply_and_snapshots(out: &mut String, apply: &ApplyStats) {
    metric(
        out,
        "llmgw_raft_applied_entries_total",
        "Log entries applied to the state machine since start.",
        "counter",
        apply.entries.load(Ordering::Relaxed) as f64,
    );
    metric(
        out,
        "llmgw_raft_snapshots_installed_total",
        "Snapshots received from a leader and installed.",
        "counter",
        apply.snapshots_installed.load(Ordering::Relaxed) as f64,
    );
    metric(
        out,
        "llmgw_raft_snapshot_bytes",
        "Size of the last snapshot this peer built or installed.",
        "gauge",
        apply.snapshot_bytes.load(Ordering::Relaxed) as f64,
    );
    let seconds = |nanos: &AtomicU64| nanos.load(Ordering::Relaxed) as f64 / 1e9;
    metric(
        out,
        "llmgw_raft_snapshot_build_seconds",
        "How long building (encoding and storing) the last snapshot took.",
        "gauge",
        seconds(&apply.snapshot_build_nanos),
    );
    metric(
        out,
        "llmgw_raft_snapshot_install_seconds",
        "How long installing the last snapshot received from a leader took.",
        "gauge",
        seconds(&apply.snapshot_install_nanos),
    );
}

fn write_agent_streams(out: &mut String, hub: &Hub) {
    metric(
        out,
        "llmgw_agent_streams",
        "Agent streams open on this peer (the leader holds them all).",
        "gauge",
        hub.connected() as f64,
    );
    metric(
        out,
        "llmgw_agent_commands_sent_total",
        "Start, stop and drain commands sent to agents by this peer.",
        "counter",
        hub.commands_sent.load(Ordering::Relaxed) as f64,
    );
    metric(
        out,
        "llmgw_agent_command_refusals_total",
        "Commands agents refused (stale leader term, validation).",
        "counter",
        hub.refusals_total.load(Ordering::Relaxed) as f64,
    );
}

/// How long applying committed entries and syncing the log take.
fn write_raft_latency(out: &mut String, state: &ApiState, apply: &ApplyStats) {
    summary(
        out,
        "llmgw_raft_apply_seconds",
        "Time spent applying batches of committed entries.",
        [&apply.nanos_total, &apply.batches, &apply.nanos_max],
    );
    let syncs = state.control.log_sync_stats();
    summary(
        out,
        "llmgw_raft_log_sync_seconds",
        "Synced (fsynced) writes of the Raft log and vote: what a peer waits for before it acknowledges.",
        [&syncs.nanos_total, &syncs.syncs, &syncs.nanos_max],
    );
    summary(
        out,
        "llmgw_raft_acknowledged_record_sync_seconds",
        "The part of each synced log write spent recording what it acknowledged (a second synced block that lets a torn WAL tail be told from damage).",
        [
            &syncs.record_nanos_total,
            &syncs.syncs,
            &syncs.record_nanos_max,
        ],
    );
}

/// Nodes by status and replicas by state, from this peer's applied state.
fn write_fleet(out: &mut String, state: &ApiState) {
    let (nodes, replicas) = state.control.read(super::fleet::counts);
    let _ = writeln!(out, "# HELP llmgw_nodes Registered GPU nodes by status.");
    let _ = writeln!(out, "# TYPE llmgw_nodes gauge");
    for status in ["ready", "unreachable", "lost"] {
        let n = nodes.get(status).copied().unwrap_or(0);
        let _ = writeln!(out, "llmgw_nodes{{status=\"{status}\"}} {n}");
    }
    let _ = writeln!(out, "# HELP llmgw_replicas Model replicas by state.");
    let _ = writeln!(out, "# TYPE llmgw_replicas gauge");
    for (replica_state, n) in &replicas {
        let _ = writeln!(out, "llmgw_replicas{{state=\"{replica_state}\"}} {n}");
    }
}

/// A summary (`_sum`, `_count`) and its `_max` gauge, from nanosecond
/// counters: total, count, max.
fn summary(out: &mut String, name: &str, help: &str, [total, count, max]: [&AtomicU64; 3]) {
    let seconds = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 / 1e9;
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} summary");
    let _ = writeln!(out, "{name}_sum {}", seconds(total));
    let _ = writeln!(out, "{name}_count {}", count.load(Ordering::Relaxed));
    let _ = writeln!(
        out,
        "# HELP {name}_max The slowest since this peer started."
    );
    let _ = writeln!(out, "# TYPE {name}_max gauge");
    let _ = writeln!(out, "{name}_max {}", seconds(max));
}
