//! Proposing many leader decisions at once: they travel in batches, so a
//! round that places thousands of replicas, or a fleet reporting at once,
//! costs a few log entries and synced writes instead of thousands.

use futures::StreamExt;
use llmgw_raft::{ControlError, ControlPlane, MAX_ENTRY_BYTES, entry_bytes, now_ms};
use llmgw_state::Command;

/// Commands per log entry.
const BATCH: usize = 256;
/// Bytes of commands per log entry: the entry bound, less room for the
/// envelope (`Decided`, `Batch`).
pub(crate) const BATCH_BYTES: usize = MAX_ENTRY_BYTES - (64 << 10);
/// Batches in flight at once.
const IN_FLIGHT: usize = 4;

/// Who stands behind a set of commands.
#[derive(Debug, Clone, Copy)]
pub enum Author {
    /// The leader of this term decided them from its own view; they are
    /// dropped once it no longer leads that term (never forwarded).
    Leader(u64),
    /// Facts an agent reported; whoever leads may commit them.
    Agent,
}

/// Proposes `commands`, batched. A failure is logged (the next round or
/// report decides again); the answer says whether every batch committed.
pub async fn propose_all(control: &ControlPlane, author: Author, commands: Vec<Command>) -> bool {
    let batches = runs(commands, BATCH, BATCH_BYTES, entry_bytes);
    futures::stream::iter(batches)
        .map(|mut chunk| async move {
            let what = match chunk.as_slice() {
                [one] => one.to_string(),
                many => format!("a batch of {}", many.len()),
            };
            let written = match author {
                Author::Leader(term) => control.propose_as_leader(term, chunk).await,
                Author::Agent => {
                    let command = if chunk.len() == 1 {
                        chunk.remove(0)
                    } else {
                        Command::Batch {
                            commands: chunk,
                            at_ms: now_ms(),
                        }
                    };
                    control.write(command).await
                }
            };
            match written {
                Ok(_) => true,
                // A leader's decisions are refused whole only when its
                // leadership was superseded: nothing of them happened.
                Err(ControlError::Rejected(rejection)) if matches!(author, Author::Leader(_)) => {
                    tracing::info!(%rejection, "{what} was dropped");
                    false
                }
                Err(ControlError::Rejected(rejection)) => {
                    tracing::debug!(%rejection, "{what} was refused; the next round decides again");
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, "{what} did not commit");
                    false
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .fold(true, |all, ok| async move { all && ok })
        .await
}

/// `items` in order, cut into runs of at most `count` items and `bytes`
/// bytes by `size`. An item over `bytes` alone is a run of its own (the
/// log refuses it, naming its size; the others still go).
pub(crate) fn runs<T>(
    items: Vec<T>,
    count: usize,
    bytes: usize,
    size: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    let mut runs: Vec<Vec<T>> = Vec::new();
    let mut run_bytes = 0;
    for item in items {
        let item_bytes = size(&item);
        match runs.last_mut() {
            Some(run) if run.len() < count && run_bytes + item_bytes <= bytes => {
                run_bytes += item_bytes;
                run.push(item);
            }
            _ => {
                run_bytes = item_bytes;
                runs.push(vec![item]);
            }
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_hold_to_both_the_count_and_the_bytes() {
        let sizes = vec![400, 400, 400, 100, 100, 100, 100, 2000, 10];
        let cut = runs(sizes, 3, 1000, |s| *s);
        assert_eq!(
            cut,
            vec![
                vec![400, 400],
                vec![400, 100, 100],
                vec![100, 100],
                vec![2000],
                vec![10]
            ]
        );
        assert!(runs(Vec::<usize>::new(), 3, 1000, |s| *s).is_empty());
    }
}
