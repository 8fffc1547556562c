//! llama.cpp's aarch64 arithmetic, in portable code: the orders its NEON build (GCC,
//! `-march=armv8-a`, `-std=gnu11`, so multiplies and adds fuse where the C source writes them
//! together) sums one-row dot products in. These are the definitions the NEON kernels
//! (`aarch64`) must match bit for bit, and they run on any CPU, so x86 tests check them against
//! llama.cpp's own aarch64 results (`fixtures/quant/dots-aarch64-neon.json`) too.
//!
//! What differs from the x86 orders ([`crate::dot`]):
//! - **activations**: `quantize_row_q8_0` / `q8_1` scale by `1 / d` with `d = amax / 127`
//!   (x86: `127 / amax`), which rounds differently ([`quantize_row_q8`]), and Q8_K's reference
//!   quantiser fuses `iscale * x + 12582912` (`crate::kquants::quantize_row_q8_k_as`);
//! - **the 32-element formats** take blocks in pairs into two 4-lane accumulators; each lane is
//!   an exact integer sum (without dotprod, `ggml_vdotq_s32` pairs products `2l, 2l + 1` of each
//!   half vector with `2l + 8, 2l + 9`), converted, multiplied by `d_w * d_a` and added
//!   *unfused* (GCC keeps `vmlaq_n_f32` a multiply then an add); an odd last block is added in
//!   scalar code;
//! - **the K formats and IQ4_XS** sum each super-block to one exact integer first, then add it
//!   scaled with one fused multiply-add;
//! - **F32 and F16** use four 4-lane accumulators over 16-element steps; BF16 has no NEON path
//!   and sums in f64 element by element.

use strata_gguf::GgmlType;

use crate::formats::{QK, block_codes, rd_f16};
use crate::kformats::{KBlock, decode, min_sum, q8k_bsum, q8k_d};
use crate::kquants::{Q6_K_BYTES, Q8_K_BYTES, QK_K};

/// Which integer lane grouping the build's `ggml_vdotq_s32` has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lanes {
    /// No dotprod: `vmull_s8` pairs, lane `l` = products `2l, 2l + 1, 2l + 8, 2l + 9`.
    Neon,
    /// `sdot`: lane `l` = products `4l..4l + 4`; and half-precision vector arithmetic, which
    /// every core with dotprod has (ARMv8.2-A and later: Apple M-series, Graviton 2 on,
    /// Neoverse, Cortex-A76 on), so F16 rows are summed in f16 ([`dot_f16_half`]).
    #[allow(dead_code)]
    Dotprod,
}

/// `vaddvq_f32`: pairwise, `(a0 + a1) + (a2 + a3)`.
#[inline(always)]
pub(crate) fn hsum4(a: &[f32; 4]) -> f32 {
    (a[0] + a[1]) + (a[2] + a[3])
}

/// Dot product of `n` elements: weight row `w` in format `ty`, activation row `a` in
/// [`crate::formats::act_type`]`(ty)` (quantised by [`quantize_row_q8`] for Q8_0 / Q8_1), in the
/// order of llama.cpp's aarch64 `vec_dot` for the format: the NEON kernel where one exists
/// (on aarch64), else [`dot_portable`].
pub(crate) fn dot(lanes: Lanes, ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    #[cfg(target_arch = "aarch64")]
    if crate::aarch64::handles(lanes, ty) {
        return crate::aarch64::dot(ty, w, a, n);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2, FMA and F16C.
        return unsafe { dot_avx2(lanes, ty, w, a, n) };
    }
    dot_portable(lanes, ty, w, a, n)
}

/// [`dot_portable`] compiled for AVX2 with FMA and F16C, so the fused steps are single
/// instructions and the integer lanes vectorise: an x86 CPU computing in an ARM flavour
/// (the aarch64 parity tests run natively this way).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(lanes: Lanes, ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    if lanes == Lanes::Neon && matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) {
        let qoff = if ty == GgmlType::Q4_1 { 4 } else { 2 };
        // SAFETY: AVX2 is enabled here; whole blocks of both rows (the caller's shapes).
        return legacy_with(ty, w, a, n, |xb, yb| unsafe {
            neon_lanes_avx2(ty, xb, &yb[qoff..])
        });
    }
    dot_portable(lanes, ty, w, a, n)
}

