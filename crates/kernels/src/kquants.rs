//! The 256-element "K" formats: Q4_K and Q6_K weights, and the Q8_K activations they are
//! multiplied with.
//!
//! The dot products reproduce llama.cpp's AVX2 kernels (`ggml_vec_dot_q4_K_q8_K`,
//! `ggml_vec_dot_q6_K_q8_K`) lane by lane: per super-block each of eight 32-bit lanes collects
//! exact integer sums (four products per lane per 32-element chunk, times the sub-block scale),
//! then accumulates `d * lane` with one fused multiply-add; the Q4_K minimums go through a
//! separate four-lane accumulator. The same integers in the same lanes give the same floats.
//!
//! Block layouts (bytes):
//! - Q4_K (144): `d` f16, `dmin` f16, 12 bytes of packed 6-bit scales and mins, 128 of nibbles.
//! - Q6_K (210): 128 low-nibble bytes `ql`, 64 high-bit bytes `qh`, 16 `i8` scales, `d` f16.
//! - Q8_K (292): `d` f32, 256 `i8` quants, 16 `i16` sums of each 16 quants.

use crate::dot::hsum8;
use crate::formats::rd_f16;

/// Elements of a super-block.
pub(crate) const QK_K: usize = 256;
/// Bytes of a Q4_K block.
pub(crate) const Q4_K_BYTES: usize = 144;
/// Bytes of a Q6_K block.
pub(crate) const Q6_K_BYTES: usize = 210;
/// Bytes of a Q8_K block.
pub(crate) const Q8_K_BYTES: usize = 292;

pub(crate) fn rd_f32(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// llama.cpp's `nearest_int`: round half to even through the float adder (|x| < 2^22).
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    ((v.to_bits() & 0x007F_FFFF) as i32) - 0x0040_0000
}

/// Quantises `x` (a multiple of 256 long) to Q8_K blocks exactly as `quantize_row_q8_K_ref`.
pub(crate) fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    quantize_row_q8_k_as(false, x, out)
}

