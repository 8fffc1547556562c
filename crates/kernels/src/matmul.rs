//! Matrix products of quantised weights with activations, split across the thread pool.
//!
//! Weights are `rows x cols` (a row is one output feature, stored contiguously as in GGUF).
//! Activations are converted once per call to the weight format's activation format (see
//! [`crate::formats::act_type`]) into a reusable buffer, then every thread claims chunks of rows
//! and computes them for all tokens, tile by tile, so a weight block is decoded once per tile.

use strata_gguf::{GgmlType, GgufFile};

use crate::acts::{QuantActs, needs_ys};
use crate::formats::act_type;
use crate::{Error, Result, ThreadPool, dot::dot_scalar};

/// Where a weight matrix's bytes live.
#[derive(Clone, Debug)]
pub enum WeightBytes {
    /// A byte range of a mapped GGUF file (zero copy; only touched pages are read).
    Mapped {
        /// The file.
        file: GgufFile,
        /// Offset in the model's address space (a split model's parts end to end).
        start: usize,
        /// Length in bytes.
        len: usize,
    },
    /// Bytes owned by the process (a gathered slice of columns, or a synthetic matrix).
    Owned(Vec<u8>),
}

impl WeightBytes {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            WeightBytes::Owned(v) => v,
            WeightBytes::Mapped { file, start, len } => file.range(*start, *len),
        }
    }
}

/// How a matrix's bytes are laid out.
#[derive(Clone, Debug)]
pub(crate) enum Storage {
    /// Row by row, as in the GGUF file.
    Plain(WeightBytes),
    /// Rows interleaved in groups for the SIMD kernels (see [`crate::packed`]).
    Packed(Vec<u8>),
}

/// A weight matrix in one of the GGUF formats.
#[derive(Clone, Debug)]
pub struct QMatrix {
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    /// The row count of the whole tensor this matrix was cut from: llama.cpp picks its kernel
    /// (and with it the float order strata must follow) by the tensor's row count, so a slice
    /// keeps its tensor's order.
    pub(crate) order_rows: usize,
    /// Whether llama.cpp may repack this matrix (every 2-D weight; not the per-head slices of a
    /// 3-D tensor multiplied by `ggml_mul_mat`, such as DeepSeek's `attn_k_b`).
    pub(crate) repackable: bool,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) data: Storage,
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
        if data.bytes().len() != rows * row_bytes {
            return Err(Error::Shape {
                what: "matrix data",
                detail: format!(
                    "{} bytes for {rows} x {cols} {ty} (expected {})",
                    data.bytes().len(),
                    rows * row_bytes
                ),
            });
        }
        if !crate::supported_weight(ty) {
            return Err(Error::UnsupportedType(ty));
        }
        Ok(QMatrix {
            ty,
            rows,
            order_rows: rows,
            repackable: true,
            cols,
            row_bytes,
            data: Storage::Plain(data),
        })
    }

    /// The matrix in the layout the fastest kernel for this CPU reads: repacked into row groups
    /// (an owned copy) when a SIMD kernel for the format exists, unchanged otherwise. A packed
    /// matrix computes the same bits as the plain one; it no longer gives out rows
    /// ([`QMatrix::row`] returns `None`), so keep a plain matrix for row look-ups (embeddings).
    pub fn prepared(self) -> QMatrix {
        if crate::simd_kernels(self.ty) {
            self.packed()
        } else {
            self
        }
    }

    /// The matrix repacked into row groups, whatever the CPU (tests use this directly).
    pub(crate) fn packed(self) -> QMatrix {
        let Storage::Plain(plain) = &self.data else {
            return self;
        };
        // IQ4_NL and MXFP4 have a packed kernel only in llama.cpp's repacked order.
        let iq4_nl_other_order = matches!(self.ty, GgmlType::IQ4NL | GgmlType::MXFP4)
            && !repacked_b32(self.ty, self.repack_rows());
        if !crate::packed::packable(self.ty) || iq4_nl_other_order {
            return self;
        }
        let nb = self.cols / self.ty.block_size();
        let data = Storage::Packed(crate::packed::pack(self.ty, plain.bytes(), self.rows, nb));
        // The mapped original is never read again: let its pages go from this process.
        if let WeightBytes::Mapped { file, start, len } = plain {
            file.release(*start, *len);
        }
        QMatrix { data, ..self }
    }

    /// The matrix as a slice of a tensor of `rows` rows (see `order_rows`): products follow the
    /// float order llama.cpp uses for the whole tensor.
    pub fn cut_from(mut self, rows: usize) -> QMatrix {
        self.order_rows = rows;
        self
    }

    /// The matrix as one llama.cpp never repacks (a slice of a 3-D tensor that `ggml_mul_mat`
    /// multiplies head by head): its products keep `vec_dot`'s order whatever its row count.
    pub fn never_repacked(mut self) -> QMatrix {
        self.repackable = false;
        self
    }

    /// The row count llama.cpp's repacking rule sees: the tensor's, or 1 (never a multiple of
    /// 8) for a matrix it leaves as it is.
    fn repack_rows(&self) -> usize {
        if self.repackable { self.order_rows } else { 1 }
    }

    /// Whether the matrix is in the packed layout.
    pub fn is_packed(&self) -> bool {
        matches!(self.data, Storage::Packed(_))
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

    /// The bytes of row `r` in the file layout, if `r` exists and the matrix is not packed.
    pub fn row(&self, r: usize) -> Option<&[u8]> {
        match &self.data {
            Storage::Plain(b) => b
                .bytes()
                .get(r * self.row_bytes..(r + 1).checked_mul(self.row_bytes)?),
            Storage::Packed(_) => None,
        }
    }
}

