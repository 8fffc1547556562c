#![allow(clippy::unwrap_used)]

use super::*;
use crate::dot::dot_scalar;
use crate::formats::{act_type, dequantize_row, quantize_weights};

/// A small deterministic generator (xorshift), so failures reproduce without a seed dance.
struct Rng(u64);
impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

const TYPES: [GgmlType; 16] = [
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q5K,
    GgmlType::IQ4XS,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4NL,
    GgmlType::MXFP4,
    GgmlType::BF16,
    GgmlType::F16,
    GgmlType::F32,
];

/// Relative tolerance of a product against the dequantised-weight f32 reference, measured
/// against `sum |w_i * x_i|`: 8-bit activation quantisation contributes at most ~1/254 of a
/// block's largest activation per element; f16 activations ~1/2048.
fn tolerance(ty: GgmlType) -> f32 {
    match act_type(ty) {
        GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8K => 1.0 / 100.0,
        GgmlType::F16 => 1.0 / 1000.0,
        GgmlType::BF16 => 1.0 / 100.0,
        _ => 1e-5,
    }
}

fn check(ty: GgmlType, rows: usize, cols: usize, n: usize, threads: usize, seed: u64) {
    let mut rng = Rng(seed);
    let wf = rng.vec(rows * cols, 0.5);
    let x = rng.vec(n * cols, 2.0);
    let w = QMatrix::new(
        ty,
        rows,
        cols,
        WeightBytes::Owned(quantize_weights(ty, &wf)),
    )
    .unwrap();
    let mut acts = x86_acts();
    acts.quantize(ty, &x, n, cols);
    let pool = ThreadPool::new(threads);
    let mut out = vec![0.0f32; n * rows];
    // The fastest layout for this CPU (packed where a SIMD kernel exists)...
    matmul(&pool, &w.clone().prepared(), &acts, &mut out);
    // ...and the plain scalar path, which is the reference.
    let mut plain_out = vec![0.0f32; n * rows];
    matmul(&pool, &w, &acts, &mut plain_out);

    let act_ty = act_type(ty);
    let act_bytes = act_ty.row_bytes(cols).unwrap();
    let mut wrow = vec![0.0f32; cols];
    for t in 0..n {
        let a = &acts.buf_for_test()[t * act_bytes..(t + 1) * act_bytes];
        for r in 0..rows {
            // 1. SIMD (if any) equals the scalar reference bit for bit.
            let s = if KFORMATS.contains(&ty) {
                kquant_reference(ty, rows, n, t).1(ty, w.row(r).unwrap(), a, cols)
            } else {
                b32_reference(ty, rows, cols, n)(ty, w.row(r).unwrap(), a, cols)
            };
            assert_eq!(plain_out[t * rows + r].to_bits(), s.to_bits());
            let got = out[t * rows + r];
            assert_eq!(
                got.to_bits(),
                s.to_bits(),
                "{ty} r{r} t{t}: simd {got} scalar {s}"
            );
            // 2. Both are close to the f32 product with dequantised weights.
            dequantize_row(ty, w.row(r).unwrap(), &mut wrow);
            let xs = &x[t * cols..(t + 1) * cols];
            let exact: f32 = wrow.iter().zip(xs).map(|(a, b)| a * b).sum();
            let mag: f32 = wrow.iter().zip(xs).map(|(a, b)| (a * b).abs()).sum();
            let err = (got - exact).abs();
            assert!(
                err <= tolerance(ty) * mag + 1e-5,
                "{ty} r{r} t{t}: {got} vs f32 {exact} (err {err}, magnitude {mag})"
            );
        }
    }
}

