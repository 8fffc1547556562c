//! AVX2 row-by-row dot products of IQ4_NL, MXFP4, BF16 and F16 weights in the orders of llama.cpp's AVX2
//! `vec_dot` and tinyBLAS kernels. Each is bit-identical to its scalar twin in [`crate::dot`]:
//! `dot_pairs` / `dot_half` (`vec_dot`), `dot_repacked` and `dot_tinyblas`.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::formats::{MXFP4_VALUES, e8m0_half, rd_f16};
use crate::kformats::IQ4NL_VALUES;
use crate::x86::hsum8;

/// Bytes of an IQ4_NL block (f16 scale, 16 bytes of indices), of an MXFP4 block (E8M0
/// exponent, 16 bytes of indices) and of a Q8_0 block.
const IQ4_NL_BYTES: usize = 18;
const MXFP4_BYTES: usize = 17;
const Q8_0_BYTES: usize = 34;

/// The 32 signed codes of the 4-bit table-format block whose 16 index bytes are at `qs`
/// (`MX`: MXFP4's table, else IQ4_NL's): elements 0..16 (low nibbles) in the low half, 16..32
/// (high nibbles) in the high half.
#[inline(always)]
unsafe fn lut4_codes<const MX: bool>(qs: *const u8) -> __m256i {
    let table: &[i8; 16] = if MX { &MXFP4_VALUES } else { &IQ4NL_VALUES };
    let lut = _mm_loadu_si128(table.as_ptr() as *const __m128i);
    let m4 = _mm_set1_epi8(0x0F);
    let q = _mm_loadu_si128(qs as *const __m128i);
    let lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4));
    let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    _mm256_set_m128i(hi, lo)
}

/// Block bytes, index offset and scale of block `ib` of a 4-bit table-format row.
#[inline(always)]
fn lut4_block<const MX: bool>(w: &[u8], ib: usize) -> (usize, f32) {
    if MX {
        (ib * MXFP4_BYTES + 1, e8m0_half(w[ib * MXFP4_BYTES]))
    } else {
        (ib * IQ4_NL_BYTES + 2, rd_f16(w, ib * IQ4_NL_BYTES))
    }
}

/// The eight lane sums (four products each) of signed codes `x` and signed quants `y`.
#[inline(always)]
unsafe fn lane_sums(x: __m256i, y: __m256i) -> __m256 {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// The whole integer sum of signed codes `x` times signed quants `y`.
#[inline(always)]
unsafe fn block_sum(x: __m256i, y: __m256i) -> i32 {
    let p = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),
        _mm256_set1_epi16(1),
    );
    crate::x86::hsum_epi32(p)
}

/// IQ4_NL (or, with `MX`, MXFP4) times Q8_0 activations: `PAIRS` is the order of
/// `ggml_vec_dot_iq4_nl_q8_0` / `ggml_vec_dot_mxfp4_q8_0` (even and odd blocks in two
/// accumulators, an odd last block added unfused), otherwise tinyBLAS's (one accumulator).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` and `a` must hold `n / 32` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_lut4<const MX: bool, const PAIRS: bool>(
    w: &[u8],
    a: &[u8],
    n: usize,
) -> f32 {
    let nb = n / 32;
    let wb = if MX { MXFP4_BYTES } else { IQ4_NL_BYTES };
    assert!(w.len() >= nb * wb && a.len() >= nb * Q8_0_BYTES);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let block = |ib: usize, acc: __m256| {
        let (at, dx) = lut4_block::<MX>(w, ib);
        let d = rd_f16(a, ib * Q8_0_BYTES) * dx;
        let q = _mm256_loadu_si256(ap.add(ib * Q8_0_BYTES + 2) as *const __m256i);
        _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            lane_sums(lut4_codes::<MX>(wp.add(at)), q),
            acc,
        )
    };
    if !PAIRS {
        let mut acc = _mm256_setzero_ps();
        for ib in 0..nb {
            acc = block(ib, acc);
        }
        return hsum8(acc);
    }
    let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut ib = 0;
    while ib + 1 < nb {
        acc1 = block(ib, acc1);
        acc2 = block(ib + 1, acc2);
        ib += 2;
    }
    let mut sum = hsum8(_mm256_add_ps(acc1, acc2));
    if ib < nb {
        // The odd last block: `sumf += d * (sumi1 + sumi2)`, one rounding each.
        let (at, dx) = lut4_block::<MX>(w, ib);
        let q = _mm256_loadu_si256(ap.add(ib * Q8_0_BYTES + 2) as *const __m256i);
        let s = block_sum(lut4_codes::<MX>(wp.add(at)), q);
        let d = rd_f16(a, ib * Q8_0_BYTES) * dx;
        sum += d * s as f32;
    }
    sum
}

/// MXFP4 times Q8_0 activations in the order of llama.cpp's repacked 8-row kernels (the twin of
/// [`crate::dot::dot_repacked`]): each block's whole integer sum times `d_w * d_a`, fused into
/// one accumulator block after block.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` and `a` must hold `n / 32` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_mxfp4_repacked(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / 32;
    assert!(w.len() >= nb * MXFP4_BYTES && a.len() >= nb * Q8_0_BYTES);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = 0.0f32;
    for ib in 0..nb {
        let (at, dx) = lut4_block::<true>(w, ib);
        let q = _mm256_loadu_si256(ap.add(ib * Q8_0_BYTES + 2) as *const __m256i);
        let s = block_sum(lut4_codes::<true>(wp.add(at)), q);
        acc = (s as f32).mul_add(dx * rd_f16(a, ib * Q8_0_BYTES), acc);
    }
    acc
}

/// Eight bf16 (`BF`) or f16 values at `p` as f32.
#[inline(always)]
unsafe fn load_half<const BF: bool>(p: *const u8) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    if BF {
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    } else {
        _mm256_cvtph_ps(h)
    }
}

