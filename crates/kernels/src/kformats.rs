//! The other 256-element formats: Q2_K, Q3_K, Q5_K and IQ4_XS weights against Q8_K activations
//! (Q4_K and Q6_K, the common pair of `Q4_K_M` files, have hand-tuned paths in
//! [`crate::kquants`]).
//!
//! Every one of them decodes to the same shape ([`KBlock`]): 256 signed codes, a scale per
//! 16-element sub-block (a 32-element format repeats its scale), a minimum per sub-block where
//! the format has one, and the block's `d` / `dmin`. llama.cpp's two x86 paths then only differ
//! in float order, which is what this module reproduces:
//!
//! - **one token at a time** (`ggml_vec_dot_*_q8_K`, batches under 8): eight 32-bit lanes, lane
//!   `l` holding the exact integer sum over every 32-element chunk of `scale * (four products
//!   4l..4l + 4)`, accumulated across blocks with a fused multiply-add by `d_w * d_a`; the
//!   minimums go through lanes (Q2_K) or a scalar (Q5_K) of their own ([`dot`]);
//! - **the tiled kernel** (`ggml-cpu/tiled`, batches of 8 or more): the whole block's exact
//!   integer `S`, then `r = d_w * S`, less `dmin_w * M` in one rounding, then `acc += r * d_a`
//!   fused ([`dot_tiled`]).
//!
//! Block layouts (bytes):
//! - Q2_K (84): 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit codes,
//!   `d` f16, `dmin` f16.
//! - Q3_K (110): 32 bytes of high bits, 64 of 2-bit low codes, 12 of packed 6-bit scales, `d`.
//! - Q5_K (176): `d`, `dmin`, 12 bytes of packed 6-bit scales and mins (as Q4_K), 32 bytes of
//!   fifth bits, 128 of nibbles.
//! - IQ4_XS (136): `d`, 16 high scale bits, 4 bytes of low scale nibbles, 128 bytes of indices
//!   into the non-linear table [`IQ4NL_VALUES`].

use strata_gguf::GgmlType;

use crate::dot::hsum8;
use crate::formats::rd_f16;
use crate::kquants::{Q8_K_BYTES, QK_K, q4k_scales_mins};

/// The 16 values of IQ4_NL / IQ4_XS codes (ggml's `kvalues_iq4nl`).
pub(crate) const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Whether this module computes with `ty`.
pub(crate) fn handles(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q5K | GgmlType::IQ4XS
    )
}

/// Whether [`dot_tiled`] computes with `ty` (the formats of [`handles`] and Q4_K).
pub(crate) fn tiles(ty: GgmlType) -> bool {
    handles(ty) || ty == GgmlType::Q4K
}

/// One super-block, decoded.
#[derive(Clone, Debug)]
pub(crate) struct KBlock {
    /// Signed code of each element (offsets already removed).
    pub(crate) codes: [i8; QK_K],
    /// Integer scale of each 16-element sub-block.
    pub(crate) scales: [i32; 16],
    /// Integer minimum of each 16-element sub-block (zero where the format has none).
    pub(crate) mins: [i32; 16],
    /// Block scale.
    pub(crate) d: f32,
    /// Block scale of the minimums.
    pub(crate) dmin: f32,
}