/// The scalar reference for a batch of `n` times a `rows x cols` matrix of one of the
/// non-K formats, in the order llama.cpp's AVX2 build computes it: Q4_0 and IQ4_NL tensors with
/// a row count that is a multiple of 8 in its repacked kernels' order; batches of two or more
/// through tinyBLAS (IQ4_NL; BF16, F16 and F32 when the shape suits it); `vec_dot` otherwise.
fn b32_reference(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
) -> fn(GgmlType, &[u8], &[u8], usize) -> f32 {
    let repacked =
        matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4NL | GgmlType::MXFP4) && rows.is_multiple_of(8);
    let tinyblas = n >= 2
        && match ty {
            GgmlType::IQ4NL => !repacked,
            GgmlType::BF16 | GgmlType::F16 | GgmlType::F32 => {
                cols.is_multiple_of(8) && rows.is_multiple_of(4)
            }
            _ => false,
        };
    if repacked {
        crate::dot::dot_repacked
    } else if tinyblas {
        crate::dot::dot_tinyblas
    } else {
        dot_scalar
    }
}

#[test]
fn matmul_matches_scalar_and_f32_reference() {
    for (i, ty) in TYPES.into_iter().enumerate() {
        let shapes: [(usize, usize, usize, usize); 15] = [
            (1, 32, 1, 1),
            (7, 64, 3, 2),
            (37, 256, 9, 2),
            (64, 576, 5, 3),
            (6, 96, 1, 1),
            (130, 128, 70, 2),
            (9, 512, 3, 2),
            (16, 512, 2, 2),
            (16, 512, 6, 2),
            (16, 512, 11, 2),
            (5, 1024, 1, 1),
            (8, 96, 1, 1),
            (24, 160, 7, 2),
            (12, 96, 2, 1),
            (6, 40, 3, 1),
        ];
        for (rows, cols, n, threads) in shapes {
            if !cols.is_multiple_of(ty.block_size()) {
                continue;
            }
            check(
                ty,
                rows,
                cols,
                n,
                threads,
                0x9E37_79B9 + i as u64 * 7 + rows as u64,
            );
        }
    }
}

#[test]
fn weight_quantisers_round_trip() {
    let mut rng = Rng(7);
    let x = rng.vec(256, 1.0);
    for ty in TYPES {
        let q = quantize_weights(ty, &x);
        let mut back = vec![0.0; 256];
        dequantize_row(ty, &q, &mut back);
        let max_err = x
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let bound = match ty {
            GgmlType::Q2K => 0.4,
            GgmlType::Q3K => 0.25,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K | GgmlType::IQ4XS | GgmlType::IQ4NL => {
                0.15
            }
            // A power-of-two scale and E2M1 values: up to a quarter of the block maximum.
            GgmlType::MXFP4 => 0.3,
            GgmlType::BF16 => 4e-3,
            GgmlType::Q6K => 0.05,
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5K => 0.07,
            GgmlType::Q8_0 => 0.01,
            _ => 1e-3,
        };
        assert!(max_err <= bound, "{ty}: max error {max_err}");
    }
}

#[test]
fn activation_quantisation_rounds_half_to_even() {
    // amax 127 gives id = 1, so codes are the rounded inputs: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
    let mut x = vec![0.0f32; 32];
    x[0] = 127.0;
    x[1] = 0.5;
    x[2] = 1.5;
    x[3] = 2.5;
    x[4] = -2.5;
    let mut out = vec![0u8; 34];
    formats::quantize_row_q8_0(&x, &mut out);
    let codes: Vec<i8> = out[2..7].iter().map(|&b| b as i8).collect();
    assert_eq!(codes, [127, 0, 2, 2, -2]);
}

#[test]
fn unsupported_formats_are_refused() {
    let e = QMatrix::new(GgmlType::Q8K, 1, 256, WeightBytes::Owned(vec![0; 292])).unwrap_err();
    assert!(
        e.to_string().contains("unsupported weight format Q8_K"),
        "{e}"
    );
    let e = QMatrix::new(GgmlType::Q8_0, 2, 32, WeightBytes::Owned(vec![0; 34])).unwrap_err();
    assert!(e.to_string().contains("expected 68"), "{e}");
}

