//! Block layouts of the quantised formats, their scalar dequantisation, and the 8-bit
//! quantisation of activations.
//!
//! Activations are quantised exactly as llama.cpp's x86 path does it (scale `amax / 127`, inverse
//! `127 / amax`, round half to even), because strata's greedy output must match llama.cpp token for
//! token and a different rounding rule flips a few activation codes per row.

use half::f16;
use strata_gguf::GgmlType;

/// Elements in a block of the 32-element formats.
pub const QK: usize = 32;
/// Bytes of a Q4_0 block: f16 scale + 16 bytes of nibbles.
pub const Q4_0_BYTES: usize = 18;
/// Bytes of a Q4_1 block: f16 scale, f16 min, 16 bytes of nibbles.
pub const Q4_1_BYTES: usize = 20;
/// Bytes of a Q5_0 block: f16 scale, 4 bytes of high bits, 16 bytes of nibbles.
pub const Q5_0_BYTES: usize = 22;
/// Bytes of a Q8_0 block: f16 scale + 32 signed bytes.
pub const Q8_0_BYTES: usize = 34;
/// Bytes of a Q8_1 block: f16 scale, f16 `scale * sum(q)`, 32 signed bytes.
pub const Q8_1_BYTES: usize = 36;

#[inline]
pub(crate) fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// A bf16 value (its bits) as f32: the upper half of the f32's bits, exactly.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Rounds an f32 to f16 precision and back (what ggml does when it stores an f16).
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// The 16 values of MXFP4 codes: E2M1 floats doubled, so they are integers (ggml's
/// `kvalues_mxfp4`); the block scale is halved to match ([`e8m0_half`]).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the value of an E8M0 scale (`2^(e - 128)`), as ggml's `ggml_e8m0_to_fp32_half` builds
/// it: in the exponent bits, or as the subnormal `2^-128` / `2^-127` for `e` 0 and 1.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// Decodes one block of a 32-element integer format into its signed codes.
///
/// Returns the codes and, for Q4_1 and Q5_1, the block minimum (`m`, added as `m * sum(y)` by the dot).
pub(crate) fn block_codes(ty: GgmlType, b: &[u8], out: &mut [i8; QK]) -> (f32, f32) {
    match ty {
        GgmlType::Q4_0 => {
            for j in 0..16 {
                out[j] = (b[2 + j] & 0x0F) as i8 - 8;
                out[j + 16] = (b[2 + j] >> 4) as i8 - 8;
            }
            (rd_f16(b, 0), 0.0)
        }
        GgmlType::Q4_1 => {
            for j in 0..16 {
                out[j] = (b[4 + j] & 0x0F) as i8;
                out[j + 16] = (b[4 + j] >> 4) as i8;
            }
            (rd_f16(b, 0), rd_f16(b, 2))
        }
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let lo = (b[6 + j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (b[6 + j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                out[j] = lo as i8 - 16;
                out[j + 16] = hi as i8 - 16;
            }
            (rd_f16(b, 0), 0.0)
        }
        GgmlType::Q5_1 => {
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            for j in 0..16 {
                let lo = (b[8 + j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (b[8 + j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                out[j] = lo as i8;
                out[j + 16] = hi as i8;
            }
            (rd_f16(b, 0), rd_f16(b, 2))
        }
        GgmlType::Q8_0 => {
            for j in 0..QK {
                out[j] = b[2 + j] as i8;
            }
            (rd_f16(b, 0), 0.0)
        }
        GgmlType::IQ4NL => {
            use crate::kformats::IQ4NL_VALUES as V;
            for j in 0..16 {
                out[j] = V[usize::from(b[2 + j] & 0x0F)];
                out[j + 16] = V[usize::from(b[2 + j] >> 4)];
            }
            (rd_f16(b, 0), 0.0)
        }
        GgmlType::MXFP4 => {
            for j in 0..16 {
                out[j] = MXFP4_VALUES[usize::from(b[1 + j] & 0x0F)];
                out[j + 16] = MXFP4_VALUES[usize::from(b[1 + j] >> 4)];
            }
            (e8m0_half(b[0]), 0.0)
        }
        _ => (0.0, 0.0),
    }
}

/// Dequantises one row of `ty` into `out` (the f32 reference every kernel is tested against).
///
/// `row` must hold exactly `out.len()` elements of `ty`; the caller checked the shape.
pub fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_0
        | GgmlType::IQ4NL
        | GgmlType::MXFP4 => {
            let bb = ty.block_bytes();
            let mut codes = [0i8; QK];
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(bb)) {
                let (d, m) = block_codes(ty, b, &mut codes);
                for (o, &q) in o.iter_mut().zip(codes.iter()) {
                    *o = f32::from(q) * d + m;
                }
            }
        }
        GgmlType::Q4K => crate::kquants::dequantize_q4_k(row, out),
        GgmlType::Q6K => crate::kquants::dequantize_q6_k(row, out),
        ty if crate::kformats::handles(ty) => crate::kformats::dequantize(ty, row, out),
        _ => out.fill(f32::NAN),
    }
}

/// The format activations are converted to before a dot product with weights of format `ty`
/// (ggml's `vec_dot_type`).
pub fn act_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4NL | GgmlType::MXFP4 => {
            GgmlType::Q8_0
        }
        GgmlType::Q2K
        | GgmlType::Q3K
        | GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K
        | GgmlType::IQ4XS => GgmlType::Q8K,
        GgmlType::F16 => GgmlType::F16,
        GgmlType::BF16 => GgmlType::BF16,
        _ => GgmlType::F32,
    }
}

/// Scale of a block as the x86 path computes it: `amax / 127`, and its inverse `127 / amax`.
#[inline]
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (d, id)
}

