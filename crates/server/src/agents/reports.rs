//! Shard statuses from agents become replicated shard states. Only the
//! node a shard is assigned to may report on it, and only changes are
//! written.

use std::collections::HashMap;
use std::time::Duration;

use llmgw_raft::{ControlPlane, now_ms};
use llmgw_state::{Command, FleetState};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::service::Report;
use llmgw_agent_wire::{failure, shard_state};

/// Where reports go: the replicated state they are checked against and
/// the log they are written to.
trait Ledger {
    /// The commands `reports` make, read against the current state.
    fn commands<'a>(&self, reports: impl Iterator<Item = &'a Report>) -> Vec<Command>;
    /// Writes `commands`; false when some did not commit.
    async fn write(&self, commands: Vec<Command>) -> bool;
    /// Another peer leads: the reports are its to take, and agents report
    /// there once they find it.
    fn another_leads(&self) -> bool;
}

impl Ledger for ControlPlane {
    fn commands<'a>(&self, reports: impl Iterator<Item = &'a Report>) -> Vec<Command> {
        self.read(|fleet| reports.filter_map(|r| to_command(fleet, r)).collect())
    }

    async fn write(&self, commands: Vec<Command>) -> bool {
        crate::propose::propose_all(self, crate::propose::Author::Agent, commands).await
    }

    fn another_leads(&self) -> bool {
        self.leader().is_some_and(|(id, _)| id != self.id())
    }
}

/// The first wait before reports that did not commit are tried again, and
/// the longest (the wait doubles while writes keep failing).
const FIRST_RETRY: Duration = Duration::from_millis(250);
const LAST_RETRY: Duration = Duration::from_secs(8);

/// Runs until the channel closes. An agent sends each status once, so a
/// report whose write failed (a lease lapsing for a moment, a full disk, a
/// slow commit) is tried again until it commits; otherwise a stop or a
/// drain would wait for it forever. Reports are dropped only once another
/// peer leads: agents find it and tell it from their registrations.
pub async fn write_reports(control: ControlPlane, reports: mpsc::UnboundedReceiver<Report>) {
    write_reports_to(&control, reports).await;
}

async fn write_reports_to(ledger: &impl Ledger, mut reports: mpsc::UnboundedReceiver<Report>) {
    let mut batch = Vec::new();
    // The latest report per node and shard not yet written. Keyed by node
    // too: a node naming another's shard (refused later) must not displace
    // that node's own report.
    let mut pending: HashMap<(String, String), Report> = HashMap::new();
    let mut retry_after = FIRST_RETRY;
    // Set while writes fail: reports that arrive before it join the
    // pending ones and wait with them, so a leader that cannot commit
    // tries at the pace of its backoff, not at the pace agents report.
    let mut retry_at: Option<Instant> = None;
    loop {
        let wait = reports.recv_many(&mut batch, 4096);
        let received = match retry_at {
            None => Some(wait.await),
            Some(due) => tokio::time::timeout_at(due, wait).await.ok(),
        };
        if received == Some(0) {
            return;
        }
        for report in batch.drain(..) {
            let key = (report.node.clone(), report.status.shard_id.clone());
            pending.insert(key, report);
        }
        if retry_at.is_some_and(|due| Instant::now() < due) {
            continue;
        }
        if ledger.another_leads() {
            pending.clear();
            retry_at = None;
            continue;
        }
        let commands = ledger.commands(pending.values());
        if ledger.write(commands).await {
            pending.clear();
            retry_after = FIRST_RETRY;
            retry_at = None;
        } else {
            retry_at = Some(Instant::now() + retry_after);
            retry_after = (retry_after * 2).min(LAST_RETRY);
        }
    }
}

