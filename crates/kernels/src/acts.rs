//! Activations converted for the products of one weight format (see [`QuantActs`]).

use strata_gguf::GgmlType;

use crate::attn::Flavour;
use crate::formats::{QK, act_type, quantize_act_row};
#[cfg(target_arch = "x86_64")]
use crate::matmul::HALF_TILE;
use crate::matmul::{KTILE_MIN_BATCH, ktiles_enabled};

/// Activations converted for a product with a given weight format; reused across calls so the
/// hot path does not allocate once it has seen its largest batch.
///
/// Besides the blocks in ggml's layout, it keeps side arrays the SIMD kernels read instead of
/// re-deriving them for every weight row: block scales as f32, Q8_1 block sums as f32, and for
/// Q4_0 weights eight times the sum of each group of four quants.
#[derive(Debug, Default)]
pub struct QuantActs {
    pub(crate) ty: Option<GgmlType>,
    pub(crate) weight_ty: Option<GgmlType>,
    pub(crate) n: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) buf: Vec<u8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) ys: Vec<i32>,
    /// Q8_K rows interleaved by eight tokens for the K-quant tile kernels (batches of
    /// [`KTILE_MIN_BATCH`] or more on AVX2), else empty.
    pub(crate) tiles: Vec<u8>,
    /// The batch whose float order the products follow, if not these rows' own: its size and
    /// the index of row 0 in it (see [`QuantActs::as_rows_of`]).
    pub(crate) order: Option<(usize, usize)>,
    /// Whether every row is computed in the order of a batch of one (kept across
    /// [`QuantActs::quantize`] calls; see [`QuantActs::set_rows_independent`]).
    pub(crate) independent: bool,
    /// Products for llama.cpp's `mul_mat_id` (see [`QuantActs::set_mul_mat_id`]).
    pub(crate) mul_mat_id: bool,
    /// BF16 / F16 rows widened to f32 for the half-precision tile path (batches of
    /// `HALF_TILE.1` or more on AVX2), else empty.
    pub(crate) wide: Vec<f32>,
    /// Which llama.cpp build's arithmetic the products follow (kept across
    /// [`QuantActs::quantize`] calls; see [`QuantActs::set_flavour`]).
    pub(crate) flavour: Flavour,
    /// The f32 activations themselves, for F16 and F32 weights under an ARM flavour: llama.cpp's
    /// aarch64 build multiplies a batch with f16 weights by the f32 activations (tinyBLAS), not
    /// by their f16 conversion. Else empty.
    pub(crate) raw: Vec<f32>,
}

impl QuantActs {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Converts `n` rows of `cols` activations (`x.len() >= n * cols`) for weights of
    /// `weight_ty`.
    pub fn quantize(&mut self, weight_ty: GgmlType, x: &[f32], n: usize, cols: usize) {
        let act = act_type(weight_ty);
        let row_bytes = act.row_bytes(cols).unwrap_or(0);
        let need = n * row_bytes;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        let blocked = matches!(act, GgmlType::Q8_0 | GgmlType::Q8_1);
        let nb = if blocked { cols / QK } else { 0 };
        if blocked && self.d.len() < n * nb {
            self.d.resize(n * nb, 0.0);
            self.s.resize(n * nb, 0.0);
        }
        let want_ys = needs_ys(weight_ty);
        if want_ys && self.ys.len() < n * nb * 8 {
            self.ys.resize(n * nb * 8, 0);
        }
        for (t, (xr, out)) in x
            .chunks_exact(cols)
            .zip(self.buf.chunks_exact_mut(row_bytes))
            .take(n)
            .enumerate()
        {
            match act {
                GgmlType::Q8_0 | GgmlType::Q8_1 if self.flavour.arm() => {
                    crate::arm::quantize_row_q8(act == GgmlType::Q8_1, xr, out);
                }
                GgmlType::Q8K if self.flavour.arm() => {
                    crate::kquants::quantize_row_q8_k_as(true, xr, out);
                }
                GgmlType::Q8_0 | GgmlType::Q8_1 => {
                    let sides = crate::formats::Q8Sides {
                        d: &mut self.d[t * nb..(t + 1) * nb],
                        s: &mut self.s[t * nb..(t + 1) * nb],
                        ys: if want_ys {
                            Some(&mut self.ys[t * nb * 8..(t + 1) * nb * 8])
                        } else {
                            None
                        },
                        ys_scale: if weight_ty == GgmlType::Q5_0 { 16 } else { 8 },
                    };
                    crate::formats::quantize_row_q8(act == GgmlType::Q8_1, xr, out, sides);
                }
                _ => quantize_act_row(act, xr, out),
            }
        }
        self.tiles.clear();
        self.order = None;
        self.raw.clear();
        if self.flavour.arm() && matches!(weight_ty, GgmlType::F16 | GgmlType::F32) {
            self.raw.extend_from_slice(&x[..n * cols]);
        }
        if act == GgmlType::Q8K && n >= KTILE_MIN_BATCH && ktiles_enabled() && !self.flavour.arm() {
            crate::kquants::interleave_q8k(
                &self.buf,
                row_bytes,
                n,
                cols / crate::kquants::QK_K,
                &mut self.tiles,
            );
        }
        self.wide.clear();
        // Only the tile path reads them: not `mul_mat_id` products, nor rows in one-token order
        // (batched decoding), which go one dot at a time.
        #[cfg(target_arch = "x86_64")]
        if matches!(act, GgmlType::BF16 | GgmlType::F16)
            && n >= HALF_TILE.1
            && !self.mul_mat_id
            && !self.independent
            && !self.flavour.arm()
            && crate::isa().avx2
        {
            self.wide.resize(n * cols, 0.0);
            for (src, dst) in self
                .buf
                .chunks_exact(row_bytes)
                .zip(self.wide.chunks_exact_mut(cols))
            {
                // SAFETY: `isa().avx2` implies AVX2 and F16C.
                unsafe {
                    if act == GgmlType::BF16 {
                        crate::x86_rowdot::widen_half::<true>(src, dst)
                    } else {
                        crate::x86_rowdot::widen_half::<false>(src, dst)
                    }
                }
            }
        }
        self.ty = Some(act);
        self.weight_ty = Some(weight_ty);
        self.n = n;
        self.cols = cols;
        self.row_bytes = row_bytes;
    }

