//! strata's data plane: how ranks of one model instance move activations between them.
//!
//! A [`Communicator`] holds this rank's links to every other rank, over TCP (any hosts;
//! TCP_NODELAY, persistent connections, length-framed messages after a versioned handshake) or
//! shared memory (ranks on one host; the lowest-latency path, standing in for RDMA). The
//! handshake proves the session token both ways and agrees on per-connection keys; every
//! message after it is sealed with AES-256-GCM under a counter nonce, so data between ranks is
//! private, and altered, replayed or dropped frames fail the link ([`Error::Auth`]). A link
//! emulator ([`LinkShape`]) adds latency and caps bandwidth inside the transport, so slow
//! networks can be studied on one machine. On top sit point-to-point messages and the
//! collectives tensor and pipeline parallelism need: all-reduce (sum), all-gather, broadcast.
//!
//! The mesh is built by [`coordinate`] (rank 0) and [`join`] (every other rank).
#![warn(missing_docs)]

mod bootstrap;
mod clock;
mod collectives;
mod comm;
mod error;
pub mod fuzz;
mod handshake;
mod link;
mod probe;
mod seal;
mod shape;
mod shm_place;

pub use bootstrap::{
    MeshConfig, SHM_RING_BYTES, Transport, coordinate, join, loopback_pair, new_token,
};
pub use collectives::RING_MIN_BYTES;
pub use comm::{CommStats, Communicator};
pub use error::{Error, Result};
pub use handshake::PROTOCOL_VERSION;
pub use probe::{
    LinkFigures, OVERHEAD_READ, ProbeSize, answer_probe, exchange_overhead, probe_link,
};
pub use seal::{MAX_MESSAGE, sealing_cost};
pub use shape::{LinkShape, parse_bandwidth, parse_latency};
