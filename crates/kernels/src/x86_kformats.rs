//! AVX2 kernels for the formats of [`crate::kformats`] (Q2_K, Q3_K, Q5_K, IQ4_XS; Q4_K in the
//! tiled order): each 32-bit lane holds the same exact integers as the scalar reference and goes
//! through the same float operations, so the results are the same bits.
//!
//! [`dot`] is llama.cpp's one-token kernel for the format; [`tile`] computes one row against
//! groups of eight tokens in the interleaved Q8_K layout ([`crate::kquants::interleave_q8k`])
//! in the tiled kernel's order, decoding the row's block once for all of them.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use strata_gguf::GgmlType;

use crate::kformats::{IQ4NL_VALUES, iq4xs_scale, q3k_scales};
use crate::kquants::{
    Q8_K_BYTES, QK_K, TILE_BLOCK_BYTES, TILE_BSUMS, TILE_QUANTS, q4k_scales_mins,
};
use crate::x86::hsum8;

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// A block's scales per 16-element sub-block, minimums, `d` and `dmin`.
struct Scales {
    sc: [i16; 16],
    mins: [i16; 16],
    d: f32,
    dmin: f32,
}

#[inline(always)]
unsafe fn scales(ty: GgmlType, x: *const u8) -> Scales {
    let mut s = Scales {
        sc: [0; 16],
        mins: [0; 16],
        d: 0.0,
        dmin: 0.0,
    };
    match ty {
        GgmlType::Q2K => {
            for k in 0..16 {
                let b = *x.add(k);
                s.sc[k] = i16::from(b & 0x0F);
                s.mins[k] = i16::from(b >> 4);
            }
            s.d = f16_at(x.add(80));
            s.dmin = f16_at(x.add(82));
        }
        GgmlType::Q3K => {
            let v = q3k_scales(std::slice::from_raw_parts(x, 110));
            for (sc, v) in s.sc.iter_mut().zip(v) {
                *sc = i16::from(v) - 32;
            }
            s.d = f16_at(x.add(108));
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let (sc, m) = q4k_scales_mins(std::slice::from_raw_parts(x, 16));
            for k in 0..8 {
                s.sc[2 * k] = sc[k] as i16;
                s.sc[2 * k + 1] = sc[k] as i16;
                s.mins[2 * k] = m[k] as i16;
                s.mins[2 * k + 1] = m[k] as i16;
            }
            s.d = f16_at(x);
            s.dmin = f16_at(x.add(2));
        }
        _ => {
            let blk = std::slice::from_raw_parts(x, 136);
            for ib in 0..8 {
                let v = iq4xs_scale(blk, ib) as i16 - 32;
                s.sc[2 * ib] = v;
                s.sc[2 * ib + 1] = v;
            }
            s.d = f16_at(x);
        }
    }
    s
}

/// The 32 signed codes of chunk `c` (elements `32c..32c + 32`) of the block at `x`.
#[inline(always)]
unsafe fn codes(ty: GgmlType, x: *const u8, c: usize) -> __m256i {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let shr = |v: __m256i, n: usize| _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32));
    match ty {
        GgmlType::Q2K => {
            let (j, k) = (c / 4, c % 4);
            _mm256_and_si256(shr(load(x.add(16 + 32 * j)), 2 * k), m3)
        }
        GgmlType::Q3K => {
            let (j, k) = (c / 4, c % 4);
            let low = _mm256_and_si256(shr(load(x.add(32 + 32 * j)), 2 * k), m3);
            let high = _mm256_and_si256(shr(load(x), c), one);
            let code = _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
            _mm256_sub_epi8(code, _mm256_set1_epi8(4))
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let five = ty == GgmlType::Q5K;
            let qs = if five { 48 } else { 16 };
            let bits = load(x.add(qs + 32 * (c / 2)));
            let nib = _mm256_and_si256(shr(bits, 4 * (c % 2)), m4);
            if five {
                let hb = _mm256_and_si256(shr(load(x.add(16)), c), one);
                _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4))
            } else {
                nib
            }
        }
        _ => {
            let values = _mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i);
            let bits = _mm_loadu_si128(x.add(8 + 16 * c) as *const __m128i);
            let m4 = _mm_set1_epi8(0x0F);
            let lo = _mm_shuffle_epi8(values, _mm_and_si128(bits, m4));
            let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
            _mm256_set_m128i(hi, lo)
        }
    }
}

