//! Matrix products of quantised weights with activations, split across the thread pool.
//!
//! Weights are `rows x cols` (a row is one output feature, stored contiguously as in GGUF).
//! Activations are converted once per call to the weight format's activation format (see
//! [`crate::formats::act_type`]) into a reusable buffer, then every thread claims chunks of rows
//! and computes them for all tokens, tile by tile, so a weight block is decoded once per tile.

use std::sync::atomic::{AtomicUsize, Ordering};

use strata_gguf::{GgmlType, GgufFile};

use crate::formats::{act_type, quantize_act_row};
use crate::{Error, Result, ThreadPool, dot::dot_scalar};

/// Where a weight matrix's bytes live.
#[derive(Clone, Debug)]
pub enum WeightBytes {
    /// A byte range of a mapped GGUF file (zero copy; only touched pages are read).
    Mapped {
        /// The file.
        file: GgufFile,
        /// Absolute offset.
        start: usize,
        /// Length in bytes.
        len: usize,
    },
    /// Bytes owned by the process (a gathered slice of columns, or a synthetic matrix).
    Owned(Vec<u8>),
}

/// A weight matrix in one of the GGUF formats.
#[derive(Clone, Debug)]
pub struct QMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: WeightBytes,
}

impl QMatrix {
    /// Wraps `data` as a `rows x cols` matrix of `ty`, checking the size.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: WeightBytes) -> Result<QMatrix> {
        let row_bytes = ty.row_bytes(cols).ok_or(Error::Shape {
            what: "matrix row length",
            detail: format!(
                "{cols} is not a multiple of {ty}'s block size {}",
                ty.block_size()
            ),
        })?;
        let m = QMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            data,
        };
        if m.bytes().len() != rows * row_bytes {
            return Err(Error::Shape {
                what: "matrix data",
                detail: format!(
                    "{} bytes for {rows} x {cols} {ty} (expected {})",
                    m.bytes().len(),
                    rows * row_bytes
                ),
            });
        }
        if !crate::supported_weight(ty) {
            return Err(Error::UnsupportedType(ty));
        }
        Ok(m)
    }

    /// Element format.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row length (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// All bytes, row-major.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            WeightBytes::Owned(v) => v,
            WeightBytes::Mapped { file, start, len } => file
                .bytes()
                .get(*start..start.saturating_add(*len))
                .unwrap_or(&[]),
        }
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// Activations converted for a product with a given weight format; reused across calls so the
/// hot path does not allocate once it has seen its largest batch.
#[derive(Debug, Default)]
pub struct QuantActs {
    ty: Option<GgmlType>,
    n: usize,
    cols: usize,
    row_bytes: usize,
    buf: Vec<u8>,
}

impl QuantActs {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Converts `n` rows of `cols` activations (`x.len() == n * cols`) for weights of `weight_ty`.
    pub fn quantize(&mut self, weight_ty: GgmlType, x: &[f32], n: usize, cols: usize) {
        let act = act_type(weight_ty);
        let row_bytes = act.row_bytes(cols).unwrap_or(0);
        let need = n * row_bytes;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        for (xr, out) in x
            .chunks_exact(cols)
            .zip(self.buf.chunks_exact_mut(row_bytes))
            .take(n)
        {
            quantize_act_row(act, xr, out);
        }
        self.ty = Some(act);
        self.n = n;
        self.cols = cols;
        self.row_bytes = row_bytes;
    }

    /// Number of activation rows (tokens).
    pub fn n(&self) -> usize {
        self.n
    }

    fn row_ptr(&self, t: usize) -> *const u8 {
        self.buf[t * self.row_bytes..].as_ptr()
    }
}

/// Rows claimed by a thread at a time.
const ROW_CHUNK: usize = 16;

