//! llama.cpp's split GGUFs: one model in several files, as `llama-gguf-split --split` writes
//! them and the large models on model hubs are published.
//!
//! Part `N` of `M` is named `PREFIX-0000N-of-0000M.gguf` (five digits, `N` from 1). Every part
//! is a GGUF file of its own, with its own header, tensor infos and data; the first carries
//! the model's metadata. Each part says where it belongs: `split.no` (from 0), `split.count`
//! and `split.tensors.count` (the tensors of all parts). [`crate::GgufFile::open`] given the
//! first part opens them all and reads them as one model: tensors keep their order, and a
//! tensor's offset is in one address space that lays the parts end to end.
//!
//! A part that is missing, belongs to another set, or disagrees about the count is refused in
//! one line naming it; so is a later part given where the first is expected.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Error, GgufFile, Inner, Metadata, Part, Result};

/// The key with a part's index (from 0).
pub const KEY_NO: &str = "split.no";
/// The key with the number of parts.
pub const KEY_COUNT: &str = "split.count";
/// The key with the number of tensors in all parts.
pub const KEY_TENSORS: &str = "split.tensors.count";

/// Most parts a set may have (llama.cpp writes the count as five digits).
const MAX_PARTS: u32 = 99_999;

/// The file name of part `no` (from 1) of `count` of the set named `prefix`.
pub fn part_name(prefix: &str, no: u32, count: u32) -> String {
    format!("{prefix}-{no:05}-of-{count:05}.gguf")
}

/// A split part's file name read back: its prefix, part number (from 1) and count. `None` for a
/// name of another form.
pub fn parse_name(name: &str) -> Option<(&str, u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if prefix.is_empty() || !digits(no) || !digits(count) {
        return None;
    }
    let (no, count) = (no.parse().ok()?, count.parse().ok()?);
    (1..=count).contains(&no).then_some((prefix, no, count))
}

/// The split keys of a part: (index from 0, count, tensors in all parts), or `None` for a model
/// in one file (no `split.count`, or a count of 1).
fn keys(meta: &Metadata) -> Result<Option<(u32, u32, u64)>> {
    if meta.get(KEY_COUNT).is_none() {
        return Ok(None);
    }
    let count = meta.get_u32(KEY_COUNT)?;
    if count <= 1 {
        return Ok(None);
    }
    let no = meta.get_u32(KEY_NO)?;
    let tensors = meta.get_u64(KEY_TENSORS)?;
    Ok(Some((no, count, tensors)))
}

/// The files of a split set, found from its first part.
#[derive(Debug)]
pub(crate) struct SplitSet {
    /// Every part's path, the first (given) one first.
    pub(crate) paths: Vec<PathBuf>,
    count: u32,
    tensors: u64,
}

