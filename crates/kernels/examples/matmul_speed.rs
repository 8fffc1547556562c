//! Times matmul on SmolLM2's shapes (Q4_1, Q8_0) and Gemma 3 270M's (Q5_0 gate/up and q, Q8_0 v,
//! K-quant attn_output 640x1024 and ffn_down 640x2048), and a 1B model's FFN matrix in each
//! further type: `cargo run --release -p strata-kernels --example matmul_speed
//! [threads] [tokens] [filter]`, `filter` keeping the shapes whose name contains it (e.g. `_K`).
//! Prints the median of several calls and GB/s of weights streamed per call (the shapes named
//! "in L2" fit the L2 cache, so their GB/s is the kernel's compute limit, not memory's). Set
//! `STRATA_NO_KTILES=1` to time K-quant batches row by row instead of with the tile kernels.
#![allow(clippy::unwrap_used)]
use std::time::Instant;

use strata_kernels::formats::quantize_weights;
use strata_kernels::{GgmlType, QMatrix, QuantActs, ThreadPool, WeightBytes, matmul};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = args.first().map_or(1, |a| a.parse().unwrap());
    let n = args.get(1).map_or(1, |a| a.parse().unwrap());
    let filter = args.get(2).map_or("", String::as_str);
    let pool = ThreadPool::new(threads);
    for (name, ty, rows, cols) in [
        ("q 576x576", GgmlType::Q4_1, 576, 576),
        ("k 192x576", GgmlType::Q4_1, 192, 576),
        ("gate 1536x576", GgmlType::Q4_1, 1536, 576),
        ("down 576x1536", GgmlType::Q4_1, 576, 1536),
        ("head 49152x576", GgmlType::Q8_0, 49152, 576),
        ("Q5_0 2048x640", GgmlType::Q5_0, 2048, 640),
        ("Q5_0 1024x640", GgmlType::Q5_0, 1024, 640),
        ("Q8_0 256x640", GgmlType::Q8_0, 256, 640),
        ("Q4_K 640x1024", GgmlType::Q4K, 640, 1024),
        ("Q4_K 640x2048", GgmlType::Q4K, 640, 2048),
        ("Q6_K 640x1024", GgmlType::Q6K, 640, 1024),
        ("Q6_K 640x2048", GgmlType::Q6K, 640, 2048),
        // A 1B model's FFN matrix in each further type (8192 x 2048).
        ("Q5_1 8192x2048", GgmlType::Q5_1, 8192, 2048),
        ("Q2_K 8192x2048", GgmlType::Q2K, 8192, 2048),
        ("Q3_K 8192x2048", GgmlType::Q3K, 8192, 2048),
        ("Q5_K 8192x2048", GgmlType::Q5K, 8192, 2048),
        ("IQ4_XS 8192x2048", GgmlType::IQ4XS, 8192, 2048),
        ("IQ4_NL 8192x2048", GgmlType::IQ4NL, 8192, 2048),
        ("Q4_0 8192x2048", GgmlType::Q4_0, 8192, 2048),
        // An 8B model's attention and FFN matrices, and the node profile's probe.
        ("Q4_0 4096x4096", GgmlType::Q4_0, 4096, 4096),
        ("Q4_0 14336x4096", GgmlType::Q4_0, 14336, 4096),
        ("Q8_0 512x1024 probe", GgmlType::Q8_0, 512, 1024),
        ("BF16 8192x2048", GgmlType::BF16, 8192, 2048),
        // The same formats on a matrix that stays in L2 (about 110-200 KB): the speed of the
        // kernel's instructions alone, with no memory traffic, which bounds decode speed when
        // it is below the memory bandwidth.
        ("Q2_K 256x2048 in L2", GgmlType::Q2K, 256, 2048),
        ("Q3_K 256x2048 in L2", GgmlType::Q3K, 256, 2048),
        ("Q4_K 256x2048 in L2", GgmlType::Q4K, 256, 2048),
        ("Q5_K 256x2048 in L2", GgmlType::Q5K, 256, 2048),
        ("Q6_K 256x2048 in L2", GgmlType::Q6K, 256, 2048),
        ("IQ4_XS 256x2048 in L2", GgmlType::IQ4XS, 256, 2048),
    ] {
        if !name.contains(filter) {
            continue;
        }
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
        let iters = (2_000_000_000 / (rows * cols * n)).clamp(5, 20000);
        matmul(&pool, &m, &acts, &mut out);
        // The median of five timings of `iters / 5` calls each.
        let mut per: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..iters / 5 {
                    matmul(&pool, &m, &acts, &mut out);
                }
                t.elapsed().as_secs_f64() / (iters / 5) as f64
            })
            .collect();
        per.sort_by(f64::total_cmp);
        let per = per[2];
        let bytes = (rows * ty.row_bytes(cols).unwrap()) as f64;
        println!(
            "{name:16} {:9.1} us/call  {:6.1} GB/s  {:7.2} ns/row-block/token",
            per * 1e6,
            bytes / per / 1e9,
            per * 1e9 / (rows * cols / ty.block_size() * n) as f64 * threads as f64
        );
    }
}