impl Default for KBlock {
    fn default() -> Self {
        KBlock {
            codes: [0; QK_K],
            scales: [0; 16],
            mins: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// Q3_K's sixteen 6-bit scales (before the `- 32`), unpacked as ggml's `kmask` trick does.
pub(crate) fn q3k_scales(x: &[u8]) -> [i8; 16] {
    let w =
        |i: usize| u32::from_le_bytes([x[96 + 4 * i], x[97 + 4 * i], x[98 + 4 * i], x[99 + 4 * i]]);
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    let (k1, k2) = (0x0303_0303u32, 0x0F0F_0F0Fu32);
    let words = [
        (a0 & k2) | ((tmp & k1) << 4),
        (a1 & k2) | (((tmp >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, wd) in words.iter().enumerate() {
        for (j, b) in wd.to_le_bytes().into_iter().enumerate() {
            out[4 * i + j] = b as i8;
        }
    }
    out
}

/// IQ4_XS's 6-bit scale of 32-element sub-block `ib` (before the `- 32`).
pub(crate) fn iq4xs_scale(x: &[u8], ib: usize) -> i32 {
    let sh = u16::from_le_bytes([x[2], x[3]]);
    let lo = (x[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    i32::from(lo) | ((i32::from(sh >> (2 * ib)) & 3) << 4)
}

/// Decodes block `x` of `ty` into `out`.
pub(crate) fn decode(ty: GgmlType, x: &[u8], out: &mut KBlock) {
    out.mins = [0; 16];
    out.dmin = 0.0;
    match ty {
        GgmlType::Q2K => {
            for (s, &b) in x[..16].iter().enumerate() {
                out.scales[s] = i32::from(b & 0x0F);
                out.mins[s] = i32::from(b >> 4);
            }
            for e in 0..QK_K {
                let (half, el) = (e / 128, e % 128);
                let byte = x[16 + 32 * half + el % 32];
                out.codes[e] = ((byte >> (2 * (el / 32))) & 3) as i8;
            }
            out.d = rd_f16(x, 80);
            out.dmin = rd_f16(x, 82);
        }
        GgmlType::Q3K => {
            for (s, v) in q3k_scales(x).into_iter().enumerate() {
                out.scales[s] = i32::from(v) - 32;
            }
            for e in 0..QK_K {
                let (half, el) = (e / 128, e % 128);
                let (group, l) = (el / 32, el % 32);
                let low = (x[32 + 32 * half + l] >> (2 * group)) & 3;
                let high = (x[l] >> (4 * half + group)) & 1;
                out.codes[e] = (low | (high << 2)) as i8 - 4;
            }
            out.d = rd_f16(x, 108);
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let (sc, m) = q4k_scales_mins(x);
            for s in 0..8 {
                out.scales[2 * s] = sc[s];
                out.scales[2 * s + 1] = sc[s];
                out.mins[2 * s] = m[s];
                out.mins[2 * s + 1] = m[s];
            }
            // Q4_K: nibbles at 16; Q5_K: fifth bits at 16, nibbles at 48.
            let five = ty == GgmlType::Q5K;
            let qs = if five { 48 } else { 16 };
            for j in 0..4 {
                for p in 0..32 {
                    let q = x[qs + 32 * j + p];
                    let h = if five { x[16 + p] } else { 0 };
                    out.codes[64 * j + p] = ((q & 0x0F) | (((h >> (2 * j)) & 1) << 4)) as i8;
                    out.codes[64 * j + 32 + p] = ((q >> 4) | (((h >> (2 * j + 1)) & 1) << 4)) as i8;
                }
            }
            out.d = rd_f16(x, 0);
            out.dmin = rd_f16(x, 2);
        }
        GgmlType::IQ4XS => {
            for ib in 0..8 {
                let s = iq4xs_scale(x, ib) - 32;
                out.scales[2 * ib] = s;
                out.scales[2 * ib + 1] = s;
                for j in 0..16 {
                    let q = x[8 + 16 * ib + j];
                    out.codes[32 * ib + j] = IQ4NL_VALUES[usize::from(q & 0x0F)];
                    out.codes[32 * ib + 16 + j] = IQ4NL_VALUES[usize::from(q >> 4)];
                }
            }
            out.d = rd_f16(x, 0);
        }
        _ => *out = KBlock::default(),
    }
}

pub(crate) fn q8k_d(a: &[u8]) -> f32 {
    f32::from_le_bytes([a[0], a[1], a[2], a[3]])
}

pub(crate) fn q8k_bsum(a: &[u8], k: usize) -> i32 {
    i32::from(i16::from_le_bytes([
        a[4 + QK_K + 2 * k],
        a[5 + QK_K + 2 * k],
    ]))
}

/// Lane `l` of the one-token kernels: over the eight 32-element chunks, the sub-block scale
/// times the products of elements `4l..4l + 4` of the chunk.
fn lanes(b: &KBlock, y: &[u8]) -> [i32; 8] {
    let mut sumi = [0i32; 8];
    for c in 0..8 {
        for (l, lane) in sumi.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4)
                .map(|p| i32::from(b.codes[32 * c + p]) * i32::from(y[4 + 32 * c + p] as i8))
                .sum();
            *lane += b.scales[2 * c + l / 4] * s;
        }
    }
    sumi
}

/// The exact sum of the minimums times the activations' 16-element sums.
pub(crate) fn min_sum(b: &KBlock, y: &[u8]) -> i32 {
    (0..16).map(|k| b.mins[k] * q8k_bsum(y, k)).sum()
}

/// Dot product of one row of `ty` and one Q8_K row of `n` elements in the order of llama.cpp's
/// AVX2 one-token kernel for the format.
pub(crate) fn dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bb = ty.block_bytes();
    let mut blk = KBlock::default();
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (x, y) in w
        .chunks_exact(bb)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        decode(ty, x, &mut blk);
        let yd = q8k_d(y);
        if ty == GgmlType::Q2K {
            // Minimums first, lane l taking sub-blocks 2l and 2l + 1.
            let dmin = -yd * blk.dmin;
            for (l, a) in acc.iter_mut().enumerate() {
                let prod = blk.mins[2 * l] * q8k_bsum(y, 2 * l)
                    + blk.mins[2 * l + 1] * q8k_bsum(y, 2 * l + 1);
                *a = dmin.mul_add(prod as f32, *a);
            }
        } else if ty == GgmlType::Q5K {
            let dmin = -yd * blk.dmin;
            summs = dmin.mul_add(min_sum(&blk, y) as f32, summs);
        }
        let d = yd * blk.d;
        for (a, s) in acc.iter_mut().zip(lanes(&blk, y)) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(&acc) + summs
}

/// The exact integer dot of a decoded block with a Q8_K block (the tiled kernel's `S`).
pub(crate) fn block_dot(b: &KBlock, y: &[u8]) -> i32 {
    (0..16)
        .map(|k| {
            let s: i32 = (16 * k..16 * k + 16)
                .map(|e| i32::from(b.codes[e]) * i32::from(y[4 + e] as i8))
                .sum();
            b.scales[k] * s
        })
        .sum()
}

/// Dot product of one row of `ty` and one Q8_K row of `n` elements in the order of llama.cpp's
/// tiled kernel.
pub(crate) fn dot_tiled(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bb = ty.block_bytes();
    let with_min = matches!(ty, GgmlType::Q2K | GgmlType::Q4K | GgmlType::Q5K);
    let mut blk = KBlock::default();
    let mut acc = 0.0f32;
    for (x, y) in w
        .chunks_exact(bb)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        decode(ty, x, &mut blk);
        let mut r = blk.d * block_dot(&blk, y) as f32;
        if with_min {
            r = (-blk.dmin).mul_add(min_sum(&blk, y) as f32, r);
        }
        acc = r.mul_add(q8k_d(y), acc);
    }
    acc
}

/// Dequantises a row of `ty` with ggml's `dequantize_row_*` float operations.
pub(crate) fn dequantize(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    let mut blk = KBlock::default();
    for (x, o) in row
        .chunks_exact(ty.block_bytes())
        .zip(out.chunks_exact_mut(QK_K))
    {
        decode(ty, x, &mut blk);
        for (e, v) in o.iter_mut().enumerate() {
            let k = e / 16;
            let dl = blk.d * blk.scales[k] as f32;
            let ml = blk.dmin * blk.mins[k] as f32;
            let q = f32::from(blk.codes[e]);
            *v = match ty {
                GgmlType::Q2K | GgmlType::Q5K => dl * q - ml,
                _ => dl * q,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random blocks of `ty` with sane f16 scales (every code pattern, no NaN).
    pub(crate) fn random_blocks(ty: GgmlType, nb: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut bytes: Vec<u8> = (0..nb * ty.block_bytes())
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect();
        let f16s: &[usize] = match ty {
            GgmlType::Q2K => &[80, 82],
            GgmlType::Q3K => &[108],
            GgmlType::Q5K => &[0, 2],
            _ => &[0],
        };
        for (b, blk) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
            for (i, &at) in f16s.iter().enumerate() {
                let v = half::f16::from_f32(0.001 + 0.0007 * ((b * 3 + i) % 11) as f32);
                blk[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        bytes
    }

    #[test]
    fn both_orders_are_close_to_the_dequantised_product() {
        for ty in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::Q5K, GgmlType::IQ4XS] {
            let n = 3 * QK_K;
            let w = random_blocks(ty, 3, 77);
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let mut a = vec![0u8; 3 * Q8_K_BYTES];
            crate::kquants::quantize_row_q8_k(&x, &mut a);
            let mut wf = vec![0.0; n];
            dequantize(ty, &w, &mut wf);
            let exact: f32 = wf.iter().zip(&x).map(|(a, b)| a * b).sum();
            let mag: f32 = wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            for got in [dot(ty, &w, &a, n), dot_tiled(ty, &w, &a, n)] {
                assert!((got - exact).abs() <= mag / 100.0, "{ty}: {got} vs {exact}");
            }
        }
    }

    #[test]
    fn q3_k_scales_unpack_as_ggml() {
        // Scale s: low nibble in byte s % 8 (s < 8 low, else high nibble), high two bits in
        // byte 8 + s % 4 at bit 2 * (s / 4).
        let mut x = vec![0u8; 110];
        let want: Vec<i8> = (0..16).map(|s| ((s * 5 + 3) % 64) as i8).collect();
        for (s, &v) in want.iter().enumerate() {
            let v = v as u8;
            x[96 + s % 8] |= (v & 0x0F) << if s < 8 { 0 } else { 4 };
            x[96 + 8 + s % 4] |= (v >> 4) << (2 * (s / 4));
        }
        assert_eq!(q3k_scales(&x).to_vec(), want);
    }
}
