//! GGUF model files: a validating reader over a memory map, and a small writer.
//!
//! [`GgufFile::open`] maps the file, parses the header and checks every tensor's type, shape,
//! offset, alignment and byte size against the file before anything else touches it; after that,
//! [`GgufFile::tensor_data`] hands out the exact byte range of a tensor with no further checks.
//! The engine borrows weight rows straight from the map, so a worker that owns only a shard
//! touches (and pages in) only that shard.
//!
//! This crate sits at the bottom of the workspace: it must never depend on the tokenizer, the
//! kernels or the engine.
#![warn(missing_docs)]

mod error;
mod metadata;
mod parse;
pub mod split;
mod types;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use error::{Error, Result};
pub use metadata::{Array, Metadata, Value};
pub use types::GgmlType;
pub use writer::GgufWriter;

/// Where one tensor lives in the file and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    /// Element format.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte length of the data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Elements per row (`dims[0]`).
    pub fn row_len(&self) -> usize {
        self.dims[0] as usize
    }

    /// Number of rows: the product of all dimensions but the first.
    pub fn n_rows(&self) -> usize {
        self.dims[1..].iter().product::<u64>() as usize
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        (self.n_bytes as usize) / self.n_rows().max(1)
    }
}

/// The bytes behind a GGUF file: a read-only memory map, or an owned buffer (tests, fuzzing).
#[derive(Debug)]
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// One file of a model: the whole model, or one part of a split set.
#[derive(Debug)]
struct Part {
    path: PathBuf,
    backing: Backing,
    /// Where this part's bytes start in the model's address space (the sizes of the parts
    /// before it): tensor offsets are in that space, so a tensor names its part by where it is.
    base: u64,
}

#[derive(Debug)]
struct Inner {
    parts: Vec<Part>,
    header: parse::Header,
    /// Every `(start, len)` [`GgufFile::range`] handed out, when the file was opened to record
    /// them ([`GgufFile::open_recording`]).
    reads: Option<Mutex<Vec<(u64, u64)>>>,
}

/// An opened, validated GGUF model: one file, or every part of a llama.cpp split set (see
/// [`split`]) read as one. Cheap to clone: clones share the maps.
#[derive(Clone, Debug)]
pub struct GgufFile {
    inner: Arc<Inner>,
}

impl GgufFile {
    /// Maps and validates the model at `path`: the file, or, when it is the first part of a
    /// split set, every part (found beside it by llama.cpp's names). A later part is refused
    /// with the name of the first.
    pub fn open(path: &Path) -> Result<GgufFile> {
        Self::open_parts(path, true)
    }

    /// Reads only the header of the model at `path` (metadata and tensor shapes; for a split
    /// set, the header of every part), which may be cut off anywhere after it: enough to plan
    /// with, never to run. Tensor data reads as empty.
    pub fn open_header(path: &Path) -> Result<GgufFile> {
        Self::open_parts(path, false)
    }

    /// [`open`](Self::open), remembering every byte range read through the file from now on
    /// ([`reads`](Self::reads)). Loading a shard from a file whose tensor data is not all there
    /// yet (a sparse partial download: holes read as zeros) tells which bytes the shard needs.
    pub fn open_recording(path: &Path) -> Result<GgufFile> {
        let mut f = Self::open(path)?;
        if let Some(inner) = Arc::get_mut(&mut f.inner) {
            inner.reads = Some(Mutex::new(Vec::new()));
        }
        Ok(f)
    }

    /// The byte ranges read since [`open_recording`](Self::open_recording), in the model's
    /// address space, sorted and merged; empty for a file not opened to record.
    pub fn reads(&self) -> Vec<(u64, u64)> {
        let Some(reads) = &self.inner.reads else {
            return Vec::new();
        };
        let mut all: Vec<(u64, u64)> = reads
            .lock()
            .map(|r| r.iter().map(|&(s, n)| (s, s + n)).collect())
            .unwrap_or_default();
        all.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
        for (a, b) in all {
            match out.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        out
    }

    /// Where each file of the model starts in its address space (0 for the first; a split
    /// set's later parts after the sizes of those before).
    pub fn part_starts(&self) -> Vec<u64> {
        self.inner.parts.iter().map(|p| p.base).collect()
    }

    fn open_parts(path: &Path, whole: bool) -> Result<GgufFile> {
        let read = if whole { map } else { header_bytes };
        let first = Self::from_backing(path.to_path_buf(), read(path)?, whole)?;
        let Some(set) = split::SplitSet::of(first.metadata(), path)? else {
            return Ok(first);
        };
        let mut parts = vec![first];
        for p in set.paths.iter().skip(1) {
            let backing = read(p).map_err(|e| set.missing(p, e))?;
            parts.push(Self::from_backing(p.clone(), backing, whole)?);
        }
        set.join(parts, whole)
    }

    /// Validates an in-memory GGUF image.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_backing(PathBuf::from("<memory>"), Backing::Owned(bytes), true)
    }