/// Quantises `x` (a multiple of 32 long) to Q8_0 blocks in `out`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let (d, id) = q8_scale(xb);
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (o, &v) in ob[2..].iter_mut().zip(xb) {
            *o = (v * id).round_ties_even() as i32 as i8 as u8;
        }
    }
}

/// Quantises `x` (a multiple of 32 long) to Q8_1 blocks in `out`.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let (d, id) = q8_scale(xb);
        let mut sum = 0i32;
        for (o, &v) in ob[4..].iter_mut().zip(xb) {
            let q = (v * id).round_ties_even() as i32;
            sum += q;
            *o = q as i8 as u8;
        }
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        ob[2..4].copy_from_slice(&f16::from_f32(d * sum as f32).to_bits().to_le_bytes());
    }
}

/// Side arrays filled alongside Q8_0 / Q8_1 blocks (see [`crate::QuantActs`]).
pub(crate) struct Q8Sides<'a> {
    /// Block scales (the stored f16 value, as f32).
    pub(crate) d: &'a mut [f32],
    /// Q8_1 `d * sum(q)` (the stored f16 value, as f32); untouched for Q8_0.
    pub(crate) s: &'a mut [f32],
    /// `ys_scale` times the sum of each group of four quants, eight per block, if wanted (the
    /// offset of the weight codes: 8 for Q4_0, 16 for Q5_0).
    pub(crate) ys: Option<&'a mut [i32]>,
    /// See `ys`.
    pub(crate) ys_scale: i32,
}

/// Quantises one activation row to Q8_0 (`q81 == false`) or Q8_1 blocks and fills the side
/// arrays; the same bits as [`quantize_row_q8_0`] / [`quantize_row_q8_1`].
pub(crate) fn quantize_row_q8(q81: bool, x: &[f32], out: &mut [u8], sides: Q8Sides<'_>) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: AVX2 and F16C were detected; `out` holds one block per 32 inputs, and the
        // side arrays one entry (eight for `ys`) per block, as the caller sized them.
        unsafe { crate::x86_ops::quantize_row_q8(q81, x, out, sides) };
        return;
    }
    if q81 {
        quantize_row_q8_1(x, out);
    } else {
        quantize_row_q8_0(x, out);
    }
    let (bb, qoff) = if q81 {
        (Q8_1_BYTES, 4)
    } else {
        (Q8_0_BYTES, 2)
    };
    let mut ys = sides.ys;
    for (b, blk) in out.chunks_exact(bb).enumerate().take(x.len() / QK) {
        sides.d[b] = rd_f16(blk, 0);
        if q81 {
            sides.s[b] = rd_f16(blk, 2);
        }
        if let Some(ys) = ys.as_deref_mut() {
            for l in 0..8 {
                let q = &blk[qoff + 4 * l..qoff + 4 * l + 4];
                ys[8 * b + l] = sides.ys_scale * q.iter().map(|&v| i32::from(v as i8)).sum::<i32>();
            }
        }
    }
}

/// Converts `x` to little-endian f16 bytes.
pub fn quantize_row_f16(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
    }
}

