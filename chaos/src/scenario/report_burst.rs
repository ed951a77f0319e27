//! A burst of maximum-size agent reports under a fleet, with a follower
//! paused so that catching it up afterwards takes the largest appends the
//! log allows. Registrations of nodes that do not exist arrive at once
//! from the harness, each with its own node certificate: half just under
//! the registration bound (accepted, the largest entries a registration
//! group makes), half at the agent message cap (refused by their size).
//! Writes keep flowing through the burst, and the paused follower catches
//! up (the run's closing checks compare every peer's state). Without the
//! bounds, such a burst left registrations uncommitted and cost the
//! leader its leadership.

use std::time::{Duration, Instant};

use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_proto::agent::agent_service_client::AgentServiceClient;
use llmgw_proto::agent::control_message::Body as Down;
use llmgw_proto::agent::{AgentMessage, Register};
use llmgw_tls::{Identity, Tls};
use tokio_stream::StreamExt;

use super::ctx::{promise, write_through};
use super::{Ctx, ScenarioError};
use crate::fleet::Subject;
use crate::history::Outcome;
use crate::invariants::Checked;
use crate::linearizability::RegOp;

pub const BURST_REPORTS_ANSWERED: &str = "burst-reports-answered-by-size";
pub const BURST_WRITES_FLOWED: &str = "burst-writes-kept-flowing";

/// Nodes whose registration is just under the bound.
const ACCEPTED: usize = 24;
/// Nodes whose registration is at the agent message cap.
const OVERSIZED: usize = 24;
/// Labels per registration (the most a registration may carry).
const LABELS: usize = 64;
/// Bytes per label value: 64 of them, with their names, just under the
/// 256 KiB a registration may take.
const ACCEPTED_LABEL_BYTES: usize = 4_040;
/// Bytes per label value: 64 of them make 3 MiB, under the 4 MiB agent
/// message cap.
const OVERSIZED_LABEL_BYTES: usize = 48 << 10;
/// How long every registration of the burst has to be answered.
const ANSWERED_WITHIN: Duration = Duration::from_secs(60);
/// How long the first write after the burst may take.
const WRITE_WITHIN: Duration = Duration::from_secs(15);
/// How long from the burst's start the admin writes are counted (the
/// paused follower resumes after it).
const FLOW_WINDOW: Duration = Duration::from_secs(12);
/// The pace of the two extra writers that never send to the paused peer:
/// the base load's, so that the burst, not the load, is the fault.
const WRITER_PAUSE: Duration = Duration::from_millis(30);
/// Fewer admin writes to the live peers than this in `FLOW_WINDOW` prove
/// nothing (two paced writers take several a second even under the
/// burst).
const MIN_WRITES_DURING_BURST: usize = 15;

pub(super) async fn max_size_reports(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    let behind = ctx.pick(&followers);
    let senders = prepare_senders(ctx)?;
    for (node, _, _) in &senders {
        ctx.open_window(Subject::Node(node.clone()), false);
    }
    // The base load's workers wait out their 12 s timeout whenever they
    // pick the paused peer; these never do, so the writes counted show
    // what the live majority takes.
    ctx.start_writers_avoiding(2, Some(behind), WRITER_PAUSE);
    ctx.pause(behind);
    let from_us = ctx.history.now_us();
    ctx.fault(format!(
        "{ACCEPTED} registrations of ~{} KiB and {OVERSIZED} of {} MiB at once to leader {leader}",
        (LABELS * ACCEPTED_LABEL_BYTES) >> 10,
        (LABELS * OVERSIZED_LABEL_BYTES) >> 20
    ));
    let endpoint = llmgw_tls::endpoint(&ctx.cluster.grpc(leader)).map_err(ScenarioError::Setup)?;
    let mut burst = tokio::task::JoinSet::new();
    for (node, label_bytes, tls) in senders {
        let endpoint = endpoint.clone();
        burst.spawn(async move {
            let answer = register(&endpoint, &tls, &node, label_bytes).await;
            (node, label_bytes, answer)
        });
    }
    let started = Instant::now();
    let mut answers = Vec::new();
    while let Ok(Some(joined)) = tokio::time::timeout(
        ANSWERED_WITHIN.saturating_sub(started.elapsed()),
        burst.join_next(),
    )
    .await
    {
        if let Ok(answer) = joined {
            answers.push(answer);
        }
    }
    burst.abort_all();
    ctx.fault(format!(
        "{} of {} registrations answered in {:.1}s",
        answers.len(),
        ACCEPTED + OVERSIZED,
        started.elapsed().as_secs_f64()
    ));
    let write = write_after_burst(ctx, leader).await;
    // The follower stays paused for the whole window, so that the load's
    // writes are counted while the one live follower takes the burst.
    tokio::time::sleep(FLOW_WINDOW.saturating_sub(started.elapsed())).await;
    let to_us = ctx.history.now_us();
    ctx.resume(behind);
    let redirected = answers
        .iter()
        .filter(|(_, _, answer)| deferred(answer))
        .count();
    promise(
        ctx,
        BURST_REPORTS_ANSWERED,
        format!(
            "{ACCEPTED} registrations under the bound ({redirected} told to dial again), \
             {OVERSIZED} over it"
        ),
        answered_by_size(&answers),
    );
    let taken = ctx
        .history
        .ops()
        .into_iter()
        .filter(|op| op.invoke_us >= from_us && op.complete_us <= to_us && op.peer != behind)
        .filter(|op| matches!(op.op, RegOp::Write(_)) && matches!(op.outcome, Outcome::Ok(_)))
        .count();
    ctx.stop_burst().await;
    ctx.extra_checks
        .push(writes_flowed(write, taken, from_us, to_us));
    for node in answers.iter().map(|(node, _, _)| node.clone()) {
        ctx.close_window(&Subject::Node(node));
    }
    ctx.hold(4000, 6000).await;
    Ok(())
}