/// One Q4_0 / Q4_1 / Q8_0 block's four integer lanes in the grouping of ggml's `vdotq_s32`
/// fallback, with AVX2: `maddubs` sums products `2k, 2k + 1` (NEON's `vpaddlq_s16` pairs), and
/// lane `l` adds pairs `l, l + 4, l + 8, l + 12`; exact integers, so the same lanes.
///
/// # Safety
/// AVX2 must be present; `xb` holds one block of `ty` and `y` its 32 activation quants.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn neon_lanes_avx2(ty: GgmlType, xb: &[u8], y: &[u8]) -> ([i32; 4], f32, f32) {
    use std::arch::x86_64::*;
    // SAFETY: the loads stay inside the block and the 32 quants, as the caller promised.
    unsafe {
        let (c, m) = if ty == GgmlType::Q8_0 {
            (_mm256_loadu_si256(xb.as_ptr().add(2).cast()), 0.0)
        } else {
            let off = if ty == GgmlType::Q4_1 { 4 } else { 2 };
            let q = _mm_loadu_si128(xb.as_ptr().add(off).cast());
            let nib = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(q, nib);
            let hi = _mm_and_si128(_mm_srli_epi16(q, 4), nib);
            let c = _mm256_set_m128i(hi, lo);
            if ty == GgmlType::Q4_0 {
                (_mm256_sub_epi8(c, _mm256_set1_epi8(8)), 0.0)
            } else {
                (c, rd_f16(xb, 2))
            }
        };
        let yv = _mm256_loadu_si256(y.as_ptr().cast());
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(yv, c));
        let p_lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(pairs));
        let p_hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(pairs, 1));
        let s8 = _mm256_add_epi32(p_lo, p_hi);
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        let mut s = [0i32; 4];
        _mm_storeu_si128(s.as_mut_ptr().cast(), s4);
        (s, rd_f16(xb, 0), m)
    }
}

/// The portable definition of [`dot`], which every NEON kernel must match bit for bit.
#[inline(always)]
pub(crate) fn dot_portable(lanes: Lanes, ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    match ty {
        GgmlType::F32 => dot_f32(w, a, n),
        GgmlType::F16 => match lanes {
            Lanes::Neon => dot_f16(w, a, n),
            Lanes::Dotprod => dot_f16_half(w, a, n),
        },
        GgmlType::BF16 => dot_bf16(w, a, n),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            dot_legacy(lanes, ty, w, a, n)
        }
        GgmlType::IQ4NL | GgmlType::MXFP4 => dot_lut(ty, w, a, n),
        GgmlType::Q6K => dot_q6_k(w, a, n),
        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::IQ4XS => {
            dot_k(ty, w, a, n)
        }
        _ => f32::NAN,
    }
}

#[inline(always)]
fn f32_at(row: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
}

#[inline(always)]
fn f16_at(row: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])).to_f32()
}

/// `ggml_vec_dot_f32`/`_f16`'s four 4-lane accumulators, reduced `(c0 + c2) + (c1 + c3)` lane
/// by lane, then pairwise.
#[inline(always)]
fn reduce4x4(c: &[[f32; 4]; 4]) -> f32 {
    let x: [f32; 4] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
    hsum4(&x)
}

/// F32: 16 elements a step into four fused 4-lane accumulators, then the elements past the
/// last whole step into the reduced sum one by one, as GCC vectorises that loop: where four or
/// more are left, multiplied four at a time unfused and added in order, the last `rem % 4`
/// (or all of them, if fewer than four) fused.
#[inline(always)]
fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut c = [[0.0f32; 4]; 4];
    let steps = n / 16 * 16;
    for i in (0..steps).step_by(16) {
        for (k, c) in c.iter_mut().enumerate() {
            for (l, c) in c.iter_mut().enumerate() {
                let j = i + 4 * k + l;
                *c = f32_at(w, j).mul_add(f32_at(a, j), *c);
            }
        }
    }
    let mut sum = reduce4x4(&c);
    let rem = n - steps;
    let unfused = if rem >= 4 { rem / 4 * 4 } else { 0 };
    for j in steps..steps + unfused {
        sum += f32_at(w, j) * f32_at(a, j);
    }
    for j in steps + unfused..n {
        sum = f32_at(w, j).mul_add(f32_at(a, j), sum);
    }
    sum
}

