//! Errors of the GGUF reader: each names the field or tensor that was wrong and what was expected,
//! so a corrupt download reads as one clear line rather than a panic deep in the engine.

use std::path::PathBuf;

/// Everything that can go wrong while opening or querying a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// File that failed.
        path: PathBuf,
        /// Underlying OS error.
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// Only versions 2 and 3 (64-bit counts) are supported.
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// A read ran past the end of the file.
    #[error(
        "file truncated while reading {what} at byte {offset} (need {need} bytes, file has {len})"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Where the read started.
        offset: u64,
        /// Bytes needed from `offset`.
        need: u64,
        /// File length.
        len: u64,
    },
    /// A header count or length is impossible for the file's size.
    #[error("{what} is {value}, impossible for a file of {len} bytes")]
    ImplausibleCount {
        /// Which count.
        what: String,
        /// Its value.
        value: u64,
        /// File length.
        len: u64,
    },
    /// A string is not UTF-8.
    #[error("{what}: string is not valid UTF-8")]
    BadUtf8 {
        /// Which string.
        what: String,
    },
    /// A metadata value type tag is unknown.
    #[error("metadata {key}: unknown value type {tag}")]
    BadValueType {
        /// Key of the value.
        key: String,
        /// The tag found.
        tag: u32,
    },
    /// Arrays nested deeper than the format needs.
    #[error("metadata {key}: arrays nested too deeply")]
    NestingTooDeep {
        /// Key of the value.
        key: String,
    },
    /// The same metadata key or tensor name appears twice.
    #[error("duplicate {what} {name:?}")]
    Duplicate {
        /// "metadata key" or "tensor".
        what: &'static str,
        /// The duplicated name.
        name: String,
    },
    /// A tensor uses a ggml type this build does not know.
    #[error("tensor {name}: unsupported tensor type {type_id}")]
    UnsupportedTensorType {
        /// Tensor name.
        name: String,
        /// Raw ggml type id.
        type_id: u32,
    },
    /// A tensor's shape is invalid.
    #[error("tensor {name}: invalid shape {dims:?} ({why})")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Dimensions as stored.
        dims: Vec<u64>,
        /// What is wrong.
        why: &'static str,
    },
    /// A tensor's data does not lie inside the file, or is misaligned.
    #[error("tensor {name}: {why}")]
    BadTensorData {
        /// Tensor name.
        name: String,
        /// What is wrong, with the numbers.
        why: String,
    },
    /// `general.alignment` is not a power of two.
    #[error("general.alignment is {0}, expected a non-zero power of two")]
    BadAlignment(u64),
    /// A metadata key the caller needs is absent.
    #[error("metadata key {0} is missing")]
    MissingKey(String),
    /// A metadata value has a different type than the caller needs.
    #[error("metadata key {key}: expected {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// Type wanted.
        expected: &'static str,
        /// Type found.
        found: &'static str,
    },
    /// A tensor the caller needs is absent.
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    /// A part of a split model is missing, misnamed or of another set.
    #[error("{}: {why}", path.display())]
    Split {
        /// The part.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
