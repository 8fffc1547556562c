//! AVX2 kernels of attention for the query heads that share one KV head
//! ([`crate::attn::scores_grouped`], [`crate::attn::weighted_sum_grouped`]), in the two orders
//! of an AVX2 build of llama.cpp: tinyBLAS's for batches (one 8-lane accumulator, `hsum`) and
//! `ggml_vec_dot_f16`'s for single tokens (four 8-lane accumulators over 32-element steps).
//!
//! Both products are the same shape: `G` vectors (the heads' queries, or their probabilities)
//! dotted with each of `n` rows (keys, or transposed value rows). Every output keeps its
//! accumulators, order and reduction exactly; only the tiling changes. One load of a row feeds
//! every head of the group and, in batches, several rows share each load of a head's vector, so
//! the loop is bound by the multiply-adds rather than by loads from L2.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::x86::hsum8;

/// `G` vectors and `n` rows: what both grouped products read and write.
#[derive(Clone, Copy)]
pub(crate) struct Dots {
    /// Vector `h` at `x + h * xs`.
    pub(crate) x: *const f32,
    pub(crate) xs: usize,
    /// Row `r` at `rows + r * rs`.
    pub(crate) rows: *const f32,
    pub(crate) rs: usize,
    pub(crate) n: usize,
    /// Elements per dot product.
    pub(crate) len: usize,
    /// Each result is multiplied by this (1 leaves it exact).
    pub(crate) scale: f32,
    /// Result `(h, r)` goes to `out + h * os + r`.
    pub(crate) out: *mut f32,
    pub(crate) os: usize,
}

impl Dots {
    /// The same product for heads `h0..` only.
    unsafe fn heads_from(self, h0: usize) -> Dots {
        Dots {
            x: self.x.add(h0 * self.xs),
            out: self.out.add(h0 * self.os),
            ..self
        }
    }

    /// The same product for rows `r0..` only.
    unsafe fn rows_from(self, r0: usize) -> Dots {
        Dots {
            rows: self.rows.add(r0 * self.rs),
            n: self.n - r0,
            out: self.out.add(r0),
            ..self
        }
    }
}

/// Batch order: `out(h, r) = hsum8(sum over 8-element steps of x_h * row_r) * scale`, `R` rows
/// at a time.
///
/// # Safety
/// AVX2 and FMA must be available; `len` must be a multiple of 8 and every vector, row and
/// output inside its buffer.
#[target_feature(enable = "avx2,fma")]
unsafe fn batch8_tile<const G: usize, const R: usize>(d: Dots) {
    let mut r0 = 0;
    while r0 + R <= d.n {
        let mut acc = [[_mm256_setzero_ps(); R]; G];
        let mut i = 0;
        while i < d.len {
            for r in 0..R {
                let row = _mm256_loadu_ps(d.rows.add((r0 + r) * d.rs + i));
                for (h, a) in acc.iter_mut().enumerate() {
                    a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(d.x.add(h * d.xs + i)), row, a[r]);
                }
            }
            i += 8;
        }
        for (h, a) in acc.iter().enumerate() {
            for (r, &v) in a.iter().enumerate() {
                *d.out.add(h * d.os + r0 + r) = hsum8(v) * d.scale;
            }
        }
        r0 += R;
    }
    if r0 < d.n {
        // The last rows, one at a time.
        batch8_tile::<G, 1>(d.rows_from(r0));
    }
}

/// [`batch8_tile`] for `g` heads, with as many rows per tile as keep the accumulators (at most
/// twelve) in registers.
///
/// # Safety
/// As for [`batch8_tile`], with `g` in `1..=4`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_batch8(g: usize, d: Dots) {
    match g {
        1 => batch8_tile::<1, 4>(d),
        2 => batch8_tile::<2, 4>(d),
        3 => batch8_tile::<3, 4>(d),
        4 => batch8_tile::<4, 3>(d),
        _ => unreachable!("groups are split into at most four heads, got {g}"),
    }
}

/// `ggml_vec_dot_f16`'s AVX2 reduction of its four accumulators (as in
/// [`crate::x86_ops::dot_single8`]): `(s0 + s2) + (s1 + s3)`, halves, then two horizontal adds.
#[inline(always)]
unsafe fn reduce_single8(s: &[__m256; 4]) -> f32 {
    let x = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// Single-token order: `out(h, r) = dot_single8(x_h, row_r) * scale`, a row at a time.
///
/// # Safety
/// AVX2 and FMA must be available; `len` must be a multiple of 32 and every vector, row and
/// output inside its buffer.
#[target_feature(enable = "avx2,fma")]
unsafe fn single8_tile<const G: usize>(d: Dots) {
    for r in 0..d.n {
        let row = d.rows.add(r * d.rs);
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        let mut i = 0;
        while i < d.len {
            // Transposed value rows are short streams that start cold (keys are one long
            // stream, for which this changes little): fetch the next row alongside this one.
            let next = d.rows.wrapping_add((r + 1) * d.rs + i) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(next);
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64));
            for j in 0..4 {
                let y = _mm256_loadu_ps(row.add(i + 8 * j));
                for (h, a) in acc.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(d.x.add(h * d.xs + i + 8 * j));
                    a[j] = _mm256_fmadd_ps(x, y, a[j]);
                }
            }
            i += 32;
        }
        for (h, a) in acc.iter().enumerate() {
            *d.out.add(h * d.os + r) = reduce_single8(a) * d.scale;
        }
    }
}

/// [`single8_tile`] for `g` heads (four as two pairs: twelve accumulators at most).
///
/// # Safety
/// As for [`single8_tile`], with `g` in `1..=4`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_single8(g: usize, d: Dots) {
    match g {
        1 => single8_tile::<1>(d),
        2 => single8_tile::<2>(d),
        3 => single8_tile::<3>(d),
        4 => {
            single8_tile::<2>(d);
            single8_tile::<2>(d.heads_from(2));
        }
        _ => unreachable!("groups are split into at most four heads, got {g}"),
    }
}

/// The grouped product in `order` (one the kernels take: `Batch8` or `Single8`).
///
/// # Safety
/// As for [`dots_batch8`] or [`dots_single8`].
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dots(order: crate::attn::DotOrder, g: usize, d: Dots) {
    match order {
        crate::attn::DotOrder::Batch8 => dots_batch8(g, d),
        crate::attn::DotOrder::Single8 => dots_single8(g, d),
        other => unreachable!("no grouped kernel for {other:?}"),
    }
}