fn to_command(fleet: &FleetState, report: &Report) -> Option<Command> {
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
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A log that refuses its first `failures` writes and records what it
    /// was asked.
    struct FlakyLedger {
        failures: AtomicUsize,
        writes: AtomicUsize,
        asked: Mutex<Vec<Vec<(String, String)>>>,
    }

    impl FlakyLedger {
        fn failing(failures: usize) -> Self {
            FlakyLedger {
                failures: AtomicUsize::new(failures),
                writes: AtomicUsize::new(0),
                asked: Mutex::new(Vec::new()),
            }
        }
    }

    impl Ledger for FlakyLedger {
        fn commands<'a>(&self, reports: impl Iterator<Item = &'a Report>) -> Vec<Command> {
            let mut keys: Vec<(String, String)> = reports
                .map(|r| (r.node.clone(), r.status.shard_id.clone()))
                .collect();
            keys.sort();
            let commands = vec![Command::Unknown; keys.len()];
            self.asked.lock().unwrap().push(keys);
            commands
        }

        async fn write(&self, _commands: Vec<Command>) -> bool {
            self.writes.fetch_add(1, Ordering::SeqCst);
            self.failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                })
                .is_err()
        }

        fn another_leads(&self) -> bool {
            false
        }
    }

    fn report(node: &str, shard: &str) -> Report {
        Report {
            node: node.into(),
            status: llmgw_proto::agent::ShardStatus {
                shard_id: shard.into(),
                ..Default::default()
            },
        }
    }

    /// Feeds `reports` to the writer and runs it until `ledger` has seen
    /// `writes` writes (or ten seconds passed), then closes the channel.
    async fn run_until(ledger: &FlakyLedger, reports: Vec<Report>, writes: usize) {
        let (tx, rx) = mpsc::unbounded_channel();
        for report in reports {
            tx.send(report).unwrap();
        }
        let watch = async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while ledger.writes.load(Ordering::SeqCst) < writes
                && std::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(tx);
        };
        tokio::join!(write_reports_to(ledger, rx), watch);
    }

    #[tokio::test]
    async fn a_report_whose_write_failed_is_written_again_until_it_commits() {
        let ledger = FlakyLedger::failing(2);
        run_until(&ledger, vec![report("n1", "r1-r0")], 3).await;
        assert_eq!(ledger.writes.load(Ordering::SeqCst), 3);
        let asked = ledger.asked.lock().unwrap();
        let once = vec![("n1".to_owned(), "r1-r0".to_owned())];
        assert_eq!(*asked, [once.clone(), once.clone(), once]);
    }

    #[tokio::test]
    async fn reports_arriving_while_writes_fail_wait_for_the_backoff() {
        // No write commits: 40 reports arrive over about 400 ms.
        let ledger = FlakyLedger::failing(usize::MAX);
        let (tx, rx) = mpsc::unbounded_channel();
        let arrivals = async move {
            for i in 0..40 {
                tx.send(report("n1", &format!("r{i}-r0"))).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let started = std::time::Instant::now();
        tokio::join!(write_reports_to(&ledger, rx), arrivals);
        let writes = ledger.writes.load(Ordering::SeqCst);
        // One write at once, then one when each wait of the backoff ends
        // (250 ms, then 500 ms, ...), not one per arrival.
        let mut due = Vec::new();
        let (mut at, mut wait) = (Duration::ZERO, FIRST_RETRY);
        while at < started.elapsed() {
            due.push(at);
            at += wait;
            wait = (wait * 2).min(LAST_RETRY);
        }
        assert!(
            writes <= due.len(),
            "{writes} writes in {:?} for 40 reports; the backoff allows {}",
            started.elapsed(),
            due.len()
        );
        // The last attempt carried every report that had arrived by then.
        let asked = ledger.asked.lock().unwrap();
        assert!(asked.last().unwrap().len() > 1, "{asked:?}");
    }

    #[tokio::test]
    async fn a_node_naming_another_nodes_shard_does_not_displace_its_report() {
        let ledger = FlakyLedger::failing(0);
        let reports = vec![report("owner", "r1-r0"), report("other", "r1-r0")];
        run_until(&ledger, reports, 1).await;
        let asked = ledger.asked.lock().unwrap();
        assert_eq!(asked.len(), 1);
        assert_eq!(
            asked[0],
            [
                ("other".to_owned(), "r1-r0".to_owned()),
                ("owner".to_owned(), "r1-r0".to_owned())
            ]
        );
    }

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
