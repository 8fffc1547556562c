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
pub(crate) fn dot_scalar(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    match ty {
        GgmlType::F32 => dot_f32(w, a, n),
        GgmlType::F16 => dot_half(false, w, a, n),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            dot_lanes(ty, w, a, n)
        }
        GgmlType::IQ4NL | GgmlType::MXFP4 => dot_pairs(ty, w, a, n),
        GgmlType::BF16 => dot_half(true, w, a, n),
        GgmlType::Q4K => crate::kquants::dot_q4_k(w, a, n),
        GgmlType::Q6K => crate::kquants::dot_q6_k(w, a, n),
        ty if crate::kformats::handles(ty) => crate::kformats::dot(ty, w, a, n),
        _ => f32::NAN,
    }
}

/// Element `i` of a row of f32 values.
#[inline(always)]
fn f32_at(row: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
}

/// F32 in the order of llama.cpp's AVX2 `ggml_vec_dot_f32`: 32 elements a step into four
/// 8-lane fused accumulators, reduced `(c0 + c2) + (c1 + c3)`, the lanes summed by halves and
/// two horizontal adds, then the elements past the last whole step fused in one by one.
fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut c = [[0.0f32; 8]; 4];
    let steps = n / 32 * 32;
    for i in (0..steps).step_by(32) {
        for (k, c) in c.iter_mut().enumerate() {
            for (l, c) in c.iter_mut().enumerate() {
                let j = i + 8 * k + l;
                *c = f32_at(w, j).mul_add(f32_at(a, j), *c);
            }
        }
    }
    let x: [f32; 8] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
    let t: [f32; 4] = std::array::from_fn(|l| x[l] + x[l + 4]);
    let mut sum = (t[0] + t[1]) + (t[2] + t[3]);
    for j in steps..n {
        sum = f32_at(w, j).mul_add(f32_at(a, j), sum);
    }
    sum
}

/// The 32-element formats in one 8-lane accumulator: each block's eight integer lane sums (four
/// products each) times `d_w * d_a`, fused into the lane, the lanes reduced by [`hsum8`]. This is
/// llama.cpp's AVX2 `vec_dot` for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, and its tinyBLAS kernel's
/// order for every 32-element format (IQ4_NL too).
fn dot_lanes(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
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
        let lanes = lane_sums(&codes, &yb[qoff..]);
        for (acc, s) in acc.iter_mut().zip(lanes) {
            *acc = dd.mul_add(s as f32, *acc);
        }
    }
    hsum8(&acc) + summs
}

/// The eight lane sums of one block: lane `l` holds `sum(codes[4l..4l+4] * y[4l..4l+4])`.
fn lane_sums(codes: &[i8; QK], y: &[u8]) -> [i32; 8] {
    std::array::from_fn(|lane| {
        (0..4)
            .map(|k| {
                let i = lane * 4 + k;
                i32::from(codes[i]) * i32::from(y[i] as i8)
            })
            .sum()
    })
}

/// IQ4_NL and MXFP4 in the order of llama.cpp's AVX2 `ggml_vec_dot_iq4_nl_q8_0` and
/// `ggml_vec_dot_mxfp4_q8_0`: blocks in pairs, even ones in one 8-lane accumulator and odd ones
/// in another, the two added lane by lane and reduced by [`hsum8`]; an odd last block is added
/// as `d * sum` (one rounding each, no fusing: measured against llama.cpp's own function).
fn dot_pairs(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / QK;
    let wb = ty.block_bytes();
    let mut acc = [[0.0f32; 8]; 2];
    let mut codes = [0i8; QK];
    let block = |ib: usize, codes: &mut [i8; QK]| {
        let xb = &w[ib * wb..(ib + 1) * wb];
        let yb = &a[ib * 34..(ib + 1) * 34];
        let (dx, _) = block_codes(ty, xb, codes);
        (rd_f16(yb, 0) * dx, lane_sums(codes, &yb[2..]))
    };
    let mut ib = 0;
    while ib + 1 < nb {
        for (k, acc) in acc.iter_mut().enumerate() {
            let (d, lanes) = block(ib + k, &mut codes);
            for (acc, s) in acc.iter_mut().zip(lanes) {
                *acc = d.mul_add(s as f32, *acc);
            }
        }
        ib += 2;
    }
    let both: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sum = hsum8(&both);
    for ib in ib..nb {
        let (d, lanes) = block(ib, &mut codes);
        sum += d * lanes.iter().sum::<i32>() as f32;
    }
    sum
}