fn split_error(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Split {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

impl SplitSet {
    /// The set whose first part is `path` (with metadata `meta`), or `None` for a model in one
    /// file. A later part is refused with the name of the first.
    pub(crate) fn of(meta: &Metadata, path: &Path) -> Result<Option<SplitSet>> {
        let Some((no, count, tensors)) = keys(meta)? else {
            return Ok(None);
        };
        if count > MAX_PARTS || no >= count {
            return Err(split_error(
                path,
                format!("{KEY_NO} {no} of {KEY_COUNT} {count} is not a part of a set"),
            ));
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some((prefix, named_no, named_count)) = parse_name(name) else {
            return Err(split_error(
                path,
                format!(
                    "part {} of a split model of {count}, but not named PREFIX-{:05}-of-{count:05}.gguf, \
                     so its other parts cannot be found",
                    no + 1,
                    no + 1
                ),
            ));
        };
        let dir = path.parent().unwrap_or(Path::new(""));
        if (named_no, named_count) != (no + 1, count) {
            return Err(split_error(
                path,
                format!(
                    "named part {named_no} of {named_count}, but its header says part {} of {count}",
                    no + 1
                ),
            ));
        }
        if no != 0 {
            return Err(split_error(
                path,
                format!(
                    "part {} of {count} of a split model: open its first part, {}",
                    no + 1,
                    dir.join(part_name(prefix, 1, count)).display()
                ),
            ));
        }
        let paths = (1..=count)
            .map(|n| dir.join(part_name(prefix, n, count)))
            .collect();
        Ok(Some(SplitSet {
            paths,
            count,
            tensors,
        }))
    }

    /// The error for part `p`, which could not be read.
    pub(crate) fn missing(&self, p: &Path, e: Error) -> Error {
        let no = self.paths.iter().position(|q| q == p).map_or(0, |i| i + 1);
        let why = match e {
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                format!("part {no} of {} of the split model is missing", self.count)
            }
            Error::Io { source, .. } => format!("part {no} of {}: {source}", self.count),
            other => format!("part {no} of {}: {other}", self.count),
        };
        split_error(p, why)
    }

    /// The parts, opened in order, as one model: each checked against the set, tensors laid
    /// end to end.
    pub(crate) fn join(self, files: Vec<GgufFile>, whole: bool) -> Result<GgufFile> {
        let mut parts = Vec::with_capacity(files.len());
        let mut header = None;
        let mut tensors = Vec::new();
        let mut base = 0u64;
        for (i, f) in files.into_iter().enumerate() {
            let path = self.paths[i].clone();
            match keys(f.metadata())? {
                Some((no, count, total)) if no as usize == i && count == self.count => {
                    if total != self.tensors {
                        return Err(split_error(
                            &path,
                            format!(
                                "{KEY_TENSORS} is {total}, the first part's is {}: not one set",
                                self.tensors
                            ),
                        ));
                    }
                }
                Some((no, count, _)) => {
                    return Err(split_error(
                        &path,
                        format!(
                            "says it is part {} of {count}, expected part {} of {}",
                            no + 1,
                            i + 1,
                            self.count
                        ),
                    ));
                }
                None => {
                    return Err(split_error(&path, "is not a part of a split model"));
                }
            }
            let inner = Arc::try_unwrap(f.inner)
                .map_err(|_| split_error(&path, "was opened elsewhere while the set was read"))?;
            let len = inner
                .parts
                .iter()
                .map(|p| p.backing.bytes().len() as u64)
                .sum::<u64>();
            for mut t in inner.header.tensors.iter().cloned() {
                t.offset += base;
                tensors.push(t);
            }
            for p in inner.parts {
                parts.push(Part {
                    path: p.path,
                    backing: p.backing,
                    base,
                });
            }
            if header.is_none() {
                header = Some(inner.header);
            }
            // Header-only reads hold the start of each part, not all of it: the next part
            // starts where the file ends, so offsets still name their part.
            base += if whole {
                len
            } else {
                std::fs::metadata(&path).map_or(len, |m| m.len().max(len))
            };
        }
        if tensors.len() as u64 != self.tensors {
            return Err(split_error(
                &self.paths[0],
                format!(
                    "the {} parts hold {} tensors, {KEY_TENSORS} says {}",
                    self.count,
                    tensors.len(),
                    self.tensors
                ),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(t) = tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
            return Err(Error::Duplicate {
                what: "tensor",
                name: t.name.clone(),
            });
        }
        let Some(mut header) = header else {
            return Err(split_error(&self.paths[0], "has no parts"));
        };
        header.tensors = tensors;
        Ok(GgufFile {
            inner: Arc::new(Inner {
                parts,
                header,
                reads: None,
            }),
        })
    }
}

/// `file` split into parts of at most `per_part` tensors each, byte for byte as
/// `llama-gguf-split --split --split-max-tensors PER_PART` writes them: the first part carries
/// the metadata, every part ends its metadata with the three split keys, each tensor's data is
/// padded to the default alignment. Part `i` is to be named [`part_name`]`(prefix, i + 1, n)`.
/// Held in memory: for tests and small models.
pub fn split_by_tensors(file: &GgufFile, per_part: usize) -> Vec<Vec<u8>> {
    use crate::{GgufWriter, Value};
    let per_part = per_part.max(1);
    let tensors = file.tensors();
    let chunks: Vec<&[crate::TensorInfo]> = tensors.chunks(per_part).collect();
    let count = chunks.len().max(1) as u16;
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let mut w = GgufWriter::new();
            if i == 0 {
                for (k, v) in file.metadata().iter() {
                    if ![KEY_NO, KEY_COUNT, KEY_TENSORS].contains(&k) {
                        w.kv(k, v.clone());
                    }
                }
            }
            // In llama-gguf-split's order: it sets the count last, once it knows it, and
            // setting a key again moves it to the end.
            w.kv(KEY_NO, Value::U16(i as u16));
            w.kv(KEY_TENSORS, Value::I32(tensors.len() as i32));
            w.kv(KEY_COUNT, Value::U16(count));
            for t in *chunk {
                w.tensor(&t.name, &t.dims, t.ggml_type, file.tensor_data(t).to_vec());
            }
            w.to_bytes()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{GgmlType, GgufWriter, Value};

    /// A model of `n` small F32 tensors with some metadata.
    fn model(n: usize) -> GgufFile {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::String("llama".into()));
        w.kv("llama.block_count", Value::U32(7));
        for i in 0..n {
            let data: Vec<u8> = (0..4 * 8).map(|b| (i * 31 + b) as u8).collect();
            w.tensor(&format!("t{i}"), &[8], GgmlType::F32, data);
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    }

    fn write(dir: &Path, prefix: &str, parts: &[Vec<u8>]) -> Vec<PathBuf> {
        let n = parts.len() as u32;
        parts
            .iter()
            .enumerate()
            .map(|(i, bytes)| {
                let p = dir.join(part_name(prefix, i as u32 + 1, n));
                std::fs::write(&p, bytes).unwrap();
                p
            })
            .collect()
    }

    #[test]
    fn names_follow_llama_cpp() {
        assert_eq!(part_name("m", 2, 8), "m-00002-of-00008.gguf");
        assert_eq!(
            parse_name("DeepSeek-V3.1-Q4_K_M-00003-of-00008.gguf"),
            Some(("DeepSeek-V3.1-Q4_K_M", 3, 8))
        );
        for bad in [
            "m-0002-of-00008.gguf",
            "m-00009-of-00008.gguf",
            "-00001-of-00002.gguf",
            "m.gguf",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_split_set_reads_as_the_whole_model() {
        let whole = model(10);
        let dir = tempfile::tempdir().unwrap();
        let paths = write(dir.path(), "m", &split_by_tensors(&whole, 4));
        assert_eq!(paths.len(), 3);
        for read in [
            GgufFile::open(&paths[0]).unwrap(),
            GgufFile::open_header(&paths[0]).unwrap(),
        ] {
            assert_eq!(read.paths().len(), 3);
            assert_eq!(read.metadata().get_u32("llama.block_count").unwrap(), 7);
            let names: Vec<&str> = read.tensors().iter().map(|t| t.name.as_str()).collect();
            let expected: Vec<&str> = whole.tensors().iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, expected);
        }
        let read = GgufFile::open(&paths[0]).unwrap();
        for (a, b) in read.tensors().iter().zip(whole.tensors()) {
            assert_eq!(read.tensor_data(a), whole.tensor_data(b), "{}", a.name);
        }
        let sizes: u64 = paths
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert_eq!(read.file_len(), sizes);
    }

    #[test]
    fn a_missing_or_foreign_part_and_a_later_part_are_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let paths = write(dir.path(), "m", &split_by_tensors(&model(10), 4));
        // A later part names the first.
        let e = GgufFile::open(&paths[1]).unwrap_err().to_string();
        assert!(
            e.contains("m-00001-of-00003.gguf") && e.contains("part 2 of 3"),
            "{e}"
        );
        // A part of another set of the same shape.
        let other = tempfile::tempdir().unwrap();
        let theirs = write(other.path(), "m", &split_by_tensors(&model(9), 4));
        std::fs::copy(&theirs[2], &paths[2]).unwrap();
        let e = GgufFile::open(&paths[0]).unwrap_err().to_string();
        assert!(e.contains("m-00003-of-00003.gguf"), "{e}");
        // A missing part.
        std::fs::remove_file(&paths[2]).unwrap();
        let e = GgufFile::open(&paths[0]).unwrap_err().to_string();
        assert!(e.contains("part 3 of 3") && e.contains("missing"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        // A renamed first part cannot find the rest.
        let renamed = dir.path().join("model.gguf");
        std::fs::copy(&paths[0], &renamed).unwrap();
        let e = GgufFile::open(&renamed).unwrap_err().to_string();
        assert!(e.contains("PREFIX-00001-of-00003.gguf"), "{e}");
    }
}
