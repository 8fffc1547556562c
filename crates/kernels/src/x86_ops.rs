//! AVX2 versions of the element-wise operations in [`crate::ops`], [`crate::attn`] and the
//! activation quantiser in [`crate::formats`]. Each performs the same IEEE operations, lane by
//! lane, as its scalar twin (which stays the reference in the tests), so results are the same
//! bits; only the instruction count changes.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use half::f16;

use crate::formats::{Q8Sides, QK};
use crate::x86::{hsum_epi32, hsum8};

/// The sum of sixteen lanes in `_mm512_reduce_add_ps` order: halves, quarters, then pairs.
#[inline(always)]
unsafe fn reduce16(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(hi, lo);
    // Quarters, then (s4[0] + s4[2]) + (s4[1] + s4[3]).
    hsum8(s8)
}

#[inline(always)]
unsafe fn round_f16_v(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// Rounds every value of `x` to f16 precision.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn round_f16_slice(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = _mm256_loadu_ps(c.as_ptr());
        _mm256_storeu_ps(c.as_mut_ptr(), round_f16_v(v));
    }
    for v in chunks.into_remainder() {
        *v = f16::from_f32(*v).to_f32();
    }
}

#[inline(always)]
unsafe fn pow2i(k: __m256i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        k,
        _mm256_set1_epi32(127),
    )))
}

/// Eight lanes of [`crate::ops::ggml_expf`].
#[inline(always)]
unsafe fn expf8(x: __m256) -> __m256 {
    let r = _mm256_set1_ps(12_582_912.0);
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3FB8_AA3B)), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35BF_BE8E)),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3F31_7200)), x),
    );
    let u = _mm256_mul_ps(b, b);
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)),
            u,
            _mm256_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3F7F_FFF6), b, _mm256_set1_ps(1.0)),
    );
    // j * 2^n rounded once: split 2^n = 2^(n - n1) * 2^n1 with n1 clamped to the normal range,
    // so the first product is exact and only the second rounds (to a subnormal, or to infinity).
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_max_epi32(
        _mm256_min_epi32(ni, _mm256_set1_epi32(127)),
        _mm256_set1_epi32(-126),
    );
    let n2 = _mm256_sub_epi32(ni, n1);
    let res = _mm256_mul_ps(_mm256_mul_ps(j, pow2i(n2)), pow2i(n1));
    // |n| > 192: 0 below, infinity above (as the scalar code).
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    if _mm256_movemask_ps(big) == 0 {
        return res;
    }
    let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(n, _mm256_setzero_ps());
    let edge = _mm256_and_ps(pos, _mm256_set1_ps(f32::INFINITY));
    _mm256_blendv_ps(res, edge, big)
}

/// Eight lanes of [`crate::ops::ggml_expf_avx2`] (ggml's `ggml_v_expf` for `__m256`).
#[inline(always)]
unsafe fn expf8_avx2(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = _mm256_set1_ps(12_582_912.0);
    let z = _mm256_fmadd_ps(x, c(0x3FB8_AA3B), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c(0x35BF_BE8E), _mm256_fnmadd_ps(n, c(0x3F31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)),
            u,
            _mm256_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)),
        ),
        u,
        _mm256_mul_ps(c(0x3F7F_FFF6), b),
    );
    if _mm256_movemask_ps(big) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7F00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    _mm256_or_ps(
        _mm256_and_ps(huge, _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            huge,
            _mm256_or_ps(
                _mm256_and_ps(big, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                _mm256_andnot_ps(big, _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

/// [`crate::ops::softmax`] as an AVX2 build computes it: blocks of eight exponentials summed in
/// `hsum` order, block sums in f64.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn softmax_avx2(x: &mut [f32], sink: Option<f32>) {
    let max = x
        .iter()
        .copied()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    let vmax = _mm256_set1_ps(max);
    let mut sum = 0.0f64;
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = expf8_avx2(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), vmax));
        _mm256_storeu_ps(c.as_mut_ptr(), v);
        sum += f64::from(hsum8(v));
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut pad = [f32::NEG_INFINITY; 8];
        pad[..rest.len()].copy_from_slice(rest);
        let v = expf8_avx2(_mm256_sub_ps(_mm256_loadu_ps(pad.as_ptr()), vmax));
        _mm256_storeu_ps(pad.as_mut_ptr(), v);
        rest.copy_from_slice(&pad[..rest.len()]);
        sum += f64::from(hsum8(v));
    }
    sum += crate::ops::sink_term(sink, max);
    let inv = _mm256_set1_ps((1.0 / sum) as f32);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = _mm256_loadu_ps(c.as_ptr());
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_mul_ps(v, inv));
    }
    let inv = (1.0 / sum) as f32;
    for v in chunks.into_remainder() {
        *v *= inv;
    }
}

/// [`crate::ops::swiglu`] with the AVX2 build's exponential.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(gate.as_ptr().add(i));
        let e = expf8_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
        i += 8;
    }
    for j in i..n {
        let x = gate[j];
        gate[j] = x / (1.0 + crate::ops::ggml_expf_avx2(-x)) * up[j];
    }
}