#[test]
fn simd_activation_quantisation_matches_scalar() {
    let mut rng = Rng(11);
    for (i, scale) in [1e-3f32, 1.0, 300.0].into_iter().enumerate() {
        let mut x = rng.vec(96, scale);
        if i == 0 {
            x[5] = 0.0;
            x[40..72].fill(0.0); // an all-zero block
        }
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            let mut acts = x86_acts();
            acts.quantize(ty, &x, 1, 96);
            let act = act_type(ty);
            let mut want = vec![0u8; act.row_bytes(96).unwrap()];
            formats::quantize_act_row(act, &x, &mut want);
            assert_eq!(
                acts.buf_for_test()[..want.len()],
                want[..],
                "{ty} scale {scale}"
            );
        }
    }
}

#[test]
fn simd_ops_match_their_scalar_definitions() {
    let mut rng = Rng(5);
    for n in [1usize, 7, 16, 33, 100, 257] {
        let base = rng.vec(n, 30.0);
        for fl in [attn::Flavour::Avx512, attn::Flavour::Avx2] {
            // A sink below, inside and above the scores' range.
            for sink in [None, Some(-50.0), Some(3.0), Some(80.0)] {
                let mut a = base.clone();
                let mut b = base.clone();
                ops::softmax(&mut a, sink, fl);
                ops::softmax_ref(&mut b, sink, fl);
                assert_eq!(bits(&a), bits(&b), "softmax n={n} {fl:?} sink {sink:?}");
                // The sink takes its share of the probability mass and no more.
                let total: f64 = a.iter().map(|&v| f64::from(v)).sum();
                let sink_share = sink.map_or(0.0, |s| {
                    let max = base.iter().copied().fold(s, f32::max);
                    let z: f64 = base.iter().map(|&v| f64::from(v - max).exp()).sum::<f64>()
                        + f64::from(s - max).exp();
                    f64::from(s - max).exp() / z
                });
                assert!(
                    (total + sink_share - 1.0).abs() < 1e-4,
                    "n={n} {sink:?}: {total}"
                );
            }
        }

        let up = rng.vec(n, 3.0);
        for fl in [attn::Flavour::Avx512, attn::Flavour::Avx2] {
            let mut a = base.clone();
            let mut b = base.clone();
            ops::swiglu(&mut a, &up, fl);
            ops::swiglu_ref(&mut b, &up, fl);
            assert_eq!(bits(&a), bits(&b), "swiglu n={n} {fl:?}");
        }

        let mut a = base.clone();
        ops::round_f16_slice(&mut a);
        let b: Vec<f32> = base.iter().map(|&v| formats::round_f16(v)).collect();
        assert_eq!(bits(&a), bits(&b), "round_f16 n={n}");
    }
    // The exponential's edges: underflow to subnormals and zero, overflow to infinity.
    let mut xs: Vec<f32> = (-110..=95).map(|i| i as f32 * 1.013).collect();
    xs.extend([
        -87.5, -88.7, -103.2, -104.0, -150.0, 88.5, 89.0, 200.0, -200.0,
    ]);
    while !xs.len().is_multiple_of(8) {
        xs.push(0.25);
    }
    let up = vec![1.0f32; xs.len()];
    let mut a: Vec<f32> = xs.iter().map(|v| -v).collect();
    let mut b = a.clone();
    ops::swiglu(&mut a, &up, attn::Flavour::Avx512);
    ops::swiglu_ref(&mut b, &up, attn::Flavour::Avx512);
    assert_eq!(bits(&a), bits(&b), "swiglu edges");
    let mut a: Vec<f32> = xs.iter().map(|v| -v).collect();
    let mut b = a.clone();
    ops::swiglu(&mut a, &up, attn::Flavour::Avx2);
    ops::swiglu_ref(&mut b, &up, attn::Flavour::Avx2);
    assert_eq!(bits(&a), bits(&b), "swiglu edges (AVX2 build)");
    // The AVX2 build's exponential is within an ulp or two of libm's, edges included.
    for &x in &xs {
        let (ours, libm) = (ops::ggml_expf_avx2(-x), (-x).exp());
        if ours == libm {
            continue;
        }
        let rel = ((ours - libm) / libm.max(f32::MIN_POSITIVE)).abs();
        assert!(
            rel < 1e-6 || (libm < 1e-37 && (ours - libm).abs() < 1e-38),
            "exp({}) {ours} vs {libm}",
            -x
        );
    }
}

