//! Placement of model replicas on GPUs, as a pure function.
//!
//! [`place`] takes the fleet as the scheduler sees it ([`NodeView`]s) and a
//! [`Request`] (the model's profiles in order, where its other replicas are,
//! nodes to avoid) and returns a [`Placement`] or an [`Explanation`] with a
//! count per reason for every profile tried. No clock, no randomness, no I/O:
//! the same input gives the same answer, and the leader commits the answer
//! to Raft rather than re-running it on followers.
//!
//! [`Placer`] gives the same answers for many placements in a row, each
//! seeing the ones before, re-evaluating only what a placement changed.
//!
//! Inside a node the best-connected GPU set wins (all-NVLink before PCIe
//! paths). A multi-node replica lands on one fabric only, never on a node
//! without one. Replicas of one model spread across nodes and `rack` labels.

mod explain;
mod fleet;
mod place;
mod placer;

pub use explain::{Explanation, FabricShortfall, ProfileExplanation, Reason};
pub use fleet::{
    GpuView, LinkView, NodeHealth, NodeView, Placement, Request, ShardPlacement, Siblings, Strategy,
};
pub use llmgw_topology::LinkKind;
pub use place::{best_gpu_set, place};
pub use placer::Placer;