/// Fewest groups of four rows a thread claims at a time.
const MIN_GROUP_CHUNK: usize = 4;
/// Chunks per thread a matrix is cut into (dynamic claiming absorbs uneven progress).
const CHUNKS_PER_THREAD: usize = 4;
/// Rows claimed by a thread at a time on the plain path.
const ROW_CHUNK: usize = 16;
/// Tokens of a batch whose activations are reused while they are in the L2 cache.
const TOKEN_BLOCK: usize = 64;

/// A raw output pointer that threads write disjoint elements through.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: each thread writes only the rows of the chunks it claimed from an atomic counter, so no
// two threads write the same element.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Taking `self` makes closures capture the whole wrapper (which is `Sync`), not the field.
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `out[t * w.rows() + r] = dot(row r of w, acts[t])` for all tokens `t` and rows `r`.
///
/// `acts` must have been quantised for `w`'s format and `w.cols()` columns; `out` must hold
/// `acts.n() * w.rows()` floats.
pub fn matmul(pool: &ThreadPool, w: &QMatrix, acts: &QuantActs, out: &mut [f32]) {
    if acts.flavour.arm() {
        return crate::matmul_arm::matmul(pool, w, acts, out);
    }
    let n = acts.n;
    check_shapes(w, acts, out);
    let optr = OutPtr(out.as_mut_ptr());
    match &w.data {
        Storage::Packed(packed) => {
            let mut jobs = [PackedJob {
                w,
                packed,
                out: optr,
                chunk: 0,
                g_chunks: 0,
                first_unit: 0,
            }];
            matmul_packed(pool, &mut jobs, acts)
        }
        Storage::Plain(bytes) => {
            let bytes = bytes.bytes();
            if ktiled(w, acts) {
                return matmul_ktiles(pool, w, bytes, acts, optr);
            }
            #[cfg(target_arch = "x86_64")]
            if half_tiled(w, acts) {
                return matmul_half_tiles(pool, w, bytes, acts, optr);
            }
            // The batch whose order applies, and the index of row 0 in it.
            let (order_n, first) = acts.order_batch();
            // llama.cpp's repacked Q4_K kernels take tokens four at a time, then one at a time;
            // its tiled K-quant kernel takes batches of 8 or more tokens whole.
            let (dot, dot4, n4) = if order_n >= TILED_MIN_BATCH && tiled_format(w) {
                let d = tiled_dot(w.ty);
                (d, d, 0)
            } else if tinyblas_order(w, order_n) && !acts.mul_mat_id {
                let d = tinyblas_dot(w.ty);
                (d, d, 0)
            } else {
                (
                    row_dot(w.ty, w.repack_rows(), false),
                    row_dot(w.ty, w.repack_rows(), true),
                    // `mul_mat_id` runs repacked experts one token at a time.
                    if acts.mul_mat_id {
                        0
                    } else {
                        (order_n / 4 * 4).saturating_sub(first)
                    },
                )
            };
            pool.run_units(w.rows.div_ceil(ROW_CHUNK), &|_tid, chunk| {
                let r0 = chunk * ROW_CHUNK;
                let r1 = (r0 + ROW_CHUNK).min(w.rows);
                for t in 0..n {
                    let a = &acts.buf[t * acts.row_bytes..(t + 1) * acts.row_bytes];
                    for r in r0..r1 {
                        let row = &bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                        let v = if t < n4 { dot4 } else { dot }(w.ty, row, a, w.cols);
                        // SAFETY: in bounds (checked above) and owned by this thread.
                        unsafe { *optr.ptr().add(t * w.rows + r) = v };
                    }
                }
            });
        }
    }
}

