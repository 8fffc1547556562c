//! `strata-hub`: models from the Hugging Face hub, into the hub's own cache.
//!
//! A reference (`hf:OWNER/REPO[:QUANT][@REVISION]`, [`HubRef`]) names a repository and which
//! of its GGUFs to run ([`pick`]: by quantisation tag, by path, or the only one; every part of
//! a split set together). [`Hub::pull`] asks the hub which commit the revision is and which
//! files it holds, fetches the chosen files into the cache ([`HubCache`], the layout the
//! hub's clients share, so their downloads are used as they are and strata's serve them), and
//! checks each against the SHA-256 the hub publishes.
//!
//! Why not the `hf-hub` crate: it fetches a file as one stream into a temporary file, while
//! strata fetches ranges (several at once, resumable from a record of the ranges held, and
//! later only the ranges a node's shard needs, some of them from peers). Those need the
//! ranged transfer this crate is built around; the hub protocol itself is four requests.
//!
//! Nothing here knows strata's own store: this crate is beside `strata-gguf` at the bottom.

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![deny(unused_must_use, unsafe_op_in_unsafe_fn)]

mod cache;
mod client;
mod download;
mod error;
pub mod pick;
mod ranges;
mod reference;
mod remove;
mod sparse;
mod verify;

use std::path::{Path, PathBuf};

pub use cache::HubCache;
pub use client::{Entry, Retry, Token};
pub use download::{FileEvent, Held, Transfer};
pub use error::{Error, Result, human};
pub use ranges::RangeSet;
pub use reference::{HubRef, SCHEME};
pub use remove::Removed;
pub use sparse::Sparse;
pub use verify::{Check, FileCheck};

use client::Client;
use error::IoContext;

/// The hub's address when `HF_ENDPOINT` does not name another.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// What a pull reports while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HubEvent<'a> {
    /// Asking the hub what the reference names.
    Resolving {
        /// `owner/repo@revision`.
        what: &'a str,
    },
    /// The files the reference names, and how many of their bytes are not yet in the cache.
    Plan {
        /// Number of files (parts).
        files: usize,
        /// Their bytes in all.
        bytes: u64,
        /// Bytes of files not complete in the cache.
        missing: u64,
    },
    /// One file's progress.
    File(FileEvent<'a>),
}

/// The chosen files of a reference, as the hub lists them.
#[derive(Debug, Clone)]
pub struct Remote {
    /// `owner/name`.
    pub repo: String,
    /// The commit the revision stands for.
    pub commit: String,
    /// The model's files, in part order.
    pub files: Vec<Entry>,
}

/// A model now complete in the cache.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The commit fetched.
    pub commit: String,
    /// Each file's path in the snapshot, in part order (the first is the one to open).
    pub paths: Vec<PathBuf>,
    /// Bytes of all its files.
    pub size: u64,
    /// Bytes this pull took from the network.
    pub fetched: u64,
}

/// A hub, its token and the cache its files go to.
#[derive(Debug, Clone)]
pub struct Hub {
    client: Client,
    cache: HubCache,
    transfer: Transfer,
}

/// The token file this process was told to use ([`use_token_file`]).
static TOKEN_FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Makes `path` (a `--hf-token-file`) this process's token file, ahead of `HF_TOKEN`, for
/// every hub built from the environment afterwards; a second call is ignored. A front end
/// calls this once, before anything builds a store: the token then reaches every path that
/// pulls (run, serve, a node's loads) without being passed through each, and never appears on
/// a command line other than as a file name.
pub fn use_token_file(path: PathBuf) {
    let _ = TOKEN_FILE.set(path);
}

