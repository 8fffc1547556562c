//! llama.cpp's aarch64 `vec_dot` for two weight rows times two activation rows at once
//! (`nrc` = 2): the path its i8mm build's matrix product takes for pairs of rows and pairs of
//! tokens, where Q4_0, Q4_1, Q8_0, Q4_K and Q6_K have a `vmmlaq_s32` kernel. The instruction
//! gives the four (row, token) integer sums of a block exactly, so each of the four results is
//! its own running sum over blocks (or super-blocks) of `f32(integer) * scale`, where GCC keeps
//! `vmlaq_f32` / `vmlsq_f32` a multiply then an add. These are the portable definitions a
//! NEON i8mm kernel must match, checked against llama.cpp's own results
//! (`fixtures/quant/dots-aarch64-i8mm.json`).

use strata_gguf::GgmlType;

use crate::arm::{Lanes, block_lanes};
use crate::formats::{QK, block_codes, rd_f16};
use crate::kformats::{KBlock, block_dot, decode, min_sum, q8k_d};
use crate::kquants::{Q6_K_BYTES, Q8_K_BYTES, QK_K, q6k_block_total};

/// Weight rows `w[0]`, `w[1]` (format `ty`) times activation rows `a[0]`, `a[1]` (quantised as
/// for [`crate::arm::dot`]) over `n` elements, as `[w0·a0, w1·a0, w0·a1, w1·a1]` (llama.cpp
/// stores the first two at `s`, the others at `s + bs`); `None` for a format without a
/// two-row kernel. (The matrix product does not take this path yet: the engine's `neon`
/// flavour is the NEON build's, and the i8mm build's flavour also needs its repacked layouts.)
#[allow(dead_code)]
pub(crate) fn dot_pair(ty: GgmlType, w: [&[u8]; 2], a: [&[u8]; 2], n: usize) -> Option<[f32; 4]> {
    let out = match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => pair_legacy(ty, w, a, n),
        GgmlType::Q4K => pair_q4_k(w, a, n),
        GgmlType::Q6K => pair_q6_k(w, a, n),
        _ => return None,
    };
    Some(out)
}

/// The result index of weight row `r` and activation row `c`.
#[inline(always)]
fn at(r: usize, c: usize) -> usize {
    2 * c + r
}

/// Q4_0, Q8_0 and Q4_1: per block, `acc += f32(codes · y) * (d_x * d_y)`; Q4_1 adds its
/// minimum terms `m_x * s_y`, summed apart, at the end.
fn pair_legacy(ty: GgmlType, w: [&[u8]; 2], a: [&[u8]; 2], n: usize) -> [f32; 4] {
    let q81 = ty == GgmlType::Q4_1;
    let (ab, qoff) = if q81 { (36, 4) } else { (34, 2) };
    let wb = ty.block_bytes();
    let mut acc = [0.0f32; 4];
    let mut summs = [0.0f32; 4];
    let mut codes = [[0i8; QK]; 2];
    for ib in 0..n / QK {
        let x = [&w[0][ib * wb..], &w[1][ib * wb..]];
        let y = [&a[0][ib * ab..], &a[1][ib * ab..]];
        let dm: [(f32, f32); 2] = std::array::from_fn(|r| block_codes(ty, x[r], &mut codes[r]));
        for c in 0..2 {
            let dy = rd_f16(y[c], 0);
            for r in 0..2 {
                // `vmmlaq_s32` sums the block exactly, as any grouping of its lanes does.
                let s: i32 = block_lanes(Lanes::Dotprod, &codes[r], &y[c][qoff..])
                    .iter()
                    .sum();
                acc[at(r, c)] += s as f32 * (dm[r].0 * dy);
                if q81 {
                    summs[at(r, c)] += dm[r].1 * rd_f16(y[c], 2);
                }
            }
        }
    }
    if q81 {
        for (acc, m) in acc.iter_mut().zip(summs) {
            *acc += m;
        }
    }
    acc
}

/// Q4_K: per super-block, `acc -= f32(mins · bsums) * (dmin_x * d_y)`, then
/// `acc += f32(scaled codes · y) * (d_x * d_y)`.
fn pair_q4_k(w: [&[u8]; 2], a: [&[u8]; 2], n: usize) -> [f32; 4] {
    let wb = GgmlType::Q4K.block_bytes();
    let mut acc = [0.0f32; 4];
    let mut blk = [KBlock::default(), KBlock::default()];
    for ib in 0..n / QK_K {
        let y = [&a[0][ib * Q8_K_BYTES..], &a[1][ib * Q8_K_BYTES..]];
        for (r, blk) in blk.iter_mut().enumerate() {
            decode(GgmlType::Q4K, &w[r][ib * wb..], blk);
        }
        for c in 0..2 {
            let yd = q8k_d(y[c]);
            for (r, blk) in blk.iter().enumerate() {
                let acc = &mut acc[at(r, c)];
                *acc -= min_sum(blk, y[c]) as f32 * (blk.dmin * yd);
                *acc += block_dot(blk, y[c]) as f32 * (blk.d * yd);
            }
        }
    }
    acc
}

/// Q6_K: per super-block, `acc += f32(total) * (d_x * d_y)`, the total the exact
/// `scale * (code - 32) · y` (llama.cpp subtracts `32 * scale * bsum` from the unsigned codes'
/// products, the same integer).
fn pair_q6_k(w: [&[u8]; 2], a: [&[u8]; 2], n: usize) -> [f32; 4] {
    let mut acc = [0.0f32; 4];
    for ib in 0..n / QK_K {
        let x = [&w[0][ib * Q6_K_BYTES..], &w[1][ib * Q6_K_BYTES..]];
        let y = [&a[0][ib * Q8_K_BYTES..], &a[1][ib * Q8_K_BYTES..]];
        for c in 0..2 {
            for r in 0..2 {
                let scale = rd_f16(x[r], 208) * q8k_d(y[c]);
                acc[at(r, c)] += q6k_block_total(x[r], y[c]) as f32 * scale;
            }
        }
    }
    acc
}
