//! Importing a local model file into the store (`strata models import`), and the cards that make
//! imported models part of the catalog.
//!
//! An import is a model file plus a card beside it, `models/<id>/card.toml`, in the format of the
//! built-in cards but with `source.imported_from` instead of download parts. [`Store::new`] reads
//! those cards after the built-in ones, so an imported id resolves, lists, verifies and is served
//! to peers like a catalog id; only pulling is impossible, there being nowhere to pull from.
//!
//! The store never reads GGUF contents (see the crate docs): the caller checks that the file
//! loads and describes it in an [`ImportMeta`]; the store links or copies the file, hashes it and
//! writes the card. The invariants of a pull hold here too: the file reaches its final path only
//! by rename, once its size and SHA-256 are known, under the model's lock; and the card is written
//! (also by rename) only after the file is in place, so a card never names a file that was not
//! completely installed.

use std::fmt::Display;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use tempfile::TempPath;

use crate::card::{IMPORT_CARD_FILE, ModelCard, ModelFile, Source, is_id};
use crate::catalog::Catalog;
use crate::digest::{check_file, hash_stream};
use crate::error::{Error, IoContext, Result};
use crate::install::{create_dir, readable_temp, sync_dir};
use crate::notice;
use crate::progress::PullEvent;
use crate::store::{Store, local_file};

/// What the model file says about itself, read by the caller (which can parse GGUF) for the
/// card of an import. The store fills in the rest: id, file name, size, SHA-256, provenance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportMeta {
    /// Model family (`general.basename`, or the architecture).
    pub family: String,
    /// GGUF `general.architecture`.
    pub architecture: String,
    /// Parameter count as usually written, e.g. `135M`.
    pub params: String,
    /// The most common weight format of the matrices, e.g. `Q4_K`.
    pub quant: String,
    /// Trained context length in tokens.
    pub context_length: u32,
    /// `general.license`, or `unknown`.
    pub license: String,
}

/// How an import put the file into the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportMethod {
    /// A hard link to the original: same file system, no bytes copied, no space used. The
    /// original and the store's file are then one file, so editing the original in place
    /// changes the store's copy too (`strata models verify` notices).
    HardLinked,
    /// A byte copy (another file system, or one that refuses links).
    Copied,
    /// The same file (same SHA-256) was already in the store under this id: nothing changed.
    AlreadyPresent,
}

/// The result of [`Store::import`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The model's card (the existing one, for [`ImportMethod::AlreadyPresent`]).
    pub card: ModelCard,
    /// The installed file.
    pub path: PathBuf,
    /// How it got there.
    pub method: ImportMethod,
}

