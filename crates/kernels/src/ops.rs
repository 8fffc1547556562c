//! Element-wise and row-wise operations of a transformer layer, written to round where ggml
//! rounds (products in f32, long sums in f64) so hidden states track llama.cpp's closely.

/// RMS normalisation with a learned scale: `out = (x * 1/sqrt(mean(x^2) + eps)) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// Cosine/sine table of rotary embeddings for one position, in ggml's `NORM` layout (adjacent
/// pairs), computed with ggml's repeated-multiplication recurrence for the angle.
pub fn rope_table(
    pos: usize,
    n_dims: usize,
    freq_base: f32,
    out_cos: &mut [f32],
    out_sin: &mut [f32],
) {
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    let mut theta = pos as f32;
    for i in 0..n_dims / 2 {
        out_cos[i] = theta.cos();
        out_sin[i] = theta.sin();
        theta *= theta_scale;
    }
}

/// Rotates adjacent pairs `(x[2i], x[2i+1])` of one head by the table's angles.
pub fn rope_apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (pair, (&c, &s)) in x.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
        let (x0, x1) = (pair[0], pair[1]);
        pair[0] = x0 * c - x1 * s;
        pair[1] = x0 * s + x1 * c;
    }
}

/// Rotates NEOX-style halves `(x[i], x[i + n/2])` (used by some architectures, e.g. Gemma).
pub fn rope_apply_neox(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (x0, x1) = (x[i], x[i + half]);
        x[i] = x0 * cos[i] - x1 * sin[i];
        x[i + half] = x0 * sin[i] + x1 * cos[i];
    }
}

/// In-place softmax of `x` (already scaled and masked); the sum is accumulated in f64 and the
/// result multiplied by its inverse, as ggml does.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        let e = (*v - max).exp();
        sum += f64::from(e);
        *v = e;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up`, the SwiGLU activation.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = x / (1.0 + (-x).exp()) * u;
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