/// Rows times tokens of a BF16 / F16 tile (12 accumulators and 4 row vectors in the 16 AVX2
/// registers).
#[cfg(target_arch = "x86_64")]
pub(crate) const HALF_TILE: (usize, usize) = (4, 3);

/// Whether the product of a BF16 / F16 `w` with `acts` goes through [`matmul_half_tiles`]: it
/// is in tinyBLAS's order (so the tile kernel's bits are the row-by-row ones), on AVX2.
#[cfg(target_arch = "x86_64")]
fn half_tiled(w: &QMatrix, acts: &QuantActs) -> bool {
    let (order_n, _) = acts.order_batch();
    // Widened tokens exist only for batches of `HALF_TILE.1` or more on AVX2.
    matches!(w.ty, GgmlType::BF16 | GgmlType::F16)
        && acts.wide.len() >= acts.n * w.cols
        && tinyblas_order(w, order_n)
        && !acts.mul_mat_id
}

/// Bytes of weight rows a thread claims at a time in the half-precision tile path (they stay in
/// a 512 KiB L2 while every token passes them, with room for the tokens).
#[cfg(target_arch = "x86_64")]
const HALF_BLOCK_BYTES: usize = 128 * 1024;

/// BF16 / F16 weights times a batch, [`HALF_TILE`] rows times tokens at a time (see
/// [`crate::x86_rowdot::half_tile_tinyblas`], which reads the tokens [`QuantActs::quantize`]
/// widened to f32); rows and tokens left over go one dot at a time, in the same order. Threads
/// claim blocks of rows of about [`HALF_BLOCK_BYTES`]; within one, the tokens pass the block's
/// rows three at a time while the rows stay in cache.
#[cfg(target_arch = "x86_64")]
fn matmul_half_tiles(pool: &ThreadPool, w: &QMatrix, bytes: &[u8], acts: &QuantActs, out: OutPtr) {
    const RM: usize = HALF_TILE.0;
    const RN: usize = HALF_TILE.1;
    type Tile = unsafe fn(*const u8, *const f32, usize, &mut [[f32; RM]; RN]);
    let tile: Tile = if w.ty == GgmlType::BF16 {
        crate::x86_rowdot::half_tile_tinyblas::<true, RM, RN>
    } else {
        crate::x86_rowdot::half_tile_tinyblas::<false, RM, RN>
    };
    let dot = tinyblas_dot(w.ty);
    let (n, cols) = (acts.n, w.cols);
    let row = |r: usize| &bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
    let tok = |t: usize| &acts.buf[t * acts.row_bytes..(t + 1) * acts.row_bytes];
    // Rows per block: what fits the budget, but enough blocks to keep every thread busy.
    let fit = (HALF_BLOCK_BYTES / w.row_bytes.max(1)).clamp(RM, 64) / RM * RM;
    let spread = w
        .rows
        .div_ceil(CHUNKS_PER_THREAD * pool.n_threads())
        .next_multiple_of(RM);
    let block = fit.min(spread).max(RM);
    pool.run_units(w.rows.div_ceil(block), &|_tid, u| {
        let r0 = u * block;
        let r1 = (r0 + block).min(w.rows);
        let full = r0 + (r1 - r0) / RM * RM;
        let put = |t: usize, r: usize, v: f32| {
            // SAFETY: in bounds (checked by `matmul`) and owned by this thread's block.
            unsafe { *out.ptr().add(t * w.rows + r) = v };
        };
        let mut t = 0;
        while t + RN <= n {
            let toks = acts.wide[t * cols..(t + RN) * cols].as_ptr();
            for rg in (r0..full).step_by(RM) {
                let rows = bytes[rg * w.row_bytes..(rg + RM) * w.row_bytes].as_ptr();
                let mut o = [[0f32; RM]; RN];
                // SAFETY: `half_tiled` checked AVX2 (with FMA and F16C); the `RM` rows and `RN`
                // widened tokens are in bounds (sliced above) and hold `cols` values, a multiple
                // of 8 (`tinyblas_order`).
                unsafe { tile(rows, toks, cols, &mut o) };
                for (j, oj) in o.iter().enumerate() {
                    for (i, &v) in oj.iter().enumerate() {
                        put(t + j, rg + i, v);
                    }
                }
            }
            for r in full..r1 {
                for j in t..t + RN {
                    put(j, r, dot(w.ty, row(r), tok(j), cols));
                }
            }
            t += RN;
        }
        for j in t..n {
            for r in r0..r1 {
                put(j, r, dot(w.ty, row(r), tok(j), cols));
            }
        }
    });
}

