//! Errors of the engine: a model that cannot be run here, a shard that does not fit the model, or
//! a request that does not fit the context.

/// Everything that can go wrong while loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The GGUF file is malformed or lacks something the architecture needs.
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    /// A weight has a format or shape the kernels cannot use.
    #[error("{tensor}: {source}")]
    Kernel {
        /// The tensor.
        tensor: String,
        /// What the kernels said.
        source: strata_kernels::Error,
    },
    /// The architecture named in `general.architecture` is not implemented.
    #[error("unsupported architecture {arch:?} (supported: {supported})")]
    UnsupportedArchitecture {
        /// The architecture the file names.
        arch: String,
        /// The ones this engine runs.
        supported: String,
    },
    /// Hyper-parameters are inconsistent (e.g. head count does not divide the width).
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// The shard specification does not fit the model.
    #[error("invalid shard: {0}")]
    InvalidShard(String),
    /// The prompt plus the tokens to generate do not fit the context window.
    #[error("context overflow: {needed} tokens needed, context holds {limit}")]
    ContextOverflow {
        /// Tokens the request needs.
        needed: usize,
        /// Context size.
        limit: usize,
    },
    /// An empty prompt (nothing to condition on).
    #[error("empty prompt: at least one token is needed")]
    EmptyPrompt,
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// Memory for the KV cache could not be reserved.
    #[error(
        "cannot allocate a KV cache of {bytes} bytes for {n_ctx} positions (try a smaller --ctx-size)"
    )]
    CacheTooLarge {
        /// Positions asked for.
        n_ctx: usize,
        /// Bytes that would be needed.
        bytes: u128,
    },
    /// A tensor-parallel exchange with other ranks failed.
    #[error("exchange with other ranks failed")]
    Collective(#[source] crate::CommError),
    /// Tokenizer or chat template failure.
    #[error(transparent)]
    Tokenizer(#[from] strata_tokenizer::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
