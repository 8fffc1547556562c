//! The repositories a test hub serves: every `OWNER/NAME` directory two levels under its
//! root, with the identities the real hub gives files and commits.
//!
//! Large and binary files are LFS files (the tree lists their SHA-256 and the bytes come
//! from the CDN); small text files are plain git blobs served by the hub itself, identified
//! by their git object id. The commit id is a digest of the listing, so it changes exactly
//! when a file does.

use sha1::Digest as _;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Files at or above this size are LFS files whatever their name.
const LFS_FROM: u64 = 1 << 20;
/// Names that are always LFS files (as `.gitattributes` on the hub makes them).
const LFS_SUFFIXES: [&str; 4] = [".gguf", ".bin", ".safetensors", ".pt"];

/// One file of a repository.
#[derive(Debug, Clone)]
pub struct RepoFile {
    /// Path inside the repository, `/`-separated.
    pub path: String,
    /// Size of the content in bytes.
    pub size: u64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
    /// The git object id the tree lists: of the content, or of the LFS pointer.
    pub oid: String,
    /// Whether the bytes come from the CDN.
    pub lfs: bool,
    /// Size of the LFS pointer text.
    pub pointer_size: u64,
    /// Where the bytes are on disk.
    pub disk: PathBuf,
}

/// One repository at its only commit.
#[derive(Debug, Clone)]
pub struct Repo {
    /// `owner/name`.
    pub id: String,
    /// Forty hex digits.
    pub commit: String,
    /// Files by path.
    pub files: BTreeMap<String, RepoFile>,
}

/// The git id of a blob with these bytes.
fn git_oid(bytes: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex(&h.finalize())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The text git stores in place of an LFS file.
fn lfs_pointer(sha256: &str, size: u64) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n")
}

/// SHA-256 and git id of a file, reading it once.
fn digest(path: &Path, size: u64) -> std::io::Result<(String, String)> {
    let mut f = std::fs::File::open(path)?;
    let mut sha256 = sha2::Sha256::new();
    let mut git = sha1::Sha1::new();
    git.update(format!("blob {size}\0").as_bytes());
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha256.update(&buf[..n]);
        git.update(&buf[..n]);
    }
    Ok((hex(&sha256.finalize()), hex(&git.finalize())))
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = std::fs::metadata(e.path())?;
        if kind.is_dir() {
            walk(&e.path(), &rel, out)?;
        } else if kind.is_file() {
            out.push((rel, e.path()));
        }
    }
    Ok(())
}

impl Repo {
    /// Reads the repository in `dir` as `id`.
    pub fn scan(id: &str, dir: &Path) -> std::io::Result<Repo> {
        let mut found = Vec::new();
        walk(dir, "", &mut found)?;
        let mut files = BTreeMap::new();
        let mut listing = sha1::Sha1::new();
        for (path, disk) in found {
            let size = std::fs::metadata(&disk)?.len();
            let lfs = size >= LFS_FROM || LFS_SUFFIXES.iter().any(|s| path.ends_with(s));
            let (sha256, content_oid) = digest(&disk, size)?;
            let (oid, pointer_size) = if lfs {
                let p = lfs_pointer(&sha256, size);
                (git_oid(p.as_bytes()), p.len() as u64)
            } else {
                (content_oid, 0)
            };
            listing.update(format!("{path}\0{oid}\n").as_bytes());
            files.insert(
                path.clone(),
                RepoFile {
                    path,
                    size,
                    sha256,
                    oid,
                    lfs,
                    pointer_size,
                    disk,
                },
            );
        }
        Ok(Repo {
            id: id.to_string(),
            commit: hex(&listing.finalize()),
            files,
        })
    }

    /// The commit a revision names: `main` or the commit itself.
    pub fn resolve(&self, rev: &str) -> Option<&str> {
        (rev == "main" || rev == self.commit).then_some(self.commit.as_str())
    }

