//! Log messages another program reads: the chaos suite's invariants find
//! these in the peers' and agents' logs. The writer logs the constant and
//! the reader looks for it, so rewording one cannot silently blind the
//! other; anything that varies goes in the line's fields, never the text.

/// A leader's liveness check moved a node to another status (fields
/// `node`, `from`, `to`).
pub const NODE_STATUS_CHANGED: &str = "node status changed";

/// A peer that no longer leads closed the agent streams it held (fields
/// `term`, `closed`, `why`).
pub const AGENT_STREAMS_RELEASED: &str =
    "no longer leading the fleet; closed the agent streams so agents find the leader";

/// An agent's stream to the control plane ended (fields `peer`, `why`).
pub const CONTROL_PLANE_STREAM_LOST: &str = "control-plane stream lost";

/// An agent's registration was accepted: its stream to the leader is open
/// (fields `peer`, `node`).
pub const AGENT_REGISTERED: &str = "stream open; registered";

/// An agent stopped waiting on a peer that went silent and looks for the
/// leader through the others (fields `peer`, `why`).
pub const CONTROL_PLANE_PEER_SILENT: &str =
    "leaving a silent peer; finding the leader through the others";
