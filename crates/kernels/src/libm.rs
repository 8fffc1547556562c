//! The C library's `tanhf` as llama.cpp's builds get it from glibc, on either architecture.
//!
//! ggml calls `tanhf` for GELU's table and for soft-capping. glibc's `tanhf` (and the
//! `expm1f` under it) is the same C code on x86-64 and aarch64, but the aarch64 build fuses
//! several of its multiplies and adds, which moves about one result in ten thousand by an ulp.
//! An f16 GELU table built from either differs in a few entries, enough to change a model's
//! greedy output. strata therefore computes `tanhf` itself, operation for operation as the
//! flavour's C library does (`fused`: the aarch64 build's contractions, read off its code), so
//! every flavour gives its bits on every CPU.

/// `tanhf(x)` as glibc computes it; `fused` selects its aarch64 build (see the module docs).
pub(crate) fn tanhf(x: f32, fused: bool) -> f32 {
    let jx = x.to_bits();
    let ix = jx & 0x7FFF_FFFF;
    if ix > 0x7F7F_FFFF {
        // NaN or infinity: 1/x +- 1.
        return if jx >> 31 == 0 {
            1.0 / x + 1.0
        } else {
            1.0 / x - 1.0
        };
    }
    let ax = x.abs();
    let z = if ix > 0x41AF_FFFF {
        // |x| >= 22: 1 - tiny.
        1.0 - f32::from_bits(0x0DA2_4260)
    } else if ix == 0 {
        return x;
    } else if ix <= 0x23FF_FFFF {
        // |x| < 2^-55: x * (1 + x).
        return x * (1.0 + x);
    } else if ix <= 0x3F7F_FFFF {
        let t = expm1f(-2.0 * ax, fused);
        -t / (t + 2.0)
    } else {
        let t = expm1f(ax + ax, fused);
        1.0 - 2.0 / (t + 2.0)
    };
    if jx >> 31 == 0 { z } else { -z }
}

/// `a * b + c`, fused or rounded twice.
#[inline(always)]
fn madd(fused: bool, a: f32, b: f32, c: f32) -> f32 {
    if fused { a.mul_add(b, c) } else { a * b + c }
}

/// glibc's `expm1f` (fdlibm's algorithm), for the arguments [`tanhf`] passes (finite, not
/// below -27 ln 2 by more than the early exit handles).
fn expm1f(x: f32, fused: bool) -> f32 {
    const LN2_HI: f32 = f32::from_bits(0x3F31_7180);
    const LN2_LO: f32 = f32::from_bits(0x3717_F7D1);
    const INVLN2: f32 = f32::from_bits(0x3FB8_AA3B);
    const Q: [f32; 5] = [
        f32::from_bits(0xBD08_8889),
        f32::from_bits(0x3AD0_0D01),
        f32::from_bits(0xB8A6_70CD),
        f32::from_bits(0x3686_7E54),
        f32::from_bits(0xB457_EDBB),
    ];
    let hx = x.to_bits() & 0x7FFF_FFFF;
    let negative = x.to_bits() >> 31 != 0;
    if hx >= 0x4195_B844 {
        // |x| >= 27 ln 2.
        if hx >= 0x42B1_7218 {
            if hx > 0x7F80_0000 {
                return x + x;
            }
            if hx == 0x7F80_0000 {
                return if negative { -1.0 } else { x };
            }
            if x > f32::from_bits(0x42B1_7180) {
                return f32::INFINITY;
            }
        }
        if negative {
            return f32::from_bits(0x0DA2_4260) - 1.0;
        }
    }
    // Argument reduction: x = k ln 2 + (hi - lo), c the rounding of hi - lo.
    let (x, c, k) = if hx > 0x3EB1_7218 {
        let (hi, lo, k) = if hx < 0x3F85_1592 {
            if negative {
                (x + LN2_HI, -LN2_LO, -1)
            } else {
                (x - LN2_HI, LN2_LO, 1)
            }
        } else {
            let k = (INVLN2 * x + if negative { -0.5 } else { 0.5 }) as i32;
            let t = k as f32;
            (madd(fused, -t, LN2_HI, x), t * LN2_LO, k)
        };
        let r = hi - lo;
        (r, (hi - r) - lo, k)
    } else if hx < 0x3300_0000 {
        // |x| < 2^-25: x itself.
        return x;
    } else {
        (x, 0.0, 0)
    };
    let hfx = 0.5 * x;
    let hxs = x * hfx;
    let mut r1 = madd(fused, hxs, Q[4], Q[3]);
    for q in [Q[2], Q[1], Q[0], 1.0] {
        r1 = madd(fused, r1, hxs, q);
    }
    let t = madd(fused, -hfx, r1, 3.0);
    let e = (r1 - t) / madd(fused, -x, t, 6.0) * hxs;
    if k == 0 {
        // x - (x * e - hxs).
        return x - madd(fused, x, e, -hxs);
    }
    // e = (x * (e - c) - c) - hxs.
    let e = madd(fused, x, e - c, -c) - hxs;
    let with_exponent = |y: f32| f32::from_bits(y.to_bits().wrapping_add((k << 23) as u32));
    match k {
        -1 => madd(fused, x - e, 0.5, -0.5),
        1 if x < -0.25 => (e - (x + 0.5)) * -2.0,
        1 => madd(fused, x - e, 2.0, 1.0),
        k if k <= -2 || k > 56 => with_exponent(1.0 - (e - x)) - 1.0,
        k if k < 23 => {
            let t = f32::from_bits(0x3F80_0000 - (0x0100_0000 >> k));
            with_exponent(t - (e - x))
        }
        k => {
            let t = f32::from_bits(((0x7F - k) << 23) as u32);
            with_exponent(x - (e + t) + 1.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On this CPU's own flavour the port gives the C library's bits (`f32::tanh` is glibc's
    /// `tanhf`): x86-64 without fusing, aarch64 with. Sampled densely over the range GELU and
    /// soft-capping use, plus the edges.
    #[test]
    fn tanhf_is_the_c_librarys() {
        let fused = cfg!(target_arch = "aarch64");
        let mut checked = 0u64;
        let mut bits = 0x2000_0000u32;
        let edges = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            22.0,
            -22.0,
            1e-30,
            f32::INFINITY,
            f32::NAN,
        ];
        let check = |x: f32| {
            let (ours, libc) = (tanhf(x, fused), x.tanh());
            assert!(
                ours.to_bits() == libc.to_bits() || (ours.is_nan() && libc.is_nan()),
                "tanhf({x:e} = {:#010x}): {ours:e} vs the C library's {libc:e}",
                x.to_bits()
            );
        };
        for x in edges {
            check(x);
        }
        while bits < 0x4200_0000 {
            let x = f32::from_bits(bits);
            check(x);
            check(-x);
            checked += 1;
            bits += 61;
        }
        assert!(checked > 5_000_000);
    }
}