/// One node certificate per sender, made before the burst so that the
/// burst itself is only registrations.
fn prepare_senders(ctx: &Ctx) -> Result<Vec<(String, usize, Tls)>, ScenarioError> {
    let accepted = (0..ACCEPTED).map(|i| (format!("burst-max-{i}"), ACCEPTED_LABEL_BYTES));
    let oversized = (0..OVERSIZED).map(|i| (format!("burst-over-{i}"), OVERSIZED_LABEL_BYTES));
    accepted
        .chain(oversized)
        .map(|(node, label_bytes)| {
            let files = ctx.cluster.node_tls(&node)?;
            let tls = Tls::load(files, Identity::Node(node.clone()))
                .map_err(|e| ScenarioError::Setup(format!("node {node}'s certificate: {e}")))?;
            Ok((node, label_bytes, tls))
        })
        .collect()
}

/// Registers `node` with `LABELS` labels of `label_bytes` each; the
/// leader's first answer, or its refusal.
async fn register(
    endpoint: &tonic::transport::Endpoint,
    tls: &Tls,
    node: &str,
    label_bytes: usize,
) -> Result<Down, tonic::Status> {
    let labels = (0..LABELS)
        .map(|l| (format!("label-{l}"), "x".repeat(label_bytes)))
        .collect();
    let register = AgentMessage {
        body: Some(Up::Register(Register {
            node_id: node.to_owned(),
            mgmt_addr: "127.0.0.1".into(),
            labels,
            ..Register::default()
        })),
    };
    // Not `unavailable`: a leader that cannot be reached defers nothing.
    let channel = llmgw_tls::connect(endpoint, Some(tls))
        .await
        .map_err(|e| tonic::Status::unknown(format!("cannot connect: {e}")))?;
    let mut answers = AgentServiceClient::new(channel)
        .max_encoding_message_size(8 << 20)
        .connect(tokio_stream::iter([register]).chain(tokio_stream::pending()))
        .await?
        .into_inner();
    match answers.message().await? {
        Some(message) => message
            .body
            .ok_or_else(|| tonic::Status::internal("an answer with no body")),
        None => Err(tonic::Status::aborted("the stream ended unanswered")),
    }
}

/// Whether `answer` tells an agent to come back later rather than
/// refusing what it sent: a redirect with its reason, or `unavailable`
/// (a leader whose lease lapsed for a moment under the burst drops the
/// decision in flight). Agents dial again after either.
fn deferred(answer: &Result<Down, tonic::Status>) -> bool {
    match answer {
        Ok(Down::Redirect(redirect)) => !redirect.reason.is_empty(),
        Err(status) => status.code() == tonic::Code::Unavailable,
        Ok(_) => false,
    }
}

/// Every registration under the bound was registered or deferred (see
/// [`deferred`]); every one over it was refused naming the bound; none
/// went unanswered.
fn answered_by_size(
    answers: &[(String, usize, Result<Down, tonic::Status>)],
) -> Result<(), String> {
    let mut wrong = Vec::new();
    for (node, label_bytes, answer) in answers {
        let oversized = *label_bytes == OVERSIZED_LABEL_BYTES;
        match (oversized, answer) {
            (false, Ok(Down::Registered(_))) => {}
            (false, answer) if deferred(answer) => {}
            (true, Err(status))
                if status.code() == tonic::Code::InvalidArgument
                    && status.message().contains("at most 256 KiB") => {}
            (_, Ok(other)) => wrong.push(format!("{node}: answered {other:?}")),
            (_, Err(status)) => {
                wrong.push(format!("{node}: {:?} {}", status.code(), status.message()))
            }
        }
    }
    let registered = answers
        .iter()
        .filter(|(_, bytes, answer)| {
            *bytes != OVERSIZED_LABEL_BYTES && matches!(answer, Ok(Down::Registered(_)))
        })
        .count();
    if registered == 0 {
        wrong.push("no registration under the bound was registered".to_owned());
    }
    let unanswered = ACCEPTED + OVERSIZED - answers.len();
    if unanswered > 0 {
        wrong.push(format!(
            "{unanswered} registrations not answered within {ANSWERED_WITHIN:?}"
        ));
    }
    if wrong.is_empty() {
        return Ok(());
    }
    let more = wrong.len().saturating_sub(5);
    wrong.truncate(5);
    if more > 0 {
        wrong.push(format!("... {more} more"));
    }
    Err(wrong.join("; "))
}

