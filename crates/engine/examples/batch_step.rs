//! Probe: time of one batched decode step for 1..=16 sequences on the default model, to see how
//! much of continuous batching's gain the engine itself delivers (no HTTP, no client).
//!
//! `cargo run --release -p strata-engine --example batch_step [THREADS] [SEQUENCES,...]`
//! (default sequences 1,2,4,8,16; one count alone is what a profiler wants).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use strata_engine::{Batch, Model};
use strata_gguf::GgufFile;

fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let path = strata_store::Store::from_env()
        .unwrap()
        .ensure("smollm2-135m-instruct")
        .unwrap();
    let counts: Vec<usize> = std::env::args()
        .nth(2)
        .map(|c| c.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
    let file = GgufFile::open(&path).unwrap();
    let mut batch = Batch::new(Model::load_full(&file).unwrap(), threads, 16, 512).unwrap();
    println!("| sequences | step ms | tok/s | vs 1 |");
    println!("| ---: | ---: | ---: | ---: |");
    let mut base = 0.0;
    for &n in &counts {
        let slots: Vec<_> = (0..n)
            .map(|i| batch.start(&[1, 2, 3, 4 + i as u32]).unwrap().0)
            .collect();
        let steps: Vec<_> = slots.iter().map(|&s| (s, 100u32)).collect();
        for _ in 0..5 {
            batch.step(&steps).unwrap();
        }
        let reps = 64;
        let t = Instant::now();
        for _ in 0..reps {
            batch.step(&steps).unwrap();
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
        let tps = n as f64 * 1e3 / ms;
        if n == 1 {
            base = tps;
        }
        let vs = if base > 0.0 {
            format!("{:.2}x", tps / base)
        } else {
            "-".into()
        };
        println!("| {n} | {ms:.2} | {tps:.0} | {vs} |");
        for s in slots {
            batch.release(s);
        }
    }
}
