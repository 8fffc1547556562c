//! NEON kernels for aarch64, in the orders of llama.cpp's aarch64 NEON build: each computes
//! exactly what its portable definition in [`crate::arm`] computes (the kernel tests check
//! them bit for bit under qemu at two CPU levels), with vector instructions. NEON is part of
//! the aarch64 baseline, so no run-time detection is needed.
//!
//! - The 32-element formats: each block's integer lanes from `vmull_s8` pairs added by
//!   `vpaddlq_s16` (the grouping of ggml's `vdotq_s32` fallback), into the float steps of
//!   `crate::arm::legacy_with`.
//! - The K formats and IQ4_XS: the block decoded by [`crate::kformats::decode`], its
//!   16-element integer products summed with NEON, then the portable float steps.

use std::arch::aarch64::*;

use strata_gguf::GgmlType;

use crate::arm::Lanes;
use crate::formats::{QK, block_codes, rd_f16};
use crate::kformats::KBlock;
use crate::kquants::{QK_K, q6k_code, q6k_scale};

/// Whether a NEON kernel exists for `ty` with `lanes`.
pub(crate) fn handles(lanes: Lanes, ty: GgmlType) -> bool {
    lanes == Lanes::Neon
        && matches!(
            ty,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q2K
                | GgmlType::Q3K
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K
                | GgmlType::IQ4XS
        )
}

/// [`crate::arm::dot`] for a format [`handles`] takes.
pub(crate) fn dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON is always present on aarch64; the rows hold `n` elements of their formats
    // (the callers checked the shapes), which every load below stays inside.
    unsafe {
        match ty {
            GgmlType::Q6K => dot_q6_k(w, a, n),
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::IQ4XS => {
                dot_k(ty, w, a, n)
            }
            _ => dot_legacy(ty, w, a, n),
        }
    }
}

/// ggml's `ggml_vdotq_s32` without dotprod: lane `l` gets products `2l, 2l + 1` of the low
/// eight bytes and `2l + 8, 2l + 9` (those of the high eight).
#[inline(always)]
unsafe fn vdot(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON operations.
    unsafe {
        let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let p1 = vmull_high_s8(a, b);
        vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1))
    }
}

/// The signed codes of one 32-element block as two vectors (elements 0..16, 16..32) and the
/// block's scale and minimum.
#[inline(always)]
unsafe fn codes(ty: GgmlType, b: &[u8]) -> (int8x16_t, int8x16_t, f32, f32) {
    // SAFETY: `b` holds one whole block of `ty`.
    unsafe {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let off = if ty == GgmlType::Q4_1 { 4 } else { 2 };
                let v = vld1q_u8(b.as_ptr().add(off));
                let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
                let hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
                if ty == GgmlType::Q4_0 {
                    let k = vdupq_n_s8(8);
                    (vsubq_s8(lo, k), vsubq_s8(hi, k), rd_f16(b, 0), 0.0)
                } else {
                    (lo, hi, rd_f16(b, 0), rd_f16(b, 2))
                }
            }
            GgmlType::Q8_0 => (
                vld1q_s8(b.as_ptr().add(2).cast()),
                vld1q_s8(b.as_ptr().add(18).cast()),
                rd_f16(b, 0),
                0.0,
            ),
            _ => {
                let mut c = [0i8; QK];
                let (d, m) = block_codes(ty, b, &mut c);
                (vld1q_s8(c.as_ptr()), vld1q_s8(c.as_ptr().add(16)), d, m)
            }
        }
    }
}

/// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (see `crate::arm::dot_legacy`): the lanes by NEON.
unsafe fn dot_legacy(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let qoff = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        4
    } else {
        2
    };
    crate::arm::legacy_with(ty, w, a, n, |xb, yb| {
        // SAFETY: whole blocks of both rows (the caller's shapes).
        unsafe {
            let (lo, hi, dx, m) = codes(ty, xb);
            let y = yb.as_ptr().add(qoff).cast::<i8>();
            let p = vaddq_s32(vdot(lo, vld1q_s8(y)), vdot(hi, vld1q_s8(y.add(16))));
            let mut s = [0i32; 4];
            vst1q_s32(s.as_mut_ptr(), p);
            (s, dx, m)
        }
    })
}

/// The exact integer sum of `scales[k] * (codes · q8)` over the sixteen 16-element sub-blocks.
#[inline(always)]
unsafe fn block_dot(b: &KBlock, q8: *const i8) -> i32 {
    // SAFETY: `q8` points at 256 quants; the codes are 256 long.
    unsafe {
        let mut total = 0i32;
        for k in 0..16 {
            let c = vld1q_s8(b.codes.as_ptr().add(16 * k));
            let y = vld1q_s8(q8.add(16 * k));
            total += b.scales[k] * vaddvq_s32(vdot(c, y));
        }
        total
    }
}

/// Q2_K, Q3_K, Q4_K, Q5_K and IQ4_XS (see `crate::arm::dot_k`).
unsafe fn dot_k(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: a Q8_K block holds 256 quants after its scale.
    crate::arm::dot_k_with(ty, w, a, n, |blk, y| unsafe {
        block_dot(blk, y.as_ptr().add(4).cast())
    })
}

/// Q6_K (see `crate::arm::dot_q6_k`).
unsafe fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    crate::arm::dot_q6_k_with(w, a, n, |x, y| {
        let mut c = [0i8; QK_K];
        for (e, c) in c.iter_mut().enumerate() {
            *c = (q6k_code(x, e) - 32) as i8;
        }
        let mut total = 0i32;
        // SAFETY: 256 codes and 256 quants after the Q8_K block's scale.
        unsafe {
            let q8 = y.as_ptr().add(4).cast::<i8>();
            for sb in 0..16 {
                let p = vdot(vld1q_s8(c.as_ptr().add(16 * sb)), vld1q_s8(q8.add(16 * sb)));
                total += q6k_scale(x, sb) * vaddvq_s32(p);
            }
        }
        total
    })
}
