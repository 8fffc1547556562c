//! Element-wise and row-wise operations of a transformer layer, written to round where ggml
//! rounds (products in f32, long sums in f64) so hidden states track llama.cpp's closely.

use crate::attn::Flavour;

/// RMS normalisation with a learned scale: `out = (x * 1/sqrt(mean(x^2) + eps)) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// [`rms_norm`] of `x` into itself.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    scale_by(x, scale, w);
}

/// The factor [`rms_norm`] multiplies `x` by, `1/sqrt(mean(x^2) + eps)`: squares in f32, their
/// sum in f64, as ggml's `rms_norm` computes it.
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0f32 / (mean + eps).sqrt()
}

/// `x = (x * scale) * w`: the second half of an RMSNorm whose factor came from a wider row
/// ([`rms_scale`] of a whole row, applied to a shard's slice of it).
pub fn scale_by(x: &mut [f32], scale: f32, w: &[f32]) {
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// A model's rotary embedding frequencies.
#[derive(Clone, Copy, Debug)]
pub struct RopeFreqs<'a> {
    /// Rotated dimensions of a head.
    pub n_dims: usize,
    /// Frequency base.
    pub base: f32,
    /// Linear position scale (1 without scaling).
    pub freq_scale: f32,
    /// Per-frequency divisors (Llama 3's `rope_freqs`, LongRoPE's factors), `n_dims / 2`.
    pub factors: Option<&'a [f32]>,
    /// Magnitude of the cosines and sines (ggml's `attn_factor`, 1 without scaling).
    pub mscale: f32,
    /// YaRN: how far the fast-rotating dimensions keep their unscaled angle (ggml's
    /// `ext_factor`; 0 turns YaRN off, 1 with `rope.scaling.type = yarn`).
    pub ext_factor: f32,
    /// YaRN's correction range, in rotations over the original context (`beta_fast`,
    /// `beta_slow`; 32 and 1 unless the model says otherwise).
    pub beta: (f32, f32),
    /// The context the model was trained for before scaling (YaRN's correction dims).
    pub n_ctx_orig: usize,
}

impl RopeFreqs<'_> {
    /// Plain RoPE: no scaling, no factors.
    pub fn plain(n_dims: usize, base: f32) -> RopeFreqs<'static> {
        RopeFreqs {
            n_dims,
            base,
            freq_scale: 1.0,
            factors: None,
            mscale: 1.0,
            ext_factor: 0.0,
            beta: (32.0, 1.0),
            n_ctx_orig: 0,
        }
    }

    /// YaRN's first and last corrected dimension pair, as ggml's `ggml_rope_yarn_corr_dims`
    /// computes them (in f32, from the rotations `beta` over the original context).
    fn yarn_corr_dims(&self) -> [f32; 2] {
        let n_dims = self.n_dims as f32;
        let dim = |rotations: f32| {
            n_dims * (self.n_ctx_orig as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.base.ln())
        };
        let start = dim(self.beta.0).floor();
        let end = dim(self.beta.1).ceil();
        [start.max(0.0), end.min(n_dims - 1.0)]
    }
}