/// Smallest batch the K-quant tile kernels take (smaller ones go row by row, token by token).
pub(crate) const KTILE_MIN_BATCH: usize = 4;
/// Smallest batch of Q6_K products the tile kernels take (below it, the half-empty group costs
/// more than it saves).
const KTILE_MIN_Q6_K: usize = 6;
/// Rows of a unit of work of the K-quant tile path.
const KTILE_ROWS: usize = 64;
/// Tokens of a unit of work of the K-quant tile path (a multiple of 8 * [`KTILE_GROUPS`]).
const KTILE_TOKENS: usize = 64;
/// Groups of eight tokens a row meets at a time.
const KTILE_GROUPS: usize = 4;

/// Whether the K-quant tile kernels may run: AVX2, unless `STRATA_NO_KTILES` is set (to time or
/// check the row-by-row path).
pub(crate) fn ktiles_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        cfg!(target_arch = "x86_64")
            && crate::isa().avx2
            && std::env::var_os("STRATA_NO_KTILES").is_none()
    })
}

/// Whether the product of `w` with `acts` goes through the K-quant tile kernels, when the
/// activations were interleaved: Q6_K; Q4_K with a row count that is a multiple of 8
/// (llama.cpp's repacked order); batches of 8 or more of the other K formats (its tiled order).
fn ktiled(w: &QMatrix, acts: &QuantActs) -> bool {
    !acts.tiles.is_empty()
        && acts.order_batch() == (acts.n, 0)
        && match w.ty {
            GgmlType::Q4K if w.repack_rows().is_multiple_of(8) => true,
            GgmlType::Q6K => acts.n >= KTILE_MIN_Q6_K,
            ty => crate::kformats::tiles(ty) && acts.n >= TILED_MIN_BATCH,
        }
}

/// The K-quant tile path: threads claim (token block, row chunk) units, token blocks outermost,
/// and within a unit every row meets [`KTILE_GROUPS`] groups of eight tokens at a time (its
/// nibbles and scales decoded once for all of them), the groups staying in cache while the rows
/// pass. Each (row, token) gets exactly the float operations of [`row_dot`] / [`tiled_dot`].
fn matmul_ktiles(pool: &ThreadPool, w: &QMatrix, bytes: &[u8], acts: &QuantActs, out: OutPtr) {
    let n = acts.n;
    let groups = n.div_ceil(crate::kquants::TILE_TOKENS);
    let per_block = KTILE_TOKENS / crate::kquants::TILE_TOKENS;
    let n_tb = groups.div_ceil(per_block);
    let n_rc = w.rows.div_ceil(KTILE_ROWS);
    // Q4_K: llama.cpp's four-token kernel takes the first `n / 4 * 4` tokens (none under
    // `mul_mat_id`, which runs repacked experts one token at a time).
    let n4 = if w.ty == GgmlType::Q4K && w.repack_rows().is_multiple_of(8) {
        if acts.mul_mat_id { 0 } else { n / 4 * 4 }
    } else {
        n
    };
    pool.run_units(n_tb * n_rc, &|_tid, u| {
        let (tb, rc) = (u / n_rc, u % n_rc);
        let g1 = ((tb + 1) * per_block).min(groups);
        let r0 = rc * KTILE_ROWS;
        let r1 = (r0 + KTILE_ROWS).min(w.rows);
        let mut g = tb * per_block;
        while g < g1 {
            if g + KTILE_GROUPS <= g1 {
                ktile_rows::<KTILE_GROUPS>(w, bytes, acts, g, r0..r1, n4, out);
                g += KTILE_GROUPS;
            } else {
                ktile_rows::<1>(w, bytes, acts, g, r0..r1, n4, out);
                g += 1;
            }
        }
    });
}

