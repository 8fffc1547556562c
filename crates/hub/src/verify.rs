//! Checking what the cache holds of a model, with no network.
//!
//! A complete blob is named by the hub's identity of its bytes (the SHA-256 of an LFS file, the
//! git blob id of a small one), so hashing it again checks it against what the hub published.
//! A file held in part (a node's shard) cannot be checked that way: the hub publishes whole-file
//! hashes only. Its report says how much of it is here instead.

use std::path::PathBuf;

use crate::download::digest;
use crate::error::{Error, IoContext, Result};
use crate::{HubCache, HubRef, RangeSet, pick};

/// What a check of one file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Every byte is here and hashes to the hub's identity of the file.
    Verified {
        /// The SHA-256 (LFS) or git blob id the bytes hash to.
        hash: String,
    },
    /// Only some byte ranges are here (a shard's); nothing to hash them against.
    Partial {
        /// Bytes here.
        held: u64,
    },
    /// The bytes hash to something else.
    Mismatch {
        /// The hub's identity (the blob's name).
        expected: String,
        /// What the bytes hash to.
        got: String,
    },
}

/// One file of a model and what its check found.
#[derive(Debug, Clone)]
pub struct FileCheck {
    /// Its path in the repository.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// Where its bytes are.
    pub blob: PathBuf,
    /// The finding.
    pub check: Check,
}

impl HubCache {
    /// Checks every file of the model `r` names that the cache holds, whole or in part.
    pub fn verify(
        &self,
        r: &HubRef,
        progress: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<Vec<FileCheck>> {
        let what = r.what();
        let missing = || {
            Error::NoSuchModel(format!(
                "{what} is not in the Hugging Face cache at {}",
                self.root().display()
            ))
        };
        if r.revision.split('/').any(|s| s == ".." || s.is_empty()) {
            return Err(missing());
        }
        let refs = self.repo_dir(&r.repo).join("refs").join(&r.revision);
        let commit = std::fs::read_to_string(refs)
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| r.revision.clone());
        if commit.contains('/') || commit.contains("..") {
            return Err(missing());
        }
        // A node's shard is linked in the view folder, a whole model in the snapshot.
        let views = self.repo_dir(&r.repo).join(".strata-views").join(&commit);
        let snapshot = self.snapshot(&r.repo, &commit);
        let dir = if views.is_dir() {
            views
        } else if snapshot.is_dir() {
            snapshot
        } else {
            return Err(missing());
        };
        let models = pick::models(&pick::ggufs_in(&dir));
        let model = pick::choose(&models, &r.pick, &what).map_err(Error::NoSuchModel)?;
        let mut out = Vec::new();
        for path in &model.files {
            let link = dir.join(path);
            let blob = std::fs::canonicalize(&link).at("following", &link)?;
            let size = std::fs::metadata(&blob).at("reading", &blob)?.len();
            let name = blob
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let check = if let Some(etag) = name.strip_suffix(".strata-partial") {
                let record = blob.with_file_name(format!("{etag}.strata-partial.ranges"));
                let held = RangeSet::load(&record)?.len();
                Check::Partial { held }
            } else {
                let lfs = name.len() == 64;
                let file = std::fs::File::open(&blob).at("opening", &blob)?;
                let got = digest(&file, size, lfs, &mut |done| progress(path, done, size))
                    .at("reading", &blob)?;
                if got == name.to_ascii_lowercase() {
                    Check::Verified { hash: got }
                } else {
                    Check::Mismatch {
                        expected: name,
                        got,
                    }
                }
            };
            out.push(FileCheck {
                path: path.clone(),
                size,
                blob,
                check,
            });
        }
        Ok(out)
    }
}