/// Where a token comes from, first match wins: the file given (or set by
/// [`use_token_file`]), then `HF_TOKEN`, then the file the hub's own CLI writes at login (`HF_TOKEN_PATH`, else
/// `$HF_HOME/token`, else `~/.cache/huggingface/token`).
pub fn token_from_env(token_file: Option<&Path>) -> Result<Option<Token>> {
    if let Some(path) = token_file.or(TOKEN_FILE.get().map(PathBuf::as_path)) {
        let text = std::fs::read_to_string(path).at("reading the token file", path)?;
        return Token::new(&text).map(Some).ok_or_else(|| Error::Io {
            action: "reading a token from",
            path: path.to_path_buf(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, "the file is empty"),
        });
    }
    if let Some(t) = std::env::var("HF_TOKEN").ok().and_then(|t| Token::new(&t)) {
        return Ok(Some(t));
    }
    let var = |n: &str| {
        std::env::var_os(n)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let login = var("HF_TOKEN_PATH")
        .or_else(|| var("HF_HOME").map(|h| h.join("token")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/token")));
    Ok(login
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| Token::new(&t)))
}

/// Whether `HF_HUB_OFFLINE` is set to a true value (`1`, `true`, `yes`, `on`).
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

impl Hub {
    /// A hub at `endpoint` with an optional token, writing to `cache`.
    pub fn new(endpoint: &str, token: Option<Token>, cache: HubCache) -> Hub {
        Hub {
            client: Client::new(endpoint, token, Retry::default()),
            cache,
            transfer: Transfer::default(),
        }
    }

    /// The hub `HF_ENDPOINT` names (else the public one), with the token [`token_from_env`]
    /// finds and the cache [`HubCache::from_env`] names; `None` without a cache location, or
    /// when `HF_HUB_OFFLINE` says to use the cache alone (as the hub's own clients do).
    pub fn from_env(token_file: Option<&Path>) -> Result<Option<Hub>> {
        if offline() {
            return Ok(None);
        }
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = token_from_env(token_file)?;
        Ok(HubCache::from_env().map(|cache| Hub::new(&endpoint, token, cache)))
    }

    /// The same hub with another transfer setting.
    pub fn with_transfer(mut self, transfer: Transfer) -> Hub {
        self.transfer = transfer;
        self
    }

    /// The same hub with another retry setting.
    pub fn with_retry(mut self, retry: Retry) -> Hub {
        self.client.retry = retry;
        self
    }

    /// The hub's address.
    pub fn endpoint(&self) -> &str {
        &self.client.endpoint
    }

    /// The cache files go to.
    pub fn cache(&self) -> &HubCache {
        &self.cache
    }

    /// Asks the hub which commit and files `r` names.
    pub fn remote(&self, r: &HubRef) -> Result<Remote> {
        let commit = self.client.revision(&r.repo, &r.revision)?;
        let entries = self.client.tree(&r.repo, &commit)?;
        let names: Vec<String> = entries.iter().map(|e| e.path.clone()).collect();
        let models = pick::models(&names);
        let what = r.what();
        let model = pick::choose(&models, &r.pick, &what).map_err(Error::NoSuchModel)?;
        let missing = pick::missing_parts(model);
        if !missing.is_empty() {
            return Err(Error::MissingParts {
                repo: what,
                first: model.first.clone(),
                missing,
            });
        }
        let files = model
            .files
            .iter()
            .filter_map(|f| entries.iter().find(|e| &e.path == f).cloned())
            .collect();
        Ok(Remote {
            repo: r.repo.clone(),
            commit,
            files,
        })
    }

    /// Makes the files `r` names complete and checked in the cache, fetching what is missing.
    pub fn pull(&self, r: &HubRef, on_event: &mut dyn FnMut(HubEvent<'_>)) -> Result<Pulled> {
        on_event(HubEvent::Resolving { what: &r.what() });
        let remote = self.remote(r)?;
        let size = remote.files.iter().map(|e| e.size).sum();
        let missing = remote
            .files
            .iter()
            .filter(|e| {
                std::fs::metadata(self.cache.blob(&remote.repo, e.etag()))
                    .map_or(true, |m| m.len() != e.size)
            })
            .map(|e| e.size)
            .sum();
        on_event(HubEvent::Plan {
            files: remote.files.len(),
            bytes: size,
            missing,
        });
        let mut fetched = 0;
        let mut paths = Vec::new();
        for entry in &remote.files {
            let job = download::Job {
                repo: &remote.repo,
                commit: &remote.commit,
                entry,
            };
            let (_, n) =
                download::fetch(&self.client, &self.cache, &job, self.transfer, &mut |e| {
                    on_event(HubEvent::File(e))
                })?;
            fetched += n;
            paths.push(
                self.cache
                    .link(&remote.repo, &remote.commit, &entry.path, entry.etag())?,
            );
        }
        self.cache
            .set_ref(&remote.repo, &r.revision, &remote.commit)?;
        tracing::info!(model = %r.id(), commit = %remote.commit, fetched, "pulled");
        Ok(Pulled {
            commit: remote.commit,
            paths,
            size,
            fetched,
        })
    }
}