/// A raw output pointer that threads write disjoint elements through.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each thread writes only the rows of the chunks it claimed from an atomic counter, so no
// two threads write the same element.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Taking `self` makes closures capture the whole wrapper (which is `Sync`), not the field.
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `out[t * w.rows() + r] = dot(w.row(r), acts[t])` for all tokens `t` and rows `r`.
///
/// `acts` must have been quantised for `w`'s format and `w.cols()` columns; `out` must hold
/// `acts.n() * w.rows()` floats.
pub fn matmul(pool: &ThreadPool, w: &QMatrix, acts: &QuantActs, out: &mut [f32]) {
    let n = acts.n;
    assert_eq!(
        acts.ty,
        Some(act_type(w.ty)),
        "activations quantised for another format"
    );
    assert_eq!(acts.cols, w.cols, "activation width");
    assert!(out.len() >= n * w.rows, "output too small");
    let n_chunks = w.rows.div_ceil(ROW_CHUNK);
    let next = AtomicUsize::new(0);
    let optr = OutPtr(out.as_mut_ptr());
    let simd = crate::simd_tile(w.ty);
    pool.run(&|_tid| {
        loop {
            let chunk = next.fetch_add(1, Ordering::Relaxed);
            if chunk >= n_chunks {
                break;
            }
            let r0 = chunk * ROW_CHUNK;
            let r1 = (r0 + ROW_CHUNK).min(w.rows);
            match simd {
                // SAFETY: `simd_tile` returned a kernel only if the CPU supports it; pointers
                // cover whole rows of the checked sizes; this thread owns rows r0..r1.
                Some(k) => unsafe { k(w, acts, r0, r1, optr.ptr()) },
                None => {
                    for t in 0..n {
                        let a = &acts.buf[t * acts.row_bytes..(t + 1) * acts.row_bytes];
                        for r in r0..r1 {
                            let v = dot_scalar(w.ty, w.row(r), a, w.cols);
                            // SAFETY: in bounds (checked above) and owned by this thread.
                            unsafe { *optr.ptr().add(t * w.rows + r) = v };
                        }
                    }
                }
            }
        }
    });
}

/// A tiled SIMD kernel over rows `r0..r1` for all tokens.
pub(crate) type TileFn = unsafe fn(&QMatrix, &QuantActs, usize, usize, *mut f32);

/// AVX2 tiling: 4 rows x up to 4 tokens, falling back to narrower tiles at the edges.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `out` must hold `acts.n * w.rows` floats.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_avx2(w: &QMatrix, acts: &QuantActs, r0: usize, r1: usize, out: *mut f32) {
    use crate::x86::tile;
    let nb = w.cols / 32;
    let ldo = w.rows;
    let wp = |r: usize| w.bytes()[r * w.row_bytes..].as_ptr();
    let n = acts.n;
    let mut r = r0;
    // SAFETY (whole body): the caller guarantees the CPU features and the output size; every
    // row pointer addresses `nb` whole blocks inside the matrix or activation buffer.
    unsafe {
        while r + 4 <= r1 {
            let ws = [wp(r), wp(r + 1), wp(r + 2), wp(r + 3)];
            let mut t = 0;
            while t + 4 <= n {
                let a = [
                    acts.row_ptr(t),
                    acts.row_ptr(t + 1),
                    acts.row_ptr(t + 2),
                    acts.row_ptr(t + 3),
                ];
                tile::<4, 4>(w.ty, ws, a, nb, out.add(t * ldo + r), ldo);
                t += 4;
            }
            while t < n {
                tile::<4, 1>(w.ty, ws, [acts.row_ptr(t)], nb, out.add(t * ldo + r), ldo);
                t += 1;
            }
            r += 4;
        }
        while r < r1 {
            for t in 0..n {
                tile::<1, 1>(
                    w.ty,
                    [wp(r)],
                    [acts.row_ptr(t)],
                    nb,
                    out.add(t * ldo + r),
                    ldo,
                );
            }
            r += 1;
        }
    }
}

#[cfg(test)]
impl QuantActs {
    pub(crate) fn buf_for_test(&self) -> &[u8] {
        &self.buf
    }
}
