//! A memory-read bandwidth probe: the roofline that decode speed is measured against.
//!
//! Decoding one token reads every weight once, so `bandwidth / weight bytes` bounds tokens per
//! second. The probe streams a buffer much larger than the last-level cache with the same thread
//! pool (and the same contiguous-chunk split) the matmuls use.

use std::time::Instant;

use crate::ThreadPool;

/// Best-of-`rounds` read bandwidth in bytes per second over a buffer of `bytes` bytes.
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, rounds: usize) -> f64 {
    let words = (bytes / 8).max(1024);
    let buf: Vec<u64> = (0..words as u64).collect();
    let n = pool.n_threads();
    let per = words / n;
    let buf = &buf;
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        pool.run(&|tid| {
            let part = &buf[tid * per..(tid + 1) * per];
            let mut acc = [0u64; 8];
            for c in part.chunks_exact(8) {
                for (a, &v) in acc.iter_mut().zip(c) {
                    *a = a.wrapping_add(v);
                }
            }
            std::hint::black_box(acc);
        });
        let secs = start.elapsed().as_secs_f64();
        best = best.max((per * n * 8) as f64 / secs.max(1e-9));
    }
    best
}