#[test]
fn simd_attention_orders_match_their_scalar_definitions() {
    use attn::{DotOrder, dot_f16_order, dot_f16_order_ref};
    let mut rng = Rng(9);
    for hd in [64usize, 128, 80] {
        let q = rng.vec(hd, 2.0);
        let keys: Vec<Vec<f32>> = (0..150).map(|_| rng.vec(hd, 2.0)).collect();
        for order in [
            DotOrder::Single,
            DotOrder::Single8,
            DotOrder::Batch,
            DotOrder::Batch8,
        ] {
            for k in &keys[..3] {
                assert_eq!(
                    dot_f16_order(order, &q, k).to_bits(),
                    dot_f16_order_ref(order, &q, k).to_bits(),
                    "dot {order:?} hd {hd}"
                );
            }
        }
    }
}

/// Every order of llama.cpp's f16 attention products.
const ATTN_ORDERS: [attn::DotOrder; 4] = [
    attn::DotOrder::Single,
    attn::DotOrder::Single8,
    attn::DotOrder::Batch,
    attn::DotOrder::Batch8,
];

#[test]
fn grouped_attention_kernels_match_the_per_head_reference() {
    use attn::{
        MAX_GROUP, MAX_STEP, dot_f16_order_ref, padded_len, scores_grouped, weighted_sum_grouped,
        weighted_sum_order_ref,
    };
    let mut rng = Rng(29);
    for order in ATTN_ORDERS {
        for hd in [64usize, 256, 72, 8] {
            for len in [1usize, 3, 8, 17, 33, 70] {
                // The cache's f16, and the same values as f32 for the reference.
                let half = |v: Vec<f32>| -> Vec<half::f16> {
                    v.into_iter().map(half::f16::from_f32).collect()
                };
                let keys_h = half(rng.vec(len * hd, 2.0));
                let keys: Vec<f32> = keys_h.iter().map(|x| x.to_f32()).collect();
                let values_h = half(rng.vec(len * hd, 2.0));
                let values: Vec<f32> = values_h.iter().map(|x| x.to_f32()).collect();
                // Rows longer than needed, as the cache's are, with finite values past `len`
                // that the zero probabilities must cancel.
                let stride = len.div_ceil(MAX_STEP) * MAX_STEP + 8;
                let mut vt = half(rng.vec(hd * stride, 2.0));
                for p in 0..len {
                    for d in 0..hd {
                        vt[d * stride + p] = values_h[p * hd + d];
                    }
                }
                for g in 1..=MAX_GROUP {
                    let what = format!("{order:?} g {g} hd {hd} len {len}");
                    let q = rng.vec(g * hd, 2.0);
                    let mut sc = vec![f32::NAN; g * stride];
                    scores_grouped(order, &q, hd, &keys_h, len, 0.125, &mut sc, stride);
                    for h in 0..g {
                        let want: Vec<f32> = (0..len)
                            .map(|p| {
                                dot_f16_order_ref(
                                    order,
                                    &q[h * hd..(h + 1) * hd],
                                    &keys[p * hd..(p + 1) * hd],
                                ) * 0.125
                            })
                            .collect();
                        let got = &sc[h * stride..h * stride + len];
                        assert_eq!(bits(got), bits(&want), "scores {what} h {h}");
                    }

                    // Probabilities zero past each head's length, the shorter heads included.
                    let mut w = vec![0.0f32; g * stride];
                    let lens: Vec<usize> = (0..g).map(|h| len - (h % 2) * (len / 2)).collect();
                    for h in 0..g {
                        let r = rng.vec(lens[h], 1.0);
                        w[h * stride..h * stride + lens[h]].copy_from_slice(&r);
                    }
                    let mut out = vec![f32::NAN; g * hd];
                    let lenp = padded_len(order, len);
                    weighted_sum_grouped(order, &w, stride, &vt, stride, hd, lenp, &mut out);
                    let mut acc = vec![0.0; 64 * hd];
                    for h in 0..g {
                        let mut want = vec![0.0; hd];
                        weighted_sum_order_ref(
                            order,
                            &w[h * stride..h * stride + lens[h]],
                            |p| &values[p * hd..(p + 1) * hd],
                            &mut acc,
                            &mut want,
                        );
                        assert_eq!(
                            bits(&out[h * hd..(h + 1) * hd]),
                            bits(&want),
                            "wsum {what} h {h} of length {}",
                            lens[h]
                        );
                    }
                }
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn fused_products_equal_separate_ones() {
    let mut rng = Rng(21);
    let cols = 128;
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::F16,
    ] {
        let mats: Vec<QMatrix> = [40usize, 12, 12]
            .iter()
            .map(|&rows| {
                let w = rng.vec(rows * cols, 0.5);
                QMatrix::new(ty, rows, cols, WeightBytes::Owned(quantize_weights(ty, &w)))
                    .unwrap()
                    .prepared()
            })
            .collect();
        for n in [1usize, 5] {
            let x = rng.vec(n * cols, 1.0);
            let mut acts = x86_acts();
            acts.quantize(ty, &x, n, cols);
            let pool = ThreadPool::new(2);
            let mut sep: Vec<Vec<f32>> = mats.iter().map(|m| vec![0.0; n * m.rows()]).collect();
            for (m, o) in mats.iter().zip(sep.iter_mut()) {
                matmul(&pool, m, &acts, o);
            }
            let mut fused: Vec<Vec<f32>> =
                mats.iter().map(|m| vec![f32::NAN; n * m.rows()]).collect();
            let mut parts: Vec<(&QMatrix, &mut [f32])> = mats
                .iter()
                .zip(fused.iter_mut())
                .map(|(m, o)| (m, o.as_mut_slice()))
                .collect();
            matmul_multi(&pool, &acts, &mut parts);
            for (a, b) in sep.iter().zip(&fused) {
                assert_eq!(bits(a), bits(b), "{ty} n={n}");
            }
        }
    }
}

/// Offsets of the f16 fields of a K-format block.
fn kquant_f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[0],
    }
}

/// A K-quant matrix of random bytes (every scale and code pattern), with sane f16 scales.
fn random_kquant_rows(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut bytes: Vec<u8> = (0..rows * cols / 256 * bb)
        .map(|_| (rng.f32().to_bits() >> 7) as u8)
        .collect();
    for blk in bytes.chunks_exact_mut(bb) {
        for &at in kquant_f16_fields(ty) {
            let v = half::f16::from_f32(rng.f32().abs() * 0.01 + 1e-4);
            blk[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    bytes
}

/// The K formats llama.cpp multiplies with Q8_K activations.
const KFORMATS: [GgmlType; 6] = [
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q5K,
    GgmlType::IQ4XS,
];

/// The scalar reference for token `t` of a batch of `n` times a row of a `rows`-row matrix of
/// `ty`, in the order llama.cpp's x86 path picks for that product, and the kernel `matmul` runs
/// for it row by row.
#[allow(clippy::type_complexity)]
fn kquant_reference(
    ty: GgmlType,
    rows: usize,
    n: usize,
    t: usize,
) -> (
    fn(GgmlType, &[u8], &[u8], usize) -> f32,
    fn(GgmlType, &[u8], &[u8], usize) -> f32,
) {
    let four = t < n / 4 * 4;
    let repacked = ty == GgmlType::Q4K && rows.is_multiple_of(8);
    if n >= 8 && !repacked {
        let scalar: fn(GgmlType, &[u8], &[u8], usize) -> f32 = if ty == GgmlType::Q6K {
            |_, w, a, n| kquants::dot_q6_k_tiled(w, a, n)
        } else {
            kformats::dot_tiled
        };
        (crate::matmul::tiled_dot(ty), scalar)
    } else if repacked {
        let scalar: fn(GgmlType, &[u8], &[u8], usize) -> f32 = if four {
            |_, w, a, n| kquants::dot_q4_k_repacked(w, a, n, true)
        } else {
            |_, w, a, n| kquants::dot_q4_k_repacked(w, a, n, false)
        };
        (crate::matmul::row_dot(ty, rows, four), scalar)
    } else {
        (crate::matmul::row_dot(ty, rows, four), dot_scalar)
    }
}

/// The K-quant products of a batch, whatever path `matmul` takes (the tile kernels for batches
/// of four or more on AVX2), equal the per-row kernels and the scalar references bit for bit, in
/// both of llama.cpp's orders for each format, on random and on extreme codes and activations.
#[test]
fn kquant_batches_match_the_per_row_kernels() {
    let mut rng = Rng(0x5EED);
    for ty in KFORMATS {
        for (rows, cols) in [(8usize, 256usize), (40, 768), (13, 512), (72, 512)] {
            for extreme in [0u8, 1, 2] {
                let mut bytes = random_kquant_rows(ty, rows, cols, &mut rng);
                if extreme > 0 {
                    // Codes and scales at their extremes (Q6_K: largest codes, scales +-127).
                    for blk in bytes.chunks_exact_mut(ty.block_bytes()) {
                        let fields = kquant_f16_fields(ty);
                        for (i, b) in blk.iter_mut().enumerate() {
                            if !fields.iter().any(|&f| i == f || i == f + 1) {
                                *b = match ty {
                                    GgmlType::Q4K => 0xFF,
                                    GgmlType::Q6K if i >= 192 => {
                                        if extreme == 1 {
                                            0x7F
                                        } else {
                                            0x80
                                        }
                                    }
                                    GgmlType::Q6K => 0xFF,
                                    _ if extreme == 1 => 0xFF,
                                    _ => 0x00,
                                };
                            }
                        }
                    }
                }
                let w = QMatrix::new(ty, rows, cols, WeightBytes::Owned(bytes)).unwrap();
                for n in [1usize, 3, 4, 5, 6, 7, 8, 13, 16, 17, 29, 64, 70, 130] {
                    let x = match extreme {
                        0 => rng.vec(n * cols, 3.0),
                        // Every activation code at +-127.
                        1 => vec![1.0; n * cols],
                        _ => vec![-1.0; n * cols],
                    };
                    let mut acts = x86_acts();
                    acts.quantize(ty, &x, n, cols);
                    let ab = act_type(ty).row_bytes(cols).unwrap();
                    assert_eq!(acts.has_tiles(), isa().avx2 && n >= 4, "{ty} n{n}");
                    for threads in [1, 2] {
                        let mut out = vec![f32::NAN; n * rows];
                        matmul(&ThreadPool::new(threads), &w, &acts, &mut out);
                        for t in 0..n {
                            let a = &acts.buf_for_test()[t * ab..(t + 1) * ab];
                            let (kernel, reference) = kquant_reference(ty, rows, n, t);
                            for r in 0..rows {
                                let row = w.row(r).unwrap();
                                let simd = kernel(ty, row, a, cols);
                                let scalar = reference(ty, row, a, cols);
                                let got = out[t * rows + r];
                                let what = format!("{ty} {rows}x{cols} n{n} t{t} r{r} x{extreme}");
                                assert_eq!(simd.to_bits(), scalar.to_bits(), "{what}");
                                assert_eq!(got.to_bits(), simd.to_bits(), "{what}: {got} {simd}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The one-token dot products of the formats whose `vec_dot` order has special cases equal
/// llama.cpp's own functions bit for bit (`fixtures/quant/dots.json`, written by
/// scripts/make-dot-vectors.py through libggml-cpu): the scalar twin and this CPU's kernel.
#[test]
fn vec_dot_orders_match_llama_cpp() {
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../../../fixtures/quant/dots.json")).unwrap();
    let mut checked = 0;
    for (name, cases) in doc["types"].as_object().unwrap() {
        let ty = GgmlType::from_name(name).unwrap();
        for c in cases.as_array().unwrap() {
            let n = c["n"].as_u64().unwrap() as usize;
            let row = |k: &str| crate::quantize::tests::case(c[k].as_u64().unwrap() as usize);
            let (w, x) = (row("w"), row("a"));
            let wq = quantize_weights(ty, &w[..n]);
            let mut acts = x86_acts();
            acts.quantize(ty, &x[..n], 1, n);
            let a = &acts.buf_for_test()[..act_type(ty).row_bytes(n).unwrap()];
            let want = c["bits"].as_u64().unwrap() as u32;
            let scalar = dot_scalar(ty, &wq, a, n);
            let fast = crate::matmul::row_dot(ty, 1, false)(ty, &wq, a, n);
            let what = format!("{name} n{n} w{} a{}", c["w"], c["a"]);
            assert_eq!(
                scalar.to_bits(),
                want,
                "{what}: scalar {scalar} vs {}",
                f32::from_bits(want)
            );
            assert_eq!(fast.to_bits(), want, "{what}: kernel {fast}");
            checked += 1;
        }
    }
    assert!(checked >= 100, "{checked} cases");
}

#[test]
fn mxfp4_scales_are_half_their_power_of_two() {
    use crate::formats::e8m0_half;
    assert_eq!(e8m0_half(127), 0.5);
    assert_eq!(e8m0_half(128), 1.0);
    assert_eq!(e8m0_half(2), 2f32.powi(-126));
    // Below the normal range ggml writes the subnormals 2^-128 and 2^-127 directly.
    assert_eq!(e8m0_half(1), 2f32.powi(-127));
    assert_eq!(e8m0_half(0), 2f32.powi(-128));
    assert_eq!(e8m0_half(254), 2f32.powi(126));
    // A block whose largest magnitude is 3 gets exponent floor(log2 3) - 2 + 127 = 126 and
    // stores 3 as code 7 (12 * 2^-2); 0.3 rounds to the nearest table value, 0.25 (code 1).
    let mut x = vec![0.0f32; 32];
    x[0] = 3.0;
    x[17] = -0.3;
    let q = quantize_weights(GgmlType::MXFP4, &x);
    assert_eq!(q.len(), 17);
    assert_eq!(q[0], 126);
    assert_eq!(q[1] & 0x0F, 7);
    assert_eq!(q[2] >> 4, 9);
    let mut back = vec![0.0; 32];
    dequantize_row(GgmlType::MXFP4, &q, &mut back);
    assert_eq!((back[0], back[17]), (3.0, -0.25));
}

/// MXFP4 scales at the bottom of the range (the subnormals ggml writes for exponents 0 and 1)
/// and far above 1 go through the packed kernel as through the scalar twin, bit for bit.
#[test]
fn mxfp4_extreme_exponents_match_the_scalar_reference() {
    let (rows, cols, n) = (16, 128, 5);
    let exps = [0u8, 1, 2, 3, 100, 126, 127, 128, 150];
    let mut rng = Rng(0xF4F4);
    let nb = cols / 32;
    let mut bytes = vec![0u8; rows * nb * 17];
    for (i, blk) in bytes.chunks_exact_mut(17).enumerate() {
        blk[0] = exps[i % exps.len()];
        for b in &mut blk[1..] {
            *b = (rng.f32().abs() * 255.0) as u8;
        }
    }
    let w = QMatrix::new(GgmlType::MXFP4, rows, cols, WeightBytes::Owned(bytes)).unwrap();
    let x = rng.vec(n * cols, 3.0);
    let mut acts = x86_acts();
    acts.quantize(GgmlType::MXFP4, &x, n, cols);
    let mut out = vec![0.0f32; n * rows];
    matmul(&ThreadPool::new(2), &w.clone().prepared(), &acts, &mut out);
    let ab = act_type(GgmlType::MXFP4).row_bytes(cols).unwrap();
    for t in 0..n {
        let a = &acts.buf_for_test()[t * ab..(t + 1) * ab];
        for r in 0..rows {
            let want = crate::dot::dot_repacked(GgmlType::MXFP4, w.row(r).unwrap(), a, cols);
            assert_eq!(out[t * rows + r].to_bits(), want.to_bits(), "r{r} t{t}");
        }
    }
}

#[test]
fn weighted_sums_over_split_runs_equal_those_over_one_row() {
    use attn::{MAX_GROUP, MAX_STEP, ValueRun, padded_len, weighted_sum_grouped};
    let mut rng = Rng(31);
    let half = |v: Vec<f32>| -> Vec<half::f16> { v.into_iter().map(half::f16::from_f32).collect() };
    for order in ATTN_ORDERS {
        // SIMD head widths and portable ones (72, 8).
        for hd in [64usize, 256, 72, 8] {
            for len in [65usize, 130, 200] {
                let lenp = padded_len(order, len);
                let stride = lenp + 24;
                let vt = half(rng.vec(hd * stride, 2.0));
                // Cut the row at whole steps of every order: each piece in a buffer of its own,
                // with its own row stride (as a shared block and a sequence's cache have).
                let cuts: Vec<usize> = (MAX_STEP..lenp).step_by(MAX_STEP).chain([lenp]).collect();
                let mut pieces = Vec::new();
                let mut from = 0;
                for &to in &cuts {
                    let n = to - from;
                    let vs = n + 8 * pieces.len();
                    let mut buf = half(rng.vec(hd * vs, 2.0));
                    for d in 0..hd {
                        buf[d * vs..d * vs + n].copy_from_slice(&vt[d * stride + from..][..n]);
                    }
                    pieces.push((buf, vs, n));
                    from = to;
                }
                assert!(pieces.len() >= 2);
                for g in 1..=MAX_GROUP {
                    let mut w = vec![0.0f32; g * stride];
                    for h in 0..g {
                        w[h * stride..h * stride + len].copy_from_slice(&rng.vec(len, 1.0));
                    }
                    let mut whole = vec![f32::NAN; g * hd];
                    weighted_sum_grouped(order, &w, stride, &vt, stride, hd, lenp, &mut whole);
                    let runs = pieces.iter().map(|(vt, vs, len)| ValueRun {
                        vt,
                        vs: *vs,
                        len: *len,
                    });
                    let mut split = vec![f32::NAN; g * hd];
                    attn::weighted_sum_runs(order, &w, stride, runs, hd, &mut split);
                    assert_eq!(
                        bits(&split),
                        bits(&whole),
                        "{order:?} hd {hd} len {len} g {g}"
                    );
                }
            }
        }
    }
}

/// Activations for products in the x86 builds' orders (the ones these tests check), which strata
/// reproduces on every CPU, an aarch64 one included.
fn x86_acts() -> QuantActs {
    let mut acts = QuantActs::new();
    acts.set_flavour(attn::Flavour::Avx512);
    acts
}
