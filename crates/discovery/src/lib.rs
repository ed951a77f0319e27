//! What a GPU node has: GPUs, how they are linked, and its InfiniBand or
//! RoCE ports, checked against the fabrics agent.yaml declares.
//!
//! [`discover`] tries, in order, a fixture (simulated nodes only), NVML,
//! `nvidia-smi`, and finally reports no GPUs, recording which source was
//! used and why the others were skipped. Fabric identity is never inferred
//! from the wire: fabrics come from agent.yaml, and discovery only checks
//! that their HCAs exist and are up.

mod discover;
mod fixture;
mod infiniband;
mod inventory;
mod nvidia_smi;
mod nvml;

pub use discover::discover;
pub use fixture::Fixture;
pub use infiniband::{check_fabrics, parse_rate, parse_state, read_ports};
pub use inventory::{FabricStatus, Gpu, GpuLink, GpuSource, HcaPort, Inventory, normalize_bus_id};
pub use llmgw_topology::LinkKind;
pub use nvidia_smi::{NvidiaSmiError, QUERY_ARGS, parse_query, parse_topology};
