//! AVX2 dot products of Q4_K and Q6_K rows with Q8_K activations: the instruction sequence of
//! llama.cpp's `ggml_vec_dot_q4_K_q8_K` / `ggml_vec_dot_q6_K_q8_K`, so each 32-bit lane holds the
//! same integers as [`crate::kquants`]'s scalar references and the results are the same bits.
//!
//! For batches, [`q4_k_tile`] and [`q6_k_tile`] compute one row against 8 to 32 tokens at once,
//! one token per 32-bit lane (activations interleaved by [`crate::kquants::interleave_q8k`]):
//! a row's codes and scales are decoded once per block instead of once per token, and each
//! token's lane goes through the same integers and float operations as the one-token kernels.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::kquants::{
    Q4_K_BYTES, Q6_K_BYTES, Q8_K_BYTES, QK_K, TILE_BLOCK_BYTES, TILE_BSUMS, TILE_QUANTS,
    q4k_scales_mins,
};
use crate::x86::{hsum_epi32, hsum4, hsum8};

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Q4_K row `w` · Q8_K row `a`, `n` elements.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` and `a` must hold `n / 256` blocks each.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..n / QK_K {
        let x = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let d = yd * f16_at(x.as_ptr());
        let dmin = -yd * f16_at(x.as_ptr().add(2));
        let (sc, m) = q4k_scales_mins(x);
        let mins = _mm_setr_epi16(
            m[0] as i16,
            m[1] as i16,
            m[2] as i16,
            m[3] as i16,
            m[4] as i16,
            m[5] as i16,
            m[6] as i16,
            m[7] as i16,
        );
        let bs = _mm256_loadu_si256(y.as_ptr().add(4 + QK_K) as *const __m256i);
        let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        let prod = _mm_madd_epi16(mins, q8s);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let q4 = x.as_ptr().add(16);
        let q8 = y.as_ptr().add(4);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_l = _mm256_set1_epi16(sc[2 * j] as i16);
            let scale_h = _mm256_set1_epi16(sc[2 * j + 1] as i16);
            let bits = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
            let q4l = _mm256_and_si256(bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let q8l = _mm256_loadu_si256(q8.add(64 * j) as *const __m256i);
            let q8h = _mm256_loadu_si256(q8.add(64 * j + 32) as *const __m256i);
            let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
            let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum8(acc) + hsum4(acc_m)
}

/// Q6_K row `w` · Q8_K row `a`, `n` elements.
///
/// # Safety
/// As for [`dot_q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_q6_k_impl::<false>(w, a, n)
}

/// [`crate::kquants::dot_q6_k_tiled`].
///
/// # Safety
/// As for [`dot_q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k_tiled(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_q6_k_impl::<true>(w, a, n)
}

#[inline(always)]
unsafe fn dot_q6_k_impl<const TILED: bool>(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc_t = 0.0f32;
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK_K {
        let x = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let dw = f16_at(x.as_ptr().add(208));
        let d = yd * dw;
        let q8sums = _mm256_loadu_si256(y.as_ptr().add(4 + QK_K) as *const __m256i);
        let scales = _mm_loadu_si128(x.as_ptr().add(192) as *const __m128i);
        let scales16 = _mm256_cvtepi8_epi16(scales);
        let sub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales16), 5);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let ql = x.as_ptr().add(64 * j);
            let qh = x.as_ptr().add(128 + 32 * j);
            let q8 = y.as_ptr().add(4 + 128 * j);
            let b1 = _mm256_loadu_si256(ql as *const __m256i);
            let b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let bh = _mm256_loadu_si256(qh as *const __m256i);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2);
            let h2 = _mm256_and_si256(bh, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(-64)), 2);
            let q = [
                _mm256_or_si256(_mm256_and_si256(b1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(b2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15), h3),
            ];
            for (k, qk) in q.iter().enumerate() {
                let y8 = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(*qk, y8);
                let c = 4 * j + k;
                let sa = i16::from(x[192 + 2 * c] as i8);
                let sb = i16::from(x[192 + 2 * c + 1] as i8);
                let sc = _mm256_setr_epi16(
                    sa, sa, sa, sa, sa, sa, sa, sa, sb, sb, sb, sb, sb, sb, sb, sb,
                );
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p16));
            }
        }
        let sumi = _mm256_sub_epi32(sumi, sub);
        if TILED {
            let total = hsum_epi32(sumi);
            acc_t = (dw * total as f32).mul_add(yd, acc_t);
        } else {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    if TILED { acc_t } else { hsum8(acc) }
}