/// Rows `rows` of `w` times the `CV` token groups from `g` (see [`matmul_ktiles`]).
fn ktile_rows<const CV: usize>(
    w: &QMatrix,
    bytes: &[u8],
    acts: &QuantActs,
    g: usize,
    rows: std::ops::Range<usize>,
    n4: usize,
    out: OutPtr,
) {
    use crate::kquants::{QK_K, TILE_BLOCK_BYTES, TILE_TOKENS};
    let (n, nb) = (acts.n, w.cols / QK_K);
    let y: [*const u8; CV] =
        std::array::from_fn(|v| acts.tiles[(g + v) * nb * TILE_BLOCK_BYTES..].as_ptr());
    let t0 = g * TILE_TOKENS;
    let t1 = ((g + CV) * TILE_TOKENS).min(n);
    // Q4_K: tokens before `n4` in the four-token kernel's order, the others in the other.
    let split = n4.saturating_sub(t0);
    for r in rows {
        let row = bytes[r * w.row_bytes..(r + 1) * w.row_bytes].as_ptr();
        let mut o = [[0.0f32; 8]; CV];
        // SAFETY: AVX2, FMA and F16C were detected (`ktiles_enabled`); the row holds `nb` blocks
        // and each group `nb` interleaved blocks.
        unsafe { ktile::<CV>(w.ty, w.repack_rows(), n, split, row, nb, &y, &mut o) };
        for t in t0..t1 {
            let v = o[(t - t0) / TILE_TOKENS][(t - t0) % TILE_TOKENS];
            // SAFETY: in bounds (checked by `check_shapes`); this thread alone owns the rows of
            // this unit for its tokens.
            unsafe { *out.ptr().add(t * w.rows + r) = v };
        }
    }
}

/// One row of `ty` (of a `rows`-row matrix) times the `CV` token groups at `y`: llama.cpp's
/// order for a batch of `n` tokens, the first `split` of them in the Q4_K four-token kernel's.
///
/// # Safety
/// As for [`crate::x86_kquants::q4_k_tile`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn ktile<const CV: usize>(
    ty: GgmlType,
    rows: usize,
    n: usize,
    split: usize,
    row: *const u8,
    nb: usize,
    y: &[*const u8; CV],
    out: &mut [[f32; 8]; CV],
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as the caller promised.
    unsafe {
        use crate::x86_kquants::{BLOCKS, CHUNKS, SPLIT, q4_k_tile, q6_k_tile};
        if ty != GgmlType::Q6K && !(ty == GgmlType::Q4K && rows.is_multiple_of(8)) {
            crate::x86_kformats::tile::<CV>(ty, row, nb, y, out);
        } else if ty == GgmlType::Q4K {
            match split {
                0 => q4_k_tile::<CV, BLOCKS>(row, nb, y, 0, out),
                s if s >= 8 * CV => q4_k_tile::<CV, CHUNKS>(row, nb, y, s, out),
                s => q4_k_tile::<CV, SPLIT>(row, nb, y, s, out),
            }
        } else if n >= TILED_MIN_BATCH {
            q6_k_tile::<CV, true>(row, nb, y, out);
        } else {
            q6_k_tile::<CV, false>(row, nb, y, out);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("tiles exist only on x86_64: {ty} {rows} {n} {split} {row:?} {nb} {y:?} {out:?}");
}

/// One matrix of a packed product: the weights and where its output goes.
#[derive(Clone, Copy)]
struct PackedJob<'a> {
    w: &'a QMatrix,
    // Read only by the x86 tile kernels (elsewhere no matrix is packed).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    packed: &'a [u8],
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    out: OutPtr,
    /// Groups per chunk, chunks per token block, and this job's first unit.
    chunk: usize,
    g_chunks: usize,
    first_unit: usize,
}

