//! Times the packed matmul on SmolLM2-like shapes: `cargo run --release -p strata-kernels
//! --example matmul_speed [threads] [tokens]`. Prints GB/s of weights streamed per call.
#![allow(clippy::unwrap_used)]
use std::time::Instant;

use strata_kernels::formats::quantize_weights;
use strata_kernels::{GgmlType, QMatrix, QuantActs, ThreadPool, WeightBytes, matmul};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let threads = args.first().copied().unwrap_or(1);
    let n = args.get(1).copied().unwrap_or(1);
    let pool = ThreadPool::new(threads);
    for (name, ty, rows, cols) in [
        ("q 576x576", GgmlType::Q4_1, 576, 576),
        ("k 192x576", GgmlType::Q4_1, 192, 576),
        ("gate 1536x576", GgmlType::Q4_1, 1536, 576),
        ("down 576x1536", GgmlType::Q4_1, 576, 1536),
        ("head 49152x576", GgmlType::Q8_0, 49152, 576),
    ] {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let m = QMatrix::new(ty, rows, cols, WeightBytes::Owned(quantize_weights(ty, &w)))
            .unwrap()
            .prepared();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let mut acts = QuantActs::new();
        acts.quantize(ty, &x, n, cols);
        let mut out = vec![0.0; n * rows];
        let iters = (2_000_000_000 / (rows * cols * n)).clamp(3, 20000);
        matmul(&pool, &m, &acts, &mut out);
        let t = Instant::now();
        for _ in 0..iters {
            matmul(&pool, &m, &acts, &mut out);
        }
        let per = t.elapsed().as_secs_f64() / iters as f64;
        let bytes = (rows * ty.row_bytes(cols).unwrap()) as f64;
        println!(
            "{name:16} {:8.1} us/call  {:6.1} GB/s  {:7.2} ns/row-block/token",
            per * 1e6,
            bytes / per / 1e9,
            per * 1e9 / (rows * cols / 32 * n) as f64 * threads as f64
        );
    }
}