/// [`crate::kquants::dot_q4_k_repacked`]: exact integer totals per super-block (or per
/// 64-element chunk with `PER_CHUNK`), one fused multiply-add each.
///
/// # Safety
/// As for [`dot_q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k_repacked<const PER_CHUNK: bool>(w: &[u8], a: &[u8], n: usize) -> f32 {
    assert!(w.len() >= n / QK_K * Q4_K_BYTES && a.len() >= n / QK_K * Q8_K_BYTES);
    let m4 = _mm256_set1_epi8(0x0F);
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for i in 0..n / QK_K {
        let x = w.as_ptr().add(i * Q4_K_BYTES);
        let y = a.as_ptr().add(i * Q8_K_BYTES);
        let yd = (y as *const f32).read_unaligned();
        let (dd, dm) = (f16_at(x) * yd, f16_at(x.add(2)) * yd);
        // Scales in bytes 0..8, minimums in 8..16.
        let sm = crate::x86_kformats::q4k_scales_mins_v(x);
        let mut sc = [0u8; 16];
        _mm_storeu_si128(sc.as_mut_ptr() as *mut __m128i, sm);
        let bsums = _mm256_loadu_si256(y.add(4 + QK_K) as *const __m256i);
        let q4 = x.add(16);
        let q8 = y.add(4);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let bits = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
            let q4l = _mm256_and_si256(bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let q8l = _mm256_loadu_si256(q8.add(64 * j) as *const __m256i);
            let q8h = _mm256_loadu_si256(q8.add(64 * j + 32) as *const __m256i);
            let pl = _mm256_madd_epi16(
                _mm256_set1_epi16(i16::from(sc[2 * j])),
                _mm256_maddubs_epi16(q4l, q8l),
            );
            let ph = _mm256_madd_epi16(
                _mm256_set1_epi16(i16::from(sc[2 * j + 1])),
                _mm256_maddubs_epi16(q4h, q8h),
            );
            let chunk = _mm256_add_epi32(pl, ph);
            if PER_CHUNK {
                // Minimum `2j` covers bsums 4j, 4j+1; `2j+1` covers 4j+2, 4j+3.
                let b =
                    |k: usize| i32::from((y.add(4 + QK_K + 2 * k) as *const i16).read_unaligned());
                let chunk_min = i32::from(sc[8 + 2 * j]) * (b(4 * j) + b(4 * j + 1))
                    + i32::from(sc[8 + 2 * j + 1]) * (b(4 * j + 2) + b(4 * j + 3));
                acc = (hsum_epi32(chunk) as f32).mul_add(dd, acc);
                acc_m = (chunk_min as f32).mul_add(dm, acc_m);
            } else {
                sumi = _mm256_add_epi32(sumi, chunk);
            }
        }
        if !PER_CHUNK {
            // Every minimum times the sum of its two bsums: exact integers, in any order.
            let mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
            let mins = hsum_epi32(_mm256_madd_epi16(bsums, mins));
            acc = (hsum_epi32(sumi) as f32).mul_add(dd, acc);
            acc_m = (mins as f32).mul_add(dm, acc_m);
        }
    }
    acc - acc_m
}

