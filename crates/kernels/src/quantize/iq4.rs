//! The non-linear 4-bit types, IQ4_NL (32-value blocks) and IQ4_XS (256-value super-blocks of
//! 32): codes index a fixed table of 16 levels instead of an even grid, so quantising is a
//! nearest-level search under a scale tried at several values.

use super::{GROUP_MAX_EPS, QK_K, nearest_int, put_f16};

/// The 16 levels of IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `best_index_int8`: the index of the level of `val` (ascending) nearest to `x`.
fn best_index_int8(val: &[i8; 16], x: f32) -> u8 {
    let v = |i: usize| f32::from(val[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0, 15);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// `quantize_row_iq4_nl_impl` without importance weights and with `ntry` 7, for one IQ4_NL
/// block (32 values: d 0, qs 2..18) or one IQ4_XS super-block (256 values: d 0, scales_h 2,
/// scales_l 4..8, qs 8..136).
pub(super) fn iq4(x: &[f32], out: &mut [u8]) {
    const NTRY: i32 = 7;
    let values = &KVALUES_IQ4NL;
    let v0 = f32::from(values[0]);
    let nb = x.len() / 32;
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 32];
    let mut weight = [0.0f32; 32];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..nb {
        let xb = &x[32 * ib..32 * ib + 32];
        for (w, &v) in weight.iter_mut().zip(xb) {
            *w = v * v;
        }
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        // Weighted sums of level times value and level squared at inverse scale `id`.
        let sums = |id: f32, lb: Option<&mut [u8]>| {
            let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
            let mut lb = lb;
            for j in 0..32 {
                let k = best_index_int8(values, id * xb[j]);
                if let Some(lb) = lb.as_deref_mut() {
                    lb[j] = k;
                }
                let q = f32::from(values[usize::from(k)]);
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            (sumqx, sumq2)
        };
        let d0 = -max / v0;
        let (sumqx, sumq2) = sums(1.0 / d0, Some(&mut l[32 * ib..32 * ib + 32]));
        let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            let (sumqx, sumq2) = sums((itry + i32::from(values[0])) as f32 / max, None);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let q4 = if nb > 1 {
        let d = -max_scale / 32.0;
        put_f16(out, 0, d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
        for ib in 0..nb {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 32 * ib..32 * ib + 32 {
                l[j] = best_index_int8(values, idl * x[j]);
            }
            let li = (li + 32) as u8;
            if ib % 2 == 0 {
                scales_l[ib / 2] = li & 0xF;
            } else {
                scales_l[ib / 2] |= (li & 0xF) << 4;
            }
            scales_h |= u16::from(li >> 4) << (2 * (ib % 8));
        }
        out[2..4].copy_from_slice(&scales_h.to_le_bytes());
        out[4..8].copy_from_slice(&scales_l);
        &mut out[8..]
    } else {
        put_f16(out, 0, scales[0]);
        let id = if scales[0] != 0.0 {
            1.0 / scales[0]
        } else {
            0.0
        };
        for (lj, &v) in l.iter_mut().zip(x) {
            *lj = best_index_int8(values, id * v);
        }
        &mut out[2..]
    };
    for i in 0..nb {
        for j in 0..16 {
            q4[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}