/// YaRN's ramp between interpolated and extrapolated angles for pair `i` (ggml's
/// `rope_yarn_ramp`, which takes the dimension `2 i` and halves it again).
fn yarn_ramp(corr: [f32; 2], i: usize) -> f32 {
    let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// Cosine/sine table of rotary embeddings for one position, computed as ggml's rope cache does:
/// the angle advances by repeated multiplication, each pair's angle is divided by its frequency
/// factor (1 when absent) and multiplied by the linear scale; cosines and sines are then
/// multiplied by `mscale` (each step an exact no-op at 1). With YaRN (`ext_factor` not 0) each
/// pair's angle mixes the scaled and unscaled angles along a ramp over the correction dims, and
/// the magnitude grows by `1 + 0.1 ln(1 / freq_scale)`, as in ggml's `rope_yarn`.
pub fn rope_table(pos: usize, f: &RopeFreqs<'_>, out_cos: &mut [f32], out_sin: &mut [f32]) {
    let theta_scale = f.base.powf(-2.0 / f.n_dims as f32);
    let yarn = (f.ext_factor != 0.0).then(|| {
        // ggml-cpu is built with FMA, and GCC contracts `1.0f + 0.1f * x` into one.
        let mscale = f.mscale * 0.1f32.mul_add((1.0 / f.freq_scale).ln(), 1.0);
        (f.yarn_corr_dims(), mscale)
    });
    let mut theta = pos as f32;
    for i in 0..f.n_dims / 2 {
        let ff = f.factors.map_or(1.0, |v| v[i]);
        let extrap = theta / ff;
        let interp = f.freq_scale * extrap;
        let (angle, mscale) = match yarn {
            None => (interp, f.mscale),
            Some((corr, mscale)) => {
                let mix = yarn_ramp(corr, i) * f.ext_factor;
                // `interp * (1 - mix) + extrap * mix`, contracted as GCC contracts it.
                (interp.mul_add(1.0 - mix, extrap * mix), mscale)
            }
        };
        out_cos[i] = angle.cos() * mscale;
        out_sin[i] = angle.sin() * mscale;
        theta *= theta_scale;
    }
}

#[inline(always)]
fn rope_impl(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (pair, (&c, &s)) in x.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
        let (x0, x1) = (pair[0], pair[1]);
        // GCC contracts ggml's `x0*c - x1*s` and `x0*s + x1*c` into these fused forms; the
        // rounding differs from the plain expressions in the last bit.
        pair[0] = x0.mul_add(c, -(x1 * s));
        pair[1] = x0.mul_add(s, x1 * c);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rope_fma(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    rope_impl(x, cos, sin)
}

/// Rotates adjacent pairs `(x[2i], x[2i+1])` of one head by the table's angles (ggml's `NORM`
/// mode, with its fused multiply-adds).
pub fn rope_apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2 and FMA are available.
        return unsafe { rope_fma(x, cos, sin) };
    }
    rope_impl(x, cos, sin)
}

/// [`rope_apply`] as llama.cpp's aarch64 build computes it: GCC vectorises its loop over
/// adjacent pairs four pairs at a time there and contracts `x0*cos - x1*sin` the other way
/// round (`x0*cos` rounded, `x1*sin` fused); the pairs past the last four keep the scalar form.
pub fn rope_apply_neon(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let whole = cos.len() / 4 * 4;
    for (pair, (&c, &s)) in x.chunks_exact_mut(2).zip(cos.iter().zip(sin)).take(whole) {
        let (x0, x1) = (pair[0], pair[1]);
        pair[0] = (-x1).mul_add(s, x0 * c);
        pair[1] = x0.mul_add(s, x1 * c);
    }
    rope_impl(&mut x[2 * whole..], &cos[whole..], &sin[whole..]);
}

/// Rotates NEOX-style halves `(x[i], x[i + n/2])` (used by some architectures, e.g. Gemma),
/// with the same fused multiply-adds as [`rope_apply`].
pub fn rope_apply_neox(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2 and FMA are available.
        return unsafe { rope_neox_fma(x, cos, sin) };
    }
    rope_neox_impl(x, cos, sin)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rope_neox_fma(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    rope_neox_impl(x, cos, sin)
}

#[inline(always)]
fn rope_neox_impl(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (x0, x1) = (x[i], x[i + half]);
        x[i] = x0.mul_add(cos[i], -(x1 * sin[i]));
        x[i + half] = x0.mul_add(sin[i], x1 * cos[i]);
    }
}