/// Writes `x` as little-endian f32 bytes.
pub fn quantize_row_f32(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// Converts one activation row to `act` format (one of [`act_type`]'s results).
pub fn quantize_act_row(act: GgmlType, x: &[f32], out: &mut [u8]) {
    match act {
        GgmlType::Q8_0 => quantize_row_q8_0(x, out),
        GgmlType::Q8_1 => quantize_row_q8_1(x, out),
        GgmlType::Q8K => crate::kquants::quantize_row_q8_k(x, out),
        GgmlType::F16 => quantize_row_f16(x, out),
        GgmlType::BF16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&crate::quantize::fp32_to_bf16(v).to_le_bytes());
            }
        }
        _ => quantize_row_f32(x, out),
    }
}

/// Quantises f32 values to `ty` blocks (for tests and tools that write synthetic models; not
/// used on the inference path). Every format follows llama.cpp's reference quantiser (what
/// `llama-quantize` runs without an importance matrix) operation for operation, so it writes
/// the bytes llama.cpp writes: the legacy formats here, the K-quants, Q5_1, IQ4_NL, IQ4_XS and
/// BF16 in `quantize`. A trailing partial block is dropped.
pub fn quantize_weights(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let n_blocks = x.len() / ty.block_size();
    let mut out = vec![0u8; n_blocks * ty.block_bytes()];
    match ty {
        GgmlType::F32 => quantize_row_f32(x, &mut out),
        GgmlType::F16 => quantize_row_f16(x, &mut out),
        GgmlType::Q8_0 => {
            // The reference rounds half away from zero (`roundf`), unlike the activation path.
            for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
                let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                for (o, &v) in ob[2..].iter_mut().zip(xb) {
                    *o = (v * id).round() as i32 as i8 as u8;
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let (bits, bb) = if ty == GgmlType::Q4_0 {
                (4, 18)
            } else {
                (5, 22)
            };
            let half = 1i32 << (bits - 1);
            for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
                let mut max = 0.0f32;
                for &v in xb {
                    if v.abs() > max.abs() {
                        max = v;
                    }
                }
                let d = max / -(half as f32);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                // `(int8_t)(x * id + 8.5f)`: one rounding of the sum, then truncation.
                let offset = half as f32 + 0.5;
                let q = |v: f32| ((v * id + offset) as i32).clamp(0, 2 * half - 1) as u8;
                let mut qh = 0u32;
                let nib = bb - 16;
                for j in 0..16 {
                    let (a, b) = (q(xb[j]), q(xb[j + 16]));
                    ob[nib + j] = (a & 0x0F) | ((b & 0x0F) << 4);
                    qh |= u32::from((a >> 4) & 1) << j;
                    qh |= u32::from((b >> 4) & 1) << (j + 16);
                }
                if ty == GgmlType::Q5_0 {
                    ob[2..6].copy_from_slice(&qh.to_le_bytes());
                }
            }
        }
        GgmlType::Q2K
        | GgmlType::Q3K
        | GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K
        | GgmlType::Q5_1
        | GgmlType::IQ4NL
        | GgmlType::IQ4XS
        | GgmlType::BF16 => {
            if let Some(q) = crate::quantize::quantize(ty, &x[..n_blocks * ty.block_size()]) {
                out = q;
            }
        }
        GgmlType::MXFP4 => quantize_mxfp4(x, &mut out),
        GgmlType::Q4_1 => {
            for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_1_BYTES)) {
                let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
                let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                ob[2..4].copy_from_slice(&f16::from_f32(min).to_bits().to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                for j in 0..16 {
                    ob[4 + j] = q(xb[j]) | (q(xb[j + 16]) << 4);
                }
            }
        }
        _ => {}
    }
    out
}

/// `quantize_row_mxfp4_ref`: the block's exponent from its largest magnitude
/// (`floor(log2(amax)) - 2 + 127`, with the C library's `log2f`, as ggml calls it), each value
/// the nearest table entry times the halved scale (the first on ties).
fn quantize_mxfp4(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(17)) {
        let amax = xb
            .iter()
            .fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let best = |v: f32| -> u8 {
            let mut best = 0;
            let mut err = (f32::from(MXFP4_VALUES[0]) * d - v).abs();
            for (i, &k) in MXFP4_VALUES.iter().enumerate().skip(1) {
                let e = (f32::from(k) * d - v).abs();
                if e < err {
                    best = i as u8;
                    err = e;
                }
            }
            best
        };
        ob[0] = e;
        for j in 0..16 {
            ob[1 + j] = best(xb[j]) | (best(xb[j + 16]) << 4);
        }
    }
}