/// F16 without half-precision arithmetic: as [`dot_f32`] on the widened values (their products
/// are exact, so fusing changes nothing), the leftover elements added in f64.
#[inline(always)]
fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut c = [[0.0f32; 4]; 4];
    let steps = n / 16 * 16;
    for i in (0..steps).step_by(16) {
        for (k, c) in c.iter_mut().enumerate() {
            for (l, c) in c.iter_mut().enumerate() {
                let j = i + 4 * k + l;
                *c += f16_at(w, j) * f16_at(a, j);
            }
        }
    }
    let mut sum = f64::from(reduce4x4(&c));
    for j in steps..n {
        sum += f64::from(f16_at(w, j) * f16_at(a, j));
    }
    sum as f32
}

/// F16 with half-precision arithmetic (`vfmaq_f16`): 32 elements a step into four 8-lane f16
/// accumulators, each step one fused multiply-add rounded to f16; the accumulators added in
/// f16 (`0 + 2`, `1 + 3`, then those two), widened, the halves added and summed pairwise; the
/// leftover elements added in f64.
#[inline(always)]
fn dot_f16_half(w: &[u8], a: &[u8], n: usize) -> f32 {
    use half::f16;
    let h = |row: &[u8], i: usize| f16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]]));
    // Exact in f64 for every finite result (an f16 product has 22 significant bits and the
    // operands' exponents are close enough), so the one rounding is f16's.
    let fma =
        |acc: f16, x: f16, y: f16| f16_nearest(f64::from(x).mul_add(f64::from(y), f64::from(acc)));
    let add = |x: f16, y: f16| f16_nearest(f64::from(x) + f64::from(y));
    let mut c = [[f16::ZERO; 8]; 4];
    let steps = n / 32 * 32;
    for i in (0..steps).step_by(32) {
        for (k, c) in c.iter_mut().enumerate() {
            for (l, c) in c.iter_mut().enumerate() {
                let j = i + 8 * k + l;
                *c = fma(*c, h(w, j), h(a, j));
            }
        }
    }
    let [c0, c1, c2, c3] = c;
    let half_sum =
        |x: [f16; 8], y: [f16; 8]| -> [f16; 8] { std::array::from_fn(|l| add(x[l], y[l])) };
    let c0 = half_sum(half_sum(c0, c2), half_sum(c1, c3));
    let t: [f32; 4] = std::array::from_fn(|l| f32::from(c0[l]) + f32::from(c0[l + 4]));
    let mut sum = f64::from(hsum4(&t));
    for j in steps..n {
        sum += f64::from(f16_at(w, j) * f16_at(a, j));
    }
    sum as f32
}

/// `x` rounded once to the nearest f16 (ties to even; past the largest, infinity). Not
/// `half::f16::from_f64`, which on some targets rounds to f32 first: twice rounded, a sum
/// lands on the other side of a tie now and then.
fn f16_nearest(x: f64) -> half::f16 {
    use half::f16;
    if x.is_nan() {
        return f16::NAN;
    }
    let a = x.abs();
    let r = if a >= 65520.0 {
        f64::INFINITY
    } else {
        // The f16 spacing at `a`: 2^-24 below the normal range, else 2^(exponent - 10).
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let ulp = 2f64.powi(e.max(-14) - 10);
        (a / ulp).round_ties_even() * ulp
    };
    // Exact in f32 and in f16 now, so either conversion keeps it.
    f16::from_f32(r.copysign(x) as f32)
}

/// BF16: every (exact) product added in f64, in element order.
#[inline(always)]
fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let at = |row: &[u8], i: usize| {
        crate::formats::bf16_to_f32(u16::from_le_bytes([row[2 * i], row[2 * i + 1]]))
    };
    let mut sum = 0.0f64;
    for j in 0..n {
        sum += f64::from(at(w, j) * at(a, j));
    }
    sum as f32
}