/// ggml's tanh-approximation GELU in f32, with the fused multiply-add GCC forms from
/// `1 + GELU_COEF_A * x * x`, and the `tanhf` of the flavour's C library.
fn gelu_f32(x: f32, flavour: Flavour) -> f32 {
    let gelu_coef_a = f32::from_bits(0x3D37_2713); // 0.044715
    let sqrt_2_over_pi = f32::from_bits(0x3F4C_422A); // sqrt(2 / pi)
    let inner = (gelu_coef_a * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + crate::libm::tanhf(sqrt_2_over_pi * x * inner, flavour.arm()))
}

/// ggml's GELU table: the f16 result for every f16 input (ggml evaluates GELU through it), as
/// the flavour's build computes it.
fn gelu_table(flavour: Flavour) -> &'static [u16] {
    static TABLES: [std::sync::OnceLock<Vec<u16>>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    TABLES[usize::from(flavour.arm())].get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                half::f16::from_f32(gelu_f32(x, flavour)).to_bits()
            })
            .collect()
    })
}

/// `gate = gelu(gate) * up`, the GeGLU activation, as ggml computes it: inputs at or below -10
/// give 0, at or above 10 pass through, others go through the f16 table of the flavour.
pub fn geglu(gate: &mut [f32], up: &[f32], flavour: Flavour) {
    let table = gelu_table(flavour);
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            let t = table[usize::from(half::f16::from_f32(x).to_bits())];
            half::f16::from_bits(t).to_f32() * u
        };
    }
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// Soft-capping, `cap * tanh(x / cap)` in place, in ggml's three steps (`ggml_scale` by the f32
/// `1 / cap`, `ggml_tanh`, which is the C library's `tanhf`, `ggml_scale` by `cap`), so the bits
/// match the flavour's build.
pub fn softcap(x: &mut [f32], cap: f32, flavour: Flavour) {
    let inv = 1.0 / cap;
    for v in x {
        *v = crate::libm::tanhf(*v * inv, flavour.arm()) * cap;
    }
}