/// A write through the leader after the burst is taken within
/// `WRITE_WITHIN`; `Err` holds the last answer.
async fn write_after_burst(ctx: &mut Ctx, leader: u64) -> Result<Duration, String> {
    let taken = write_through(ctx, leader, "chaos-after-burst", WRITE_WITHIN).await;
    if let Ok(took) = &taken {
        ctx.fault(format!(
            "a write after the burst taken in {:.2}s",
            took.as_secs_f64()
        ));
    }
    taken
}

fn writes_flowed(
    write: Result<Duration, String>,
    taken: usize,
    from_us: u64,
    to_us: u64,
) -> Checked {
    let mut violations: Vec<String> = write.err().into_iter().collect();
    if taken < MIN_WRITES_DURING_BURST {
        violations.push(format!(
            "only {taken} admin writes taken during the burst, fewer than the \
             {MIN_WRITES_DURING_BURST} that show writes flowing"
        ));
    }
    Checked::new(
        BURST_WRITES_FLOWED,
        format!(
            "{taken} admin writes taken by the live peers from {:.1}s to {:.1}s, and a write after the burst",
            from_us as f64 / 1e6,
            to_us as f64 / 1e6
        ),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmgw_proto::agent::{Redirect, Registered};

    #[test]
    fn the_two_sizes_straddle_the_registration_bound() {
        let size = |label_bytes: usize| {
            let register = Register {
                node_id: "burst-max-23".into(),
                mgmt_addr: "127.0.0.1".into(),
                labels: (0..LABELS)
                    .map(|l| (format!("label-{l}"), "x".repeat(label_bytes)))
                    .collect(),
                ..Register::default()
            };
            prost::Message::encoded_len(&register)
        };
        let bound = 256 << 10;
        let accepted = size(ACCEPTED_LABEL_BYTES);
        assert!(
            accepted <= bound && accepted > bound - (4 << 10),
            "{accepted}"
        );
        let oversized = size(OVERSIZED_LABEL_BYTES);
        assert!(oversized > bound && oversized < 4 << 20, "{oversized}");
    }

    #[test]
    fn a_registration_answered_against_its_size_or_not_at_all_is_reported() {
        let registered = || Ok(Down::Registered(Registered::default()));
        let refused = || {
            Err(tonic::Status::invalid_argument(
                "a registration may be at most 256 KiB",
            ))
        };
        let mut answers: Vec<_> = (0..ACCEPTED)
            .map(|i| (format!("burst-max-{i}"), ACCEPTED_LABEL_BYTES, registered()))
            .chain(
                (0..OVERSIZED)
                    .map(|i| (format!("burst-over-{i}"), OVERSIZED_LABEL_BYTES, refused())),
            )
            .collect();
        assert_eq!(answered_by_size(&answers), Ok(()));

        answers[1].2 = Ok(Down::Redirect(Redirect {
            reason: "peer 1 leads term 1 but no majority of peers has answered it for 0.9s".into(),
            ..Redirect::default()
        }));
        assert_eq!(
            answered_by_size(&answers),
            Ok(()),
            "a redirect with its reason"
        );

        answers[2].2 = Err(tonic::Status::unavailable("peer 1 no longer leads term 1"));
        assert_eq!(
            answered_by_size(&answers),
            Ok(()),
            "unavailable: dial again"
        );

        answers[0].2 = Err(tonic::Status::invalid_argument(
            "a registration may be at most 256 KiB",
        ));
        answers[ACCEPTED].2 = registered();
        answers.pop();
        let all_deferred: Vec<_> = answers
            .iter()
            .map(|(node, bytes, answer)| {
                let deferred = || Err(tonic::Status::unavailable("peer 1 no longer leads term 1"));
                let kept = if *bytes == ACCEPTED_LABEL_BYTES {
                    deferred()
                } else {
                    answer.clone()
                };
                (node.clone(), *bytes, kept)
            })
            .collect();
        assert!(
            answered_by_size(&all_deferred)
                .unwrap_err()
                .contains("no registration under the bound was registered")
        );

        let wrong = answered_by_size(&answers).unwrap_err();
        assert!(wrong.contains("burst-max-0: InvalidArgument"), "{wrong}");
        assert!(
            wrong.contains("burst-over-0: answered Registered"),
            "{wrong}"
        );
        assert!(wrong.contains("1 registrations not answered"), "{wrong}");
    }

    #[test]
    fn writes_flowed_needs_the_write_after_and_enough_writes_during() {
        assert!(
            writes_flowed(Ok(Duration::from_millis(80)), MIN_WRITES_DURING_BURST, 0, 1)
                .violations
                .is_empty()
        );
        let stalled = writes_flowed(Err("no write".into()), 2, 0, 1);
        assert_eq!(stalled.violations.len(), 2, "{:?}", stalled.violations);
    }
}
