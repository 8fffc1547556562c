//! Portable scalar dot products between one weight row and one activation row.
//!
//! These are the reference the SIMD kernels are tested against, so they reproduce the SIMD
//! arithmetic exactly: each 32-element block yields eight integer partial sums of four products
//! (one per 32-bit lane of an AVX2 register), each lane accumulates `scale * sum` with a fused
//! multiply-add across blocks, and the lanes are reduced in the AVX2 horizontal-add order. That is
//! also the order llama.cpp uses, which is what makes token-exact agreement with it possible.

use strata_gguf::GgmlType;

use crate::formats::{QK, block_codes, rd_f16};

/// Reduces eight lanes in the order of an AVX2 horizontal add (high half + low half, then
/// `movehl`, then `movehdup`).
#[inline]
pub(crate) fn hsum8(a: &[f32; 8]) -> f32 {
    let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    let s = [r[0] + r[2], r[1] + r[3]];
    s[0] + s[1]
}

/// Dot product of `n` elements: weight row `w` in format `ty`, activation row `a` in
/// [`crate::formats::act_type`]`(ty)`.
pub fn dot_scalar(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    match ty {
        GgmlType::F32 => w
            .chunks_exact(4)
            .zip(a.chunks_exact(4))
            .take(n)
            .map(|(x, y)| {
                f32::from_le_bytes([x[0], x[1], x[2], x[3]])
                    * f32::from_le_bytes([y[0], y[1], y[2], y[3]])
            })
            .sum(),
        GgmlType::F16 => w
            .chunks_exact(2)
            .zip(a.chunks_exact(2))
            .take(n)
            .map(|(x, y)| rd_f16(x, 0) * rd_f16(y, 0))
            .sum(),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            let with_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
            let (ab, qoff) = if with_min { (36, 4) } else { (34, 2) };
            let wb = ty.block_bytes();
            let mut acc = [0.0f32; 8];
            let mut summs = 0.0f32;
            let mut codes = [0i8; QK];
            for (xb, yb) in w.chunks_exact(wb).zip(a.chunks_exact(ab)).take(n / QK) {
                let (dx, m) = block_codes(ty, xb, &mut codes);
                let dy = rd_f16(yb, 0);
                if with_min {
                    summs = m.mul_add(rd_f16(yb, 2), summs);
                }
                let dd = dx * dy;
                for (lane, acc) in acc.iter_mut().enumerate() {
                    let s: i32 = (0..4)
                        .map(|k| {
                            let i = lane * 4 + k;
                            i32::from(codes[i]) * i32::from(yb[qoff + i] as i8)
                        })
                        .sum();
                    *acc = dd.mul_add(s as f32, *acc);
                }
            }
            hsum8(&acc) + summs
        }
        GgmlType::Q4K => crate::kquants::dot_q4_k(w, a, n),
        GgmlType::Q6K => crate::kquants::dot_q6_k(w, a, n),
        ty if crate::kformats::handles(ty) => crate::kformats::dot(ty, w, a, n),
        _ => f32::NAN,
    }
}
