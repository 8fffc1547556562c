//! Fetching one file into the hub cache: several ranges at once, resumable, checked.
//!
//! The bytes go to `blobs/<etag>.strata-partial`, a sparse file of the full length, and each
//! range, once written and synced, into the record beside it ([`RangeSet`]). A killed or cut
//! download resumes from the record; only when every byte is held is the file hashed against
//! what the hub publishes and renamed to `blobs/<etag>`, so nothing half-written ever looks
//! like a complete blob. A mismatch deletes the partial file, which held only this download's
//! bytes; blobs already in the cache are never touched.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sha2::Digest;

use crate::cache::HubCache;
use crate::client::{Client, Entry, Located, bare, http_error};
use crate::error::{Error, IoContext, Result};
use crate::ranges::RangeSet;

/// What a download reports while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileEvent<'a> {
    /// Another process is writing this blob; waiting for it.
    WaitingForLock {
        /// The file's path in its repository.
        file: &'a str,
    },
    /// Bytes of the file held so far (those from an earlier run included).
    Downloading {
        /// The file's path in its repository.
        file: &'a str,
        /// Bytes held.
        done: u64,
        /// The file's size.
        total: u64,
    },
    /// Bytes hashed so far.
    Verifying {
        /// The file's path in its repository.
        file: &'a str,
        /// Bytes hashed.
        done: u64,
        /// The file's size.
        total: u64,
    },
}

/// How a file is fetched.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// Ranges fetched at once.
    pub streams: usize,
    /// Bytes in one range request.
    pub chunk: u64,
}

impl Default for Transfer {
    fn default() -> Transfer {
        Transfer {
            streams: 4,
            chunk: 32 << 20,
        }
    }
}

/// Where a file of a repository goes and what it must hash to.
pub(crate) struct Job<'a> {
    pub repo: &'a str,
    pub commit: &'a str,
    pub entry: &'a Entry,
}

/// Bytes kept free beyond what a download needs, for the record and the file system's own use.
const SPACE_MARGIN: u64 = 16 << 20;

