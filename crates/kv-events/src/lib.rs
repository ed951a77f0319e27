//! The KV-cache events engines publish with `--kv-events-config`, and the
//! ZMQ links that carry them.
//!
//! * [`decode_batch`] reads every shape in use (vLLM 0.11's positional
//!   arrays, vLLM 0.34's and SGLang's tagged maps); [`encode_batch`] writes
//!   each of them for the simulator.
//! * [`Publisher`] plays an engine's PUB and replay sockets; [`Subscriber`]
//!   is a router's connection to one engine rank, gaps replayed.
//! * The ZeroMQ wire protocol is spoken natively ([`zmtp`]): two socket
//!   pairs over TCP need a few hundred lines, not a C library.

mod decode;
mod encode;
mod event;
mod publisher;
mod subscriber;
pub mod zmtp;

pub use decode::{DecodeError, Decoded, decode_batch};
pub use encode::encode_batch;
pub use event::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent, WireShape};
pub use publisher::{END_OF_REPLAY, Publisher, PublisherConfig};
pub use subscriber::{Delivery, Endpoints, Subscriber};
