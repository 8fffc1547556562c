//! The crate's one error type. Loading errors name the metadata key or token that was wrong and
//! what was expected, so a bad GGUF reads as one clear line; encoding errors are rare (a model
//! that wants BOS but has none) because any `&str` can be tokenized.

/// Everything that can go wrong while loading a tokenizer or chat template, or using them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A metadata key is missing or has the wrong type.
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] strata_gguf::Error),

    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error(
        "unsupported tokenizer model {model:?} (supported: \"gpt2\" (BPE), \"llama\" (SentencePiece))"
    )]
    UnsupportedModel {
        /// The value of `tokenizer.ggml.model`.
        model: String,
    },

    /// `tokenizer.ggml.pre` names a pre-tokenizer whose split rules are not implemented.
    #[error("unsupported pre-tokenizer tokenizer.ggml.pre = {pre:?} (supported: {supported})")]
    UnsupportedPre {
        /// The value of `tokenizer.ggml.pre` (empty if absent).
        pre: String,
        /// The supported names, comma-separated.
        supported: String,
    },

    /// A per-token array does not have one entry per token.
    #[error("{key} has {found} entries, expected {expected} (one per token)")]
    LengthMismatch {
        /// The metadata key.
        key: &'static str,
        /// Its length.
        found: usize,
        /// The number of tokens.
        expected: usize,
    },

    /// Two tokens have the same text, so text → id would be ambiguous (llama.cpp rejects this too).
    #[error("tokenizer.ggml.tokens: token {second} has the same text {text:?} as token {first}")]
    DuplicateToken {
        /// The text.
        text: String,
        /// The first id with it.
        first: u32,
        /// The second id with it.
        second: u32,
    },

    /// The vocabulary is too large for 32-bit token ids.
    #[error("tokenizer.ggml.tokens has {0} entries, more than 32-bit token ids can address")]
    VocabTooLarge(usize),

    /// The BPE model or pre-tokenizer could not be built or run.
    #[error("BPE tokenizer: {0}")]
    Bpe(String),

    /// The model asks for BOS/EOS to be added but does not define that token.
    #[error(
        "the model adds {which} to prompts (tokenizer.ggml.add_{which}_token) but defines no {which} token"
    )]
    MissingSpecial {
        /// `"bos"` or `"eos"`.
        which: &'static str,
    },

    /// The chat template failed to compile or to render (including `raise_exception` calls).
    #[error("chat template: {0}")]
    Template(#[from] minijinja::Error),
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