/// ggml's vectorised `expf` (`ggml_v_expf`, after ARM's optimized-routines): a degree-5
/// polynomial on a reduced argument, within 1.5 ulp of the true value. strata uses it rather than
/// libm's `expf` because llama.cpp does, and greedy parity needs the same bits.
#[inline(always)]
pub fn ggml_expf(x: f32) -> f32 {
    const R: f32 = 12_582_912.0; // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), R); // log2(e)
    let n = z - R;
    let b = (-n).mul_add(
        f32::from_bits(0x35BF_BE8E),
        (-n).mul_add(f32::from_bits(0x3F31_7200), x),
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let c4 = f32::from_bits(0x3C07_2010);
    let c3 = f32::from_bits(0x3D2B_9F17);
    let c2 = f32::from_bits(0x3E2A_AF33);
    let c1 = f32::from_bits(0x3EFF_FEDB);
    let c0 = f32::from_bits(0x3F7F_FFF6);
    let j = c4
        .mul_add(b, c3)
        .mul_add(u, c2.mul_add(b, c1))
        .mul_add(u, c0.mul_add(b, 1.0));
    // scalef: j * 2^n, rounded once (2^n built from its exponent bits; |n| <= 192 here).
    let pow2 = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (f64::from(j) * pow2) as f32
}

#[inline(always)]
fn reduce16(a: &[f32]) -> f32 {
    let s8: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let s4: [f32; 4] = std::array::from_fn(|i| s8[i + 4] + s8[i]);
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// ggml's `expf` as its AVX2 build computes it (`ggml_v_expf` for `__m256`): the same reduced
/// argument and polynomial as [`ggml_expf`] without the constant term, finished as `k + k * j`
/// with `k = 2^n` built in the exponent bits, and a two-step scale for |n| > 126.
#[inline(always)]
pub fn ggml_expf_avx2(x: f32) -> f32 {
    const R: f32 = 12_582_912.0; // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), R);
    let n = z - R;
    let b = (-n).mul_add(
        f32::from_bits(0x35BF_BE8E),
        (-n).mul_add(f32::from_bits(0x3F31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = f32::from_bits(0x3C07_2010)
        .mul_add(b, f32::from_bits(0x3D2B_9F17))
        .mul_add(
            u,
            f32::from_bits(0x3E2A_AF33).mul_add(b, f32::from_bits(0x3EFF_FEDB)),
        )
        .mul_add(u, f32::from_bits(0x3F7F_FFF6) * b);
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7F00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

#[inline(always)]
fn expf_of(flavour: Flavour, x: f32) -> f32 {
    match flavour {
        Flavour::Avx512 => ggml_expf(x),
        // The NEON `ggml_v_expf` is the AVX2 one operation for operation.
        Flavour::Avx2 | Flavour::Neon => ggml_expf_avx2(x),
    }
}

#[inline(always)]
fn softmax_impl(x: &mut [f32], sink: Option<f32>, flavour: Flavour) {
    let max = x
        .iter()
        .copied()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = expf_of(flavour, *v - max);
    }
    // ggml sums a vector of exponentials at a time in f32 (16 with AVX-512, 8 with AVX2, 4 with
    // NEON; its rows are padded with zeros to a multiple of that), then adds the block sums in
    // f64.
    match flavour {
        Flavour::Avx512 => {
            let mut block = [0.0f32; 16];
            for chunk in x.chunks(16) {
                block.fill(0.0);
                block[..chunk.len()].copy_from_slice(chunk);
                sum += f64::from(reduce16(&block));
            }
        }
        Flavour::Avx2 => {
            let mut block = [0.0f32; 8];
            for chunk in x.chunks(8) {
                block.fill(0.0);
                block[..chunk.len()].copy_from_slice(chunk);
                sum += f64::from(crate::dot::hsum8(&block));
            }
        }
        Flavour::Neon => {
            let mut block = [0.0f32; 4];
            for chunk in x.chunks(4) {
                block.fill(0.0);
                block[..chunk.len()].copy_from_slice(chunk);
                sum += f64::from(crate::arm::hsum4(&block));
            }
        }
    }
    sum += sink_term(sink, max);
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[inline(always)]
fn swiglu_impl(gate: &mut [f32], up: &[f32], flavour: Flavour) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = x / (1.0 + expf_of(flavour, -x)) * u;
    }
}

/// What an attention sink adds to a softmax's sum: a logit that joins the maximum and the
/// sum (ggml's `soft_max` with sinks: `expf(sink - max)` by the C library, added in f64) but
/// weighs no value (gpt-oss).
#[inline(always)]
pub(crate) fn sink_term(sink: Option<f32>, max: f32) -> f64 {
    sink.map_or(0.0, |s| f64::from((s - max).exp()))
}

/// In-place softmax of `x` (already scaled and masked), with the exponential and summation
/// order of the llama.cpp build `flavour` (block sums in f32, added in f64), multiplied by the
/// inverse of the sum; a `sink` logit takes part in the maximum and the sum only.
pub fn softmax(x: &mut [f32], sink: Option<f32>, flavour: Flavour) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2, FMA and F16C are available.
        return unsafe {
            match flavour {
                Flavour::Avx512 => crate::x86_ops::softmax(x, sink),
                Flavour::Avx2 => crate::x86_ops::softmax_avx2(x, sink),
                Flavour::Neon => softmax_fma(x, sink, flavour),
            }
        };
    }
    softmax_ref(x, sink, flavour)
}

/// ggml's `soft_max` operator on one row without a mask (`ggml_vec_soft_max_f32`): whole
/// vectors of exponentials (8 lanes with AVX2, 16 with AVX-512, ggml's own `expf`) summed in
/// f32 and added in f64, the elements past the last whole vector with the C library's `expf`
/// and added in f64 one by one; then every value times the f32 inverse of the sum. The router
/// of a mixture of experts takes its probabilities this way.
pub fn softmax_op(x: &mut [f32], flavour: Flavour) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let width = match flavour {
        Flavour::Avx512 => 16,
        Flavour::Avx2 => 8,
        Flavour::Neon => 4,
    };
    let whole = x.len() / width * width;
    let mut sum = 0.0f64;
    for chunk in x[..whole].chunks_mut(width) {
        for v in chunk.iter_mut() {
            *v = expf_of(flavour, *v - max);
        }
        sum += f64::from(match flavour {
            Flavour::Avx512 => reduce16(chunk),
            Flavour::Avx2 => {
                let mut b = [0.0f32; 8];
                b.copy_from_slice(chunk);
                crate::dot::hsum8(&b)
            }
            Flavour::Neon => {
                let mut b = [0.0f32; 4];
                b.copy_from_slice(chunk);
                crate::arm::hsum4(&b)
            }
        });
    }
    for v in x[whole..].iter_mut() {
        // Rust's `f32::exp` is the C library's `expf`, as ggml's scalar loop calls it.
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// The scalar definition of [`softmax`] (what the SIMD version must reproduce).
pub fn softmax_ref(x: &mut [f32], sink: Option<f32>, flavour: Flavour) {
    softmax_impl(x, sink, flavour)
}

/// gpt-oss's SwiGLU constants (llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE`): the sigmoid's slope and
/// the clamp of both inputs.
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
/// See [`SWIGLU_OAI_ALPHA`].
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// `gate = x * sigmoid(alpha * x) * (y + 1)` with `x = min(gate, limit)` and `y = up` clamped
/// to `[-limit, limit]`: gpt-oss's activation, as ggml's `swiglu_oai` computes it (the C
/// library's `expf`, `std::min` / `std::clamp` comparisons).
pub fn swiglu_oai(gate: &mut [f32], up: &[f32]) {
    let (alpha, limit) = (SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT);
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = if limit < *g { limit } else { *g };
        let y = if u < -limit {
            -limit
        } else if limit < u {
            limit
        } else {
            u
        };
        let glu = x / (1.0 + (alpha * -x).exp());
        *g = glu * (y + 1.0);
    }
}

/// `gate = silu(gate) * up`, the SwiGLU activation, with the exponential of `flavour`.
pub fn swiglu(gate: &mut [f32], up: &[f32], flavour: Flavour) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2, FMA and F16C are available.
        return unsafe {
            match flavour {
                Flavour::Avx512 => crate::x86_ops::swiglu(gate, up),
                Flavour::Avx2 => crate::x86_ops::swiglu_avx2(gate, up),
                Flavour::Neon => swiglu_fma(gate, up, flavour),
            }
        };
    }
    swiglu_ref(gate, up, flavour)
}