/// [`crate::ops::softmax`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn softmax(x: &mut [f32], sink: Option<f32>) {
    let max = x
        .iter()
        .copied()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    let vmax = _mm256_set1_ps(max);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = _mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), vmax);
        _mm256_storeu_ps(c.as_mut_ptr(), expf8(v));
    }
    for v in chunks.into_remainder() {
        *v = crate::ops::ggml_expf(*v - max);
    }
    let mut sum = 0.0f64;
    let mut blocks = x.chunks_exact(16);
    for b in &mut blocks {
        sum += f64::from(reduce16(
            _mm256_loadu_ps(b.as_ptr()),
            _mm256_loadu_ps(b.as_ptr().add(8)),
        ));
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        let mut pad = [0.0f32; 16];
        pad[..rest.len()].copy_from_slice(rest);
        sum += f64::from(reduce16(
            _mm256_loadu_ps(pad.as_ptr()),
            _mm256_loadu_ps(pad.as_ptr().add(8)),
        ));
    }
    sum += crate::ops::sink_term(sink, max);
    let inv = (1.0 / sum) as f32;
    let vinv = _mm256_set1_ps(inv);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = _mm256_loadu_ps(c.as_ptr());
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_mul_ps(v, vinv));
    }
    for v in chunks.into_remainder() {
        *v *= inv;
    }
}

/// [`crate::ops::swiglu`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let one = _mm256_set1_ps(1.0);
    let neg = _mm256_set1_ps(-0.0);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(gate.as_ptr().add(i));
        let e = expf8(_mm256_xor_ps(x, neg));
        let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
        i += 8;
    }
    for j in i..n {
        let x = gate[j];
        gate[j] = x / (1.0 + crate::ops::ggml_expf(-x)) * up[j];
    }
}

/// `K` fused multiply-add accumulators over `q` and `k` in steps of `8 * K` elements (the
/// first `n`, a multiple of the step): accumulator `j` lane `l` collects elements
/// `8 * j + l` of every step, the layout of ggml's `GGML_F32_ARR` / `GGML_F16_ARR` loops.
#[inline(always)]
unsafe fn fma_lanes<const K: usize>(q: &[f32], k: &[f32], n: usize) -> [__m256; K] {
    let mut acc = [_mm256_setzero_ps(); K];
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    let mut i = 0;
    while i < n {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(
                _mm256_loadu_ps(qp.add(i + 8 * j)),
                _mm256_loadu_ps(kp.add(i + 8 * j)),
                *a,
            );
        }
        i += 8 * K;
    }
    acc
}

/// `q · k` in `ggml_vec_dot_f16` order (four 16-lane accumulators over 64-element steps; a
/// tail beyond the last full step is added in f64).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_single(q: &[f32], k: &[f32]) -> f32 {
    let n = q.len().min(k.len());
    let full = n / 64 * 64;
    let s = fma_lanes::<8>(q, k, full);
    // Accumulator j lane l is s[2j + l / 8] lane l % 8: (s0 + s2) + (s1 + s3), then reduce16.
    let lo = _mm256_add_ps(_mm256_add_ps(s[0], s[4]), _mm256_add_ps(s[2], s[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(s[1], s[5]), _mm256_add_ps(s[3], s[7]));
    let mut sum = f64::from(reduce16(lo, hi));
    for j in full..n {
        sum += f64::from(q[j] * k[j]);
    }
    sum as f32
}

/// `q · k` in an AVX2 build's `ggml_vec_dot_f16` order (four 8-lane accumulators over
/// 32-element steps; `q.len()` a multiple of 32).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_single8(q: &[f32], k: &[f32]) -> f32 {
    let s = fma_lanes::<4>(q, k, q.len().min(k.len()) / 32 * 32);
    let x = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// `q · k` in tinyBLAS order (one 16-lane accumulator).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_batch(q: &[f32], k: &[f32]) -> f32 {
    let [lo, hi] = fma_lanes::<2>(q, k, q.len().min(k.len()) / 16 * 16);
    reduce16(lo, hi)
}

/// Quantises one row to Q8_0 / Q8_1 blocks as ggml's AVX2 `quantize_row_q8_*` does, filling the
/// side arrays.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_row_q8(q81: bool, x: &[f32], out: &mut [u8], sides: Q8Sides<'_>) {
    let (bb, qoff) = if q81 { (36, 4) } else { (34, 2) };
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut ys = sides.ys;
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let p = xb.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mul = _mm256_set1_ps(id);
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[i], mul)))
        });
        let blk = &mut out[b * bb..(b + 1) * bb];
        let dh = f16::from_f32(d);
        blk[0..2].copy_from_slice(&dh.to_bits().to_le_bytes());
        sides.d[b] = dh.to_f32();
        if q81 {
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let sum = hsum_epi32(s);
            let sh = f16::from_f32(d * sum as f32);
            blk[2..4].copy_from_slice(&sh.to_bits().to_le_bytes());
            sides.s[b] = sh.to_f32();
        }
        let w01 = _mm256_packs_epi32(q[0], q[1]);
        let w23 = _mm256_packs_epi32(q[2], q[3]);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), perm);
        _mm256_storeu_si256(blk.as_mut_ptr().add(qoff) as *mut __m256i, bytes);
        if let Some(ys) = ys.as_deref_mut() {
            // Sums of each group of four codes, times the weight codes' offset.
            let p16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes);
            let s32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(sides.ys_scale as i16));
            _mm256_storeu_si256(ys.as_mut_ptr().add(8 * b) as *mut __m256i, s32);
        }
    }
}
