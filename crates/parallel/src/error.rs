//! Errors of sharded execution.

/// What can go wrong planning, loading or running a sharded model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plan cannot be made (too many ranks for the model, bad weights, ...).
    #[error("cannot plan the shards: {0}")]
    Plan(String),
    /// A link or collective failed.
    #[error(transparent)]
    Net(#[from] strata_net::Error),
    /// The engine failed (loading a shard, a forward step).
    #[error(transparent)]
    Engine(#[from] strata_engine::Error),
    /// The model file failed to open.
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    /// Another rank reported a failure.
    #[error("rank {rank}: {message}")]
    Remote {
        /// The rank.
        rank: usize,
        /// Its error.
        message: String,
    },
    /// A message did not fit the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl From<Error> for strata_engine::EngineError {
    /// A model failure stays one (a full context is the request's fault, not the ranks');
    /// everything else is the ranks' or their links'.
    fn from(e: Error) -> Self {
        match e {
            Error::Engine(m) => strata_engine::EngineError::Model(m),
            other => strata_engine::EngineError::Ranks(Box::new(other)),
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