/// The best row-by-row dot product for `ty` on this CPU (for formats without a packed layout).
///
/// Q4_K matrices whose row count is a multiple of 8 follow llama.cpp's x86 repacked kernels'
/// order (`four`: the four-token kernel's), others its `vec_dot` order (llama.cpp picks its
/// kernel by the same rule).
pub(crate) fn row_dot(
    ty: GgmlType,
    rows: usize,
    four: bool,
) -> fn(GgmlType, &[u8], &[u8], usize) -> f32 {
    if repacked_b32(ty, rows) {
        #[cfg(target_arch = "x86_64")]
        if ty == GgmlType::MXFP4 && crate::isa().avx2 {
            // SAFETY: `isa().avx2` implies AVX2, FMA and F16C; rows hold `n` elements.
            return |_, w, a, n| unsafe { crate::x86_rowdot::dot_mxfp4_repacked(w, a, n) };
        }
        return crate::dot::dot_repacked;
    }
    let repacked = ty == GgmlType::Q4K && rows.is_multiple_of(8);
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY (all): `isa().avx2` implies AVX2, FMA and F16C; rows hold `n` elements.
        match ty {
            GgmlType::Q4K if repacked && four => {
                return |_, w, a, n| unsafe {
                    crate::x86_kquants::dot_q4_k_repacked::<true>(w, a, n)
                };
            }
            GgmlType::Q4K if repacked => {
                return |_, w, a, n| unsafe {
                    crate::x86_kquants::dot_q4_k_repacked::<false>(w, a, n)
                };
            }
            GgmlType::Q4K => return |_, w, a, n| unsafe { crate::x86_kquants::dot_q4_k(w, a, n) },
            GgmlType::Q6K => return |_, w, a, n| unsafe { crate::x86_kquants::dot_q6_k(w, a, n) },
            GgmlType::IQ4NL => {
                return |_, w, a, n| unsafe { crate::x86_rowdot::dot_lut4::<false, true>(w, a, n) };
            }
            GgmlType::MXFP4 => {
                return |_, w, a, n| unsafe { crate::x86_rowdot::dot_lut4::<true, true>(w, a, n) };
            }
            GgmlType::BF16 => {
                return |_, w, a, n| unsafe { crate::x86_rowdot::dot_half::<true>(w, a, n) };
            }
            GgmlType::F16 => {
                return |_, w, a, n| unsafe { crate::x86_rowdot::dot_half::<false>(w, a, n) };
            }
            GgmlType::F32 => return |_, w, a, n| unsafe { crate::x86_rowdot::dot_f32(w, a, n) },
            ty if crate::kformats::handles(ty) => {
                return |ty, w, a, n| unsafe { crate::x86_kformats::dot(ty, w, a, n) };
            }
            _ => {}
        }
    }
    match (repacked, four) {
        (true, true) => |_, w, a, n| crate::kquants::dot_q4_k_repacked(w, a, n, true),
        (true, false) => |_, w, a, n| crate::kquants::dot_q4_k_repacked(w, a, n, false),
        _ => dot_scalar,
    }
}

/// Whether llama.cpp's AVX2 build repacks a `rows`-row tensor of `ty` into its 8-row Q4_0 /
/// IQ4_NL layout, whose kernels sum each block whole before scaling it (see
/// [`crate::dot::dot_repacked`]).
pub(crate) fn repacked_b32(ty: GgmlType, rows: usize) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4NL | GgmlType::MXFP4) && rows.is_multiple_of(8)
}

