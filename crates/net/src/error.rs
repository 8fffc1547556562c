//! Errors of the data plane. Every variant names the peer rank involved, so a failure several
//! hops away still reaches the user as "rank 2 ...", not as a bare I/O error.

use std::time::Duration;

/// What can go wrong between ranks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket or mapping operation failed.
    #[error("{what} (rank {peer}): {source}")]
    Io {
        /// The rank at the other end (or this rank, for local operations).
        peer: usize,
        /// What was being done.
        what: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The peer closed its end: its process exited or the link broke.
    #[error("rank {peer} closed the link (its process exited or the connection broke)")]
    PeerClosed {
        /// The rank.
        peer: usize,
    },
    /// The peer sent nothing, not even a heartbeat, for longer than the link timeout.
    #[error(
        "rank {peer} has been silent for {waited:.1?} (no data, no heartbeat): its link is broken or its process is frozen"
    )]
    Timeout {
        /// The rank.
        peer: usize,
        /// How long this rank waited.
        waited: Duration,
    },
    /// Setting up the rank mesh failed (wrong token, version, world size, rank taken, ...).
    #[error("handshake: {0}")]
    Handshake(String),
    /// A peer sent something that does not fit the protocol.
    #[error("protocol error with rank {peer}: {what}")]
    Protocol {
        /// The rank.
        peer: usize,
        /// What was wrong.
        what: String,
    },
    /// A record on a protected link did not authenticate: it was altered, replayed, reordered
    /// or dropped in transit, or the peer holds other keys. Nothing of it was delivered.
    #[error(
        "data from rank {peer} failed authentication ({what}): it was altered, replayed, reordered or dropped in transit; nothing of it was used"
    )]
    Auth {
        /// The rank.
        peer: usize,
        /// Which check failed.
        what: &'static str,
    },
    /// A peer announced a message longer than any the protocol sends (refused before anything
    /// was allocated for it).
    #[error(
        "rank {peer} announced a message of {len} bytes, more than the largest the protocol sends ({max} bytes)"
    )]
    Oversized {
        /// The rank.
        peer: usize,
        /// The announced length.
        len: u64,
        /// The largest allowed.
        max: usize,
    },
    /// A link speed or latency could not be parsed.
    #[error("invalid link setting {0:?}")]
    BadLinkSetting(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io(peer: usize, what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { peer, what, source }
}
