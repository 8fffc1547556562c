//! Removing a model from the hub cache without touching what else the cache holds.
//!
//! Snapshots link to blobs, and one blob may serve several snapshots (a file unchanged between
//! revisions): a blob goes only when no snapshot or view links to it any more.

use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::{HubCache, HubRef, pick};

/// What [`HubCache::remove`] took away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// Files of the model unlinked.
    pub files: usize,
    /// Bytes of blobs (and partial files) deleted: those no other snapshot links to.
    pub bytes: u64,
}

/// Every file's path under `dir`, relative, `/`-separated, links included.
pub(crate) fn names_under(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        match e.file_type() {
            Ok(t) if t.is_dir() => names_under(&e.path(), &rel, out),
            _ => out.push(rel),
        }
    }
}

/// Every link under `dir` and where it leads.
fn links_under(dir: &Path, out: &mut Vec<(PathBuf, Option<PathBuf>)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => links_under(&p, out),
            Ok(t) if t.is_symlink() => out.push((p.clone(), std::fs::canonicalize(&p).ok())),
            _ => {}
        }
    }
}

impl HubCache {
    /// Removes the model `r` names from the cache: its files' links in the snapshot (and in
    /// the view of a shard held in part), and the blobs they lead to unless another snapshot
    /// still links to one. Other models of the repository stay as they are.
    pub fn remove(&self, r: &HubRef) -> Result<Removed> {
        let what = r.what();
        let repo_dir = self.repo_dir(&r.repo);
        let refs = repo_dir.join("refs").join(&r.revision);
        let commit = std::fs::read_to_string(&refs)
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| r.revision.clone());
        if commit.contains('/') || commit.contains("..") || r.revision.contains("..") {
            return Err(Error::NoSuchModel(format!("{what} is not in the cache")));
        }
        let dirs = [
            self.snapshot(&r.repo, &commit),
            repo_dir.join(".strata-views").join(&commit),
        ];
        let mut names = Vec::new();
        for d in &dirs {
            names_under(d, "", &mut names);
        }
        names.sort();
        names.dedup();
        let models = pick::models(&names);
        let model = pick::choose(&models, &r.pick, &what).map_err(Error::NoSuchModel)?;
        let mut targets = Vec::new();
        let mut files = 0;
        for path in &model.files {
            let mut found = false;
            for d in &dirs {
                let link = d.join(path);
                if std::fs::symlink_metadata(&link).is_ok() {
                    found = true;
                    if let Ok(t) = std::fs::canonicalize(&link) {
                        targets.push(t);
                    }
                    std::fs::remove_file(&link).at("removing", &link)?;
                }
            }
            files += usize::from(found);
        }
        // Blobs another snapshot or view still links to stay.
        let mut still = Vec::new();
        links_under(&repo_dir.join("snapshots"), &mut still);
        links_under(&repo_dir.join(".strata-views"), &mut still);
        let mut bytes = 0;
        targets.sort();
        targets.dedup();
        for t in targets {
            if still
                .iter()
                .any(|(_, to)| to.as_deref() == Some(t.as_path()))
            {
                continue;
            }
            bytes += std::fs::metadata(&t).map_or(0, |m| m.len());
            std::fs::remove_file(&t).at("removing", &t)?;
            let mut record = t.clone().into_os_string();
            record.push(".ranges");
            let _ = std::fs::remove_file(PathBuf::from(record));
        }
        // A snapshot left empty goes, with the refs that name it.
        for d in &dirs {
            let mut left = Vec::new();
            names_under(d, "", &mut left);
            if left.is_empty() && d.is_dir() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        if !self.snapshot(&r.repo, &commit).is_dir() {
            let mut refs = Vec::new();
            names_under(&repo_dir.join("refs"), "", &mut refs);
            for name in refs {
                let p = repo_dir.join("refs").join(&name);
                if std::fs::read_to_string(&p).is_ok_and(|c| c.trim() == commit) {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        Ok(Removed { files, bytes })
    }
}