    /// Makes the products of these rows follow the float order llama.cpp uses for them inside a
    /// batch of `batch` tokens of which they are the rows from `first` on. llama.cpp projects a
    /// prompt's attention output through the output matrix for every token and keeps the last
    /// row after that; strata projects only the last row, so it must pick the kernel order the
    /// whole batch would get. Reset by the next [`QuantActs::quantize`].
    pub fn as_rows_of(&mut self, batch: usize, first: usize) {
        self.order = (batch != self.n || first != 0).then_some((batch, first));
    }

    /// Makes every row's products follow the order of a one-token batch, until switched off:
    /// batched decoding of independent sequences must give each sequence the bits it would get
    /// alone. Unlike [`QuantActs::as_rows_of`], this persists across quantisations.
    pub fn set_rows_independent(&mut self, on: bool) {
        self.independent = on;
    }

    /// Makes the products follow the arithmetic of the llama.cpp build `flavour` names, until
    /// changed (the default is [`Flavour::native`]). Takes effect from the next
    /// [`QuantActs::quantize`]: an ARM flavour converts activations as that build does.
    pub fn set_flavour(&mut self, flavour: Flavour) {
        self.flavour = flavour;
    }

    /// Which llama.cpp build's arithmetic the products follow.
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// Whether products with these activations stand for llama.cpp's `mul_mat_id` (a mixture
    /// of experts' expert matrices): it never sends them through tinyBLAS, so BF16, F16, F32
    /// and IQ4_NL keep `vec_dot`'s order at every batch size, and it runs the experts it
    /// repacks one token at a time (Q4_K never takes the four-token kernel's order). Stays set
    /// across [`QuantActs::quantize`] calls.
    pub fn set_mul_mat_id(&mut self, on: bool) {
        self.mul_mat_id = on;
    }

    /// The batch whose float order these rows' products follow and the index of row 0 in it.
    pub(crate) fn order_batch(&self) -> (usize, usize) {
        if self.independent {
            (1, 0)
        } else {
            self.order.unwrap_or((self.n, 0))
        }
    }

    /// Number of activation rows (tokens).
    pub fn n(&self) -> usize {
        self.n
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn simd_row(&self, t: usize) -> crate::x86::ActRow {
        let nb = self.cols / QK;
        let qoff = if self.ty == Some(GgmlType::Q8_1) {
            4
        } else {
            2
        };
        let ys = if self.weight_ty.is_some_and(needs_ys) {
            self.ys[t * nb * 8..].as_ptr()
        } else {
            std::ptr::null()
        };
        crate::x86::ActRow {
            q: self.buf[t * self.row_bytes + qoff..].as_ptr(),
            stride: self.row_bytes / nb.max(1),
            d: self.d[t * nb..].as_ptr(),
            s: self.s[t * nb..].as_ptr(),
            ys,
        }
    }
}

/// Whether packed weights of `ty` read the activation quant sums (their codes are offset).
pub(crate) fn needs_ys(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0)
}

#[cfg(test)]
impl QuantActs {
    pub(crate) fn buf_for_test(&self) -> &[u8] {
        &self.buf
    }

    pub(crate) fn has_tiles(&self) -> bool {
        !self.tiles.is_empty()
    }
}