/// Whether llama.cpp sends a batch of `n` tokens times `w` through tinyBLAS in an order other
/// than its `vec_dot`'s: IQ4_NL matrices it does not repack, and BF16, F16 and F32 ones whose
/// shape tinyBLAS takes (row length a multiple of 8, row count a multiple of 4). For Q4_0, Q5_0 and
/// Q8_0 the two orders are the same.
fn tinyblas_order(w: &QMatrix, n: usize) -> bool {
    n >= 2
        && match w.ty {
            GgmlType::IQ4NL => !repacked_b32(w.ty, w.repack_rows()),
            GgmlType::BF16 | GgmlType::F16 | GgmlType::F32 => {
                w.cols.is_multiple_of(8) && w.order_rows.is_multiple_of(4)
            }
            _ => false,
        }
}

/// The dot product in tinyBLAS's order for `ty` (see [`crate::dot::dot_tinyblas`]).
pub(crate) fn tinyblas_dot(ty: GgmlType) -> fn(GgmlType, &[u8], &[u8], usize) -> f32 {
    // Only the x86 kernels depend on the type; the portable one reads it from its arguments.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ty;
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY (both): `isa().avx2` implies AVX2, FMA and F16C; rows hold `n` elements.
        match ty {
            GgmlType::IQ4NL => {
                return |_, w, a, n| unsafe {
                    crate::x86_rowdot::dot_lut4::<false, false>(w, a, n)
                };
            }
            GgmlType::BF16 => {
                return |_, w, a, n| unsafe {
                    crate::x86_rowdot::dot_half_tinyblas::<true>(w, a, n)
                };
            }
            GgmlType::F16 => {
                return |_, w, a, n| unsafe {
                    crate::x86_rowdot::dot_half_tinyblas::<false>(w, a, n)
                };
            }
            GgmlType::F32 => {
                return |_, w, a, n| unsafe { crate::x86_rowdot::dot_f32_tinyblas(w, a, n) };
            }
            _ => {}
        }
    }
    crate::dot::dot_tinyblas
}

/// Smallest batch llama.cpp sends through its tiled K-quant kernel.
const TILED_MIN_BATCH: usize = 8;

/// Whether llama.cpp sends batches of 8 or more tokens times `w` through its tiled kernel: every
/// K format it does not repack (Q4_K with a row count that is a multiple of 8 it does).
fn tiled_format(w: &QMatrix) -> bool {
    match w.ty {
        GgmlType::Q6K => true,
        GgmlType::Q4K => !w.repack_rows().is_multiple_of(8),
        ty => crate::kformats::handles(ty),
    }
}

/// The dot product of llama.cpp's tiled kernel for `ty`.
pub(crate) fn tiled_dot(ty: GgmlType) -> fn(GgmlType, &[u8], &[u8], usize) -> f32 {
    if ty != GgmlType::Q6K {
        return crate::kformats::dot_tiled;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2, FMA and F16C; rows hold `n` elements.
        return |_, w, a, n| unsafe { crate::x86_kquants::dot_q6_k_tiled(w, a, n) };
    }
    let _ = ty;
    |_, w, a, n| crate::kquants::dot_q6_k_tiled(w, a, n)
}

impl PackedJob<'static> {
    /// A placeholder for unused slots of a fixed array (never run).
    const EMPTY: PackedJob<'static> = PackedJob {
        w: &EMPTY_MATRIX,
        packed: &[],
        out: OutPtr(std::ptr::null_mut()),
        chunk: 0,
        g_chunks: 0,
        first_unit: 0,
    };
}

static EMPTY_MATRIX: QMatrix = QMatrix {
    ty: GgmlType::F32,
    rows: 0,
    order_rows: 0,
    repackable: true,
    cols: 0,
    row_bytes: 0,
    data: Storage::Packed(Vec::new()),
};