/// Four bytes at `p` in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// The orders of [`q4_k_tile`]: llama.cpp's four-token kernel's (a fused multiply-add per
/// 64-element chunk), its one-token kernel's (one per block), or both, split by token.
pub(crate) const CHUNKS: u8 = 0;
/// See [`CHUNKS`].
pub(crate) const BLOCKS: u8 = 1;
/// See [`CHUNKS`].
pub(crate) const SPLIT: u8 = 2;

/// One Q4_K row times `CV` groups of eight tokens in the interleaved Q8_K layout
/// ([`crate::kquants::interleave_q8k`]; `y[v]` points at group `v`'s first block), one token per
/// lane: lane `i` of `out[v]` is [`dot_q4_k_repacked`]`::<true>` of the row and token `8v + i`
/// in order [`CHUNKS`], `::<false>` in order [`BLOCKS`], and in order [`SPLIT`] the former for
/// tokens before `split`, the latter after.
///
/// Every lane forms the same exact integers per 64-element chunk (the products of a 32-element
/// sub-block summed in 16 bits, which cannot overflow: `8 * 2 * 15 * 127 < 2^15`, then times its
/// scale) and does the same fused multiply-adds in the same order as the one-token kernel; the
/// nibbles and scales are decoded once for all the tokens.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` must hold `nb` Q4_K blocks and every `y[v]` `nb`
/// interleaved blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k_tile<const CV: usize, const ORDER: u8>(
    w: *const u8,
    nb: usize,
    y: &[*const u8; CV],
    split: usize,
    out: &mut [[f32; 8]; CV],
) {
    let chunks = ORDER != BLOCKS;
    let blocks = ORDER != CHUNKS;
    let m4 = _mm256_set1_epi8(0x0F);
    // Accumulators of the chunk order, then of the block order.
    let mut acc = [[_mm256_setzero_ps(); CV]; 2];
    let mut acc_m = [[_mm256_setzero_ps(); CV]; 2];
    for b in 0..nb {
        let x = w.add(b * Q4_K_BYTES);
        let (sc, m) = q4k_scales_mins(std::slice::from_raw_parts(x, Q4_K_BYTES));
        let (dw, dmw) = (_mm256_set1_ps(f16_at(x)), _mm256_set1_ps(f16_at(x.add(2))));
        let yb: [*const u8; CV] = std::array::from_fn(|v| y[v].add(b * TILE_BLOCK_BYTES));
        let yd: [__m256; CV] = std::array::from_fn(|v| _mm256_loadu_ps(yb[v] as *const f32));
        let dd: [__m256; CV] = std::array::from_fn(|v| _mm256_mul_ps(dw, yd[v]));
        let dm: [__m256; CV] = std::array::from_fn(|v| _mm256_mul_ps(dmw, yd[v]));
        let mut tot = [_mm256_setzero_si256(); CV];
        let mut tot_m = [_mm256_setzero_si256(); CV];
        for j in 0..4 {
            let mut lo = [_mm256_setzero_si256(); CV];
            let mut hi = [_mm256_setzero_si256(); CV];
            for p in 0..8 {
                let bits = bcast4(x.add(16 + 32 * j + 4 * p));
                let wl = _mm256_and_si256(bits, m4);
                let wh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                for v in 0..CV {
                    let q = yb[v].add(TILE_QUANTS + 32 * (16 * j + p));
                    let ql = _mm256_loadu_si256(q as *const __m256i);
                    let qh = _mm256_loadu_si256(q.add(32 * 8) as *const __m256i);
                    lo[v] = _mm256_add_epi16(lo[v], _mm256_maddubs_epi16(wl, ql));
                    hi[v] = _mm256_add_epi16(hi[v], _mm256_maddubs_epi16(wh, qh));
                }
            }
            let (sl, sh) = (
                _mm256_set1_epi16(sc[2 * j] as i16),
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
            );
            // Minimums: m * (bsum pair sum), the pair of 16-element sums making a sub-block.
            let (ml, mh) = (
                _mm256_set1_epi32(m[2 * j] * 0x1_0001),
                _mm256_set1_epi32(m[2 * j + 1] * 0x1_0001),
            );
            for v in 0..CV {
                let cd =
                    _mm256_add_epi32(_mm256_madd_epi16(lo[v], sl), _mm256_madd_epi16(hi[v], sh));
                let bs = yb[v].add(TILE_BSUMS + 64 * j);
                let cm = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_loadu_si256(bs as *const __m256i), ml),
                    _mm256_madd_epi16(_mm256_loadu_si256(bs.add(32) as *const __m256i), mh),
                );
                if chunks {
                    acc[0][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(cd), dd[v], acc[0][v]);
                    acc_m[0][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(cm), dm[v], acc_m[0][v]);
                }
                if blocks {
                    tot[v] = _mm256_add_epi32(tot[v], cd);
                    tot_m[v] = _mm256_add_epi32(tot_m[v], cm);
                }
            }
        }
        if blocks {
            for v in 0..CV {
                acc[1][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[v]), dd[v], acc[1][v]);
                acc_m[1][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot_m[v]), dm[v], acc_m[1][v]);
            }
        }
    }
    for v in 0..CV {
        let c = _mm256_sub_ps(acc[0][v], acc_m[0][v]);
        let b = _mm256_sub_ps(acc[1][v], acc_m[1][v]);
        let r = match ORDER {
            CHUNKS => c,
            BLOCKS => b,
            _ => {
                // Lanes before `split` take the chunk order.
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let first = _mm256_set1_epi32(split.saturating_sub(8 * v).min(8) as i32);
                _mm256_blendv_ps(b, c, _mm256_castsi256_ps(_mm256_cmpgt_epi32(first, lane)))
            }
        };
        _mm256_storeu_ps(out[v].as_mut_ptr(), r);
    }
}

