//! Models that are here only in part: each file's GGUF header, then just the byte ranges a
//! node's shard loads.
//!
//! A node running one shard of a 380 GB model needs a fraction of its bytes. It fetches every
//! part's header first (the tensor list says where each tensor lies), works out which ranges
//! its shard reads, and fetches only those into the same sparse partial files and range
//! records a whole download uses; a later placement that needs more fetches only the rest, and
//! a file whose every byte arrives is checked against the hub's SHA-256 and becomes a complete
//! blob like any other.
//!
//! The engine opens a split set by its part names, so the parts are linked under their
//! repository names in `.strata-views/<commit>/` beside the snapshots (the hub's own clients
//! read only `refs`, `snapshots` and `blobs`). What is verified: a complete file against the
//! hub's SHA-256; a file held in part cannot be, since the hub publishes whole-file hashes
//! only; its bytes came over TLS from the hub's CDN for the commit the hub named.

use std::path::PathBuf;

use crate::client::Entry;
use crate::download::{self, Held, Job};
use crate::error::{Error, IoContext, Result};
use crate::{FileEvent, Hub, HubEvent, HubRef};

/// The first bytes fetched of a file to find its header's end; doubled while too short.
const FIRST_HEADER_BYTES: u64 = 256 << 10;

/// A hub model as far as it is here.
#[derive(Debug, Clone)]
pub struct Sparse {
    /// `owner/name`.
    pub repo: String,
    /// The commit its files are of.
    pub commit: String,
    /// The model's files, in part order.
    pub files: Vec<Entry>,
    /// What is here of each file, in the same order.
    pub held: Vec<Held>,
    /// The first part, in a folder that holds every part under its repository name (links to
    /// the blobs or partial files): the path to open the model by.
    pub view: PathBuf,
}

impl Sparse {
    /// Whether every file is complete and checked.
    pub fn complete(&self) -> bool {
        self.held.iter().all(|h| h.complete)
    }

    /// Bytes here, over all files.
    pub fn bytes_held(&self) -> u64 {
        self.held.iter().map(|h| h.ranges.len()).sum()
    }

    /// Bytes of all files.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|e| e.size).sum()
    }

    /// Bytes the last fetch took from the network.
    pub fn fetched(&self) -> u64 {
        self.held.iter().map(|h| h.fetched).sum()
    }
}

