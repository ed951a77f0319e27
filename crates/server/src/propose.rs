//! Proposing many leader decisions at once: they travel in batches, so a
//! round that places thousands of replicas, or a fleet reporting at once,
//! costs a few log entries and synced writes instead of thousands.

use futures::StreamExt;
use llmgw_raft::{ControlError, ControlPlane, now_ms};
use llmgw_state::Command;

/// Commands per log entry.
const BATCH: usize = 256;
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
    let mut batches = Vec::new();
    let mut commands = commands.into_iter().peekable();
    while commands.peek().is_some() {
        let chunk: Vec<Command> = commands.by_ref().take(BATCH).collect();
        batches.push(chunk);
    }
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
