//! What a peer sends is checked before openraft sees it. openraft trusts
//! its peers: entries out of order, a log id newer than the sender's own
//! vote, or a snapshot that contradicts what this peer committed trip
//! assertions inside its core, and a snapshot whose data does not decode
//! fails the state machine, which openraft treats as fatal. Anything
//! holding a peer certificate (or any client, with `insecure: true`) could
//! send such a message; it is refused here with the reason instead.

use llmgw_state::FleetState;
use llmgw_store::TypeConfig;
use openraft::alias::{LogIdOf, SnapshotMetaOf, VoteOf};
use openraft::raft::AppendEntriesRequest;
use openraft::vote::RaftLeaderId;

/// Entries are consecutive from `prev_log_id`, and neither they nor
/// `prev_log_id` claim a leader newer than the sender's vote.
pub fn check_append(rpc: &AppendEntriesRequest<TypeConfig>) -> Result<(), String> {
    let sender = rpc.vote.leader_id().to_committed();
    if let Some(prev) = &rpc.prev_log_id
        && *prev.committed_leader_id() > sender
    {
        return Err(format!(
            "append: prev_log_id {prev} is newer than the sender's vote {}",
            rpc.vote
        ));
    }
    let first = rpc.prev_log_id.as_ref().map_or(0, |prev| prev.index + 1);
    let mut previous: Option<&LogIdOf<TypeConfig>> = rpc.prev_log_id.as_ref();
    for (expected, entry) in (first..).zip(&rpc.entries) {
        let id = &entry.log_id;
        if id.index != expected {
            return Err(format!(
                "append: entry {id} is not at index {expected}: entries must follow prev_log_id \
                 without gaps"
            ));
        }
        if *id.committed_leader_id() > sender {
            return Err(format!(
                "append: entry {id} is newer than the sender's vote {}",
                rpc.vote
            ));
        }
        if let Some(before) = previous
            && id.committed_leader_id() < before.committed_leader_id()
        {
            return Err(format!(
                "append: entry {id} comes after {before}, which has a newer leader"
            ));
        }
        previous = Some(id);
    }
    Ok(())
}

/// The snapshot names the log id it covers, no newer than the sender's
/// vote, does not contradict what this peer committed, and its data is a
/// fleet state.
pub fn check_snapshot(
    vote: &VoteOf<TypeConfig>,
    meta: &SnapshotMetaOf<TypeConfig>,
    data: &[u8],
    committed: Option<&LogIdOf<TypeConfig>>,
) -> Result<(), String> {
    let Some(last) = &meta.last_log_id else {
        return Err("snapshot: meta names no last log id".to_owned());
    };
    if *last.committed_leader_id() > vote.leader_id().to_committed() {
        return Err(format!(
            "snapshot: last log id {last} is newer than the sender's vote {vote}"
        ));
    }
    if let Some(committed) = committed
        && last > committed
        && last.index <= committed.index
    {
        return Err(format!(
            "snapshot: last log id {last} contradicts this peer's committed {committed} \
             (a newer leader at the same or a lower index)"
        ));
    }
    serde_json::from_slice::<FleetState>(data)
        .map(|_| ())
        .map_err(|e| format!("snapshot: data does not decode as a fleet state: {e}"))
}

#[cfg(test)]
mod tests {
    use llmgw_state::Command;
    use llmgw_store::Entry;
    use openraft::entry::RaftEntry;

    use super::*;

    type Vote = VoteOf<TypeConfig>;
    type LogId = LogIdOf<TypeConfig>;

    fn log_id(term: u64, leader: u64, index: u64) -> LogId {
        LogId::new(
            openraft::vote::leader_id_adv::LeaderId::new(term, leader).to_committed(),
            index,
        )
    }

    fn entry(term: u64, leader: u64, index: u64) -> Entry {
        Entry::new_normal(log_id(term, leader, index), Command::Unknown)
    }

    fn append(prev: Option<LogId>, entries: Vec<Entry>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(5, 2),
            prev_log_id: prev,
            entries,
            leader_commit: None,
        }
    }

    #[test]
    fn appends_out_of_order_or_from_the_future_are_refused() {
        let ok = append(
            Some(log_id(4, 1, 9)),
            vec![entry(4, 1, 10), entry(5, 2, 11)],
        );
        assert_eq!(check_append(&ok), Ok(()));
        assert_eq!(check_append(&append(None, vec![entry(5, 2, 0)])), Ok(()));

        let gap = append(Some(log_id(4, 1, 9)), vec![entry(4, 1, 11)]);
        assert!(check_append(&gap).unwrap_err().contains("not at index 10"));
        let future = append(Some(log_id(4, 1, 9)), vec![entry(6, 1, 10)]);
        assert!(
            check_append(&future)
                .unwrap_err()
                .contains("newer than the sender's vote")
        );
        let future_prev = append(Some(log_id(7, 3, 9)), vec![]);
        assert!(
            check_append(&future_prev)
                .unwrap_err()
                .contains("prev_log_id")
        );
        let backwards = append(None, vec![entry(5, 2, 0), entry(4, 1, 1)]);
        assert!(
            check_append(&backwards)
                .unwrap_err()
                .contains("newer leader")
        );
    }

    #[test]
    fn snapshots_that_would_trip_openraft_or_the_state_machine_are_refused() {
        let vote = Vote::new_committed(5, 2);
        let state = serde_json::to_vec(&FleetState::default()).unwrap();
        let meta = |last: Option<LogId>| SnapshotMetaOf::<TypeConfig> {
            last_log_id: last,
            last_membership: Default::default(),
        };
        let fine = meta(Some(log_id(5, 2, 40)));
        assert_eq!(check_snapshot(&vote, &fine, &state, None), Ok(()));
        assert!(
            check_snapshot(&vote, &fine, b"{not json", None)
                .unwrap_err()
                .contains("does not decode")
        );
        assert!(
            check_snapshot(&vote, &meta(None), &state, None)
                .unwrap_err()
                .contains("no last log id")
        );
        assert!(
            check_snapshot(&vote, &meta(Some(log_id(6, 1, 40))), &state, None)
                .unwrap_err()
                .contains("newer than the sender's vote")
        );
        let committed = log_id(3, 1, 50);
        assert!(
            check_snapshot(&vote, &fine, &state, Some(&committed))
                .unwrap_err()
                .contains("contradicts")
        );
    }
}
