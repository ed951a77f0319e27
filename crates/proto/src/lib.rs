//! Wire types of llmgw's two gRPC services, generated from `proto/` at build
//! time: the agent stream (`agent`) and the Raft peer transport (`raft`).
//!
//! Nothing else lives here; conversions to domain types belong to the crates
//! that own those types.

#![allow(clippy::all, unreachable_pub, rust_2018_idioms)]

pub mod agent {
    tonic::include_proto!("llmgw.agent.v1");
}

pub mod raft {
    tonic::include_proto!("llmgw.raft.v1");
}
