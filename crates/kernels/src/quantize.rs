//! llama.cpp's reference weight quantisers, ported operation for operation.
//!
//! Synthetic models (`strata synth`, the parity tests) must carry the bytes llama.cpp's quantiser
//! writes, so that a model strata quantises and the same f32 model quantised by `llama-quantize`
//! are one file and llama.cpp's logits are a valid reference for ours. [`quantize`] therefore
//! reproduces what `ggml_quantize_chunk` runs without an importance matrix, not just something
//! close to it: the same f32 operations in the same order (ggml-quants.c is built for baseline
//! x86-64, so there is no fused multiply-add to imitate), the same float-to-int conversions
//! (`nearest_int`'s round half to even, C's truncating casts) and ggml's own f16 and bf16
//! conversions. `fixtures/quant/vectors.json` (written by `scripts/make-quant-vectors.py` from
//! llama.cpp's output) pins the result byte for byte.
//!
//! Which C function each type follows:
//!
//! | type | `ggml_quantize_chunk` (imatrix NULL) runs |
//! |------|-------------------------------------------|
//! | Q2_K | `quantize_row_q2_K_ref` (`make_qkx2_quants`, 16 values, MAD error) |
//! | Q3_K | `quantize_row_q3_K_ref` (`make_q3_quants`) |
//! | Q4_K | `quantize_row_q4_K_ref` (`make_qkx2_quants`, 32 values) |
//! | Q5_K | `quantize_row_q5_K_ref` (`make_qkx2_quants`, 32 values) |
//! | Q6_K | `quantize_row_q6_K_ref` (`make_qx_quants`, rmse type 1) |
//! | Q5_1 | `quantize_row_q5_1_ref` |
//! | IQ4_NL | `quantize_iq4_nl`: `quantize_row_iq4_nl_impl(32, 32, .., ntry 7)` |
//! | IQ4_XS | `quantize_iq4_xs`: `quantize_row_iq4_nl_impl(256, 32, .., ntry 7)` |
//! | BF16 | `ggml_fp32_to_bf16_row_ref` (`ggml_compute_fp32_to_bf16`) |
//!
//! IQ4_NL goes through `quantize_iq4_nl` (7 extra scale tries), not `quantize_row_iq4_nl_ref`
//! (none), because that is what `ggml_quantize_chunk` calls.

use strata_gguf::GgmlType;

const QK_K: usize = 256;
/// Below this absolute maximum a group counts as all zeros (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;
/// The 16 levels of IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Quantises `x` to `ty` exactly as llama.cpp's `ggml_quantize_chunk` does without an importance
/// matrix. `None` if `ty` is not one of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q5_1, IQ4_NL, IQ4_XS and
/// BF16, or if `x` is not a whole number of `ty`'s blocks. Any input, finite or not, gives bytes.
pub(crate) fn quantize(ty: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    let block: fn(&[f32], &mut [u8]) = match ty {
        GgmlType::Q2K => q2_k,
        GgmlType::Q3K => q3_k,
        GgmlType::Q4K => q4_k,
        GgmlType::Q5K => q5_k,
        GgmlType::Q6K => q6_k,
        GgmlType::Q5_1 => q5_1,
        GgmlType::IQ4NL | GgmlType::IQ4XS => iq4,
        GgmlType::BF16 => |x, out| out.copy_from_slice(&fp32_to_bf16(x[0]).to_le_bytes()),
        _ => return None,
    };
    let (n, bytes) = (ty.block_size(), ty.block_bytes());
    if !x.len().is_multiple_of(n) {
        return None;
    }
    let mut out = vec![0u8; x.len() / n * bytes];
    for (xb, ob) in x.chunks_exact(n).zip(out.chunks_exact_mut(bytes)) {
        block(xb, ob);
    }
    Some(out)
}

// ---------------------------------------------------------------- conversions

/// Round half to even through the float adder (`nearest_int`); meaningless but harmless beyond
/// +-4194303, where the C code asserts in debug builds only.
#[inline]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    ((v.to_bits() & 0x007F_FFFF) as i32) - 0x0040_0000
}