/// The id an import of `path` gets when none is given: the file name, lowercased, without a
/// `.gguf` suffix, with every character outside `[a-z0-9._-]` replaced by `-`. It may still be
/// unusable (a name starting with `.`, say); [`check_import_id`] says so.
pub fn default_import_id(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let stem = name.strip_suffix(".gguf").unwrap_or(&name);
    stem.chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Checks that `id` can name an import: a valid card id, and not one that a model spec would
/// read as a file path (a `.gguf` suffix), which could then never be loaded by id.
pub fn check_import_id(id: &str) -> Result<()> {
    let reason = if !is_id(id) {
        "an id must be non-empty lowercase [a-z0-9._-], starting with a letter or digit"
    } else if id.ends_with(".gguf") {
        "it ends in .gguf, so it would be read as a file path"
    } else {
        return Ok(());
    };
    Err(Error::InvalidImportId {
        id: id.to_string(),
        reason: reason.to_string(),
    })
}

impl Store {
    /// Imports the model file at `path` as `id` (see [`import_files`](Self::import_files)).
    pub fn import(&mut self, path: &Path, id: &str, meta: ImportMeta) -> Result<Imported> {
        self.import_files(&[path.to_path_buf()], id, meta)
    }

    /// Imports the model made of `files` as `id`: one file, or every part of a split GGUF in
    /// order (the first is the one a loader opens, and the names are kept, so the loader finds
    /// the others beside it). Each file is hard-linked into the store (or copied when linking
    /// fails, e.g. across file systems) and hashed, and the card is written from `meta`.
    ///
    /// An id that already names a model (built-in or imported) is refused unless the files are
    /// that model's (same SHA-256 each): then nothing changes ([`ImportMethod::AlreadyPresent`]),
    /// or the files missing here are installed for it. The caller is responsible for having
    /// checked that the files are a model the engine can load.
    pub fn import_files(
        &mut self,
        files: &[PathBuf],
        id: &str,
        meta: ImportMeta,
    ) -> Result<Imported> {
        check_import_id(id)?;
        let Some(first) = files.first() else {
            return Err(Error::InvalidImportId {
                id: id.to_string(),
                reason: "there is no file to import under it".to_string(),
            });
        };
        let mut sizes = Vec::with_capacity(files.len());
        for path in files {
            sizes.push(local_file(path)?.len());
        }
        let from = std::path::absolute(first)
            .at("resolving", first)?
            .display()
            .to_string();
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        // Hashes are placeholders until the files are hashed; checked now so that a bad name
        // or metadata fails before a large file is copied.
        let placeholder = "0".repeat(64);
        let mut card = ModelCard {
            id: id.to_string(),
            family: meta.family,
            architecture: meta.architecture,
            params: meta.params,
            quant: meta.quant,
            context_length: meta.context_length,
            file_name: name(first),
            sha256: placeholder.clone(),
            size: sizes[0],
            license: meta.license,
            description: match files.len() {
                1 => format!("imported from {from}"),
                n => format!("imported from {from} and its {} other parts", n - 1),
            },
            source: Source {
                parts: Vec::new(),
                imported_from: Some(from),
            },
            more_files: files[1..]
                .iter()
                .zip(&sizes[1..])
                .map(|(p, &size)| ModelFile {
                    file_name: name(p),
                    sha256: placeholder.clone(),
                    size,
                })
                .collect(),
        };
        let origin = format!("for {}", first.display());
        card.validate(&origin)?;
        // Different sizes cannot be the same files: refuse before copying anything.
        if let Some(existing) = self.existing_card(id)
            && !same_sizes(&existing, &sizes)
        {
            return Err(conflict(&existing));
        }
        let tmp_dir = self.tmp_dir();
        create_dir(&tmp_dir)?;
        let _lock = self.lock_model(id, &mut |_| {})?;
        self.remove_stale_temps(id)?;
        let mut staged = Vec::with_capacity(files.len());
        for path in files {
            staged.push(stage(path, &tmp_dir, id, self.link_imports)?);
        }
        let method = if staged.iter().all(|s| s.method == ImportMethod::HardLinked) {
            ImportMethod::HardLinked
        } else {
            ImportMethod::Copied
        };

        // Looked up again under the lock, where another process's import of this id is visible.
        if let Some(existing) = self.existing_card(id) {
            let hashes = existing.file_cards();
            if existing.file_count() != staged.len()
                || hashes.zip(&staged).any(|(one, s)| one.sha256 != s.sha256)
            {
                return Err(conflict(&existing));
            }
            let dest = self.card_path(&existing);
            let method = if self.installed(&existing) {
                ImportMethod::AlreadyPresent
            } else {
                for (k, s) in staged.into_iter().enumerate() {
                    let Some(one) = existing.file_card(k) else {
                        break;
                    };
                    if !self.file_installed(&one) {
                        self.place(s.file, &one)?;
                    }
                }
                method
            };
            if self.catalog.get(id).is_none() {
                self.catalog.add(existing.clone())?;
            }
            return Ok(Imported {
                card: existing,
                path: dest,
                method,
            });
        }

        let mut staged = staged.into_iter();
        if let Some(s) = staged.next() {
            (card.sha256, card.size) = (s.sha256.clone(), s.size);
            card.more_files = card
                .more_files
                .into_iter()
                .zip(staged.as_slice())
                .map(|(f, s)| ModelFile {
                    sha256: s.sha256.clone(),
                    size: s.size,
                    ..f
                })
                .collect();
            card.validate(&origin)?;
            self.place(s.file, &card)?;
        }
        for (k, s) in staged.enumerate() {
            if let Some(one) = card.file_card(k + 1) {
                self.place(s.file, &one)?;
            }
        }
        let dest = self.card_path(&card);
        self.write_import_card(&card)?;
        self.catalog.add(card.clone())?;
        Ok(Imported {
            card,
            path: dest,
            method,
        })
    }

    /// Installs an imported model's files from a peer's copy under `card`, which must be an
    /// import card, then writes the card, so this node has the import too and can serve it
    /// further. `open(k)` gives the bytes of the model's file `k` (0 is the first; a split set
    /// has one per part); it is called only for files this store lacks. The bytes get
    /// [`install_from`](Self::install_from)'s checks (size and SHA-256 against the card, before
    /// anything reaches the final path). Returns the path of the first file.
    ///
    /// A card whose id already names a different model here is refused, as an import would be.
    pub fn install_import(
        &mut self,
        card: &ModelCard,
        open: &mut dyn FnMut(usize) -> std::io::Result<Box<dyn Read>>,
        origin: &Path,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<PathBuf> {
        card.validate(&format!("'{}'", card.id))?;
        if !card.is_import() {
            return Err(Error::InvalidCard {
                origin: format!("'{}'", card.id),
                field: "source.imported_from",
                reason: "must be set: only imported models are installed with their own card"
                    .to_string(),
            });
        }
        let card = match self.existing_card(&card.id) {
            // The local card decides the file names; the bytes are the same either way.
            Some(existing) if same_files(&existing, card) => existing,
            Some(existing) => return Err(conflict(&existing)),
            None => card.clone(),
        };
        for k in 0..card.file_count() {
            let Some(one) = card.file_card(k) else { break };
            // A file already here is checked without opening the source at all.
            if self.file_installed(&one) {
                let path = self.card_path(&one);
                on_event(PullEvent::Verifying { path: &path });
                if check_file(&one, &path, on_event).is_ok() {
                    continue;
                }
            }
            let mut source = open(k).map_err(|error| Error::Io {
                action: "fetching",
                path: origin.to_path_buf(),
                error,
            })?;
            self.install_from(&one, &mut source, origin, on_event)?;
        }
        {
            let _lock = self.lock_model(&card.id, &mut |_| {})?;
            if !self.import_card_path(&card.id).is_file() {
                self.write_import_card(&card)?;
            }
        }
        let path = self.card_path(&card);
        if self.catalog.get(&card.id).is_none() {
            self.catalog.add(card)?;
        }
        Ok(path)
    }

    /// The card that `id` names here: in the catalog, or (for an import made by another
    /// process since this store was built) on disk. An unreadable card on disk counts as none,
    /// so an import can replace it.
    fn existing_card(&self, id: &str) -> Option<ModelCard> {
        if let Some(card) = self.catalog.get(id) {
            return Some(card.clone());
        }
        read_import_card(&self.model_dir(id), id).ok().flatten()
    }

    /// Renames a staged file to `card`'s path; returns that path.
    fn place(&self, staged: TempPath, card: &ModelCard) -> Result<PathBuf> {
        let dir = self.model_dir(&card.id);
        create_dir(&dir)?;
        let dest = self.card_path(card);
        // On failure the error owns the staged file, and dropping it deletes the file.
        staged.persist(&dest).map_err(|e| Error::Io {
            action: "moving the imported model to",
            path: dest.clone(),
            error: e.error,
        })?;
        sync_dir(&dir);
        Ok(dest)
    }

    /// Writes `models/<id>/card.toml` atomically (temp file, fsync, rename). Caller holds the
    /// model's lock, which keeps another import's clean-up of `<id>~` temps off this one's.
    fn write_import_card(&self, card: &ModelCard) -> Result<()> {
        let origin = format!("'{}'", card.id);
        let body = toml::to_string(card).map_err(|e| Error::CardParse {
            origin,
            message: e.to_string(),
        })?;
        let text = format!(
            "# Written by `strata models import`: the model file beside this card, checked \
             against its size and sha256.\n{body}"
        );
        let tmp_dir = self.tmp_dir();
        create_dir(&tmp_dir)?;
        let mut temp = readable_temp(&tmp_dir, &card.id, ".card")?;
        let temp_path = temp.path().to_path_buf();
        temp.write_all(text.as_bytes()).at("writing", &temp_path)?;
        temp.as_file()
            .sync_all()
            .at("flushing to disk", &temp_path)?;
        let dest = self.import_card_path(&card.id);
        temp.persist(&dest).map_err(|e| Error::Io {
            action: "writing the import's card to",
            path: dest.clone(),
            error: e.error,
        })?;
        sync_dir(&self.model_dir(&card.id));
        Ok(())
    }
}

/// A file staged in the store's temp directory, with what it hashed to.
struct Staged {
    file: TempPath,
    size: u64,
    sha256: String,
    method: ImportMethod,
}

/// Puts `src` into `tmp_dir` as `<id>~<random>.import`: a hard link when the store is on the
/// same file system (instant, and no second copy on disk), else a copy hashed as it is written.
/// A linked file is hashed after linking, so the card describes exactly the store's file.
fn stage(src: &Path, tmp_dir: &Path, id: &str, link: bool) -> Result<Staged> {
    let linked = tempfile::Builder::new()
        .prefix(&format!("{id}~"))
        .suffix(".import")
        .make_in(tmp_dir, |p| {
            if link {
                std::fs::hard_link(src, p)
            } else {
                Err(std::io::Error::from(ErrorKind::Unsupported))
            }
        });
    match linked {
        Ok(temp) => {
            let file = temp.into_temp_path();
            let mut reader = File::open(&file).at("opening", &file)?;
            let (size, sha256) = hash_stream(&mut reader, &file, None)?;
            Ok(Staged {
                file,
                size,
                sha256,
                method: ImportMethod::HardLinked,
            })
        }
        // Another file system (EXDEV), or one that refuses links (FAT, some network mounts,
        // `protected_hardlinks` on a file someone else owns): copy instead.
        Err(_) => {
            let mut temp = readable_temp(tmp_dir, id, ".import")?;
            let temp_path = temp.path().to_path_buf();
            let mut reader = File::open(src).at("opening", src)?;
            let (size, sha256) =
                hash_stream(&mut reader, src, Some((temp.as_file_mut(), &temp_path)))?;
            temp.as_file()
                .sync_all()
                .at("flushing to disk", &temp_path)?;
            Ok(Staged {
                file: temp.into_temp_path(),
                size,
                sha256,
                method: ImportMethod::Copied,
            })
        }
    }
}

/// Whether `a` and `b` pin the same files' bytes, in order (names may differ).
fn same_files(a: &ModelCard, b: &ModelCard) -> bool {
    a.sha256 == b.sha256
        && a.more_files.len() == b.more_files.len()
        && a.more_files
            .iter()
            .zip(&b.more_files)
            .all(|(x, y)| x.sha256 == y.sha256)
}

/// Whether `card`'s files have exactly `sizes`, in order.
fn same_sizes(card: &ModelCard, sizes: &[u64]) -> bool {
    card.file_count() == sizes.len()
        && card
            .file_cards()
            .zip(sizes)
            .all(|(one, &size)| one.size == size)
}

fn conflict(existing: &ModelCard) -> Error {
    Error::ImportConflict {
        id: existing.id.clone(),
        existing: if existing.is_import() {
            "an imported model"
        } else {
            "a built-in catalog model"
        },
        sha256: existing.sha256.clone(),
    }
}

/// The import card in model directory `dir`, if there is one; `id` is the directory's name,
/// which the card's id must equal (the card's file is looked for under its id).
fn read_import_card(dir: &Path, id: &str) -> Result<Option<ModelCard>> {
    let path = dir.join(IMPORT_CARD_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).at("reading", &path),
    };
    let origin = path.display().to_string();
    let card = ModelCard::from_toml(&text, &origin)?;
    let bad = |field, reason: String| Error::InvalidCard {
        origin: origin.clone(),
        field,
        reason,
    };
    if !card.is_import() {
        return Err(bad(
            "source.imported_from",
            "missing: a card in the store must be an import's".to_string(),
        ));
    }
    if card.id != id {
        return Err(bad(
            "id",
            format!("'{}' differs from its directory '{id}'", card.id),
        ));
    }
    Ok(Some(card))
}

/// `base` followed by the imports found under `root`, in id order. A card that cannot be read,
/// is invalid, or takes an id `base` already has is skipped with a warning: the built-in cards
/// always win, and one bad card never hides the others or stops the store from opening.
pub(crate) fn with_imports(mut base: Catalog, root: &Path) -> Catalog {
    let models = root.join("models");
    let entries = match std::fs::read_dir(&models) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return base,
        Err(e) => {
            warn(&Error::Io {
                action: "listing",
                path: models,
                error: e,
            });
            return base;
        }
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        // Not a name the store could have made: not an import.
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        match read_import_card(&entry.path(), &id) {
            Ok(Some(card)) => found.push(card),
            Ok(None) => {}
            Err(e) => warn(&e),
        }
    }
    found.sort_by(|a, b| a.id.cmp(&b.id));
    for card in found {
        if base.get(&card.id).is_some() {
            warn(&format_args!(
                "imported model '{}' has the id of a built-in catalog model, which is used instead",
                card.id
            ));
            continue;
        }
        if let Err(e) = base.add(card) {
            warn(&e);
        }
    }
    base
}

/// Reports that an import was skipped: a skipped card must not vanish silently, or its model
/// would just look unknown.
fn warn(what: &dyn Display) {
    notice::warn(&format_args!("skipping an imported model: {what}"));
}

#[cfg(test)]
#[path = "import_tests.rs"]
mod tests;