impl Hub {
    /// Makes the header (metadata and tensor list) of every file `r` names present, fetching
    /// nothing else: enough to plan a placement and to work out a shard's byte ranges.
    pub fn headers(&self, r: &HubRef, on_event: &mut dyn FnMut(HubEvent<'_>)) -> Result<Sparse> {
        on_event(HubEvent::Resolving { what: &r.what() });
        let remote = self.remote(r)?;
        let mut held = Vec::with_capacity(remote.files.len());
        for entry in &remote.files {
            let job = Job {
                repo: &remote.repo,
                commit: &remote.commit,
                entry,
            };
            held.push(self.header_of(&job, &mut |e| on_event(HubEvent::File(e)))?);
        }
        self.cache
            .set_ref(&remote.repo, &r.revision, &remote.commit)?;
        self.viewed(remote.repo, remote.commit, remote.files, held)
    }

    /// Fetches the ranges `want[i]` of file `i` (half-open, in the file's own offsets) that are
    /// not yet here. Files that end up whole are checked and become complete blobs.
    pub fn fetch_ranges(
        &self,
        model: &Sparse,
        want: &[Vec<(u64, u64)>],
        on_event: &mut dyn FnMut(HubEvent<'_>),
    ) -> Result<Sparse> {
        let missing: u64 = model
            .held
            .iter()
            .zip(want)
            .map(|(h, w)| w.iter().map(|&(a, b)| gap_bytes(h, a, b)).sum::<u64>())
            .sum();
        on_event(HubEvent::Plan {
            files: model.files.len(),
            bytes: want.iter().flatten().map(|(a, b)| b - a).sum(),
            missing,
        });
        let mut held = Vec::with_capacity(model.files.len());
        for (i, entry) in model.files.iter().enumerate() {
            let job = Job {
                repo: &model.repo,
                commit: &model.commit,
                entry,
            };
            let ranges = want.get(i).map(Vec::as_slice).unwrap_or_default();
            held.push(download::fetch_ranges(
                &self.client,
                &self.cache,
                &job,
                self.transfer,
                ranges,
                &mut |e| on_event(HubEvent::File(e)),
            )?);
        }
        tracing::info!(
            model = %model.repo,
            fetched = held.iter().map(|h| h.fetched).sum::<u64>(),
            "fetched a shard's ranges"
        );
        self.viewed(
            model.repo.clone(),
            model.commit.clone(),
            model.files.clone(),
            held,
        )
    }

    /// Writes bytes of file `i` of `model` that came from elsewhere (a cluster peer) at `at`,
    /// recording them as held.
    pub fn put_range(&self, model: &Sparse, i: usize, at: u64, bytes: &[u8]) -> Result<()> {
        let entry = model
            .files
            .get(i)
            .ok_or_else(|| Error::NoSuchModel(format!("{}: no file {i}", model.repo)))?;
        let job = Job {
            repo: &model.repo,
            commit: &model.commit,
            entry,
        };
        download::put(&self.cache, &job, at, bytes)
    }

    /// One file's header, fetched in growing prefixes until it parses.
    fn header_of(&self, job: &Job<'_>, on_event: &mut dyn FnMut(FileEvent<'_>)) -> Result<Held> {
        let size = job.entry.size;
        let mut want = FIRST_HEADER_BYTES.min(size);
        loop {
            let held = download::fetch_ranges(
                &self.client,
                &self.cache,
                job,
                self.transfer,
                &[(0, want)],
                on_event,
            )?;
            let prefix = read_prefix(&held.path, want)?;
            let parsed = strata_gguf::header_len(&prefix).map_err(|e| Error::Protocol {
                url: format!("{}/{}", job.repo, job.entry.path),
                message: format!("not a GGUF file: {e}"),
            })?;
            match parsed {
                Some(end) if end <= want => return Ok(held),
                Some(end) => want = end.min(size),
                None if want >= size => {
                    return Err(Error::Protocol {
                        url: format!("{}/{}", job.repo, job.entry.path),
                        message: "the GGUF header runs past the end of the file".into(),
                    });
                }
                None => want = want.saturating_mul(2).min(size),
            }
        }
    }

    /// Links every file under its repository name in the commit's view folder.
    fn viewed(
        &self,
        repo: String,
        commit: String,
        files: Vec<Entry>,
        held: Vec<Held>,
    ) -> Result<Sparse> {
        let dir = self
            .cache
            .repo_dir(&repo)
            .join(".strata-views")
            .join(&commit);
        // The hub's clients take a ref to a commit without a snapshot folder for a broken
        // cache: the commit's folder exists, holding links to complete files only.
        let snapshot = self.cache.snapshot(&repo, &commit);
        std::fs::create_dir_all(&snapshot).at("creating", &snapshot)?;
        for (entry, h) in files.iter().zip(&held) {
            let link = dir.join(&entry.path);
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent).at("creating", parent)?;
            }
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&h.path, &link).at("linking", &link)?;
            if h.complete {
                self.cache.link(&repo, &commit, &entry.path, entry.etag())?;
            }
        }
        let first = files
            .first()
            .ok_or_else(|| Error::NoSuchModel(format!("{repo}: no files")))?;
        let view = dir.join(&first.path);
        Ok(Sparse {
            repo,
            commit,
            files,
            held,
            view,
        })
    }
}

/// Bytes of `[a, b)` not in `h`.
fn gap_bytes(h: &Held, a: u64, b: u64) -> u64 {
    h.ranges.gaps(a, b).iter().map(|(x, y)| y - x).sum()
}

fn read_prefix(path: &std::path::Path, n: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(n as usize);
    std::fs::File::open(path)
        .at("opening", path)?
        .take(n)
        .read_to_end(&mut buf)
        .at("reading", path)?;
    Ok(buf)
}

impl crate::HubCache {
    /// What the cache holds of the file whose hub identity is `etag` in `repo` (`owner/name`):
    /// the path of its bytes and the ranges there, or `None`. What a node answers a peer
    /// asking for ranges; names that are not a repository and a hex identity are refused.
    pub fn holding(&self, repo: &str, etag: &str) -> Result<Option<(PathBuf, crate::RangeSet)>> {
        let hex = matches!(etag.len(), 40 | 64) && etag.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex || HubRef::parse(repo).map(|r| r.repo != repo).unwrap_or(true) {
            return Err(Error::BadReference(format!(
                "{repo:?} / {etag:?}: not a repository and a file identity"
            )));
        }
        download::holding(self, repo, etag)
    }
}