/// [`softmax_ref`] compiled with FMA, so its fused steps are instructions (the NEON flavour's
/// softmax on an x86 CPU).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_fma(x: &mut [f32], sink: Option<f32>, flavour: Flavour) {
    softmax_impl(x, sink, flavour)
}

/// [`swiglu_ref`] compiled with FMA (as [`softmax_fma`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_fma(gate: &mut [f32], up: &[f32], flavour: Flavour) {
    swiglu_impl(gate, up, flavour)
}

/// The scalar definition of [`swiglu`].
pub fn swiglu_ref(gate: &mut [f32], up: &[f32], flavour: Flavour) {
    swiglu_impl(gate, up, flavour)
}

/// Rounds every value to f16 precision (where ggml stores or converts to f16).
pub fn round_f16_slice(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2, FMA and F16C are available.
        return unsafe { crate::x86_ops::round_f16_slice(x) };
    }
    for v in x {
        *v = crate::formats::round_f16(*v);
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Index of the largest value (the first one on ties, like llama.cpp's greedy sampler).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Asks the CPU to start fetching the cache line holding `p` (a hint: no effect on results,
/// nothing on targets without one). Worth it where a loop is about to touch many scattered
/// lines one after another, whose misses would otherwise wait on each other.
#[inline]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address (SSE, part of x86-64).
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
