//! The model store: where models live on disk and the operations on them.
//!
//! Layout under the root (`$STRATA_HOME`, default `~/.cache/strata`):
//!
//! ```text
//! models/<id>/<file_name>   installed, verified model files (only ever created by rename)
//! models/<id>/card.toml     the card of a model imported from a local file (see `import.rs`)
//! locks/<id>.lock           per-model lock files (see `install`)
//! tmp/                      temp files and download directories of pulls in progress
//! ```
//!
//! Pulling lives in `install.rs`, importing local files in `import.rs`; this module has
//! construction, lookup, resolution of a user's model spec, listing, verification and removal.

use std::ffi::OsString;
use std::fmt;
use std::io::ErrorKind;
use std::path::{MAIN_SEPARATOR, Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use strata_hub::{FileEvent, Hub, HubEvent, HubRef};

use crate::card::{IMPORT_CARD_FILE, ModelCard};
use crate::catalog::{Catalog, DEFAULT_MODEL_ID};
use crate::digest::check_file;
use crate::elsewhere::{Elsewhere, is_elsewhere};
use crate::error::{Error, IoContext, Result};
use crate::fetch::{Fetcher, PipFetcher};
use crate::import::with_imports;
use crate::progress::PullEvent;

/// A directory of verified model files, a catalog of what can go in it, and a way to fetch.
#[derive(Clone)]
pub struct Store {
    root: PathBuf,
    pub(crate) catalog: Catalog,
    pub(crate) fetcher: Arc<dyn Fetcher>,
    /// Whether an import may hard-link its file (else it always copies). Always true outside
    /// tests, which turn it off to exercise the copy on a single file system.
    pub(crate) link_imports: bool,
    /// Where other tools keep the models they downloaded (`hf:`, `ollama:`, `lmstudio:` ids).
    elsewhere: Elsewhere,
    /// The Hugging Face hub `hf:` ids not in its cache are pulled from (none: cache only).
    hub: Option<Hub>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.root)
            .field("catalog", &self.catalog.ids().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// A catalog model and its state in a store, as `strata models list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelStatus {
    /// The model's card.
    #[serde(flatten)]
    pub card: ModelCard,
    /// Where the file is, or would be once pulled.
    pub path: PathBuf,
    /// Whether the file is installed (exists with the card's size).
    pub present: bool,
    /// Whether this is the default model.
    #[serde(rename = "default")]
    pub is_default: bool,
    /// Whether the model was imported from a local file (`strata models import`) rather than
    /// being a built-in catalog model.
    pub imported: bool,
}

/// What a model spec given by a user resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// The GGUF file to load (absolute).
    pub path: PathBuf,
    /// The catalog card, or `None` for a local file given by path.
    pub card: Option<ModelCard>,
}

impl Store {
    /// A store rooted at `root`, with the built-in catalog plus the models imported under
    /// `root`, fetching with pip (`$STRATA_PYTHON` or `python3`). Nothing is created on disk
    /// until it is needed.
    ///
    /// The imports are read once, here: a store sees imports made by other processes after it
    /// was built only if it is built again (every CLI command and every node request builds
    /// its own). An unreadable or invalid import card is skipped with a warning on stderr.
    pub fn new(root: impl Into<PathBuf>) -> Store {
        let root = root.into();
        Store {
            catalog: with_imports(Catalog::builtin(), &root),
            root,
            fetcher: Arc::new(PipFetcher::from_env()),
            link_imports: true,
            elsewhere: Elsewhere::default(),
            hub: None,
        }
    }

    /// The shared store: `$STRATA_HOME` if set, else `$HOME/.cache/strata`; models other tools
    /// downloaded are found where those tools keep them ([`Elsewhere::from_env`]), and `hf:`
    /// ids not in the hub cache are pulled from the hub `HF_ENDPOINT` names
    /// ([`Hub::from_env`], with the token it finds).
    pub fn from_env() -> Result<Store> {
        let root = root_from_env(std::env::var_os("STRATA_HOME"), std::env::var_os("HOME"))?;
        // A `--hf-token-file` reaches here through `strata_hub::use_token_file`.
        let hub = Hub::from_env(None)?;
        Ok(Store::new(root)
            .with_elsewhere(Elsewhere::from_env())
            .with_hub(hub))
    }

