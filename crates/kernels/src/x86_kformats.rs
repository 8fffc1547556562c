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
    match ty {
        GgmlType::Q2K => dot_of::<Q2K>(w, a, n),
        GgmlType::Q3K => dot_of::<Q3K>(w, a, n),
        GgmlType::Q4K => dot_of::<Q4K>(w, a, n),
        GgmlType::Q5K => dot_of::<Q5K>(w, a, n),
        _ => dot_of::<IQ4XS>(w, a, n),
    }
}

/// The formats as constants, so each gets a [`dot_of`] of its own with the format's branches
/// folded away (decode spends most of its time in this loop).
const Q2K: u8 = 0;
const Q3K: u8 = 1;
const Q4K: u8 = 2;
const Q5K: u8 = 3;
const IQ4XS: u8 = 4;

const fn format(t: u8) -> GgmlType {
    match t {
        Q2K => GgmlType::Q2K,
        Q3K => GgmlType::Q3K,
        Q4K => GgmlType::Q4K,
        Q5K => GgmlType::Q5K,
        _ => GgmlType::IQ4XS,
    }
}

/// [`dot`] for the format `T` stands for.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_of<const T: u8>(w: &[u8], a: &[u8], n: usize) -> f32 {
    let ty = format(T);
    let bb = ty.block_bytes();
    // Codes of these formats are never negative: they meet the activations in `maddubs`
    // directly, without the sign transfer signed codes need (the same exact integers).
    let unsigned = matches!(T, Q2K | Q4K | Q5K);
    // Sub-block scales `2c` and `2c + 1` of chunk `c` spread over the low and the high half:
    // one in-lane shuffle of the block's first or last eight scales (copied to both halves).
    let pairs: [__m256i; 4] = std::array::from_fn(|k| {
        let (a, b) = (4 * k as i8, 4 * k as i8 + 2);
        _mm256_setr_epi8(
            a,
            a + 1,
            a,
            a + 1,
            a,
            a + 1,
            a,
            a + 1,
            a,
            a + 1,
            a,
            a + 1,
            a,
            a + 1,
            a,
            a + 1,
            b,
            b + 1,
            b,
            b + 1,
            b,
            b + 1,
            b,
            b + 1,
            b,
            b + 1,
            b,
            b + 1,
            b,
            b + 1,
            b,
            b + 1,
        )
    });
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..n / QK_K {
        let x = w.as_ptr().add(i * bb);
        let y = a.as_ptr().add(i * Q8_K_BYTES);
        let yd = (y as *const f32).read_unaligned();
        let bsums = load(y.add(4 + QK_K));
        // The 16 sub-block scales as i16, unpacked in registers (the same values as `scales`).
        let (scv, d) = match T {
            Q2K => {
                // Scales in the low nibbles, minimums in the high ones.
                let ms = _mm_loadu_si128(x as *const __m128i);
                let m4 = _mm_set1_epi8(0x0F);
                let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
                let prod = _mm256_madd_epi16(mins, bsums);
                let dmin = f16_at(x.add(82));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(-yd * dmin), _mm256_cvtepi32_ps(prod), acc);
                (
                    _mm256_cvtepu8_epi16(_mm_and_si128(ms, m4)),
                    f16_at(x.add(80)),
                )
            }
            Q3K => {
                let v = q3k_scales_v(x);
                let sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(32));
                (sc, f16_at(x.add(108)))
            }
            Q4K | Q5K => {
                // Each 32-element chunk has one scale and one minimum: doubled, one per 16.
                let v = q4k_scales_mins_v(x);
                if T == Q5K {
                    let mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v, v));
                    let m = hsum_i32(_mm256_madd_epi16(mins, bsums));
                    summs = (-yd * f16_at(x.add(2))).mul_add(m as f32, summs);
                }
                (_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v)), f16_at(x))
            }
            _ => {
                // IQ4_XS: the byte-wise unpacking measured faster than word tricks here.
                let s = scales(ty, x);
                (_mm256_loadu_si256(s.sc.as_ptr() as *const __m256i), s.d)
            }
        };
        let halves = [
            _mm256_permute2x128_si256(scv, scv, 0x00),
            _mm256_permute2x128_si256(scv, scv, 0x11),
        ];
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let q = codes(ty, x, c);
            let y8 = load(y.add(4 + 32 * c));
            let p16 = if unsigned {
                _mm256_maddubs_epi16(q, y8)
            } else {
                _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y8, q))
            };
            let sc = _mm256_shuffle_epi8(halves[c / 4], pairs[c % 4]);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p16));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(yd * d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum8(acc) + summs
}

