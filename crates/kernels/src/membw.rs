//! A memory-read bandwidth probe: the roofline that decode speed is measured against.
//!
//! Decoding one token reads every weight once, so `bandwidth / weight bytes` bounds tokens per
//! second. The probe streams a buffer much larger than the last-level cache with the same thread
//! pool (and the same contiguous-chunk split) the matmuls use.

use std::time::Instant;

use crate::ThreadPool;

/// Best-of-`rounds` read bandwidth in bytes per second over a buffer of `bytes` bytes.
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, rounds: usize) -> f64 {
    let probe = ReadProbe::new(bytes);
    (0..rounds.max(1))
        .map(|_| probe.pass(pool))
        .fold(0.0, f64::max)
}

/// A buffer to read again and again, with pools of different sizes in turn (so figures to be
/// compared come from the same moments).
pub struct ReadProbe {
    buf: Vec<u64>,
}

impl ReadProbe {
    /// A buffer of `bytes` bytes (at least 8 KiB), every page touched.
    pub fn new(bytes: usize) -> ReadProbe {
        let words = (bytes / 8).max(1024);
        ReadProbe {
            buf: (0..words as u64).collect(),
        }
    }

    /// Bytes per second of one read of the buffer by every thread of `pool`, each its own
    /// contiguous part.
    pub fn pass(&self, pool: &ThreadPool) -> f64 {
        let n = pool.n_threads();
        let per = self.buf.len() / n;
        let buf = &self.buf;
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
        (per * n * 8) as f64 / secs.max(1e-9)
    }
}
