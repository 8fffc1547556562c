//! Errors of the node layer.

use std::path::{Path, PathBuf};

/// What can go wrong in the node layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The cluster key file is malformed.
    #[error("bad cluster key: {0}")]
    BadKey(String),
    /// Certificates could not be made.
    #[error("making TLS certificates: {0}")]
    Tls(String),
    /// The control plane failed.
    #[error("control plane: {0}")]
    Control(String),
    /// An instance could not be planned, loaded or run.
    #[error("{0}")]
    Instance(String),
    /// A message from a peer was malformed.
    #[error("malformed message from {peer}: {why}")]
    Message {
        /// The sender, as far as known.
        peer: String,
        /// Why it was refused.
        why: String,
    },
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn control(e: impl std::fmt::Display) -> Error {
        Error::Control(e.to_string())
    }
}

/// Results of the node layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;
