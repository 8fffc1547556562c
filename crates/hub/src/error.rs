//! The crate's one error type: every message is one complete line that names the repository or
//! file and says what to do.

use std::io;
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong finding or fetching a model on the hub.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The reference is not of the form `hf:OWNER/REPO[:QUANT][@REV]`.
    #[error("{0}")]
    BadReference(String),
    /// The hub knows no such repository (or hides a private one from this token).
    #[error(
        "{repo}: no such model repository on {endpoint}{}",
        if *token { " that this token can see" } else { " (if it is private, set HF_TOKEN or --hf-token-file)" }
    )]
    RepoNotFound {
        /// `owner/name`.
        repo: String,
        /// The hub's address.
        endpoint: String,
        /// Whether a token was sent.
        token: bool,
    },
    /// A gated repository and no token, or a token without access.
    #[error("{repo} is gated: {}", if *token {
        format!("this token has no access to it; accept its terms at {endpoint}/{repo} with the token's account")
    } else {
        format!("accept its terms at {endpoint}/{repo}, then set HF_TOKEN or --hf-token-file to a token of that account")
    })]
    Gated {
        /// `owner/name`.
        repo: String,
        /// The hub's address.
        endpoint: String,
        /// Whether a token was sent.
        token: bool,
    },
    /// The token was refused outright.
    #[error("{endpoint} refused the token (HTTP 401); check HF_TOKEN or --hf-token-file")]
    BadToken {
        /// The hub's address.
        endpoint: String,
    },
    /// No such branch, tag or commit.
    #[error("{repo} has no revision '{revision}'")]
    RevisionNotFound {
        /// `owner/name`.
        repo: String,
        /// What was asked for.
        revision: String,
    },
    /// The repository has no such file, or no GGUF matching the reference.
    #[error("{0}")]
    NoSuchModel(String),
    /// A split set on the hub lacks parts.
    #[error("{repo}: the split set {first} lacks {}", missing.join(", "))]
    MissingParts {
        /// `owner/name@rev`.
        repo: String,
        /// Its first part.
        first: String,
        /// The parts' names that are missing.
        missing: Vec<String>,
    },
    /// An HTTP answer that is none of the above, after retries when retrying made sense.
    #[error("{url}: HTTP {status}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Http {
        /// The URL (without query, which may carry signatures).
        url: String,
        /// The status.
        status: u16,
        /// The server's message, shortened.
        message: String,
    },
    /// The server could not be reached or the connection failed, after retries.
    #[error("{url}: {message}")]
    Network {
        /// The URL (without query).
        url: String,
        /// What failed.
        message: String,
    },
    /// The server answered something this client cannot read.
    #[error("{url}: unexpected answer: {message}")]
    Protocol {
        /// The URL (without query).
        url: String,
        /// What was wrong.
        message: String,
    },
    /// Not enough free space for the bytes still to fetch.
    #[error(
        "not enough space in {}: {file} needs {} more, {} free; free some space or set HF_HUB_CACHE to a larger disk",
        dir.display(), human(*need), human(*free)
    )]
    NoSpace {
        /// The cache folder.
        dir: PathBuf,
        /// The file.
        file: String,
        /// Bytes still to write.
        need: u64,
        /// Bytes free.
        free: u64,
    },
    /// A downloaded file's SHA-256 differs from what the hub publishes.
    #[error(
        "{file}: downloaded bytes have SHA-256 {got}, the hub publishes {expected}; the partial download was deleted, pull again"
    )]
    HashMismatch {
        /// `owner/name/path`.
        file: String,
        /// The hub's hash.
        expected: String,
        /// What the bytes hash to.
        got: String,
    },
    /// A file-system operation failed.
    #[error("{action} {}: {error}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// To what.
        path: PathBuf,
        /// The error.
        error: io::Error,
    },
}

/// `n` bytes as a person reads them, in binary units (`1.5 GiB`).
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Adds the path and action to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn at(self, action: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, action: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|error| Error::Io {
            action,
            path: path.into(),
            error,
        })
    }
}