/// The 6-bit codes of elements `32k + p .. 32k + p + 4` of half `h` of the Q6_K block at `x`,
/// k = 0..4, broadcast to every lane.
#[inline(always)]
unsafe fn q6_k_codes(x: *const u8, h: usize, p: usize) -> [__m256i; 4] {
    let m15 = _mm256_set1_epi8(15);
    let l0 = bcast4(x.add(64 * h + p));
    let l1 = bcast4(x.add(64 * h + 32 + p));
    let bh = bcast4(x.add(128 + 32 * h + p));
    let h0 = _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(3)), 4);
    let h1 = _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2);
    let h2 = _mm256_and_si256(bh, _mm256_set1_epi8(48));
    let h3 = _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(-64)), 2);
    [
        _mm256_or_si256(_mm256_and_si256(l0, m15), h0),
        _mm256_or_si256(_mm256_and_si256(l1, m15), h1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15), h2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15), h3),
    ]
}

/// `32 * (scale[2k] * bsum[2k] + scale[2k + 1] * bsum[2k + 1])` per token (the codes' offset),
/// for the interleaved group block at `yb`.
#[inline(always)]
unsafe fn q6_k_offset(x: *const u8, yb: *const u8, k: usize) -> __m256i {
    let s = |i: usize| i32::from(*x.add(192 + i) as i8);
    let pair = (s(2 * k) & 0xFFFF) | (s(2 * k + 1) << 16);
    let bs = _mm256_loadu_si256(yb.add(TILE_BSUMS + 32 * k) as *const __m256i);
    _mm256_slli_epi32(_mm256_madd_epi16(bs, _mm256_set1_epi32(pair)), 5)
}

