//! The K-quants (Q2_K to Q6_K): 256-value super-blocks of 16 or 32-value groups, each group's
//! scale (and minimum) found by a search over candidate scales, then stored quantised under
//! the super-block's f16 scales. The three searches are llama.cpp's, each used by the types
//! its C code uses it for.

use super::{GROUP_MAX_EPS, QK_K, nearest_int, put_f16};

// ---------------------------------------------------------------- scale searches

/// `make_qkx2_quants`: codes `0..=nmax` for `x` with a scale and a minimum, trying `nstep + 1`
/// scales and keeping the one with the least weighted error. Returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut laux = [0u8; 32];
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        let diff = scale * f32::from(l[i]) + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qx_quants` with `rmse_type` 1 and no importance weights: signed codes `-nmax..nmax`
/// (stored plus `nmax`) weighted by `x^2`, trying 18 scales around `nmax / max`.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let code = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = code(iscale, v);
        *li = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = code(iscale, v);
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (nmax + code(iscale, v)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with `do_rmse`: signed codes `-nmax..nmax` (stored plus `nmax`, or all zero
/// for an all-zero group) refined one value at a time for up to five passes.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let cur = f32::from(*li);
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*li) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

// ---------------------------------------------------------------- block quantisers

/// Packs four 2-bit code planes (`quantize_row_q2_K_ref` and `_q3_K_ref`'s `qs`).
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] =
                l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`, one block: scales 0..16, qs 16..80, d 80, dmin 82.
pub(super) fn q2_k(x: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut weights = [0.0f32; 16];
    let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (s, m) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..], -0.5, 0.1, 15, true);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let (sc, rest) = out.split_at_mut(16);
    let d = if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (b, &s) in sc.iter_mut().zip(&scales) {
            *b = nearest_int(iscale * s) as u8;
        }
        put_f16(rest, 64, max_scale / 15.0)
    } else {
        sc.fill(0);
        put_f16(rest, 64, 0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (b, &m) in sc.iter_mut().zip(&mins) {
            *b |= (nearest_int(iscale * m) << 4) as u8;
        }
        put_f16(rest, 66, max_min / 15.0)
    } else {
        put_f16(rest, 66, 0.0)
    };
    for j in 0..16 {
        let dj = d * f32::from(sc[j] & 0xF);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(sc[j] >> 4);
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / dj).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, &mut rest[..64]);
}

/// `quantize_row_q3_K_ref`, one block: hmask 0..32, qs 32..96, scales 96..108, d 108.
pub(super) fn q3_k(x: &[f32], out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    let (hmask, rest) = out.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, dh) = rest.split_at_mut(12);
    sc.fill(0);
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // `int8_t l = nearest_int(..)`: the C code truncates before clamping.
            let mut q = (i32::from(nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                sc[j] = q & 0xF;
            } else {
                sc[j - 8] |= (q & 0xF) << 4;
            }
            q >>= 4;
            sc[j % 4 + 8] |= q << (2 * (j / 4));
        }
        put_f16(dh, 0, 1.0 / iscale)
    } else {
        put_f16(dh, 0, 0.0)
    };
    for j in 0..16 {
        let lo = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
        let s = i32::from(lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        let dj = d * s as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-4, 3) + 4) as i8;
        }
    }
    hmask.fill(0);
    let mut codes = [0u8; QK_K];
    for (j, (c, &q)) in codes.iter_mut().zip(&l).enumerate() {
        // High bit of value j goes to bit j / 32 of hmask[j % 32].
        let mut q = q as u8;
        if q > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            q -= 4;
        }
        *c = q;
    }
    pack_2bit(&codes, qs);
}

/// The shared part of `quantize_row_q4_K_ref` and `_q5_K_ref`: eight sub-block scales and mins
/// (`make_qkx2_quants` with weights `rms + |x|`) packed into `out[4..16]` behind d and dmin,
/// and the codes `0..=nmax` they give.
fn q45_k(x: &[f32], out: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut weights = [0.0f32; 32];
    let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let d = put_f16(out, 0, max_scale / 63.0);
    let dmin = put_f16(out, 2, max_min / 63.0);
    let sc = &mut out[4..16];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    for j in 0..8 {
        // get_scale_min_k4
        let (s, m) = if j < 4 {
            (sc[j] & 63, sc[j + 4] & 63)
        } else {
            (
                (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
                (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
            )
        };
        let dj = d * f32::from(s);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(m);
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    l
}

/// `quantize_row_q4_K_ref`, one block: d 0, dmin 2, scales 4..16, qs 16..144.
pub(super) fn q4_k(x: &[f32], out: &mut [u8]) {
    let l = q45_k(x, out, 15, -1.0, 20);
    for (c, qs) in out[16..].chunks_exact_mut(32).enumerate() {
        for (k, q) in qs.iter_mut().enumerate() {
            *q = l[64 * c + k] | (l[64 * c + k + 32] << 4);
        }
    }
}

/// `quantize_row_q5_K_ref`, one block: d 0, dmin 2, scales 4..16, qh 16..48, qs 48..176.
pub(super) fn q5_k(x: &[f32], out: &mut [u8]) {
    let l = q45_k(x, out, 31, -0.5, 15);
    let (qh, ql) = out[16..].split_at_mut(32);
    qh.fill(0);
    for (c, qs) in ql.chunks_exact_mut(32).enumerate() {
        for (k, q) in qs.iter_mut().enumerate() {
            let (mut l1, mut l2) = (l[64 * c + k], l[64 * c + k + 32]);
            if l1 > 15 {
                l1 -= 16;
                qh[k] |= 1 << (2 * c);
            }
            if l2 > 15 {
                l2 -= 16;
                qh[k] |= 2 << (2 * c);
            }
            *q = l1 | (l2 << 4);
        }
    }
}

/// `quantize_row_q6_K_ref`, one block: ql 0..128, qh 128..192, scales 192..208, d 208.
pub(super) fn q6_k(x: &[f32], out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        out.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = put_f16(out, 208, 1.0 / iscale);
    for (ib, &s) in scales.iter().enumerate() {
        out[192 + ib] = nearest_int(iscale * s).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let dj = d * f32::from(out[192 + j] as i8);
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    let l = l.map(|v| v as u8);
    let (ql, rest) = out.split_at_mut(128);
    let qh = &mut rest[..64];
    for h in 0..2 {
        let (j, ql, qh) = (128 * h, &mut ql[64 * h..], &mut qh[32 * h..]);
        for k in 0..32 {
            let (a, b, c, e) = (l[j + k], l[j + k + 32], l[j + k + 64], l[j + k + 96]);
            ql[k] = (a & 0xF) | ((c & 0xF) << 4);
            ql[k + 32] = (b & 0xF) | ((e & 0xF) << 4);
            qh[k] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
        }
    }
}
