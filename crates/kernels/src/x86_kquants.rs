//! AVX2 dot products of Q4_K and Q6_K rows with Q8_K activations: the instruction sequence of
//! llama.cpp's `ggml_vec_dot_q4_K_q8_K` / `ggml_vec_dot_q6_K_q8_K`, so each 32-bit lane holds the
//! same integers as [`crate::kquants`]'s scalar references and the results are the same bits.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::kquants::{Q4_K_BYTES, Q6_K_BYTES, Q8_K_BYTES, QK_K, q4k_scales_mins};
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
    let m4 = _mm256_set1_epi8(0x0F);
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for i in 0..n / QK_K {
        let x = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let (dd, dm) = (f16_at(x.as_ptr()) * yd, f16_at(x.as_ptr().add(2)) * yd);
        let (sc, m) = q4k_scales_mins(x);
        let q4 = x.as_ptr().add(16);
        let q8 = y.as_ptr().add(4);
        let bs = |k: usize| {
            i32::from(i16::from_le_bytes([
                y[4 + QK_K + 2 * k],
                y[4 + QK_K + 2 * k + 1],
            ]))
        };
        let mut sumi = _mm256_setzero_si256();
        let mut mins = 0i32;
        for j in 0..4 {
            let bits = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
            let q4l = _mm256_and_si256(bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let q8l = _mm256_loadu_si256(q8.add(64 * j) as *const __m256i);
            let q8h = _mm256_loadu_si256(q8.add(64 * j + 32) as *const __m256i);
            let pl = _mm256_madd_epi16(
                _mm256_set1_epi16(sc[2 * j] as i16),
                _mm256_maddubs_epi16(q4l, q8l),
            );
            let ph = _mm256_madd_epi16(
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
                _mm256_maddubs_epi16(q4h, q8h),
            );
            let chunk = _mm256_add_epi32(pl, ph);
            let chunk_min = m[2 * j] * (bs(4 * j) + bs(4 * j + 1))
                + m[2 * j + 1] * (bs(4 * j + 2) + bs(4 * j + 3));
            if PER_CHUNK {
                acc = (hsum_epi32(chunk) as f32).mul_add(dd, acc);
                acc_m = (chunk_min as f32).mul_add(dm, acc_m);
            } else {
                sumi = _mm256_add_epi32(sumi, chunk);
                mins += chunk_min;
            }
        }
        if !PER_CHUNK {
            acc = (hsum_epi32(sumi) as f32).mul_add(dd, acc);
            acc_m = (mins as f32).mul_add(dm, acc_m);
        }
    }
    acc - acc_m
}
