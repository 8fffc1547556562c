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
    /// Another live node already held this node's id when this one joined.
    #[error(
        "another live node, {other}, has this node's id {id}: its state directory was copied \
         here, or both were started with one --state-dir. Remove {}, or give this node its \
         own --state-dir, and start it again",
        state_dir.join("node-id").display()
    )]
    IdTaken {
        /// The id.
        id: String,
        /// The node that holds it (name, host, API address).
        other: String,
        /// This node's state directory.
        state_dir: PathBuf,
    },
    /// An instance could not be planned, loaded or run.
    #[error("{0}")]
    Instance(String),
    /// The model file could not be read.
    #[error(transparent)]
    Model(#[from] strata_gguf::Error),
    /// The engine refused the model (its configuration, its shard).
    #[error(transparent)]
    Engine(#[from] strata_engine::Error),
    /// The model's tokenizer or chat template could not be read.
    #[error(transparent)]
    Tokenizer(#[from] strata_tokenizer::Error),
    /// The model does not fit the nodes asked for.
    #[error(transparent)]
    Placement(#[from] strata_cluster::PlacementError),
    /// The ranks of a sharded instance could not be started or joined.
    #[error(transparent)]
    Ranks(#[from] strata_parallel::Error),
    /// The data plane between the ranks could not be set up.
    #[error(transparent)]
    DataPlane(#[from] strata_net::Error),
    /// The instance's API could not start.
    #[error(transparent)]
    Api(#[from] strata_api::StartError),
    /// The model store failed.
    #[error(transparent)]
    Store(Box<strata_store::Error>),
    /// A model could not be fetched, copied from a peer or installed.
    #[error("{model}: {source}")]
    Fetch {
        /// The model asked for.
        model: String,
        /// Why.
        source: Box<strata_store::Error>,
    },
    /// A process or socket of an instance could not be made.
    #[error("{what}: {source}")]
    System {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A message from a peer was malformed.
    #[error("malformed message from {peer}: {why}")]
    Message {
        /// The sender, as far as known.
        peer: String,
        /// Why it was refused.
        why: String,
    },
}

impl From<strata_store::Error> for Error {
    fn from(e: strata_store::Error) -> Error {
        Error::Store(Box::new(e))
    }
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// An I/O failure of an instance's process or socket, saying what was being done.
    pub(crate) fn system(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::System { what, source }
    }

    pub(crate) fn control(e: impl std::fmt::Display) -> Error {
        Error::Control(e.to_string())
    }
}

/// Results of the node layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;
