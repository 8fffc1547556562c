//! The hub cache, laid out as the hub's own clients lay it, so files `huggingface-cli`,
//! llama.cpp or transformers downloaded are used as they are and strata's downloads serve them:
//!
//! ```text
//! $HF_HUB_CACHE/models--OWNER--NAME/
//!     refs/main                      the commit `main` pointed at when last fetched
//!     blobs/<sha256 or git sha1>     the bytes, named by the hub's ETag
//!     snapshots/<commit>/<path>      a relative symlink to ../../blobs/<etag>
//! $HF_HUB_CACHE/.locks/models--OWNER--NAME/<etag>.lock
//! ```
//!
//! The lock files are the ones the Python client takes, so the two never write one blob at once.
//! strata's partial downloads (`<etag>.strata-partial` and its range record) use names the
//! other clients do not read.

use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

/// A hub cache folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubCache {
    root: PathBuf,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl HubCache {
    /// The cache at `root`.
    pub fn new(root: impl Into<PathBuf>) -> HubCache {
        HubCache { root: root.into() }
    }

    /// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, as the hub's
    /// clients choose it; `None` without any of those variables.
    pub fn from_env() -> Option<HubCache> {
        env_path("HF_HUB_CACHE")
            .or_else(|| env_path("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| env_path("HOME").map(|h| h.join(".cache/huggingface/hub")))
            .map(HubCache::new)
    }

    /// The cache's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of repository `owner/name`.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(folder_name(repo))
    }

    /// The commit `revision` (a ref's name or a commit) stands for in the cache, if its
    /// snapshot is there.
    pub fn commit_of(&self, repo: &str, revision: &str) -> Option<String> {
        if revision.split('/').any(|s| s == ".." || s.is_empty()) {
            return None;
        }
        let dir = self.repo_dir(repo);
        let commit = std::fs::read_to_string(dir.join("refs").join(revision))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| revision.to_string());
        if commit.contains('/') || commit.contains("..") {
            return None;
        }
        dir.join("snapshots")
            .join(&commit)
            .is_dir()
            .then_some(commit)
    }

    /// The snapshot folder of `commit`.
    pub fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// Where the bytes named `etag` are kept.
    pub fn blob(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(etag)
    }

    /// The lock file the hub's clients take while writing blob `etag`.
    pub fn lock(&self, repo: &str, etag: &str) -> PathBuf {
        self.root
            .join(".locks")
            .join(folder_name(repo))
            .join(format!("{etag}.lock"))
    }

    /// Makes `snapshots/<commit>/<path>` a relative link to blob `etag`, replacing what was
    /// there, and returns it.
    pub fn link(&self, repo: &str, commit: &str, path: &str, etag: &str) -> Result<PathBuf> {
        let link = self.snapshot(repo, commit).join(path);
        let parent = link.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&parent).at("creating", &parent)?;
        // snapshots/<commit>/ plus one level per folder in `path`, back up to the repo folder.
        let depth = 2 + path.matches('/').count();
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        let _ = std::fs::remove_file(&link);
        make_link(&target, &link, &self.blob(repo, etag))?;
        Ok(link)
    }

    /// The file of a cached snapshot `r` names (see [`pick::find_in`](crate::pick::find_in)),
    /// or why there is none, with no network: what runs a model that is already here.
    pub fn find(&self, r: &crate::HubRef) -> std::result::Result<PathBuf, String> {
        let commit = self.commit_of(&r.repo, &r.revision).ok_or_else(|| {
            format!(
                "{} is not in the Hugging Face cache at {}",
                r.what(),
                self.root.display()
            )
        })?;
        crate::pick::find_in(&self.snapshot(&r.repo, &commit), &r.pick, &r.what())
    }

    /// Records that `revision` (a branch or tag) points at `commit`.
    pub fn set_ref(&self, repo: &str, revision: &str, commit: &str) -> Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.repo_dir(repo).join("refs").join(revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).at("creating", dir)?;
        }
        let tmp = path.with_extension("strata-tmp");
        std::fs::write(&tmp, commit).at("writing", &tmp)?;
        std::fs::rename(&tmp, &path).at("renaming", &tmp)
    }
}

/// `models--owner--name`.
fn folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

#[cfg(unix)]
fn make_link(target: &Path, link: &Path, _blob: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target, link).at("linking", link)
}

/// Without symlinks the hub's clients copy the blob into the snapshot; so does this.
#[cfg(not(unix))]
fn make_link(_target: &Path, link: &Path, blob: &Path) -> Result<()> {
    std::fs::copy(blob, link).at("copying to", link).map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn snapshots_link_to_blobs_relatively_as_the_hub_clients_do() {
        let t = tempfile::tempdir().unwrap();
        let c = HubCache::new(t.path());
        let blob = c.blob("o/r", "abc");
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::write(&blob, b"bytes").unwrap();
        let link = c.link("o/r", "c0", "sub/dir/m.gguf", "abc").unwrap();
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../../../blobs/abc")
        );
        assert_eq!(std::fs::read(&link).unwrap(), b"bytes");
        assert_eq!(c.commit_of("o/r", "main"), None);
        c.set_ref("o/r", "main", "c0").unwrap();
        assert_eq!(c.commit_of("o/r", "main").as_deref(), Some("c0"));
        assert_eq!(c.commit_of("o/r", "c0").as_deref(), Some("c0"));
        assert_eq!(c.commit_of("o/r", "../x"), None);
        assert!(
            c.lock("o/r", "abc")
                .ends_with(".locks/models--o--r/abc.lock")
        );
    }
}