/// llama.cpp's aarch64 tinyBLAS for F16 or F32 weights times a batch (`a`: the f32 activations
/// themselves, not their f16 conversion): one fused 4-lane accumulator over 4-element steps,
/// reduced pairwise (`n` a multiple of 4, which tinyBLAS requires).
pub(crate) fn dot_tinyblas(ty: GgmlType, w: &[u8], a: &[f32], n: usize) -> f32 {
    let at = |i: usize| {
        if ty == GgmlType::F16 {
            f16_at(w, i)
        } else {
            f32_at(w, i)
        }
    };
    let mut acc = [0.0f32; 4];
    for i in (0..n / 4 * 4).step_by(4) {
        for (l, acc) in acc.iter_mut().enumerate() {
            *acc = at(i + l).mul_add(a[i + l], *acc);
        }
    }
    hsum4(&acc)
}

/// The four integer lanes of one 32-element block: `vdot(lo 16) + vdot(hi 16)`.
#[inline(always)]
pub(crate) fn block_lanes(lanes: Lanes, codes: &[i8; QK], y: &[u8]) -> [i32; 4] {
    // All 32 products first (a shape compilers vectorise), then each lane's eight.
    let mut p = [0i32; QK];
    for ((p, &c), &y) in p.iter_mut().zip(codes).zip(&y[..QK]) {
        *p = i32::from(c) * i32::from(y as i8);
    }
    std::array::from_fn(|l| match lanes {
        Lanes::Neon => {
            let half = |b: usize| {
                (p[b + 2 * l] + p[b + 2 * l + 1]) + (p[b + 8 + 2 * l] + p[b + 9 + 2 * l])
            };
            half(0) + half(16)
        }
        Lanes::Dotprod => (0..2)
            .map(|h| (0..4).map(|k| p[16 * h + 4 * l + k]).sum::<i32>())
            .sum(),
    })
}

/// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: blocks in pairs into two 4-lane accumulators (unfused),
/// the minimum terms of Q4_1 / Q5_1 beside them, an odd last block in scalar code.
#[inline(always)]
fn dot_legacy(lanes: Lanes, ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let qoff = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        4
    } else {
        2
    };
    let mut codes = [0i8; QK];
    legacy_with(ty, w, a, n, |xb, yb| {
        let (dx, m) = block_codes(ty, xb, &mut codes);
        (block_lanes(lanes, &codes, &yb[qoff..]), dx, m)
    })
}

/// [`dot_legacy`]'s float order around `block`, which gives one block's four integer lanes,
/// its scale and its minimum from the weight block and the activation block (a kernel
/// computes the lanes its own way; the float steps stay these).
#[inline(always)]
pub(crate) fn legacy_with(
    ty: GgmlType,
    w: &[u8],
    a: &[u8],
    n: usize,
    mut block: impl FnMut(&[u8], &[u8]) -> ([i32; 4], f32, f32),
) -> f32 {
    let q81 = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let ab = if q81 { 36 } else { 34 };
    let wb = ty.block_bytes();
    let nb = n / QK;
    let mut acc = [[0.0f32; 4]; 2];
    // Q4_1 keeps one sum of minimum terms, Q5_1 one per accumulator.
    let mut summs = [0.0f32; 2];
    let mut ib = 0;
    while ib + 1 < nb {
        let mut ms = [0.0f32; 2];
        for (k, acc) in acc.iter_mut().enumerate() {
            let (xb, yb) = (&w[(ib + k) * wb..], &a[(ib + k) * ab..]);
            let (s, dx, m) = block(xb, yb);
            let dd = dx * rd_f16(yb, 0);
            for (acc, s) in acc.iter_mut().zip(s) {
                *acc += s as f32 * dd;
            }
            if q81 {
                ms[k] = m;
                if ty == GgmlType::Q5_1 {
                    summs[k] = m.mul_add(rd_f16(yb, 2), summs[k]);
                }
            }
        }
        if ty == GgmlType::Q4_1 {
            // `summs += m0 * s0 + m1 * s1`: GCC fuses the first product.
            let (s0, s1) = (rd_f16(&a[ib * ab..], 2), rd_f16(&a[(ib + 1) * ab..], 2));
            summs[0] += ms[0].mul_add(s0, ms[1] * s1);
        }
        ib += 2;
    }
    let mut sum = hsum4(&acc[0]) + hsum4(&acc[1]);
    if q81 {
        sum = sum + summs[0] + summs[1];
    }
    for ib in ib..nb {
        let (xb, yb) = (&w[ib * wb..], &a[ib * ab..]);
        let (s, dx, m) = block(xb, yb);
        let dy = rd_f16(yb, 0);
        let si = s.iter().sum::<i32>() as f32;
        sum = match ty {
            // `sumf += sumi * d_x * d_y`.
            GgmlType::Q4_0 => (si * dx).mul_add(dy, sum),
            // `sumf += (d_x * d_y) * sumi + m * s`.
            GgmlType::Q4_1 | GgmlType::Q5_1 => sum + (dx * dy).mul_add(si, m * rd_f16(yb, 2)),
            // `sumf += (d_x * d_y) * sumi` (Q8_0: `sumi * (d_x * d_y)`).
            _ => (dx * dy).mul_add(si, sum),
        };
    }
    sum
}