/// Element `i` of a row of bf16 (`BF`) or f16 values.
#[inline(always)]
fn half_at<const BF: bool>(row: &[u8], i: usize) -> f32 {
    let bits = u16::from_le_bytes([row[2 * i], row[2 * i + 1]]);
    if BF {
        crate::formats::bf16_to_f32(bits)
    } else {
        half::f16::from_bits(bits).to_f32()
    }
}

/// BF16 (`BF`) or F16 times the same in `ggml_vec_dot_bf16` / `ggml_vec_dot_f16`'s AVX2 order
/// (see [`crate::dot`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` and `a` must hold `n` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_half<const BF: bool>(w: &[u8], a: &[u8], n: usize) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut c = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, c) in c.iter_mut().enumerate() {
            let at = 2 * (i + 8 * k);
            let p = _mm256_mul_ps(load_half::<BF>(wp.add(at)), load_half::<BF>(ap.add(at)));
            *c = _mm256_add_ps(p, *c);
        }
        i += 32;
    }
    let c1 = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
    let mut sum = f64::from(if BF {
        hsum8(c1)
    } else {
        let t0 = _mm_add_ps(_mm256_castps256_ps128(c1), _mm256_extractf128_ps(c1, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    });
    for j in i..n {
        sum += f64::from(half_at::<BF>(w, j) * half_at::<BF>(a, j));
    }
    sum as f32
}

/// Widens the BF16 (`BF`) or F16 values of `src` into `dst` (exactly: every half value is an
/// f32 value).
///
/// # Safety
/// AVX2 and F16C must be available.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn widen_half<const BF: bool>(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(
            dst.as_mut_ptr().add(i),
            load_half::<BF>(src.as_ptr().add(2 * i)),
        );
        i += 8;
    }
    for (j, d) in dst.iter_mut().enumerate().take(n).skip(i) {
        *d = half_at::<BF>(src, j);
    }
}

/// [`dot_half_tinyblas`] for `RM` rows of BF16 (`BF`) or F16 times `RN` tokens at once, as
/// tinyBLAS tiles them, the tokens already widened to f32: each step loads the `RN` token
/// vectors once and widens each row vector once for `RM * RN` products. Every output gets the
/// same float operations as [`dot_half_tinyblas`] (its own accumulator, the same steps, the
/// same sum; widening is exact), so the bits are its. `out[j][i]` is row `i` times token `j`;
/// rows and tokens are `n` values each, one after the other from `rows` and `toks`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `rows` must hold `RM * n` half values and `toks`
/// `RN * n` floats (`n` a multiple of 8).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn half_tile_tinyblas<const BF: bool, const RM: usize, const RN: usize>(
    rows: *const u8,
    toks: *const f32,
    n: usize,
    out: &mut [[f32; RM]; RN],
) {
    let mut acc = [[_mm256_setzero_ps(); RM]; RN];
    let mut i = 0;
    while i + 8 <= n {
        // The tokens stay in registers and one row vector at a time joins them: with the
        // twelve accumulators of a 4 x 3 tile that is all sixteen registers, where holding every
        // row vector would spill an accumulator and chain each step through memory.
        let a: [__m256; RN] = std::array::from_fn(|j| _mm256_loadu_ps(toks.add(j * n + i)));
        for r in 0..RM {
            let w = load_half::<BF>(rows.add(2 * (r * n + i)));
            for (accs, a) in acc.iter_mut().zip(&a) {
                accs[r] = _mm256_fmadd_ps(w, *a, accs[r]);
            }
        }
        i += 8;
    }
    for (o, accs) in out.iter_mut().zip(&acc) {
        for (o, c) in o.iter_mut().zip(accs) {
            *o = hsum8(*c);
        }
    }
}

/// BF16 (`BF`) or F16 in tinyBLAS's order: one 8-lane accumulator (`n` a multiple of 8).
///
/// # Safety
/// As for [`dot_half`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_half_tinyblas<const BF: bool>(w: &[u8], a: &[u8], n: usize) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in (0..n / 8 * 8).step_by(8) {
        acc = _mm256_fmadd_ps(
            load_half::<BF>(wp.add(2 * i)),
            load_half::<BF>(ap.add(2 * i)),
            acc,
        );
    }
    hsum8(acc)
}

/// F32 in `ggml_vec_dot_f32`'s AVX2 order (see [`crate::dot`]): four fused 8-lane
/// accumulators over 32 elements a step, `(c0 + c2) + (c1 + c3)`, halves added, two horizontal
/// adds, then the rest fused in one by one.
///
/// # Safety
/// AVX2 and FMA must be available; `w` and `a` must hold `n` f32 values.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    let (wp, ap) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut c = [_mm256_setzero_ps(); 4];
    let steps = n / 32 * 32;
    let mut i = 0;
    while i < steps {
        for (k, c) in c.iter_mut().enumerate() {
            let at = i + 8 * k;
            *c = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(at)), _mm256_loadu_ps(ap.add(at)), *c);
        }
        i += 32;
    }
    let x = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    let mut sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for j in steps..n {
        sum = (*wp.add(j)).mul_add(*ap.add(j), sum);
    }
    sum
}

/// F32 in tinyBLAS's order: one fused 8-lane accumulator (`n` a multiple of 8), summed as
/// [`hsum8`].
///
/// # Safety
/// As for [`dot_f32`].
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32_tinyblas(w: &[u8], a: &[u8], n: usize) -> f32 {
    assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    let (wp, ap) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = _mm256_setzero_ps();
    for i in (0..n / 8 * 8).step_by(8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(ap.add(i)), acc);
    }
    hsum8(acc)
}