/// C's `(int)f` as x86-64 compiles it (`cvttss2si`): truncation toward zero, and `INT_MIN` for
/// NaN and out-of-range values (where Rust's `as` would saturate).
#[inline]
fn c_int(f: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        f as i32
    } else {
        i32::MIN
    }
}

/// `ggml_compute_fp32_to_fp16`: ggml's portable conversion (round to nearest even; every NaN
/// becomes 0x7E00 with its sign).
fn fp32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// `ggml_compute_fp16_to_fp32`.
fn fp16_to_fp32(h: u16) -> f32 {
    let w = u32::from(h) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    let exp_scale = f32::from_bits(0x0780_0000); // 2^-112
    let normalized = f32::from_bits((two_w >> 4) + (0xE0 << 23)) * exp_scale;
    let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
    let mag = if two_w < (1 << 27) {
        denormalized
    } else {
        normalized
    };
    f32::from_bits(sign | mag.to_bits())
}

/// `ggml_compute_fp32_to_bf16`: round to nearest even, NaN kept (and made quiet).
pub(crate) fn fp32_to_bf16(s: f32) -> u16 {
    let u = s.to_bits();
    if u & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7FFF + ((u >> 16) & 1)) >> 16) as u16
}

/// Stores `v` as ggml's f16 at `out[at..at + 2]` and returns the value stored (what the C code
/// reads back with `GGML_FP16_TO_FP32`).
fn put_f16(out: &mut [u8], at: usize, v: f32) -> f32 {
    let h = fp32_to_fp16(v);
    out[at..at + 2].copy_from_slice(&h.to_le_bytes());
    fp16_to_fp32(h)
}

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
fn q2_k(x: &[f32], out: &mut [u8]) {
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
fn q3_k(x: &[f32], out: &mut [u8]) {
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
fn q4_k(x: &[f32], out: &mut [u8]) {
    let l = q45_k(x, out, 15, -1.0, 20);
    for (c, qs) in out[16..].chunks_exact_mut(32).enumerate() {
        for (k, q) in qs.iter_mut().enumerate() {
            *q = l[64 * c + k] | (l[64 * c + k + 32] << 4);
        }
    }
}

/// `quantize_row_q5_K_ref`, one block: d 0, dmin 2, scales 4..16, qh 16..48, qs 48..176.
fn q5_k(x: &[f32], out: &mut [u8]) {
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
fn q6_k(x: &[f32], out: &mut [u8]) {
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

/// `quantize_row_q5_1_ref`, one block: d 0, m 2, qh 4..8, qs 8..24.
fn q5_1(x: &[f32], out: &mut [u8]) {
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

/// `quantize_row_iq4_nl_impl` without importance weights and with `ntry` 7, for one IQ4_NL
/// block (32 values: d 0, qs 2..18) or one IQ4_XS super-block (256 values: d 0, scales_h 2,
/// scales_l 4..8, qs 8..136).
fn iq4(x: &[f32], out: &mut [u8]) {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// Every type [`quantize`] supports.
    const TYPES: [GgmlType; 9] = [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q5_1,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::BF16,
    ];
    const ROWS: usize = 16;
    const N_PER_ROW: usize = 4096;

    /// splitmix64, as `SplitMix` in scripts/make-quant-vectors.py.
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// In [-1, 1), exact: an integer below 2^24 over 2^23, minus one.
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / 8_388_608.0 - 1.0
        }
    }

    /// Row `kind` of the fixture's input (`case` in scripts/make-quant-vectors.py).
    pub(crate) fn case(kind: usize) -> Vec<f32> {
        let mut r = SplitMix(1000 + kind as u64);
        (0..N_PER_ROW)
            .map(|i| match kind {
                0 => r.unit(),
                1 => r.unit() * 0.02,
                2 => 0.0,
                3 => r.unit() * 1e-30,
                4 => r.unit() * 1e-7,
                5 => {
                    let v = r.unit() * 0.01;
                    match i {
                        17 => 1000.0,
                        2049 => -300.0,
                        _ => v,
                    }
                }
                6 => -r.unit().abs() * 0.5,
                7 => r.unit().abs() * 3.0,
                8 => {
                    let (a, b, c) = (r.unit(), r.unit(), r.unit());
                    (a + b + c) * 0.05
                }
                9 => r.unit() * f32::from_bits(((127 + i / 32 % 24 - 12) as u32) << 23),
                10 => {
                    let m = r.next();
                    let u = r.unit();
                    if m.is_multiple_of(10) { u * 0.5 } else { 0.0 }
                }
                11 => (i / 32 % 7) as f32 * 0.125 - 0.375,
                12 => r.unit() * 1e5,
                13 => ((r.next() % 17) as i32 - 8) as f32 * 0.25,
                14 => r.unit() * if i % 2 == 0 { 1e3 } else { 1e-3 },
                _ => {
                    let u = r.unit();
                    if i % 32 == 5 { u } else { 0.0 }
                }
            })
            .collect()
    }

    fn hex(d: impl AsRef<[u8]>) -> String {
        d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn writes_the_bytes_llama_cpp_writes() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../fixtures/quant/vectors.json"))
                .expect("fixtures/quant/vectors.json parses");
        assert_eq!(doc["rows"], ROWS);
        assert_eq!(doc["n_per_row"], N_PER_ROW);
        let x: Vec<f32> = (0..ROWS).flat_map(case).collect();
        let raw: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            hex(Sha256::digest(&raw)),
            doc["input_sha256"],
            "the generator differs from scripts/make-quant-vectors.py"
        );
        let types = doc["types"].as_object().expect("a types object");
        assert_eq!(types.len(), TYPES.len());
        let mut wrong = Vec::new();
        for (name, t) in types {
            let id = t["id"].as_u64().expect("a type id") as u32;
            let ty = GgmlType::from_id(id).expect("a known type id");
            let q = quantize(ty, &x).expect("a supported type");
            assert_eq!(
                q.len() as u64,
                t["bytes"].as_u64().expect("a length"),
                "{name}"
            );
            let row = q.len() / ROWS;
            let rows = t["row_sha256"].as_array().expect("row digests");
            for (r, want) in rows.iter().enumerate() {
                if hex(Sha256::digest(&q[r * row..(r + 1) * row])) != *want {
                    wrong.push(format!("{name} row {r}"));
                }
            }
            if hex(Sha256::digest(&q)) != t["sha256"] {
                wrong.push(format!("{name} (whole)"));
            }
        }
        assert!(wrong.is_empty(), "bytes differ from llama.cpp's: {wrong:?}");
    }

    #[test]
    fn lengths_are_whole_blocks_and_output_is_deterministic() {
        let mut r = SplitMix(7);
        for ty in TYPES {
            for blocks in [1, 3] {
                let x: Vec<f32> = (0..blocks * ty.block_size()).map(|_| r.unit()).collect();
                let q = quantize(ty, &x).expect("a supported type");
                assert_eq!(q.len(), blocks * ty.block_bytes(), "{ty}");
                assert_eq!(quantize(ty, &x), Some(q), "{ty}");
            }
            if ty.block_size() > 1 {
                assert_eq!(quantize(ty, &[0.5; 33]), None, "{ty}: 33 values");
            }
        }
        assert_eq!(quantize(GgmlType::Q8_0, &[0.0; 32]), None);
        assert_eq!(quantize(GgmlType::F16, &[0.0; 32]), None);
    }

    #[test]
    fn dequantised_output_is_close_to_the_input() {
        // Worst absolute error on uniform [-1, 1) input, about 1.4 times what llama.cpp's
        // bytes give (Q2_K 0.31, Q3_K 0.21, Q4_K 0.089, Q5_K 0.038, Q6_K 0.016, Q5_1 0.032,
        // IQ4_XS 0.11, BF16 0.0019); `None` where this crate cannot dequantise the type yet
        // (lengths and determinism are checked for every type above).
        let bound = |ty| match ty {
            GgmlType::Q2K => Some(0.45),
            GgmlType::Q3K => Some(0.3),
            GgmlType::Q4K => Some(0.13),
            GgmlType::Q5K | GgmlType::Q5_1 => Some(0.06),
            GgmlType::Q6K => Some(0.025),
            GgmlType::IQ4XS => Some(0.16),
            GgmlType::BF16 => Some(0.004),
            _ => None,
        };
        let mut r = SplitMix(3);
        let x: Vec<f32> = (0..1024).map(|_| r.unit()).collect();
        for ty in TYPES {
            let Some(bound) = bound(ty) else { continue };
            let q = quantize(ty, &x).expect("a supported type");
            let mut back = vec![0.0f32; x.len()];
            if ty == GgmlType::BF16 {
                for (b, c) in back.iter_mut().zip(q.chunks_exact(2)) {
                    *b = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
                }
            } else {
                crate::formats::dequantize_row(ty, &q, &mut back);
            }
            let err = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err <= bound, "{ty}: max error {err} above {bound}");
        }
    }

    #[test]
    fn non_finite_inputs_give_bytes_not_panics() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
        ];
        for ty in TYPES {
            for (k, &s) in specials.iter().enumerate() {
                let mut x = case(k);
                x.truncate(512);
                x[k * 37] = s;
                let q = quantize(ty, &x).expect("a supported type");
                assert_eq!(q.len(), 512 / ty.block_size() * ty.block_bytes(), "{ty}");
                assert_eq!(quantize(ty, &vec![s; 512]).map(|q| q.len()), Some(q.len()));
            }
            // Arbitrary bit patterns: NaN payloads, subnormals, signed zeros, huge values.
            let mut r = SplitMix(ty.id().into());
            for _ in 0..32 {
                let x: Vec<f32> = (0..512).map(|_| f32::from_bits(r.next() as u32)).collect();
                assert_eq!(
                    quantize(ty, &x).map(|q| q.len()),
                    Some(512 / ty.block_size() * ty.block_bytes())
                );
            }
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let got: Vec<i32> = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, -0.0]
            .map(nearest_int)
            .to_vec();
        assert_eq!(got, [0, 2, 2, 0, -2, -2, 2, 0]);
        assert_eq!(c_int(31.9), 31);
        assert_eq!(c_int(-0.9), 0);
        assert_eq!(c_int(f32::NAN), i32::MIN);
        assert_eq!(c_int(3e9), i32::MIN);
    }

    #[test]
    fn ggml_half_conversions_agree_with_ieee_rounding() {
        // Every f16 reads back as the IEEE value, and converting it again is the identity.
        for h in 0..=u16::MAX {
            let v = half::f16::from_bits(h);
            if v.is_nan() {
                assert!(fp16_to_fp32(h).is_nan());
                continue;
            }
            assert_eq!(fp16_to_fp32(h).to_bits(), v.to_f32().to_bits(), "{h:#06x}");
            assert_eq!(fp32_to_fp16(v.to_f32()), h, "{h:#06x}");
        }
        // Values between f16s (ties included) round as IEEE round-to-nearest-even does.
        let mut r = SplitMix(11);
        for _ in 0..100_000 {
            let v = f32::from_bits(r.next() as u32);
            if !v.is_nan() {
                assert_eq!(fp32_to_fp16(v), half::f16::from_f32(v).to_bits(), "{v:e}");
            }
        }
        assert_eq!(fp32_to_fp16(f32::NAN), 0x7E00);
        assert_eq!(fp32_to_bf16(1.0), 0x3F80);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80); // tie, to even
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82); // tie, to even
        assert_eq!(fp32_to_bf16(f32::from_bits(0x7F80_0001)), 0x7FC0); // NaN made quiet
    }
}