/// IQ4_NL and MXFP4: blocks in pairs, each pair's two scaled integer sums added together (the
/// first product fused) before they join the sum; an odd last block added fused.
#[inline(always)]
fn dot_lut(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let wb = ty.block_bytes();
    let nb = n / QK;
    let mut codes = [0i8; QK];
    let mut block = |ib: usize| {
        let (xb, yb) = (&w[ib * wb..], &a[ib * 34..]);
        let (dx, _) = block_codes(ty, xb, &mut codes);
        let s: i32 = block_lanes(Lanes::Dotprod, &codes, &yb[2..]).iter().sum();
        (dx, rd_f16(yb, 0), s as f32)
    };
    let mut sum = 0.0f32;
    let mut ib = 0;
    while ib + 1 < nb {
        let (x0, y0, s0) = block(ib);
        let (x1, y1, s1) = block(ib + 1);
        sum += (x0 * y0).mul_add(s0, (x1 * y1) * s1);
        ib += 2;
    }
    for ib in ib..nb {
        let (dx, dy, s) = block(ib);
        sum = (dy * dx).mul_add(s, sum);
    }
    sum
}

/// Q2_K, Q3_K, Q4_K, Q5_K and IQ4_XS: each super-block's exact integer sums, then one or two
/// fused steps in the format's own arrangement.
#[inline(always)]
fn dot_k(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_k_with(ty, w, a, n, crate::kformats::block_dot)
}

/// [`dot_k`] with the integer sum of a decoded super-block and its Q8_K block from `block_sum`:
/// the one place the float steps are taken, whichever instructions made the integers.
#[inline(always)]
pub(crate) fn dot_k_with(
    ty: GgmlType,
    w: &[u8],
    a: &[u8],
    n: usize,
    block_sum: impl Fn(&KBlock, &[u8]) -> i32,
) -> f32 {
    let bb = ty.block_bytes();
    let mut blk = KBlock::default();
    let mut sum = 0.0f32;
    for (x, y) in w
        .chunks_exact(bb)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        decode(ty, x, &mut blk);
        let s = block_sum(&blk, y);
        sum = k_step(ty, &blk, y, s, sum);
    }
    sum
}

/// One super-block of [`dot_k`]: its exact integer sum `s` (and its minimums' with `y`) added
/// to `sum` in the format's arrangement of fused steps.
#[inline(always)]
pub(crate) fn k_step(ty: GgmlType, blk: &KBlock, y: &[u8], s: i32, sum: f32) -> f32 {
    let yd = q8k_d(y);
    let s = s as f32;
    match ty {
        GgmlType::Q2K => {
            let mins: i32 = (0..16).map(|k| blk.mins[k] * q8k_bsum(y, k)).sum();
            let sum = (-yd * blk.dmin).mul_add(mins as f32, sum);
            (yd * blk.d).mul_add(s, sum)
        }
        GgmlType::Q4K => {
            let sum = (-(yd * blk.dmin)).mul_add(min_sum(blk, y) as f32, sum);
            (yd * blk.d).mul_add(s, sum)
        }
        // `sumf += d * sumi - dmin * sumi_mins`: the first product fused.
        GgmlType::Q5K => sum + (yd * blk.d).mul_add(s, -((yd * blk.dmin) * min_sum(blk, y) as f32)),
        // Q3_K: `d = y.d * x.d`; IQ4_XS: `x.d * y.d`.
        GgmlType::Q3K => (yd * blk.d).mul_add(s, sum),
        _ => (blk.d * yd).mul_add(s, sum),
    }
}