/// Element `i` of a row of 16-bit floats: bf16 if `bf`, else f16.
#[inline]
fn half_at(bf: bool, row: &[u8], i: usize) -> f32 {
    let bits = u16::from_le_bytes([row[2 * i], row[2 * i + 1]]);
    if bf {
        crate::formats::bf16_to_f32(bits)
    } else {
        half::f16::from_bits(bits).to_f32()
    }
}

/// BF16 or F16 in the order of llama.cpp's AVX2 `ggml_vec_dot_bf16` / `ggml_vec_dot_f16`: 32
/// elements a step into four 8-lane accumulators, then reduced (BF16: `(c0 + c2) + (c1 + c3)`
/// and [`hsum8`]; F16: `(c0 + c2) + (c1 + c3)`, halves added, then two horizontal adds, which
/// pair the lanes differently); the elements past the last whole step are added in double
/// precision. Products of two bf16 or two f16 values are exact in f32, so fusing or not makes
/// no difference.
fn dot_half(bf: bool, w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut c = [[0.0f32; 8]; 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, c) in c.iter_mut().enumerate() {
            for (l, c) in c.iter_mut().enumerate() {
                let j = i + 8 * k + l;
                *c += half_at(bf, w, j) * half_at(bf, a, j);
            }
        }
        i += 32;
    }
    let c1: [f32; 8] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
    let mut sum = f64::from(if bf {
        hsum8(&c1)
    } else {
        let t: [f32; 4] = std::array::from_fn(|l| c1[l] + c1[l + 4]);
        (t[0] + t[1]) + (t[2] + t[3])
    });
    for j in i..n {
        sum += f64::from(half_at(bf, w, j) * half_at(bf, a, j));
    }
    sum as f32
}

/// The order of llama.cpp's tinyBLAS (llamafile sgemm) kernels, which an AVX2 build runs for
/// batches of two or more tokens when the weights were not repacked: one 8-lane accumulator per
/// output. For the 32-element formats that is [`dot_lanes`]; for BF16 and F16 (only used when
/// the row length is a multiple of 8) eight elements a step.
pub(crate) fn dot_tinyblas(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bf = match ty {
        GgmlType::BF16 => true,
        GgmlType::F16 => false,
        GgmlType::F32 => {
            // tinyBLAS's f32 kernel: one fused 8-lane accumulator.
            let mut acc = [0.0f32; 8];
            for i in (0..n / 8 * 8).step_by(8) {
                for (l, acc) in acc.iter_mut().enumerate() {
                    *acc = f32_at(w, i + l).mul_add(f32_at(a, i + l), *acc);
                }
            }
            return hsum8(&acc);
        }
        _ => return dot_lanes(ty, w, a, n),
    };
    let mut acc = [0.0f32; 8];
    for i in (0..n / 8 * 8).step_by(8) {
        for (l, acc) in acc.iter_mut().enumerate() {
            *acc += half_at(bf, w, i + l) * half_at(bf, a, i + l);
        }
    }
    hsum8(&acc)
}

/// The order of llama.cpp's repacked 8-row kernels for Q4_0, IQ4_NL and MXFP4 (`gemv`/`gemm_*_8x8_q8_0`,
/// which an AVX2 build runs for every batch size when the row count is a multiple of 8): each
/// block's whole integer sum, times `d_w * d_a`, fused into one accumulator, block after block.
pub(crate) fn dot_repacked(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let wb = ty.block_bytes();
    let mut acc = 0.0f32;
    let mut codes = [0i8; QK];
    for (xb, yb) in w.chunks_exact(wb).zip(a.chunks_exact(34)).take(n / QK) {
        let (dx, _) = block_codes(ty, xb, &mut codes);
        let s: i32 = lane_sums(&codes, &yb[2..]).iter().sum();
        acc = (s as f32).mul_add(dx * rd_f16(yb, 0), acc);
    }
    acc
}