/// The packed path: threads claim (token block, group chunk) units, token blocks outermost so
/// a block's activations stay in cache while all threads sweep the weights. Several matrices
/// that read the same activations (Q, K, V; gate, up) share one parallel region.
fn matmul_packed(pool: &ThreadPool, jobs: &mut [PackedJob<'_>], acts: &QuantActs) {
    let n = acts.n;
    let n_tb = n.div_ceil(TOKEN_BLOCK);
    let mut units = 0;
    for j in jobs.iter_mut() {
        let groups = j.w.rows.div_ceil(crate::packed::GROUP);
        // Large contiguous chunks keep each thread's weight stream sequential, which is what
        // the hardware prefetchers follow; a few chunks per thread still absorb imbalance.
        j.chunk = groups
            .div_ceil(pool.n_threads() * CHUNKS_PER_THREAD)
            .max(MIN_GROUP_CHUNK);
        j.g_chunks = groups.div_ceil(j.chunk);
        j.first_unit = units;
        units += j.g_chunks * n_tb;
    }
    let jobs = &*jobs;
    #[cfg(target_arch = "x86_64")]
    let row = |t: usize| acts.simd_row(t);
    pool.run_units(units, &|_tid, u| {
        let Some(j) = jobs.iter().rev().find(|j| j.first_unit <= u) else {
            return;
        };
        let u = u - j.first_unit;
        let groups = j.w.rows.div_ceil(crate::packed::GROUP);
        let (tb, gc) = (u / j.g_chunks, u % j.g_chunks);
        let g0 = gc * j.chunk;
        let g1 = (g0 + j.chunk).min(groups);
        let t0 = tb * TOKEN_BLOCK;
        let t1 = (t0 + TOKEN_BLOCK).min(n);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a packed matrix exists only when `simd_kernels` found AVX2, FMA and
        // F16C (or a test checked them); the packed buffer holds `groups` groups of `nb`
        // blocks; the activation rows were quantised for this format with their side
        // arrays; `out` holds `n * rows` floats and this thread alone owns the rows of
        // groups g0..g1 for tokens t0..t1.
        unsafe {
            crate::x86::matmul_groups(
                j.w.ty,
                repacked_b32(j.w.ty, j.w.repack_rows()),
                j.packed.as_ptr(),
                j.w.cols / crate::formats::QK,
                j.w.rows,
                g0..g1,
                t0..t1,
                &row,
                j.out.ptr(),
                j.w.rows,
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("packed matrices exist only where a SIMD kernel does: {g0}..{g1} {t0}..{t1}");
    });
}

/// Several products with the same activations, in one parallel region when every matrix is
/// packed (saving a thread hand-off per matrix, which matters at a few microseconds a matmul).
/// Each `(w, out)` pair obeys [`matmul`]'s contract.
pub fn matmul_multi(pool: &ThreadPool, acts: &QuantActs, parts: &mut [(&QMatrix, &mut [f32])]) {
    let all_packed = parts
        .iter()
        .all(|(w, _)| w.is_packed() && w.ty == parts[0].0.ty);
    if !all_packed
        || acts.flavour.arm()
        || parts.len() > MAX_FUSED
        || acts.ty != Some(act_type(parts[0].0.ty))
    {
        for (w, out) in parts.iter_mut() {
            matmul(pool, w, acts, out);
        }
        return;
    }
    // A fixed array, not a Vec: this runs several times per layer per token.
    let mut jobs: [PackedJob<'_>; MAX_FUSED] = [PackedJob::EMPTY; MAX_FUSED];
    for (slot, (w, out)) in jobs.iter_mut().zip(parts.iter_mut()) {
        check_shapes(w, acts, out);
        let Storage::Packed(packed) = &w.data else {
            unreachable!("checked above");
        };
        *slot = PackedJob {
            w,
            packed,
            out: OutPtr(out.as_mut_ptr()),
            chunk: 0,
            g_chunks: 0,
            first_unit: 0,
        };
    }
    matmul_packed(pool, &mut jobs[..parts.len()], acts);
}

/// Most products [`matmul_multi`] fuses into one parallel region.
const MAX_FUSED: usize = 4;

pub(crate) fn check_shapes(w: &QMatrix, acts: &QuantActs, out: &[f32]) {
    assert_eq!(
        acts.ty,
        Some(act_type(w.ty)),
        "activations quantised for another format"
    );
    assert_eq!(acts.cols, w.cols, "activation width");
    assert!(out.len() >= acts.n * w.rows, "output too small");
    assert!(
        !needs_ys(w.ty) || !w.is_packed() || acts.weight_ty == Some(w.ty),
        "packed Q4_0 / Q5_0 weights need activations quantised for their own format"
    );
}