    fn from_backing(path: PathBuf, backing: Backing, whole: bool) -> Result<GgufFile> {
        let header = parse::parse_header(backing.bytes(), whole)?;
        Ok(GgufFile {
            inner: Arc::new(Inner {
                parts: vec![Part {
                    path,
                    backing,
                    base: 0,
                }],
                header,
                reads: None,
            }),
        })
    }

    /// Path the model was opened from (the first part of a split set).
    pub fn path(&self) -> &Path {
        &self.inner.parts[0].path
    }

    /// Every file of the model, in order: one path, or the parts of a split set.
    pub fn paths(&self) -> Vec<&Path> {
        self.inner.parts.iter().map(|p| p.path.as_path()).collect()
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.inner.header.version
    }

    /// Data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.inner.header.alignment
    }

    /// Offset of the tensor data section (of the first file).
    pub fn data_offset(&self) -> u64 {
        self.inner.header.data_offset
    }

    /// The metadata key/value pairs (a split set's, from its first part).
    pub fn metadata(&self) -> &Metadata {
        &self.inner.header.metadata
    }

    /// All tensors in file order (a split set's in part order).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.inner.header.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors().iter().find(|t| t.name == name)
    }

    /// The tensor named `name`, or a [`Error::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    /// The bytes of a tensor of this model. Bounds were checked when it was opened.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.range(t.offset as usize, t.n_bytes as usize)
    }

    /// `len` bytes from `start` in the model's address space (a split set's parts one after
    /// another); empty when the range leaves the part it starts in, which no tensor's does.
    pub fn range(&self, start: usize, len: usize) -> &[u8] {
        if let Some(reads) = &self.inner.reads
            && let Ok(mut r) = reads.lock()
        {
            r.push((start as u64, len as u64));
        }
        let Some((part, at)) = self.locate(start) else {
            return &[];
        };
        part.backing
            .bytes()
            .get(at..at.saturating_add(len))
            .unwrap_or(&[])
    }

    /// The part holding byte `start` of the address space, and the offset within it.
    fn locate(&self, start: usize) -> Option<(&Part, usize)> {
        let start = start as u64;
        let part = self.inner.parts.iter().rev().find(|p| p.base <= start)?;
        Some((part, (start - part.base) as usize))
    }

    /// Tells the kernel this process will not read `start..start + len` of the model again (its
    /// contents were copied elsewhere, e.g. repacked), so those pages stop counting towards this
    /// process's resident memory. Only whole pages inside the range are released; reading them
    /// later still works (the pages come back from the page cache).
    pub fn release(&self, start: usize, len: usize) {
        let Some((part, at)) = self.locate(start) else {
            return;
        };
        let Backing::Mmap(map) = &part.backing else {
            return;
        };
        const PAGE: usize = 4096;
        let first = at.div_ceil(PAGE) * PAGE;
        let end = (at.saturating_add(len) / PAGE * PAGE).min(map.len());
        if end > first {
            // SAFETY: the map is read-only and file-backed, so dropping its pages loses nothing:
            // a later read faults them back in from the file. No reference into the range is
            // invalidated, since the mapping itself stays.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
            };
        }
    }

    /// Total size in bytes (of every part of a split set).
    pub fn file_len(&self) -> u64 {
        self.inner
            .parts
            .iter()
            .map(|p| p.backing.bytes().len() as u64)
            .sum()
    }
}

/// Where the tensor data of a GGUF file starts, from a prefix of it: `Ok(None)` while the
/// prefix is too short to hold the whole header (metadata and tensor list), an error for bytes
/// that are no GGUF header. What a download fetches first to plan from.
pub fn header_len(prefix: &[u8]) -> Result<Option<u64>> {
    match parse::parse_header(prefix, false) {
        Ok(h) => Ok(Some(h.data_offset)),
        // A count the bytes so far cannot hold may be one the rest of the file does.
        Err(Error::Truncated { .. } | Error::ImplausibleCount { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Maps `path` whole.
fn map(path: &Path) -> Result<Backing> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and private to this process. Mutation of the file by
    // another process while mapped is outside what we can guard against (as with every
    // mmap-based loader); the model store only ever installs files by atomic rename, so it
    // never rewrites a file in place.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Backing::Mmap(map))
}

/// Reads the start of `path`, as much as its header takes.
fn header_bytes(path: &Path) -> Result<Backing> {
    use std::io::Read;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    // Headers are a few MB (the vocabulary); read more while the parse runs short.
    let mut buf = Vec::new();
    let mut want = 8u64 << 20;
    loop {
        let have = buf.len() as u64;
        (&mut file)
            .take(want - have)
            .read_to_end(&mut buf)
            .map_err(io)?;
        let ended = (buf.len() as u64) < want;
        match parse::parse_header(&buf, false) {
            Err(Error::Truncated { .. }) if !ended => want = want.saturating_mul(4),
            Err(e) => return Err(e),
            Ok(_) => break,
        }
    }
    Ok(Backing::Owned(buf))
}

#[cfg(test)]
mod tests;