    /// Pulls `hf:` ids from `hub` (its cache should be the one [`Elsewhere`] reads).
    pub fn with_hub(mut self, hub: Option<Hub>) -> Store {
        self.hub = hub;
        self
    }

    /// The hub `hf:` ids are pulled from, if any.
    pub fn hub(&self) -> Option<&Hub> {
        self.hub.as_ref()
    }

    /// Pulls the model an `hf:` id names into the hub cache (fetching only what is missing
    /// there) and returns what it holds.
    pub fn pull_hub(
        &self,
        spec: &str,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<strata_hub::Pulled> {
        let rest = spec
            .strip_prefix(strata_hub::SCHEME)
            .ok_or_else(|| Error::Elsewhere {
                spec: spec.to_string(),
                why: "not a Hugging Face id (hf:OWNER/REPO[:QUANT])".into(),
            })?;
        let r = HubRef::parse(rest).map_err(|why| Error::Elsewhere {
            spec: spec.to_string(),
            why,
        })?;
        let Some(hub) = &self.hub else {
            return Err(Error::Elsewhere {
                spec: spec.to_string(),
                why: if strata_hub::offline() {
                    "HF_HUB_OFFLINE is set: only the hub cache is read".into()
                } else {
                    "no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)".into()
                },
            });
        };
        let mut current: Option<String> = None;
        let mut step = |file: &str, checking: bool, on: &mut dyn FnMut(PullEvent<'_>)| {
            let key = format!("{checking}{file}");
            if current.as_deref() != Some(&key) {
                on(if checking {
                    PullEvent::Checking { file }
                } else {
                    PullEvent::Downloading { file }
                });
                current = Some(key);
            }
        };
        Ok(hub.pull(&r, &mut |e| match e {
            HubEvent::Resolving { what } => on_event(PullEvent::Resolving { what }),
            HubEvent::Plan {
                files,
                bytes,
                missing,
            } => on_event(PullEvent::Plan {
                files,
                bytes,
                missing,
            }),
            HubEvent::File(FileEvent::WaitingForLock { file }) => {
                on_event(PullEvent::WaitingForLock { id: file })
            }
            HubEvent::File(FileEvent::Downloading { file, done, total }) => {
                step(file, false, on_event);
                on_event(PullEvent::Progress { done, total });
            }
            HubEvent::File(FileEvent::Verifying { file, done, total }) => {
                step(file, true, on_event);
                on_event(PullEvent::Progress { done, total });
            }
            _ => {}
        })?)
    }

    /// Finds models other tools downloaded in `elsewhere`'s folders.
    pub fn with_elsewhere(mut self, elsewhere: Elsewhere) -> Store {
        self.elsewhere = elsewhere;
        self
    }

    /// Where other tools' models are looked for.
    pub fn elsewhere(&self) -> &Elsewhere {
        &self.elsewhere
    }

    /// Replaces the fetcher (e.g. [`WheelDir`](crate::WheelDir) on an offline machine).
    pub fn with_fetcher(mut self, fetcher: impl Fetcher + 'static) -> Store {
        self.fetcher = Arc::new(fetcher);
        self
    }

    /// Replaces the catalog (the imports under the root are added to it, as in [`new`](Self::new)).
    pub fn with_catalog(mut self, catalog: Catalog) -> Store {
        self.catalog = with_imports(catalog, &self.root);
        self
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The catalog this store resolves ids against.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Where model `id`'s file is, or would be once pulled. Does not touch the disk.
    pub fn path(&self, id: &str) -> Result<PathBuf> {
        Ok(self.card_path(self.catalog.card(id)?))
    }

    /// Whether model `id` is installed (cheap: existence and size, no hashing).
    pub fn is_present(&self, id: &str) -> Result<bool> {
        Ok(self.installed(self.catalog.card(id)?))
    }

    /// Every catalog model (built-in, then imported) with its path and presence, in catalog
    /// order.
    pub fn list(&self) -> Vec<ModelStatus> {
        self.catalog
            .cards()
            .iter()
            .map(|card| ModelStatus {
                card: card.clone(),
                path: self.card_path(card),
                present: self.installed(card),
                is_default: card.id == DEFAULT_MODEL_ID,
                imported: card.is_import(),
            })
            .collect()
    }

    /// The path of model `id`, pulling it first if it is not installed. An imported model is
    /// never pulled: if its file is missing this is [`Error::ImportNotPresent`].
    pub fn ensure(&self, id: &str) -> Result<PathBuf> {
        self.ensure_with(id, &mut |_| {})
    }

    /// [`ensure`](Self::ensure), reporting pull progress to `on_event`.
    ///
    /// Only the size is checked for an installed file: files reach their final path solely by
    /// rename after a full hash check, so a right-sized file is a verified one unless something
    /// outside the store changed it, which is what [`verify`](Self::verify) is for.
    pub fn ensure_with(
        &self,
        id: &str,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<PathBuf> {
        let card = self.catalog.card(id)?;
        if self.installed(card) {
            return Ok(self.card_path(card));
        }
        if card.is_import() {
            return Err(Error::ImportNotPresent {
                id: card.id.clone(),
            });
        }
        self.pull(card, on_event)
    }

    /// Resolves a user's model spec to a file (see [`resolve_with`](Self::resolve_with)).
    pub fn resolve(&self, spec: &str) -> Result<ResolvedModel> {
        self.resolve_with(spec, &mut |_| {})
    }

    /// Resolves a user's model spec, pulling a catalog model if needed.
    ///
    /// A spec with a scheme (`hf:`, `ollama:`, `lmstudio:`) is a model another tool downloaded,
    /// read where it is ([`Elsewhere`]). Otherwise a spec is a local file if it names an
    /// existing path, contains a path separator, or ends in `.gguf`; such a file must exist.
    /// Anything else is a catalog id. The path rules come first so that `./model.gguf` can never
    /// be mistaken for an id, and a typo in a path is reported as a missing file rather than as
    /// an unknown model.
    pub fn resolve_with(
        &self,
        spec: &str,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<ResolvedModel> {
        if let Some(found) = self.elsewhere.resolve(spec) {
            let path = match found {
                Ok(path) => path,
                // Not in the hub cache (or not all of it): the hub has it, or says why not.
                Err(missing) if spec.starts_with(strata_hub::SCHEME) && self.hub.is_some() => {
                    if HubRef::parse(&spec[strata_hub::SCHEME.len()..]).is_err() {
                        return Err(missing);
                    }
                    let pulled = self.pull_hub(spec, on_event)?;
                    pulled
                        .paths
                        .into_iter()
                        .next()
                        .ok_or_else(|| Error::Elsewhere {
                            spec: spec.to_string(),
                            why: "the hub listed no file for it".into(),
                        })?
                }
                Err(e) => return Err(e),
            };
            return Ok(ResolvedModel { path, card: None });
        }
        if !is_path_spec(spec) {
            let card = self.catalog.card(spec)?;
            let path = self.ensure_with(spec, on_event)?;
            return Ok(ResolvedModel {
                path,
                card: Some(card.clone()),
            });
        }
        let path = Path::new(spec);
        local_file(path)?;
        Ok(ResolvedModel {
            path: std::path::absolute(path).at("resolving", path)?,
            card: None,
        })
    }

    /// Re-hashes model `id`'s installed files (every part of a split set); returns the path of
    /// the first if all match the card.
    pub fn verify(&self, id: &str) -> Result<PathBuf> {
        let card = self.catalog.card(id)?;
        for one in card.file_cards() {
            let path = self.card_path(&one);
            if !path.is_file() {
                return Err(Error::NotPresent {
                    id: card.id.clone(),
                    path,
                });
            }
            check_file(&one, &path, &mut |_| {})?;
        }
        Ok(self.card_path(card))
    }

    /// Deletes model `id`'s files; returns whether there were any. Waits for a pull in progress.
    ///
    /// For an imported model the card goes too (after the files, so an interruption leaves at
    /// worst a card without all its files, which lists as not present and which a re-import of
    /// the same files fills again). This store value still knows the card afterwards; a new one
    /// does not.
    pub fn remove(&self, id: &str) -> Result<bool> {
        let card = self.catalog.card(id)?;
        let _lock = self.lock_model(&card.id, &mut |_| {})?;
        let mut existed = false;
        for one in card.file_cards() {
            let path = self.card_path(&one);
            match std::fs::remove_file(&path) {
                Ok(()) => existed = true,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e).at("removing", &path),
            }
        }
        if card.is_import() {
            let card_file = self.import_card_path(&card.id);
            match std::fs::remove_file(&card_file) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e).at("removing", &card_file),
            }
        }
        // Leaves the directory if someone put other files there.
        let _ = std::fs::remove_dir(self.model_dir(&card.id));
        Ok(existed)
    }

    /// Where an imported model's card is kept: beside its file.
    pub(crate) fn import_card_path(&self, id: &str) -> PathBuf {
        self.model_dir(id).join(IMPORT_CARD_FILE)
    }

    pub(crate) fn card_path(&self, card: &ModelCard) -> PathBuf {
        self.model_dir(&card.id).join(&card.file_name)
    }

    pub(crate) fn model_dir(&self, id: &str) -> PathBuf {
        self.root.join("models").join(id)
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub(crate) fn locks_dir(&self) -> PathBuf {
        self.root.join("locks")
    }

    /// Whether every file of `card` is in place with its size.
    pub(crate) fn installed(&self, card: &ModelCard) -> bool {
        card.file_cards().all(|one| self.file_installed(&one))
    }

    /// Whether the one file `card` names is in place with its size.
    pub(crate) fn file_installed(&self, card: &ModelCard) -> bool {
        std::fs::metadata(self.card_path(card))
            .is_ok_and(|md| md.is_file() && md.len() == card.size)
    }
}

/// The metadata of a local model file a user named, or why it is not one.
pub(crate) fn local_file(path: &Path) -> Result<std::fs::Metadata> {
    match std::fs::metadata(path) {
        Ok(md) if md.is_file() => Ok(md),
        Ok(_) => Err(Error::NotAFile {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(Error::LocalFileMissing {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(e).at("reading", path),
    }
}

/// The store root from the values of `$STRATA_HOME` and `$HOME` (empty counts as unset).
pub(crate) fn root_from_env(
    strata_home: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf> {
    match (strata_home, home) {
        (Some(root), _) if !root.is_empty() => Ok(PathBuf::from(root)),
        (_, Some(home)) if !home.is_empty() => {
            Ok(PathBuf::from(home).join(".cache").join("strata"))
        }
        _ => Err(Error::NoHome),
    }
}

/// Whether a user's model spec names a local file rather than a catalog id: it has no scheme
/// of another tool's models (`hf:`, ...), and contains a path separator, ends in `.gguf`, or
/// names an existing path. [`Store::resolve`] reads specs this
/// way, and so must anyone who decides by the spec where a model comes from.
pub fn is_path_spec(spec: &str) -> bool {
    !is_elsewhere(spec)
        && (spec.contains('/')
            || spec.contains(MAIN_SEPARATOR)
            || spec.to_ascii_lowercase().ends_with(".gguf")
            || (!spec.is_empty() && Path::new(spec).exists()))
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
