//! AVX2 kernels of batched attention in an AVX2 build's tinyBLAS order, for the query heads that
//! share one KV head ([`crate::attn::scores_grouped`], [`crate::attn::weighted_sum_grouped`]).
//!
//! Every output is the same single 8-lane accumulator as in [`crate::x86_ops::scores_batch8`] and
//! [`crate::x86_ops::weighted_sum_batch8`], summed in the same order and reduced by the same
//! `hsum`; only the tiling changes. The one-head kernels read every key and value from L2 once
//! per fused multiply-add, which bounds them by L2 bandwidth; here one load of a key (or of a
//! transposed value row) feeds every head of the group and several keys (rows) share each
//! query (probability) load, so the loop is bound by the multiply-adds instead.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::x86::hsum8;

/// Scores of `G` query heads (rows of `hd` at `q`) against keys `0..len` (rows of `hd` at
/// `keys`): `out[h * stride + p] = hsum8(q_h · k_p) * scale`, `KT` keys at a time.
///
/// # Safety
/// AVX2 and FMA must be available; `hd` must be a multiple of 8; `q` must hold `G * hd` floats,
/// `keys` `len * hd`, and `out` `(G - 1) * stride + len`.
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_tile<const G: usize, const KT: usize>(
    q: *const f32,
    hd: usize,
    keys: *const f32,
    len: usize,
    scale: f32,
    out: *mut f32,
    stride: usize,
) {
    let mut p = 0;
    while p + KT <= len {
        let mut acc = [[_mm256_setzero_ps(); KT]; G];
        let mut i = 0;
        while i < hd {
            for j in 0..KT {
                let k = _mm256_loadu_ps(keys.add((p + j) * hd + i));
                for (h, a) in acc.iter_mut().enumerate() {
                    a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(h * hd + i)), k, a[j]);
                }
            }
            i += 8;
        }
        for (h, a) in acc.iter().enumerate() {
            for (j, &x) in a.iter().enumerate() {
                *out.add(h * stride + p + j) = hsum8(x) * scale;
            }
        }
        p += KT;
    }
    if p < len {
        // The last keys, one at a time.
        scores_tile::<G, 1>(q, hd, keys.add(p * hd), len - p, scale, out.add(p), stride);
    }
}

/// Dispatches [`scores_tile`] by group size, with as many keys per tile as keep the
/// accumulators (at most twelve) in registers.
///
/// # Safety
/// As for [`scores_tile`], with `g = G` in `1..=4`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores_grouped8(
    g: usize,
    q: *const f32,
    hd: usize,
    keys: *const f32,
    len: usize,
    scale: f32,
    out: *mut f32,
    stride: usize,
) {
    match g {
        1 => scores_tile::<1, 4>(q, hd, keys, len, scale, out, stride),
        2 => scores_tile::<2, 4>(q, hd, keys, len, scale, out, stride),
        3 => scores_tile::<3, 4>(q, hd, keys, len, scale, out, stride),
        4 => scores_tile::<4, 3>(q, hd, keys, len, scale, out, stride),
        _ => unreachable!("groups are split into at most four heads, got {g}"),
    }
}

/// Weighted sums of `G` heads over transposed values: for each head `h` and column `d`,
/// `out[h * hd + d] = hsum8(sum over p of w[h * ws + p] * vt[d * vs + p])`, lane `p % 8`, over
/// positions `0..len8` (a multiple of 8; `w` is zero past each head's real length), `DT`
/// columns at a time.
///
/// # Safety
/// AVX2 and FMA must be available; `w` must hold `(G - 1) * ws + len8` floats, `vt` `hd` rows of
/// `vs >= len8`, and `out` `G * hd`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn wsum_tile<const G: usize, const DT: usize>(
    w: *const f32,
    ws: usize,
    vt: *const f32,
    vs: usize,
    hd: usize,
    d0: usize,
    len8: usize,
    out: *mut f32,
) {
    let mut d = d0;
    while d + DT <= hd {
        let mut acc = [[_mm256_setzero_ps(); DT]; G];
        let mut p = 0;
        while p < len8 {
            for r in 0..DT {
                let v = _mm256_loadu_ps(vt.add((d + r) * vs + p));
                for (h, a) in acc.iter_mut().enumerate() {
                    a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(h * ws + p)), v, a[r]);
                }
            }
            p += 8;
        }
        for (h, a) in acc.iter().enumerate() {
            for (r, &x) in a.iter().enumerate() {
                *out.add(h * hd + d + r) = hsum8(x);
            }
        }
        d += DT;
    }
    if d < hd {
        // The last columns, one at a time.
        wsum_tile::<G, 1>(w, ws, vt, vs, hd, d, len8, out);
    }
}

/// Dispatches [`wsum_tile`] by group size (at most twelve accumulators).
///
/// # Safety
/// As for [`wsum_tile`], with `g = G` in `1..=4`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn weighted_sum_grouped8(
    g: usize,
    w: *const f32,
    ws: usize,
    vt: *const f32,
    vs: usize,
    hd: usize,
    len8: usize,
    out: *mut f32,
) {
    match g {
        1 => wsum_tile::<1, 4>(w, ws, vt, vs, hd, 0, len8, out),
        2 => wsum_tile::<2, 4>(w, ws, vt, vs, hd, 0, len8, out),
        3 => wsum_tile::<3, 4>(w, ws, vt, vs, hd, 0, len8, out),
        4 => wsum_tile::<4, 3>(w, ws, vt, vs, hd, 0, len8, out),
        _ => unreachable!("groups are split into at most four heads, got {g}"),
    }
}