/// A Q4_K / Q5_K block's eight 6-bit scales (bytes 0..8) and minimums (bytes 8..16), unpacked
/// from its 12 scale bytes with word operations (the values of `kquants::q4k_scales_mins`).
#[inline(always)]
pub(crate) unsafe fn q4k_scales_mins_v(x: *const u8) -> __m128i {
    let p = x.add(4) as *const u32;
    let (u0, u1, u2) = (
        p.read_unaligned(),
        p.add(1).read_unaligned(),
        p.add(2).read_unaligned(),
    );
    let (k6, k4, k2) = (0x3F3F_3F3Fu32, 0x0F0F_0F0Fu32, 0x0303_0303u32);
    let scales_lo = u0 & k6;
    let scales_hi = (u2 & k4) | (((u0 >> 6) & k2) << 4);
    let mins_lo = u1 & k6;
    let mins_hi = ((u2 >> 4) & k4) | (((u1 >> 6) & k2) << 4);
    _mm_set_epi32(
        mins_hi as i32,
        mins_lo as i32,
        scales_hi as i32,
        scales_lo as i32,
    )
}

/// A Q3_K block's sixteen 6-bit scales (before the `- 32`), one per byte, unpacked with the
/// word operations of `kformats::q3k_scales`.
#[inline(always)]
unsafe fn q3k_scales_v(x: *const u8) -> __m128i {
    let p = x.add(96) as *const u32;
    let (a0, a1, tmp) = (
        p.read_unaligned(),
        p.add(1).read_unaligned(),
        p.add(2).read_unaligned(),
    );
    let (k1, k2) = (0x0303_0303u32, 0x0F0F_0F0Fu32);
    _mm_set_epi32(
        (((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4)) as i32,
        (((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4)) as i32,
        ((a1 & k2) | (((tmp >> 2) & k1) << 4)) as i32,
        ((a0 & k2) | ((tmp & k1) << 4)) as i32,
    )
}

/// The sum of the eight 32-bit lanes (exact: integers).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
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
    // The formats with minimums have codes that are never negative.
    if matches!(ty, GgmlType::Q2K | GgmlType::Q4K | GgmlType::Q5K) {
        tile_of::<CV, true>(ty, w, nb, y, out)
    } else {
        tile_of::<CV, false>(ty, w, nb, y, out)
    }
}

/// [`tile`] for formats with minimums (`WITH_MIN`: unsigned codes, which meet the activations
/// in `maddubs` directly, without the sign transfer signed codes need; the same exact integers)
/// or without.
#[inline(always)]
unsafe fn tile_of<const CV: usize, const WITH_MIN: bool>(
    ty: GgmlType,
    w: *const u8,
    nb: usize,
    y: &[*const u8; CV],
    out: &mut [[f32; 8]; CV],
) {
    let bb = ty.block_bytes();
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
            // Unsigned codes meet the quants as they are; signed ones lend them their signs.
            let aw = if WITH_MIN {
                w4
            } else {
                _mm256_sign_epi8(w4, w4)
            };
            let sc = _mm256_set1_epi16(s.sc[i / 4]);
            for v in 0..CV {
                let q = load(yb[v].add(TILE_QUANTS + 32 * i));
                let q = if WITH_MIN { q } else { _mm256_sign_epi8(q, w4) };
                let p16 = _mm256_maddubs_epi16(aw, q);
                tot[v] = _mm256_add_epi32(tot[v], _mm256_madd_epi16(p16, sc));
            }
        }
        let d = _mm256_set1_ps(s.d);
        let dmin = _mm256_set1_ps(s.dmin);
        for v in 0..CV {
            let mut r = _mm256_mul_ps(d, _mm256_cvtepi32_ps(tot[v]));
            if WITH_MIN {
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