/// Makes `job`'s blob complete and checked in the cache; returns its path and the bytes this
/// call fetched.
pub(crate) fn fetch(
    client: &Client,
    cache: &HubCache,
    job: &Job<'_>,
    transfer: Transfer,
    on_event: &mut dyn FnMut(FileEvent<'_>),
) -> Result<(PathBuf, u64)> {
    let size = job.entry.size;
    let got = fetch_ranges(client, cache, job, transfer, &[(0, size)], on_event)?;
    Ok((got.path, got.fetched))
}

/// A file of a repository as far as it is here.
#[derive(Debug, Clone)]
pub struct Held {
    /// The complete blob, or the sparse partial file.
    pub path: PathBuf,
    /// Whether every byte is here and checked.
    pub complete: bool,
    /// The byte ranges here (the whole file when complete).
    pub ranges: RangeSet,
    /// Bytes this call fetched.
    pub fetched: u64,
}

/// What is here of `job`'s file, fetching nothing.
pub(crate) fn held(cache: &HubCache, job: &Job<'_>) -> Result<Held> {
    let entry = job.entry;
    let blob = cache.blob(job.repo, entry.etag());
    let mut whole = RangeSet::new();
    whole.insert(0, entry.size);
    if is_complete(&blob, entry.size) {
        return Ok(Held {
            path: blob,
            complete: true,
            ranges: whole,
            fetched: 0,
        });
    }
    let partial = sibling(&blob, ".strata-partial");
    let record = sibling(&blob, ".strata-partial.ranges");
    let ranges = match std::fs::metadata(&partial) {
        Ok(md) if md.len() == entry.size => RangeSet::load(&record)?,
        _ => RangeSet::new(),
    };
    Ok(Held {
        path: partial,
        complete: false,
        ranges,
        fetched: 0,
    })
}

/// Writes `bytes` at `at` into `job`'s partial file (made if missing) and records them as
/// held: bytes that came from elsewhere than the hub (a cluster peer's copy of the range).
/// Nothing happens to a file already complete.
pub(crate) fn put(cache: &HubCache, job: &Job<'_>, at: u64, bytes: &[u8]) -> Result<()> {
    let entry = job.entry;
    let end = at.saturating_add(bytes.len() as u64);
    if end > entry.size {
        return Err(Error::Protocol {
            url: format!("{}/{}", job.repo, entry.path),
            message: format!("bytes {at}..{end} lie past the end ({})", entry.size),
        });
    }
    let blob = cache.blob(job.repo, entry.etag());
    if is_complete(&blob, entry.size) {
        return Ok(());
    }
    let _lock = lock_blob(cache, job, &mut |_| {})?;
    let now = held(cache, job)?;
    if now.complete {
        return Ok(());
    }
    if let Some(dir) = now.path.parent() {
        std::fs::create_dir_all(dir).at("creating", dir)?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&now.path)
        .at("opening", &now.path)?;
    file.set_len(entry.size).at("sizing", &now.path)?;
    file.write_all_at(bytes, at).at("writing", &now.path)?;
    file.sync_data().at("syncing", &now.path)?;
    let mut ranges = now.ranges;
    ranges.insert(at, end);
    ranges.save(&sibling(&blob, ".strata-partial.ranges"))
}

/// What the cache holds of the file `etag` of `repo` (a peer asks by these): its path and
/// ranges, or `None`.
pub(crate) fn holding(
    cache: &HubCache,
    repo: &str,
    etag: &str,
) -> Result<Option<(PathBuf, RangeSet)>> {
    let blob = cache.blob(repo, etag);
    if let Ok(md) = std::fs::metadata(&blob)
        && md.is_file()
    {
        let mut whole = RangeSet::new();
        whole.insert(0, md.len());
        return Ok(Some((blob, whole)));
    }
    let partial = sibling(&blob, ".strata-partial");
    if !partial.is_file() {
        return Ok(None);
    }
    let ranges = RangeSet::load(&sibling(&blob, ".strata-partial.ranges"))?;
    Ok(Some((partial, ranges)))
}

/// Makes the bytes `want` (half-open ranges) of `job`'s file present in the cache, fetching
/// those not yet held into the sparse partial file. When that leaves every byte of the file
/// held, the file is checked and becomes the complete blob, as [`fetch`] makes it.
pub(crate) fn fetch_ranges(
    client: &Client,
    cache: &HubCache,
    job: &Job<'_>,
    transfer: Transfer,
    want: &[(u64, u64)],
    on_event: &mut dyn FnMut(FileEvent<'_>),
) -> Result<Held> {
    let entry = job.entry;
    let blob = cache.blob(job.repo, entry.etag());
    if is_complete(&blob, entry.size) {
        return held(cache, job);
    }
    let _lock = lock_blob(cache, job, on_event)?;
    let before = held(cache, job)?;
    if before.complete {
        return Ok(before);
    }
    let (partial, record, held_ranges) = (
        before.path,
        sibling(&blob, ".strata-partial.ranges"),
        before.ranges,
    );
    let mut gaps = Vec::new();
    for &(a, b) in want {
        gaps.extend(held_ranges.gaps(a.min(entry.size), b.min(entry.size)));
    }
    let need: u64 = gaps.iter().map(|(a, b)| b - a).sum();
    let dir = blob.parent().unwrap_or(cache.root()).to_path_buf();
    std::fs::create_dir_all(&dir).at("creating", &dir)?;
    if need > 0 {
        let free = free_space(&dir)?;
        if free < need + SPACE_MARGIN {
            return Err(Error::NoSpace {
                dir,
                file: format!("{}/{}", job.repo, entry.path),
                need,
                free,
            });
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&partial)
        .at("opening", &partial)?;
    file.set_len(entry.size).at("sizing", &partial)?;
    let held_before = held_ranges.len();
    let (fetched, now) = if need > 0 {
        let located = client.locate(job.repo, job.commit, &entry.path)?;
        let state = Shared {
            client,
            job,
            file: &file,
            partial: &partial,
            record: &record,
            located: Mutex::new(located),
            held: Mutex::new(held_ranges),
            queue: Mutex::new(chunks(&gaps, transfer.chunk)),
            received: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        };
        run_workers(&state, transfer.streams, held_before, on_event)?;
        let now = state.held.into_inner().map_err(|_| Error::Protocol {
            url: entry.path.clone(),
            message: "a download thread panicked".into(),
        })?;
        (state.received.load(Ordering::Relaxed), now)
    } else {
        (0, held_ranges)
    };
    if now.gaps(0, entry.size).is_empty() {
        verify(&file, job, &partial, on_event).inspect_err(|e| {
            if matches!(e, Error::HashMismatch { .. }) {
                let _ = std::fs::remove_file(&partial);
                let _ = std::fs::remove_file(&record);
            }
        })?;
        drop(file);
        std::fs::rename(&partial, &blob).at("renaming", &partial)?;
        let _ = std::fs::remove_file(&record);
        return Ok(Held {
            path: blob,
            complete: true,
            ranges: now,
            fetched,
        });
    }
    Ok(Held {
        path: partial,
        complete: false,
        ranges: now,
        fetched,
    })
}

/// Takes the lock the hub's clients take on a blob they write (`.locks/...`), waiting (and
/// saying so) while another process holds it; the lock lasts as long as the file returned.
fn lock_blob(
    cache: &HubCache,
    job: &Job<'_>,
    on_event: &mut dyn FnMut(FileEvent<'_>),
) -> Result<File> {
    let lock_path = cache.lock(job.repo, job.entry.etag());
    if let Some(dir) = lock_path.parent() {
        std::fs::create_dir_all(dir).at("creating", dir)?;
    }
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .at("opening", &lock_path)?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            on_event(FileEvent::WaitingForLock {
                file: &job.entry.path,
            });
            lock.lock().at("locking", &lock_path)?;
        }
        Err(TryLockError::Error(e)) => return Err(e).at("locking", &lock_path),
    }
    Ok(lock)
}

fn is_complete(blob: &Path, size: u64) -> bool {
    std::fs::metadata(blob).is_ok_and(|m| m.is_file() && m.len() == size)
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// The gaps cut into requests of at most `chunk` bytes.
fn chunks(gaps: &[(u64, u64)], chunk: u64) -> VecDeque<(u64, u64)> {
    let chunk = chunk.max(1);
    let mut out = VecDeque::new();
    for &(mut a, b) in gaps {
        while a < b {
            let e = (a + chunk).min(b);
            out.push_back((a, e));
            a = e;
        }
    }
    out
}

/// What the workers of one file share.
struct Shared<'a> {
    client: &'a Client,
    job: &'a Job<'a>,
    file: &'a File,
    partial: &'a Path,
    record: &'a Path,
    located: Mutex<Located>,
    held: Mutex<RangeSet>,
    queue: Mutex<VecDeque<(u64, u64)>>,
    /// Bytes received by this run (what crossed the network).
    received: AtomicU64,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
}

fn run_workers(
    s: &Shared<'_>,
    streams: usize,
    held_before: u64,
    on_event: &mut dyn FnMut(FileEvent<'_>),
) -> Result<()> {
    let n = streams
        .max(1)
        .min(s.queue.lock().map(|q| q.len()).unwrap_or(1).max(1));
    let entry = s.job.entry;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n).map(|_| scope.spawn(|| worker(s))).collect();
        while !handles.iter().all(|h| h.is_finished()) {
            let done = held_before + s.received.load(Ordering::Relaxed);
            on_event(FileEvent::Downloading {
                file: &entry.path,
                done: done.min(entry.size),
                total: entry.size,
            });
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    if let Some(e) = s.error.lock().ok().and_then(|mut e| e.take()) {
        return Err(e);
    }
    let held = s.held.lock().map(|h| h.len()).unwrap_or(0);
    on_event(FileEvent::Downloading {
        file: &entry.path,
        done: held,
        total: entry.size,
    });
    Ok(())
}

fn worker(s: &Shared<'_>) {
    while !s.failed.load(Ordering::Relaxed) {
        let Some((a, b)) = s.queue.lock().ok().and_then(|mut q| q.pop_front()) else {
            return;
        };
        let outcome = fetch_range(s, a, b).and_then(|done| match done {
            true => hold(s, a, b),
            false => Ok(()),
        });
        if let Err(e) = outcome {
            s.failed.store(true, Ordering::Relaxed);
            if let Ok(mut slot) = s.error.lock() {
                slot.get_or_insert(e);
            }
            return;
        }
    }
}

fn poisoned(s: &Shared<'_>) -> Error {
    Error::Protocol {
        url: s.job.entry.path.clone(),
        message: "a download thread panicked".into(),
    }
}

/// Fetches `[a, b)` into the partial file, resuming within the range after a cut connection
/// and asking the hub again for the URL if the CDN's signed one expired. `Ok(false)` when it
/// stopped early because another stream failed (what it wrote is
/// recorded).
fn fetch_range(s: &Shared<'_>, a: u64, b: u64) -> Result<bool> {
    let retry = s.client.retry;
    let mut at = a;
    let mut wait = retry.first_wait;
    let mut failures = 0;
    let mut refreshed = false;
    while at < b {
        if s.failed.load(Ordering::Relaxed) {
            if at > a {
                hold(s, a, at)?;
            }
            return Ok(false);
        }
        let located = s.located.lock().map_err(|_| poisoned(s))?.clone();
        let mut resp = s
            .client
            .send("GET", &located.url, located.same_origin, Some((at, b)))?;
        let status = resp.status().as_u16();
        let whole = status == 200 && at == 0 && b == s.job.entry.size;
        if status != 206 && !whole {
            if matches!(status, 401 | 403 | 404 | 410) && !refreshed && !located.same_origin {
                // A signed CDN URL that expired: the hub hands out a fresh one.
                refreshed = true;
                let fresh = s
                    .client
                    .locate(s.job.repo, s.job.commit, &s.job.entry.path)?;
                *s.located.lock().map_err(|_| poisoned(s))? = fresh;
                continue;
            }
            if status == 200 {
                return Err(Error::Protocol {
                    url: bare(&located.url),
                    message: "the server ignores Range requests".into(),
                });
            }
            return Err(http_error(&located.url, &mut resp));
        }
        if status == 206 && !content_range_starts_at(&resp, at) {
            return Err(Error::Protocol {
                url: bare(&located.url),
                message: format!("asked for bytes from {at}, got another Content-Range"),
            });
        }
        let from = at;
        copy_body(s, &mut resp, a, &mut at, b)?;
        if at >= b {
            return Ok(true);
        }
        tracing::debug!(file = %s.job.entry.path, at, end = b, "body ended early; resuming");
        if at > from {
            // Progress since the last failure: a long download may be cut (or see its
            // signed URL expire) many times, and each time it moved on counts afresh.
            failures = 0;
            wait = retry.first_wait;
            refreshed = false;
        }
        failures += 1;
        if failures >= retry.attempts {
            return Err(Error::Network {
                url: bare(&located.url),
                message: format!("the connection kept dropping ({failures} times) at byte {at}"),
            });
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(retry.max_wait);
    }
    Ok(true)
}

fn content_range_starts_at(resp: &ureq::http::Response<ureq::Body>, at: u64) -> bool {
    resp.headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes "))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.trim().parse::<u64>().ok())
        == Some(at)
}

/// Bytes a stream writes between updates of the record, so that a killed pull loses at most
/// this much per stream rather than a whole range.
const RECORD_EVERY: u64 = 8 << 20;

/// Adds `[a, b)`, written, to the record of bytes held.
fn hold(s: &Shared<'_>, a: u64, b: u64) -> Result<()> {
    s.file.sync_data().at("syncing", s.partial)?;
    let mut held = s.held.lock().map_err(|_| poisoned(s))?;
    held.insert(a, b);
    held.save(s.record)
}

/// Copies the body into the file from `*at` towards `end`, advancing `*at` and recording
/// `[start, *at)` as held every [`RECORD_EVERY`] bytes; a transport error mid-body ends the
/// copy early (the caller resumes), a file error fails it.
fn copy_body(
    s: &Shared<'_>,
    resp: &mut ureq::http::Response<ureq::Body>,
    start: u64,
    at: &mut u64,
    end: u64,
) -> Result<()> {
    let mut reader = resp.body_mut().as_reader();
    let mut buf = vec![0u8; 256 << 10];
    let mut recorded = *at;
    while *at < end {
        if *at - recorded >= RECORD_EVERY {
            hold(s, start, *at)?;
            recorded = *at;
        }
        let want = ((end - *at) as usize).min(buf.len());
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) => {
                // A cut connection, a reset, a timeout: the caller resumes from `*at`.
                tracing::debug!(file = %s.job.entry.path, error = %e, "body read failed");
                return Ok(());
            }
        };
        if let Err(e) = s.file.write_all_at(&buf[..n], *at) {
            if e.raw_os_error() == Some(libc::ENOSPC) {
                return Err(Error::NoSpace {
                    dir: s.partial.parent().unwrap_or(s.partial).to_path_buf(),
                    file: format!("{}/{}", s.job.repo, s.job.entry.path),
                    need: end - *at,
                    free: 0,
                });
            }
            return Err(e).at("writing", s.partial);
        }
        *at += n as u64;
        s.received.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Hashes the whole partial file against the hub's SHA-256 (LFS files) or git blob id.
fn verify(
    file: &File,
    job: &Job<'_>,
    partial: &Path,
    on_event: &mut dyn FnMut(FileEvent<'_>),
) -> Result<()> {
    let entry = job.entry;
    let lfs = entry.sha256.is_some();
    let got = digest(file, entry.size, lfs, &mut |done| {
        on_event(FileEvent::Verifying {
            file: &entry.path,
            done,
            total: entry.size,
        })
    })
    .at("reading", partial)?;
    let expected = match &entry.sha256 {
        Some(h) => h.clone(),
        None => entry.oid.to_ascii_lowercase(),
    };
    if got != expected {
        return Err(Error::HashMismatch {
            file: format!("{}/{}", job.repo, entry.path),
            expected,
            got,
        });
    }
    Ok(())
}

/// The hub's identity of `size` bytes of `file`: their SHA-256 (an LFS file's), else their
/// git blob id (SHA-1 of `blob <size>\0` and the bytes), hex. `progress` gets the bytes hashed
/// every 64 MiB and at the end.
pub(crate) fn digest(
    file: &File,
    size: u64,
    lfs: bool,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<String> {
    let mut sha256 = sha2::Sha256::new();
    let mut sha1 = sha1::Sha1::new();
    if !lfs {
        sha1.update(format!("blob {size}\0").as_bytes());
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    let mut last = 0u64;
    while at < size {
        let want = ((size - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..want], at)?;
        if lfs {
            sha256.update(&buf[..want]);
        } else {
            sha1.update(&buf[..want]);
        }
        at += want as u64;
        if at - last >= 64 << 20 || at == size {
            last = at;
            progress(at);
        }
    }
    Ok(if lfs {
        hex(&sha256.finalize())
    } else {
        hex(&sha1.finalize())
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes free to an unprivileged writer on the file system holding `dir`.
fn free_space(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| Error::Io {
        action: "checking free space of",
        path: dir.to_path_buf(),
        error: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` points at a statvfs the call fills.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).at("checking free space of", dir);
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_cut_into_requests() {
        let c = chunks(&[(0, 10), (20, 25)], 4);
        assert_eq!(
            c.into_iter().collect::<Vec<_>>(),
            vec![(0, 4), (4, 8), (8, 10), (20, 24), (24, 25)]
        );
    }

    #[test]
    fn free_space_is_read() {
        assert!(free_space(Path::new("/")).is_ok_and(|f| f > 0));
    }
}
