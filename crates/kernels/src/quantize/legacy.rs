//! The legacy 32-value block types (one scale and one minimum per block, no super-block);
//! Q5_1 is the one a synthetic model is written in.

use super::{c_int, put_f16};

/// `quantize_row_q5_1_ref`, one block: d 0, m 2, qh 4..8, qs 8..24.
pub(super) fn q5_1(x: &[f32], out: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    put_f16(out, 2, min);
    let mut qh = 0u32;
    for j in 0..16 {
        // `(uint8_t)(x0 + 0.5f)`: a truncating conversion to int, then the low byte.
        let xi0 = c_int((x[j] - min) * id + 0.5) as u8;
        let xi1 = c_int((x[j + 16] - min) * id + 0.5) as u8;
        out[8 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= u32::from((xi0 & 0x10) >> 4) << j;
        qh |= u32::from((xi1 & 0x10) >> 4) << (j + 16);
    }
    out[4..8].copy_from_slice(&qh.to_le_bytes());
}
