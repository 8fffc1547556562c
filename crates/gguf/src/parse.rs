//! The GGUF header parser. It works on a byte slice (the mmap, or a buffer in tests and fuzzing)
//! and checks every count and length against the bytes that remain before allocating, so a
//! hostile file can cause neither an out-of-bounds read nor an unbounded allocation.

use std::collections::HashSet;

use crate::metadata::{Array, Metadata, Value};
use crate::{Error, GgmlType, Result, TensorInfo};

/// `GGUF` read as a little-endian u32.
const MAGIC: [u8; 4] = *b"GGUF";
/// ggml's default data alignment when `general.alignment` is absent.
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// Nested metadata arrays deeper than this are rejected (GGUF writers emit at most one level).
const MAX_NESTING: u32 = 2;

/// The parsed header: everything except the tensor bytes.
#[derive(Debug)]
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) metadata: Metadata,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Truncated {
                what: what(),
                offset: self.pos as u64,
                need: n as u64,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` items of at least `min_size` bytes each can still fit.
    fn check_count(&self, count: u64, min_size: u64, what: &dyn Fn() -> String) -> Result<usize> {
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|need| need <= self.remaining() as u64);
        if !fits {
            return Err(Error::ImplausibleCount {
                what: what(),
                value: count,
                len: self.buf.len() as u64,
            });
        }
        // Fits in the remaining bytes, hence in usize.
        Ok(count as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("{} length", what()))?;
        let len = self.check_count(len, 1, &|| format!("{} length", what()))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Error::BadUtf8 { what: what() })
    }
}

fn read_scalar_array<T, const N: usize>(
    c: &mut Cursor<'_>,
    n: usize,
    key: &str,
    conv: fn([u8; N]) -> T,
) -> Result<Vec<T>> {
    let bytes = c.take(n * N, &|| format!("metadata {key} array"))?;
    Ok(bytes
        .chunks_exact(N)
        .map(|ch| {
            let mut a = [0u8; N];
            a.copy_from_slice(ch);
            conv(a)
        })
        .collect())
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: u32) -> Result<Array> {
    if depth > MAX_NESTING {
        return Err(Error::NestingTooDeep {
            key: key.to_string(),
        });
    }
    let tag = c.u32(&|| format!("metadata {key} array type"))?;
    let len = c.u64(&|| format!("metadata {key} array length"))?;
    let min = match tag {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => {
            return Err(Error::BadValueType {
                key: key.to_string(),
                tag,
            });
        }
    };
    let n = c.check_count(len, min, &|| format!("metadata {key} array length"))?;
    Ok(match tag {
        0 => Array::U8(read_scalar_array(c, n, key, u8::from_le_bytes)?),
        1 => Array::I8(read_scalar_array(c, n, key, i8::from_le_bytes)?),
        2 => Array::U16(read_scalar_array(c, n, key, u16::from_le_bytes)?),
        3 => Array::I16(read_scalar_array(c, n, key, i16::from_le_bytes)?),
        4 => Array::U32(read_scalar_array(c, n, key, u32::from_le_bytes)?),
        5 => Array::I32(read_scalar_array(c, n, key, i32::from_le_bytes)?),
        6 => Array::F32(read_scalar_array(c, n, key, f32::from_le_bytes)?),
        7 => Array::Bool(read_scalar_array(c, n, key, |b: [u8; 1]| b[0] != 0)?),
        10 => Array::U64(read_scalar_array(c, n, key, u64::from_le_bytes)?),
        11 => Array::I64(read_scalar_array(c, n, key, i64::from_le_bytes)?),
        12 => Array::F64(read_scalar_array(c, n, key, f64::from_le_bytes)?),
        8 => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&|| format!("metadata {key}[{i}]"))?);
            }
            Array::String(v)
        }
        _ => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

fn read_value(c: &mut Cursor<'_>, key: &str) -> Result<Value> {
    let tag = c.u32(&|| format!("metadata {key} type"))?;
    let what = || format!("metadata {key} value");
    Ok(match tag {
        0 => Value::U8(u8::from_le_bytes(c.array(&what)?)),
        1 => Value::I8(i8::from_le_bytes(c.array(&what)?)),
        2 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        5 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => Value::Bool(c.array::<1>(&what)?[0] != 0),
        8 => Value::String(c.string(&what)?),
        9 => Value::Array(read_array(c, key, 1)?),
        10 => Value::U64(u64::from_le_bytes(c.array(&what)?)),
        11 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        _ => {
            return Err(Error::BadValueType {
                key: key.to_string(),
                tag,
            });
        }
    })
}

/// Parses and validates the header of a GGUF image held in `buf`.
/// Parses the header of `buf`. With `whole`, every tensor's data must lie inside `buf`;
/// without it `buf` may end anywhere after the header (a file cut after its header, read to
/// plan with, never to run).
pub(crate) fn parse_header(buf: &[u8], whole: bool) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "magic".to_string())?;
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = c.u32(&|| "version".to_string())?;
    if !(2..=3).contains(&version) {
        return Err(Error::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".to_string())?;
    let n_kv = c.u64(&|| "metadata count".to_string())?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
    // least 8 + 4 + 8 + 4 + 8.
    let n_kv = c.check_count(n_kv, 13, &|| "metadata count".to_string())?;
    let n_tensors = c.check_count(n_tensors, 32, &|| "tensor count".to_string())?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let value = read_value(&mut c, &key)?;
        metadata.insert(key, value)?;
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(_) => {
            let a = metadata.get_u64("general.alignment")?;
            if a == 0 || !a.is_power_of_two() {
                return Err(Error::BadAlignment(a));
            }
            a
        }
    };

    let mut raw = Vec::with_capacity(n_tensors);
    let mut names = HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("tensor #{i} name"))?;
        let n_dims = c.u32(&|| format!("tensor {name} dimension count"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(Error::BadShape {
                name,
                dims: vec![],
                why: "dimension count must be 1 to 4",
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&|| format!("tensor {name} dimension {d}"))?);
        }
        let type_id = c.u32(&|| format!("tensor {name} type"))?;
        let offset = c.u64(&|| format!("tensor {name} offset"))?;
        if !names.insert(name.clone()) {
            return Err(Error::Duplicate {
                what: "tensor",
                name,
            });
        }
        raw.push((name, dims, type_id, offset));
    }

    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let file_len = if whole { buf.len() as u64 } else { u64::MAX };
    // A file without tensors (e.g. a vocabulary-only GGUF) may end without the padding.
    if data_offset > file_len && !raw.is_empty() {
        return Err(Error::Truncated {
            what: "padding before tensor data".to_string(),
            offset: c.pos as u64,
            need: data_offset - c.pos as u64,
            len: file_len,
        });
    }

    let mut tensors = Vec::with_capacity(raw.len());
    for (name, dims, type_id, rel) in raw {
        tensors.push(TensorInfo::validate(
            name,
            dims,
            type_id,
            rel,
            data_offset,
            alignment,
            file_len,
        )?);
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

impl TensorInfo {
    fn validate(
        name: String,
        dims: Vec<u64>,
        type_id: u32,
        rel_offset: u64,
        data_offset: u64,
        alignment: u64,
        file_len: u64,
    ) -> Result<TensorInfo> {
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(Error::UnsupportedTensorType { name, type_id });
        };
        if dims.contains(&0) {
            return Err(Error::BadShape {
                name,
                dims,
                why: "zero-sized dimension",
            });
        }
        let Some(n_elements) = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) else {
            return Err(Error::BadShape {
                name,
                dims,
                why: "element count overflows",
            });
        };
        let block = ggml_type.block_size() as u64;
        if !dims[0].is_multiple_of(block) {
            return Err(Error::BadShape {
                name,
                dims,
                why: "first dimension is not a whole number of quantisation blocks",
            });
        }
        let n_bytes = (n_elements / block)
            .checked_mul(ggml_type.block_bytes() as u64)
            .ok_or_else(|| Error::BadShape {
                name: name.clone(),
                dims: dims.clone(),
                why: "byte size overflows",
            })?;
        if !rel_offset.is_multiple_of(alignment) {
            return Err(Error::BadTensorData {
                name,
                why: format!("offset {rel_offset} is not a multiple of the alignment {alignment}"),
            });
        }
        let start = data_offset.checked_add(rel_offset);
        let end = start.and_then(|s| s.checked_add(n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => Ok(TensorInfo {
                name,
                dims,
                ggml_type,
                offset: start,
                n_bytes,
            }),
            _ => Err(Error::BadTensorData {
                why: format!(
                    "data at {data_offset} + {rel_offset} + {n_bytes} bytes exceeds file size {file_len}"
                ),
                name,
            }),
        }
    }
}
