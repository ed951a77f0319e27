//! The leader's reconciliation (design sections 6 and 7) as pure
//! functions: [`decide`] turns the catalog's desired replicas, node health
//! and drains into the commands one round proposes, and
//! [`desired_by_node`] derives what every node should run, drain or stop.
//! No clock, no I/O: the server's loop supplies the time and proposes the
//! commands, and `fleet-bench` calls the same `decide` in process.

pub mod autoscale;
mod fleet_view;
mod plan;
mod specs;

pub use fleet_view::{held_gpus, node_views, take_survivor_gpus};
pub use plan::{Memory, PlanSettings, decide};
pub use specs::{
    Desired, KvEventAddresses, Order, desired_by_node, desired_for_node, endpoint,
    kv_event_addresses, managed_models, outdated,
};

#[cfg(test)]
mod tests;
