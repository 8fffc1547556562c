//! What a node tells the cluster about itself: who it is, how much memory it can give, and how
//! fast it measured itself. The planner trusts measurements, not labels: two boxes with the same
//! core count can differ twofold in memory bandwidth, which is what decoding runs on.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_kernels::{GgmlType, QMatrix, QuantActs, ThreadPool, WeightBytes};

/// A node's self-description, published on the control plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Stable node id.
    pub id: String,
    /// Human name (`--name`, default the hostname).
    pub name: String,
    /// Host name.
    pub hostname: String,
    /// strata version.
    pub version: String,
    /// Physical memory, bytes.
    pub memory_total: u64,
    /// Memory available to models now (capped by `--memory-limit`), bytes.
    pub memory_available: u64,
    /// Cores usable by this process.
    pub cores: usize,
    /// Compute backend and the instruction sets its kernels use.
    pub backend: String,
    /// Measured quantised matrix-multiply throughput, GFLOP/s (all cores).
    pub matmul_gflops: f64,
    /// Measured memory read bandwidth, bytes per second (all cores).
    pub mem_bandwidth: f64,
    /// Where this node's HTTP API listens (as the node sees it).
    pub api_addr: String,
    /// Unix time the node started.
    pub started_at: u64,
    /// `--memory-limit`, bytes, if one was given.
    #[serde(default)]
    pub memory_limit: Option<u64>,
}

/// Memory figures from `/proc/meminfo`: (total, available) in bytes.
pub fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The backend string: `cpu` and the SIMD kernels in use.
pub fn backend() -> String {
    if strata_kernels::isa().avx2 {
        "cpu-avx2".into()
    } else {
        "cpu-portable".into()
    }
}

/// Speed measurements of this machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speed {
    /// Quantised matmul, GFLOP/s.
    pub matmul_gflops: f64,
    /// Memory read bandwidth, bytes per second.
    pub mem_bandwidth: f64,
}

/// Measures matmul throughput and memory bandwidth on `threads` threads (about half a second).
pub fn measure_speed(threads: usize) -> Speed {
    let pool = ThreadPool::new(threads.max(1));
    let mem_bandwidth = strata_kernels::membw::read_bandwidth(&pool, 128 << 20, 2);
    Speed {
        matmul_gflops: matmul_gflops(&pool),
        mem_bandwidth,
    }
}

/// Q8_0 weights times 32 activation rows: the prefill-shaped work, bound by compute.
pub fn matmul_gflops(pool: &ThreadPool) -> f64 {
    const ROWS: usize = 1024;
    const COLS: usize = 1024;
    const N: usize = 32;
    // Q8_0 blocks: an f16 scale (0.01) then 32 signed bytes.
    let mut bytes = Vec::with_capacity(ROWS * COLS / 32 * 34);
    for b in 0..ROWS * COLS / 32 {
        bytes.extend_from_slice(&half_bits(0.01));
        bytes.extend((0..32).map(|i| ((b * 31 + i * 7) % 255) as u8));
    }
    let Ok(w) = QMatrix::new(GgmlType::Q8_0, ROWS, COLS, WeightBytes::Owned(bytes)) else {
        return 0.0;
    };
    let w = w.prepared();
    let x: Vec<f32> = (0..N * COLS)
        .map(|i| ((i % 17) as f32 - 8.0) * 0.1)
        .collect();
    let mut acts = QuantActs::new();
    let mut out = vec![0f32; N * ROWS];
    let flops = 2.0 * (ROWS * COLS * N) as f64;
    // Warm up, then the best of a few rounds of ~20 ms each.
    acts.quantize(GgmlType::Q8_0, &x, N, COLS);
    strata_kernels::matmul(pool, &w, &acts, &mut out);
    let mut best = 0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let mut reps = 0u32;
        while t.elapsed().as_secs_f64() < 0.02 {
            acts.quantize(GgmlType::Q8_0, &x, N, COLS);
            strata_kernels::matmul(pool, &w, &acts, &mut out);
            reps += 1;
        }
        best = best.max(flops * f64::from(reps) / t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    best / 1e9
}

fn half_bits(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_are_positive_and_finite() {
        let s = measure_speed(1);
        assert!(
            s.matmul_gflops.is_finite() && s.matmul_gflops > 0.1,
            "{s:?}"
        );
        assert!(
            s.mem_bandwidth.is_finite() && s.mem_bandwidth > 1e8,
            "{s:?}"
        );
        let (total, avail) = memory();
        assert!(total > 0 && avail > 0 && avail <= total);
    }
}