/// One row of `ty` times one Q8_K row, `n` elements, in llama.cpp's one-token order (the
/// same bits as [`crate::kformats::dot`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` and `a` must hold `n / 256` blocks each.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bb = ty.block_bytes();
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..n / QK_K {
        let x = w.as_ptr().add(i * bb);
        let y = a.as_ptr().add(i * Q8_K_BYTES);
        let yd = (y as *const f32).read_unaligned();
        let s = scales(ty, x);
        if ty == GgmlType::Q2K {
            let mins = _mm256_loadu_si256(s.mins.as_ptr() as *const __m256i);
            let prod = _mm256_madd_epi16(mins, load(y.add(4 + QK_K)));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(-yd * s.dmin), _mm256_cvtepi32_ps(prod), acc);
        } else if ty == GgmlType::Q5K {
            let bs = y.add(4 + QK_K) as *const i16;
            let m: i32 = (0..16)
                .map(|k| i32::from(s.mins[k]) * i32::from(bs.add(k).read_unaligned()))
                .sum();
            summs = (-yd * s.dmin).mul_add(m as f32, summs);
        }
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let q = codes(ty, x, c);
            let y8 = load(y.add(4 + 32 * c));
            let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y8, q));
            let sc = _mm256_set_m128i(_mm_set1_epi16(s.sc[2 * c + 1]), _mm_set1_epi16(s.sc[2 * c]));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p16));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(yd * s.d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum8(acc) + summs
}

/// Four bytes at `p` in every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// One row of `ty` times `CV` groups of eight tokens in the interleaved Q8_K layout, one token
/// per lane, in llama.cpp's tiled order (the same bits as [`crate::kformats::dot_tiled`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` must hold `nb` blocks of `ty` and every `y[v]`
/// `nb` interleaved blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile<const CV: usize>(
    ty: GgmlType,
    w: *const u8,
    nb: usize,
    y: &[*const u8; CV],
    out: &mut [[f32; 8]; CV],
) {
    let bb = ty.block_bytes();
    let with_min = matches!(ty, GgmlType::Q2K | GgmlType::Q4K | GgmlType::Q5K);
    let mut acc = [_mm256_setzero_ps(); CV];
    let mut code_buf = [0i8; QK_K];
    for b in 0..nb {
        let x = w.add(b * bb);
        let s = scales(ty, x);
        for c in 0..8 {
            _mm256_storeu_si256(
                code_buf.as_mut_ptr().add(32 * c) as *mut __m256i,
                codes(ty, x, c),
            );
        }
        let yb: [*const u8; CV] = std::array::from_fn(|v| y[v].add(b * TILE_BLOCK_BYTES));
        let mut tot = [_mm256_setzero_si256(); CV];
        for i in 0..QK_K / 4 {
            let w4 = bcast4(code_buf.as_ptr().add(4 * i) as *const u8);
            let aw = _mm256_sign_epi8(w4, w4);
            let sc = _mm256_set1_epi16(s.sc[i / 4]);
            for v in 0..CV {
                let q = load(yb[v].add(TILE_QUANTS + 32 * i));
                let p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(q, w4));
                tot[v] = _mm256_add_epi32(tot[v], _mm256_madd_epi16(p16, sc));
            }
        }
        let d = _mm256_set1_ps(s.d);
        let dmin = _mm256_set1_ps(s.dmin);
        for v in 0..CV {
            let mut r = _mm256_mul_ps(d, _mm256_cvtepi32_ps(tot[v]));
            if with_min {
                let mut m = _mm256_setzero_si256();
                for k in 0..8 {
                    let pair =
                        (i32::from(s.mins[2 * k]) & 0xFFFF) | (i32::from(s.mins[2 * k + 1]) << 16);
                    let bs = load(yb[v].add(TILE_BSUMS + 32 * k));
                    m = _mm256_add_epi32(m, _mm256_madd_epi16(bs, _mm256_set1_epi32(pair)));
                }
                r = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(m), r);
            }
            let yd = _mm256_loadu_ps(yb[v] as *const f32);
            acc[v] = _mm256_fmadd_ps(r, yd, acc[v]);
        }
    }
    for v in 0..CV {
        _mm256_storeu_ps(out[v].as_mut_ptr(), acc[v]);
    }
}