/// One Q6_K row times `CV` groups of eight tokens, one token per lane (see [`q4_k_tile`]):
/// lane `t` of `out[v]` is [`dot_q6_k_tiled`] (`TILED`) or [`dot_q6_k`] of the row and token
/// `t`, the same integers and the same float operations in the same order.
///
/// # Safety
/// As for [`q4_k_tile`], with `w` holding `nb` Q6_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_tile<const CV: usize, const TILED: bool>(
    w: *const u8,
    nb: usize,
    y: &[*const u8; CV],
    out: &mut [[f32; 8]; CV],
) {
    let scale = |x: *const u8, s: usize| _mm256_set1_epi16(i16::from(*x.add(192 + s) as i8));
    let ld = |p: *const u8| _mm256_loadu_si256(p as *const __m256i);
    let mut acc = [_mm256_setzero_ps(); CV];
    // The per-token kernel's eight lanes, each its own register across tokens.
    let mut lanes = [[_mm256_setzero_ps(); CV]; 8];
    for b in 0..nb {
        let x = w.add(b * Q6_K_BYTES);
        let dw = _mm256_set1_ps(f16_at(x.add(208)));
        let yb: [*const u8; CV] = std::array::from_fn(|v| y[v].add(b * TILE_BLOCK_BYTES));
        let yd: [__m256; CV] = std::array::from_fn(|v| _mm256_loadu_ps(yb[v] as *const f32));
        if TILED {
            // The whole block's integer: sub-blocks of 16 elements are four quads of four; two
            // quads' products fit in 16 bits (`2 * 2 * 63 * 127 < 2^15`) before the scale.
            let mut tot = [_mm256_setzero_si256(); CV];
            for h in 0..2 {
                for p in (0..32).step_by(8) {
                    let qa = q6_k_codes(x, h, p);
                    let qb = q6_k_codes(x, h, p + 4);
                    for k in 0..4 {
                        let sc = scale(x, 8 * h + 2 * k + p / 16);
                        let pos = 32 * h + 8 * k + p / 4;
                        for v in 0..CV {
                            let q = yb[v].add(TILE_QUANTS + 32 * pos);
                            let s16 = _mm256_add_epi16(
                                _mm256_maddubs_epi16(qa[k], ld(q)),
                                _mm256_maddubs_epi16(qb[k], ld(q.add(32))),
                            );
                            tot[v] = _mm256_add_epi32(tot[v], _mm256_madd_epi16(s16, sc));
                        }
                    }
                }
            }
            for v in 0..CV {
                for k in 0..8 {
                    tot[v] = _mm256_sub_epi32(tot[v], q6_k_offset(x, yb[v], k));
                }
                let t = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(tot[v]));
                acc[v] = _mm256_fmadd_ps(t, yd[v], acc[v]);
            }
        } else {
            // Lane l of the per-token kernel: quad l of each 32-element chunk c = 4h + k, with
            // scale 2c + l / 4, less the offset of sub-blocks 2l and 2l + 1.
            for (l, lane) in lanes.iter_mut().enumerate() {
                let mut s = [_mm256_setzero_si256(); CV];
                for h in 0..2 {
                    let q = q6_k_codes(x, h, 4 * l);
                    for (k, qk) in q.iter().enumerate() {
                        let c = 4 * h + k;
                        let sc = scale(x, 2 * c + l / 4);
                        for v in 0..CV {
                            let y8 = ld(yb[v].add(TILE_QUANTS + 32 * (8 * c + l)));
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qk, y8), sc);
                            s[v] = _mm256_add_epi32(s[v], p);
                        }
                    }
                }
                for v in 0..CV {
                    let si = _mm256_sub_epi32(s[v], q6_k_offset(x, yb[v], l));
                    let d = _mm256_mul_ps(yd[v], dw);
                    lane[v] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(si), lane[v]);
                }
            }
        }
    }
    for v in 0..CV {
        let r = if TILED {
            acc[v]
        } else {
            // hsum_float_8 of each token's lanes: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)).
            let a: [__m256; 8] = std::array::from_fn(|l| lanes[l][v]);
            let r = [
                _mm256_add_ps(a[4], a[0]),
                _mm256_add_ps(a[5], a[1]),
                _mm256_add_ps(a[6], a[2]),
                _mm256_add_ps(a[7], a[3]),
            ];
            _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3]))
        };
        _mm256_storeu_ps(out[v].as_mut_ptr(), r);
    }
}