    /// The entries under `dir` (`""` for the root): every file and directory below it when
    /// `recursive`, else its direct children. Directories come before the files inside them.
    pub(crate) fn entries(&self, dir: &str, recursive: bool) -> Option<Vec<Entry<'_>>> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{}/", dir.trim_end_matches('/'))
        };
        let mut dirs = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        let mut any = dir.is_empty();
        for (path, f) in &self.files {
            let Some(rest) = path.strip_prefix(&prefix) else {
                continue;
            };
            any = true;
            let parts: Vec<&str> = rest.split('/').collect();
            for i in 1..parts.len() {
                if !recursive && i > 1 {
                    break;
                }
                let d = format!("{prefix}{}", parts[..i].join("/"));
                if dirs.insert(d.clone()) {
                    out.push(Entry::Dir(d));
                }
            }
            if recursive || parts.len() == 1 {
                out.push(Entry::File(f));
            }
        }
        any.then_some(out)
    }
}

/// One line of a tree listing.
#[derive(Debug)]
pub(crate) enum Entry<'a> {
    /// A directory's path.
    Dir(String),
    /// A file.
    File(&'a RepoFile),
}

impl Entry<'_> {
    /// The hub's JSON for the entry.
    pub(crate) fn json(&self) -> serde_json::Value {
        match self {
            Entry::Dir(p) => serde_json::json!({
                "type": "directory",
                "oid": git_oid(p.as_bytes()),
                "size": 0,
                "path": p,
            }),
            Entry::File(f) if f.lfs => serde_json::json!({
                "type": "file",
                "oid": f.oid,
                "size": f.size,
                "path": f.path,
                "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size},
            }),
            Entry::File(f) => serde_json::json!({
                "type": "file",
                "oid": f.oid,
                "size": f.size,
                "path": f.path,
            }),
        }
    }
}

/// Every `OWNER/NAME` directory under `root`.
pub(crate) fn scan_root(root: &Path) -> std::io::Result<BTreeMap<String, Repo>> {
    let mut repos = BTreeMap::new();
    for owner in std::fs::read_dir(root)? {
        let owner = owner?;
        if !owner.file_type()?.is_dir() {
            continue;
        }
        for repo in std::fs::read_dir(owner.path())? {
            let repo = repo?;
            if !repo.file_type()?.is_dir() {
                continue;
            }
            let id = format!(
                "{}/{}",
                owner.file_name().to_string_lossy(),
                repo.file_name().to_string_lossy()
            );
            repos.insert(id.clone(), Repo::scan(&id, &repo.path())?);
        }
    }
    Ok(repos)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn files_get_the_hubs_identities() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("o/r");
        std::fs::create_dir_all(r.join("sub")).unwrap();
        std::fs::write(r.join("README.md"), b"hello\n").unwrap();
        std::fs::write(r.join("sub/m.gguf"), b"GGUF").unwrap();
        let repos = scan_root(d.path()).unwrap();
        let repo = &repos["o/r"];
        let readme = &repo.files["README.md"];
        // `git hash-object` of "hello\n".
        assert_eq!(readme.oid, "ce013625030ba8dba906f756967f9e9ca394464a");
        assert!(!readme.lfs);
        let m = &repo.files["sub/m.gguf"];
        assert!(m.lfs);
        assert_eq!(m.sha256.len(), 64);
        assert_ne!(
            m.oid,
            git_oid(b"GGUF"),
            "an LFS file's oid is its pointer's"
        );
        assert_eq!(repo.resolve("main"), Some(repo.commit.as_str()));
        assert_eq!(repo.resolve("v2"), None);
        let all: Vec<_> = repo
            .entries("", true)
            .unwrap()
            .iter()
            .map(|e| e.json()["path"].clone())
            .collect();
        assert_eq!(all, ["README.md", "sub", "sub/m.gguf"]);
        let top = repo.entries("", false).unwrap();
        assert_eq!(top.len(), 2);
        assert!(repo.entries("nope", true).is_none());
    }
}
