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
mod types;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    backing: Backing,
    header: parse::Header,
}

/// An opened, validated GGUF file. Cheap to clone: clones share the map.
#[derive(Clone, Debug)]
pub struct GgufFile {
    inner: Arc<Inner>,
}

impl GgufFile {
    /// Maps and validates the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
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
        Self::from_backing(path.to_path_buf(), Backing::Mmap(map), true)
    }

    /// Reads only the header of the file at `path` (metadata and tensor shapes), which may
    /// be cut off anywhere after it: enough to plan with, never to run. Tensor data reads as
    /// empty.
    pub fn open_header(path: &Path) -> Result<GgufFile> {
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
        Self::from_backing(path.to_path_buf(), Backing::Owned(buf), false)
    }

    /// Validates an in-memory GGUF image.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_backing(PathBuf::from("<memory>"), Backing::Owned(bytes), true)
    }

    fn from_backing(path: PathBuf, backing: Backing, whole: bool) -> Result<GgufFile> {
        let header = parse::parse_header(backing.bytes(), whole)?;
        Ok(GgufFile {
            inner: Arc::new(Inner {
                path,
                backing,
                header,
            }),
        })
    }

    /// Path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.inner.header.version
    }

    /// Data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.inner.header.alignment
    }

    /// Offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.inner.header.data_offset
    }

    /// The metadata key/value pairs.
    pub fn metadata(&self) -> &Metadata {
        &self.inner.header.metadata
    }

    /// All tensors in file order.
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

    /// The bytes of a tensor of this file. Bounds were checked when the file was opened.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.inner.backing.bytes();
        let start = t.offset as usize;
        let end = start + t.n_bytes as usize;
        bytes.get(start..end).unwrap_or(&[])
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.inner.backing.bytes()
    }

    /// Tells the kernel this process will not read `start..start + len` of the file again (its
    /// contents were copied elsewhere, e.g. repacked), so those pages stop counting towards this
    /// process's resident memory. Only whole pages inside the range are released; reading them
    /// later still works (the pages come back from the page cache).
    pub fn release(&self, start: usize, len: usize) {
        let Backing::Mmap(map) = &self.inner.backing else {
            return;
        };
        const PAGE: usize = 4096;
        let first = start.div_ceil(PAGE) * PAGE;
        let end = (start.saturating_add(len) / PAGE * PAGE).min(map.len());
        if end > first {
            // SAFETY: the map is read-only and file-backed, so dropping its pages loses nothing:
            // a later read faults them back in from the file. No reference into the range is
            // invalidated, since the mapping itself stays.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
            };
        }
    }

    /// Total file size in bytes.
    pub fn file_len(&self) -> u64 {
        self.inner.backing.bytes().len() as u64
    }
}

#[cfg(test)]
mod tests;
