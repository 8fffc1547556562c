//! strata's node layer: what makes separate machines one cluster.
//!
//! - [`key`]: the cluster key and what is derived from it (TLS authority, MACs, fingerprint).
//! - [`identity`]: a node's stable id, host name and addresses.
//! - [`profile`]: a node's self-description and speed measurements.
//! - [`control`]: the zenoh control plane: discovery, membership, leader election, state and
//!   link probes.
//! - [`instances`]: the leader's table of model instances and how a node runs its ranks.
//! - `transfer`: models copied between nodes, verified against the catalog.
//! - [`daemon`]: `strata node`: the control plane, state publishing, link measurement and the
//!   node's HTTP API.
#![warn(missing_docs)]

pub mod control;
pub mod daemon;
mod error;
#[cfg(target_os = "macos")]
pub mod host;
pub mod identity;
pub mod instances;
pub mod key;
pub mod linkprobe;
pub mod process;
pub mod profile;
mod shard_fetch;
pub(crate) mod transfer;

pub use control::{Control, ControlConfig, LinkReport, NodeState, Snapshot};
pub use error::{Error, Result};
pub use key::ClusterKey;
pub use profile::Profile;