/// [`quantize_row_q8_k`] as an aarch64 build compiles it when `fused`: GCC fuses
/// `nearest_int`'s `iscale * x + 12582912` there, which rounds a few codes the other way.
pub(crate) fn quantize_row_q8_k_as(fused: bool, x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (o, &v) in ob[4..4 + QK_K].iter_mut().zip(xb) {
            let q = if fused {
                let v = iscale.mul_add(v, 12_582_912.0);
                ((v.to_bits() & 0x007F_FFFF) as i32) - 0x0040_0000
            } else {
                nearest_int(iscale * v)
            };
            *o = q.min(127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let sum: i32 = ob[4 + 16 * j..4 + 16 * (j + 1)]
                .iter()
                .map(|&q| i32::from(q as i8))
                .sum();
            let at = 4 + QK_K + 2 * j;
            ob[at..at + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        ob[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

fn q8k_quant(a: &[u8], i: usize) -> i32 {
    i32::from(a[4 + i] as i8)
}

fn q8k_bsum(a: &[u8], j: usize) -> i32 {
    i32::from(i16::from_le_bytes([
        a[4 + QK_K + 2 * j],
        a[4 + QK_K + 2 * j + 1],
    ]))
}

/// The eight 6-bit scales and eight 6-bit minimums of a Q4_K block.
pub(crate) fn q4k_scales_mins(b: &[u8]) -> ([i32; 8], [i32; 8]) {
    let q = &b[4..16];
    let mut sc = [0i32; 8];
    let mut m = [0i32; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = i32::from(q[j] & 63);
            m[j] = i32::from(q[j + 4] & 63);
        } else {
            sc[j] = i32::from((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
            m[j] = i32::from((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        }
    }
    (sc, m)
}

/// The 6-bit code of element `e` (0..256) of a Q6_K block.
pub(crate) fn q6k_code(b: &[u8], e: usize) -> i32 {
    let (half, r) = (e / 128, e % 128);
    let (k, p) = (r / 32, r % 32);
    let ql = &b[64 * half..64 * half + 64];
    let qh = b[128 + 32 * half + p];
    let lo = match k {
        0 => ql[p] & 15,
        1 => ql[32 + p] & 15,
        2 => ql[p] >> 4,
        _ => ql[32 + p] >> 4,
    };
    i32::from(lo | (((qh >> (2 * k)) & 3) << 4))
}

pub(crate) fn q6k_scale(b: &[u8], s: usize) -> i32 {
    i32::from(b[192 + s] as i8)
}

/// Dot product of one Q4_K row and one Q8_K row of `n` elements, in AVX2 lane order.
pub(crate) fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut acc_m = [0.0f32; 4];
    for (x, y) in w
        .chunks_exact(Q4_K_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let yd = rd_f32(y, 0);
        let d = yd * rd_f16(x, 0);
        let dmin = -yd * rd_f16(x, 2);
        let (sc, m) = q4k_scales_mins(x);
        // Minimums: four lanes of two 32-element sub-blocks each.
        for (i, am) in acc_m.iter_mut().enumerate() {
            let s = |k: usize| q8k_bsum(y, 2 * k) + q8k_bsum(y, 2 * k + 1);
            let prod = m[2 * i] * s(2 * i) + m[2 * i + 1] * s(2 * i + 1);
            *am = dmin.mul_add(prod as f32, *am);
        }
        let qs = &x[16..144];
        let mut sumi = [0i32; 8];
        for j in 0..4 {
            for (l, lane) in sumi.iter_mut().enumerate() {
                let (mut lo, mut hi) = (0i32, 0i32);
                for p in 4 * l..4 * l + 4 {
                    let q = qs[32 * j + p];
                    lo += i32::from(q & 15) * q8k_quant(y, 64 * j + p);
                    hi += i32::from(q >> 4) * q8k_quant(y, 64 * j + 32 + p);
                }
                *lane += sc[2 * j] * lo + sc[2 * j + 1] * hi;
            }
        }
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// Dot product of one Q4_K row and one Q8_K row in the order of llama.cpp's x86 repacked
/// kernels, which it uses for every Q4_K matrix whose row count is a multiple of 8.
///
/// The single-token kernel (`ggml_gemv_q4_K_8x8_q8_K`) accumulates, per super-block, the whole
/// scaled integer dot and the whole minimum correction with one fused multiply-add each; the
/// four-token kernel (`ggml_gemm_q4_K_8x8_q8_K`, which takes the first `4 * (n / 4)` tokens of a
/// batch) does so per 64-element chunk (`per_chunk`). The two accumulators are subtracted at the
/// end.
pub(crate) fn dot_q4_k_repacked(w: &[u8], a: &[u8], n: usize, per_chunk: bool) -> f32 {
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for (x, y) in w
        .chunks_exact(Q4_K_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let yd = rd_f32(y, 0);
        let (dd, dm) = (rd_f16(x, 0) * yd, rd_f16(x, 2) * yd);
        let (sc, m) = q4k_scales_mins(x);
        let qs = &x[16..144];
        let (mut dot, mut mins) = (0i32, 0i32);
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for p in 0..32 {
                let q = qs[32 * j + p];
                lo += i32::from(q & 15) * q8k_quant(y, 64 * j + p);
                hi += i32::from(q >> 4) * q8k_quant(y, 64 * j + 32 + p);
            }
            let chunk_dot = sc[2 * j] * lo + sc[2 * j + 1] * hi;
            let sum = |s: usize| q8k_bsum(y, 2 * s) + q8k_bsum(y, 2 * s + 1);
            let chunk_min = m[2 * j] * sum(2 * j) + m[2 * j + 1] * sum(2 * j + 1);
            if per_chunk {
                acc = (chunk_dot as f32).mul_add(dd, acc);
                acc_m = (chunk_min as f32).mul_add(dm, acc_m);
            } else {
                dot += chunk_dot;
                mins += chunk_min;
            }
        }
        if !per_chunk {
            acc = (dot as f32).mul_add(dd, acc);
            acc_m = (mins as f32).mul_add(dm, acc_m);
        }
    }
    acc - acc_m
}

/// Dot product of one Q6_K row and one Q8_K row of `n` elements, in AVX2 lane order.
pub(crate) fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in w
        .chunks_exact(Q6_K_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let d = rd_f32(y, 0) * rd_f16(x, 208);
        let mut sumi = [0i32; 8];
        // 32-element chunks c = 4 * half + k; lanes 0..4 use scale 2c, lanes 4..8 scale 2c + 1.
        for c in 0..8 {
            for (l, lane) in sumi.iter_mut().enumerate() {
                let sc = q6k_scale(x, 2 * c + l / 4);
                let mut s = 0i32;
                for p in 4 * l..4 * l + 4 {
                    let e = 32 * c + p;
                    s += q6k_code(x, e) * q8k_quant(y, e);
                }
                *lane += sc * s;
            }
        }
        // The codes are stored +32: subtract 32 * scale * sum(q8), lane l taking scales 2l, 2l+1.
        for (l, lane) in sumi.iter_mut().enumerate() {
            let sub = q8k_bsum(y, 2 * l) * q6k_scale(x, 2 * l)
                + q8k_bsum(y, 2 * l + 1) * q6k_scale(x, 2 * l + 1);
            *lane -= sub << 5;
        }
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(&acc)
}

/// Dot product of one Q6_K row and one Q8_K row in the order of llama.cpp's tiled K-quant
/// kernel (`ggml-cpu/tiled`), which it uses for batches of 8 or more tokens: per super-block
/// the exact integer dot `S` becomes `d_w * S`, then accumulates with one fused multiply-add
/// by the activation scale.
pub(crate) fn dot_q6_k_tiled(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w
        .chunks_exact(Q6_K_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let t = rd_f16(x, 208) * q6k_block_total(x, y) as f32;
        acc = t.mul_add(rd_f32(y, 0), acc);
    }
    acc
}

/// A Q6_K super-block's exact integer sum with its Q8_K block: `scale * ((code - 32) · q8)`
/// over the sixteen 16-element sub-blocks.
pub(crate) fn q6k_block_total(x: &[u8], y: &[u8]) -> i32 {
    let mut total = 0i32;
    for sb in 0..16 {
        let mut s = 0i32;
        for e in 16 * sb..16 * (sb + 1) {
            s += (q6k_code(x, e) - 32) * q8k_quant(y, e);
        }
        total += q6k_scale(x, sb) * s;
    }
    total
}

/// Dequantises a Q4_K row.
pub(crate) fn dequantize_q4_k(row: &[u8], out: &mut [f32]) {
    for (x, o) in row.chunks_exact(Q4_K_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (rd_f16(x, 0), rd_f16(x, 2));
        let (sc, m) = q4k_scales_mins(x);
        let qs = &x[16..144];
        for j in 0..4 {
            for p in 0..32 {
                let q = qs[32 * j + p];
                o[64 * j + p] = d * sc[2 * j] as f32 * f32::from(q & 15) - dmin * m[2 * j] as f32;
                o[64 * j + 32 + p] =
                    d * sc[2 * j + 1] as f32 * f32::from(q >> 4) - dmin * m[2 * j + 1] as f32;
            }
        }
    }
}

/// Dequantises a Q6_K row.
pub(crate) fn dequantize_q6_k(row: &[u8], out: &mut [f32]) {
    for (x, o) in row.chunks_exact(Q6_K_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let d = rd_f16(x, 208);
        for (e, v) in o.iter_mut().enumerate() {
            *v = d * q6k_scale(x, e / 16) as f32 * (q6k_code(x, e) - 32) as f32;
        }
    }
}

/// Tokens of a group in the interleaved Q8_K layout ([`interleave_q8k`]).
pub(crate) const TILE_TOKENS: usize = 8;
/// Offset of the bsum pairs in an interleaved group block (after eight f32 scales).
pub(crate) const TILE_BSUMS: usize = 32;
/// Offset of the quants in an interleaved group block (after eight pairs of eight tokens).
pub(crate) const TILE_QUANTS: usize = TILE_BSUMS + 8 * 32;
/// Bytes of one super-block of one group of eight tokens in the interleaved layout.
pub(crate) const TILE_BLOCK_BYTES: usize = TILE_QUANTS + QK_K / 4 * 32;

/// Interleaves `n` Q8_K activation rows (`row_bytes` apart in `buf`, `nb` blocks each) in groups
/// of eight tokens, so that one 256-bit load gives the same four quants of eight tokens (one
/// 32-bit lane per token) and the tile kernels keep one token per lane. Per group and block:
///
/// ```text
/// d[8] f32 | bsums (2k, 2k + 1) of each token, k = 0..8: 8 x 32 B | quants 4i..4i+4 of each
/// token, i = 0..64: 64 x 32 B
/// ```
///
/// The tokens missing from the last group are zero.
pub(crate) fn interleave_q8k(buf: &[u8], row_bytes: usize, n: usize, nb: usize, out: &mut Vec<u8>) {
    out.clear();
    out.resize(n.div_ceil(TILE_TOKENS) * nb * TILE_BLOCK_BYTES, 0);
    for (t, row) in buf.chunks_exact(row_bytes).take(n).enumerate() {
        let (g, l) = (t / TILE_TOKENS, 4 * (t % TILE_TOKENS));
        for (b, src) in row.chunks_exact(Q8_K_BYTES).take(nb).enumerate() {
            let dst = &mut out[(g * nb + b) * TILE_BLOCK_BYTES..][..TILE_BLOCK_BYTES];
            dst[l..l + 4].copy_from_slice(&src[0..4]);
            for (k, pair) in src[4 + QK_K..].chunks_exact(4).enumerate() {
                dst[TILE_BSUMS + 32 * k + l..][..4].copy_from_slice(pair);
            }
            for (i, q) in src[4..4 + QK_K].chunks_exact(4).enumerate() {
                dst[TILE_QUANTS + 32 * i + l..][..4].copy_from_slice(q);
            }
        }
    }
}
