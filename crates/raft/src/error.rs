use llmgw_state::Rejection;

/// Why a write, read or membership change did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// The state machine refused the command; nothing changed.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// No leader is known or reachable now; retry shortly.
    #[error("no Raft leader is available: {0}")]
    NoLeader(String),
    /// The leader changed while the write was in flight, or took it and
    /// heard no majority in time; it may or may not have been committed.
    #[error("the write's outcome is unknown: {0}")]
    Ambiguous(String),
    /// The write was committed at `index`, but this peer had not applied
    /// it when the wait ran out (a slow disk, a long catch-up). It happened
    /// and will apply here too; only read-your-writes on this peer could
    /// not be promised in time. HTTP 202.
    #[error("committed at log index {index}, but not yet applied on this peer: {why}")]
    CommittedNotApplied { index: u64, why: String },
    /// A request the cluster cannot accept (e.g. a retired peer id).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    /// The data directory (of this peer, or of the leader) is below its
    /// free-space reserve; reads still work. HTTP 507.
    #[error("{0}")]
    DiskFull(String),
    /// The Raft node stopped.
    #[error("the Raft node stopped: {0}")]
    Fatal(String),
}