/// Q6_K: the super-block's exact integer sum (codes less 32), times `d_w * d_a`, fused.
#[inline(always)]
fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_q6_k_with(w, a, n, crate::kquants::q6k_block_total)
}

/// [`dot_q6_k`] with each super-block's integer total from `total(x, y)`.
#[inline(always)]
pub(crate) fn dot_q6_k_with(
    w: &[u8],
    a: &[u8],
    n: usize,
    total: impl Fn(&[u8], &[u8]) -> i32,
) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w
        .chunks_exact(Q6_K_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        sum = (rd_f16(x, 208) * q8k_d(y)).mul_add(total(x, y) as f32, sum);
    }
    sum
}

/// Quantises `x` (a multiple of 32 long) to Q8_0 (`q81 == false`) or Q8_1 blocks as the NEON
/// `quantize_row_q8_0` / `_q8_1` do: `d = amax / 127`, codes `round_even(v * (1 / d))`, Q8_1's
/// sum `d * sum(codes)`.
pub(crate) fn quantize_row_q8(q81: bool, x: &[f32], out: &mut [u8]) {
    let bb = if q81 { 36 } else { 34 };
    let qoff = if q81 { 4 } else { 2 };
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (o, &v) in ob[qoff..].iter_mut().zip(xb) {
            let q = (v * id).round_ties_even() as i32;
            sum += q;
            *o = q as i8 as u8;
        }
        ob[0..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        if q81 {
            let s = half::f16::from_f32(d * sum as f32);
            ob[2..4].copy_from_slice(&s.to_bits().to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::formats::{act_type, quantize_act_row, quantize_weights};

    /// An activation row as llama.cpp's aarch64 build converts it for weights of `ty`.
    pub(crate) fn arm_acts(ty: GgmlType, x: &[f32]) -> Vec<u8> {
        let act = act_type(ty);
        let mut out = vec![0u8; act.row_bytes(x.len()).unwrap()];
        match act {
            GgmlType::Q8_0 | GgmlType::Q8_1 => quantize_row_q8(act == GgmlType::Q8_1, x, &mut out),
            GgmlType::Q8K => crate::kquants::quantize_row_q8_k_as(true, x, &mut out),
            _ => quantize_act_row(act, x, &mut out),
        }
        out
    }

    /// Every format's one-row products equal llama.cpp's aarch64 NEON build's own `vec_dot`
    /// bit for bit (`fixtures/quant/dots-aarch64-neon.json`, written by
    /// `scripts/make-dot-vectors.py --aarch64 neon` under qemu).
    #[test]
    fn neon_orders_match_llama_cpp_aarch64() {
        let checked = check_dots_fixture(
            include_str!("../../../fixtures/quant/dots-aarch64-neon.json"),
            Lanes::Neon,
        );
        assert!(checked >= 300, "{checked} cases");
    }

    /// The same against llama.cpp's build for dotprod, i8mm and half-precision arithmetic
    /// (`-march=armv8.6-a+fp16`, run under `qemu-aarch64 -cpu max,sve=off`): `sdot` lanes, F16
    /// summed in f16, and the two-row `vmmlaq_s32` kernels (`nrc` = 2).
    #[test]
    fn dotprod_and_i8mm_orders_match_llama_cpp_aarch64() {
        let checked = check_dots_fixture(
            include_str!("../../../fixtures/quant/dots-aarch64-i8mm.json"),
            Lanes::Dotprod,
        );
        assert!(checked >= 350, "{checked} cases");
    }

    /// [`f16_nearest`] rounds once: ties to even, a tie broken by a bit far below it, the
    /// subnormals and the overflow threshold.
    #[test]
    fn f16_rounding_is_single() {
        let f = |x: f64| f64::from(f16_nearest(x));
        let t = 2f64.powi(-11);
        assert_eq!(f(1.0 + t), 1.0);
        assert_eq!(f(1.0 + 3.0 * t), 1.0 + 4.0 * t);
        // Through f32 this is the tie `1 + 2^-11`, which would go down to 1.
        assert_eq!(f(1.0 + t + 2f64.powi(-40)), 1.0 + 2.0 * t);
        assert_eq!(f(-(1.0 + t + 2f64.powi(-40))), -(1.0 + 2.0 * t));
        assert_eq!(f(2f64.powi(-25)), 0.0);
        assert_eq!(f(2f64.powi(-25) + 2f64.powi(-60)), 2f64.powi(-24));
        assert_eq!(f(65519.99), 65504.0);
        assert_eq!(f(65520.0), f64::INFINITY);
        assert!(f(f64::NAN).is_nan());
    }

    /// Checks every case of a `make-dot-vectors.py --aarch64` fixture in `lanes`, the portable
    /// definition and the kernel this CPU runs alike; two-row cases through
    /// [`crate::arm_pairs::dot_pair`]. Returns how many it checked.
    fn check_dots_fixture(json: &str, lanes: Lanes) -> usize {
        let doc: serde_json::Value = serde_json::from_str(json).unwrap();
        let mut checked = 0;
        let mut wrong = Vec::new();
        for (name, cases) in doc["types"].as_object().unwrap() {
            let ty = GgmlType::from_name(name).unwrap();
            for c in cases.as_array().unwrap() {
                let n = c["n"].as_u64().unwrap() as usize;
                if lanes == Lanes::Dotprod && ty == GgmlType::Q5_0 && (n / QK) % 2 == 1 {
                    // GCC 12 miscompiles the scalar loop for Q5_0's odd last block at
                    // `-O3 -march=armv8.6-a` (its vectorised mixed-sign products give wrong
                    // integers, reproduced apart from ggml); strata takes the true sum.
                    continue;
                }
                // Rows the aarch64 quantiser rounds differently come with their bytes.
                let weights = |i: &serde_json::Value| -> Vec<u8> {
                    let w = crate::quantize::tests::case(i.as_u64().unwrap() as usize);
                    match doc["weights"][name.as_str()][i.to_string()].as_str() {
                        Some(hex) => (0..ty.row_bytes(n).unwrap())
                            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                            .collect(),
                        None => quantize_weights(ty, &w[..n]),
                    }
                };
                let acts = |i: &serde_json::Value| {
                    let x = crate::quantize::tests::case(i.as_u64().unwrap() as usize);
                    arm_acts(ty, &x[..n])
                };
                let (got, want): (Vec<f32>, Vec<u32>) = if let Some(bits) = c["bits"].as_array() {
                    let (w0, w1) = (weights(&c["w"][0]), weights(&c["w"][1]));
                    let (a0, a1) = (acts(&c["a"][0]), acts(&c["a"][1]));
                    let got = crate::arm_pairs::dot_pair(ty, [&w0, &w1], [&a0, &a1], n);
                    let want = bits.iter().map(|b| b.as_u64().unwrap() as u32).collect();
                    (got.map(Vec::from).unwrap_or_default(), want)
                } else {
                    let (wq, a) = (weights(&c["w"]), acts(&c["a"]));
                    let want = c["bits"].as_u64().unwrap() as u32;
                    let fast = dot(lanes, ty, &wq, &a, n);
                    if fast.to_bits() != want && !(fast.is_nan() && f32::from_bits(want).is_nan()) {
                        wrong.push(format!(
                            "{name} n{n} w{} a{}: kernel {fast}",
                            c["w"], c["a"]
                        ));
                    }
                    (vec![dot_portable(lanes, ty, &wq, &a, n)], vec![want])
                };
                // A NaN (an overflowing f16 sum) is one whatever its payload.
                let bits = |v: f32| {
                    if v.is_nan() {
                        f32::NAN.to_bits()
                    } else {
                        v.to_bits()
                    }
                };
                let got_bits: Vec<u32> = got.iter().map(|&v| bits(v)).collect();
                let want: Vec<u32> = want.into_iter().map(|b| bits(f32::from_bits(b))).collect();
                if got_bits != want {
                    let want: Vec<f32> = want.iter().map(|&b| f32::from_bits(b)).collect();
                    wrong.push(format!(
                        "{name} n{n} w{} a{}: {got:?} vs {want:?}",
                        c["w"], c["a"]
                    ));
                }
                checked += 1;
            }
        }
        assert!(
            wrong.is_empty(),
            "{} of {checked} differ:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
        checked
    }

    /// The kernels this CPU runs give their portable definitions' bits on random blocks of
    /// every format, at lengths with odd and even block counts and with extreme activations.
    #[test]
    fn kernels_match_the_portable_orders() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let types = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q2K,
            GgmlType::Q3K,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::IQ4NL,
            GgmlType::IQ4XS,
            GgmlType::MXFP4,
        ];
        let mut checked = 0;
        for ty in types {
            let bs = ty.block_size();
            for blocks in [1usize, 2, 3, 7, 16] {
                let n = blocks * bs.max(32);
                for scale in [1e-3f32, 1.0, 300.0] {
                    let unit = |r: u64| (r >> 40) as f32 / 8_388_608.0 - 1.0;
                    let w: Vec<f32> = (0..n).map(|_| unit(next()) * scale).collect();
                    let x: Vec<f32> = (0..n).map(|_| unit(next()) * scale).collect();
                    let wq = quantize_weights(ty, &w);
                    let a = arm_acts(ty, &x);
                    let want = dot_portable(Lanes::Neon, ty, &wq, &a, n);
                    let got = dot(Lanes::Neon, ty, &wq, &a, n);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty} n{n} x{scale}: {got} vs {want}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 16 * 5 * 3);
    }

    /// `matmul` in the NEON flavour gives every element its one-row product: `vec_dot` order,
    /// or for batches of F16 (two or more tokens) and F32 (four or more) tinyBLAS with the f32
    /// activations; plain and packed matrices alike, one and two threads, and rows in the order
    /// of a batch of one when asked.
    #[test]
    fn matmul_in_the_neon_flavour_is_the_row_products() {
        use crate::attn::Flavour;
        use crate::{QMatrix, QuantActs, ThreadPool, WeightBytes, matmul};
        let (rows, cols) = (12, 256);
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
        ] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
                .collect();
            let wq = quantize_weights(ty, &w);
            let rb = ty.row_bytes(cols).unwrap();
            for packed in [false, true] {
                let mut m = QMatrix::new(ty, rows, cols, WeightBytes::Owned(wq.clone())).unwrap();
                if packed {
                    m = m.packed();
                }
                for (n, independent) in [(1, false), (2, false), (5, false), (5, true)] {
                    let x: Vec<f32> = (0..n * cols)
                        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 32.0)
                        .collect();
                    let mut acts = QuantActs::new();
                    acts.set_flavour(Flavour::Neon);
                    acts.set_rows_independent(independent);
                    acts.quantize(ty, &x, n, cols);
                    let tiny = !independent
                        && match ty {
                            GgmlType::F16 => n >= 2,
                            GgmlType::F32 => n >= 4,
                            _ => false,
                        };
                    for threads in [1, 2] {
                        let mut out = vec![f32::NAN; n * rows];
                        matmul(&ThreadPool::new(threads), &m, &acts, &mut out);
                        for t in 0..n {
                            let xa = &x[t * cols..(t + 1) * cols];
                            let a = arm_acts(ty, xa);
                            for r in 0..rows {
                                let row = &wq[r * rb..(r + 1) * rb];
                                let want = if tiny {
                                    dot_tinyblas(ty, row, xa, cols)
                                } else {
                                    dot_portable(Lanes::Neon, ty, row, &a, cols)
                                };
                                let got = out[t * rows + r];
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{ty} packed {packed} n{n} t{t} r{r}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
