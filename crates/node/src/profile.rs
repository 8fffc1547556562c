//! What a node tells the cluster about itself: who it is, how much memory it can give, and how
//! fast it measured itself. The planner trusts measurements, not labels: two boxes with the same
//! core count can differ twofold in memory bandwidth, which is what decoding runs on.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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
    /// Measured quantised matrix-multiply throughput, GFLOP/s (all cores), on Q8_0 weights.
    pub matmul_gflops: f64,
    /// The same per weight type (ggml's names): the kernels differ by up to 2x between
    /// types, so the planner prices each model's matrices at their own type's rate (empty
    /// from older nodes: every type at `matmul_gflops`).
    #[serde(default)]
    pub matmul_gflops_by_type: BTreeMap<String, f64>,
    /// Measured attention throughput over an f16 cache, GFLOP/s (0 from older nodes).
    #[serde(default)]
    pub attention_gflops: f64,
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
#[derive(Clone, Debug, PartialEq)]
pub struct Speed {
    /// Quantised matmul on Q8_0 weights, GFLOP/s.
    pub matmul_gflops: f64,
    /// Matmul per weight type (every type the synthetic models write), GFLOP/s.
    pub matmul_gflops_by_type: BTreeMap<String, f64>,
    /// Attention over an f16 cache, GFLOP/s.
    pub attention_gflops: f64,
    /// Memory read bandwidth, bytes per second.
    pub mem_bandwidth: f64,
}

/// Measures matmul throughput (per weight type), attention throughput and memory bandwidth on
/// `threads` threads.
pub fn measure_speed(threads: usize) -> Speed {
    let pool = ThreadPool::new(threads.max(1));
    let mem_bandwidth = strata_kernels::membw::read_bandwidth(&pool, 128 << 20, 2);
    let by_type = matmul_gflops_by_type(&pool);
    Speed {
        matmul_gflops: q8_0_gflops(&by_type),
        matmul_gflops_by_type: by_type,
        attention_gflops: attention_gflops(pool.n_threads()),
        mem_bandwidth,
    }
}

/// The headline matmul figure of a [`matmul_gflops_by_type`] map: Q8_0's, the rate the planner
/// gives a type without its own.
pub fn q8_0_gflops(by_type: &BTreeMap<String, f64>) -> f64 {
    by_type.get(GgmlType::Q8_0.name()).copied().unwrap_or(0.0)
}

/// [`matmul_gflops_of`] for every weight type strata writes (the types GGUF models store
/// their matrices in), by ggml name. The planner prices any other type at the Q8_0 rate.
pub fn matmul_gflops_by_type(pool: &ThreadPool) -> BTreeMap<String, f64> {
    strata_engine::synth::WRITABLE
        .iter()
        .map(|&ty| {
            (
                ty.name().to_string(),
                matmul_gflops_of(pool, ty, 3, Duration::from_millis(15)),
            )
        })
        .filter(|(_, g)| *g > 0.0)
        .collect()
}

/// Weights of `ty` (512 x 1024, in cache: the kernel's own speed) times 32 activation rows,
/// quantising the activations each time as a prefill does: the best of `rounds` rounds of
/// `round` each, GFLOP/s (0 if the kernels do not take the type).
pub fn matmul_gflops_of(pool: &ThreadPool, ty: GgmlType, rounds: usize, round: Duration) -> f64 {
    const ROWS: usize = 512;
    const COLS: usize = 1024;
    const N: usize = 32;
    let w: Vec<f32> = (0..ROWS * COLS)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let bytes = strata_kernels::formats::quantize_weights(ty, &w);
    let Ok(w) = QMatrix::new(ty, ROWS, COLS, WeightBytes::Owned(bytes)) else {
        return 0.0;
    };
    let w = w.prepared();
    let x: Vec<f32> = (0..N * COLS)
        .map(|i| ((i % 17) as f32 - 8.0) * 0.1)
        .collect();
    let mut acts = QuantActs::new();
    let mut out = vec![0f32; N * ROWS];
    let flops = 2.0 * (ROWS * COLS * N) as f64;
    // Warm up, then the best of the rounds.
    acts.quantize(ty, &x, N, COLS);
    strata_kernels::matmul(pool, &w, &acts, &mut out);
    let mut best = 0f64;
    for _ in 0..rounds {
        let t = Instant::now();
        let mut reps = 0u32;
        while t.elapsed() < round {
            acts.quantize(ty, &x, N, COLS);
            strata_kernels::matmul(pool, &w, &acts, &mut out);
            reps += 1;
        }
        best = best.max(flops * f64::from(reps) / t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    best / 1e9
}

/// Decode attention as the engine runs it, for one query group (three heads of 64 sharing a
/// key/value head) over 1,024 cached f16 positions: scores, softmax, and the weighted sum of
/// the values. Timed on one thread and scaled by `threads` (the engine spreads head groups
/// and sequences over its threads), GFLOP/s of the two products.
pub fn attention_gflops(threads: usize) -> f64 {
    use strata_kernels::attn;
    const HD: usize = 64;
    const G: usize = 3;
    const LEN: usize = 1024;
    let flavour = attn::Flavour::native();
    let order = flavour.single();
    let q: Vec<f32> = (0..G * HD)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.05)
        .collect();
    let keys: Vec<half::f16> = (0..LEN * HD)
        .map(|i| half::f16::from_f32(((i * 31) % 97) as f32 / 97.0 - 0.5))
        .collect();
    let stride = attn::padded_len(order, LEN);
    let values: Vec<half::f16> = (0..HD * stride)
        .map(|i| half::f16::from_f32(((i * 17) % 89) as f32 / 89.0 - 0.5))
        .collect();
    let mut scores = vec![0f32; G * stride];
    let mut out = vec![0f32; G * HD];
    let once = |scores: &mut [f32], out: &mut [f32]| {
        attn::scores_grouped(order, &q, HD, &keys, LEN, 0.125, scores, stride);
        for row in scores.chunks_mut(stride) {
            strata_kernels::ops::softmax(&mut row[..LEN], None, flavour);
            strata_kernels::ops::round_f16_slice(&mut row[..LEN]);
        }
        attn::weighted_sum_grouped(order, scores, stride, &values, stride, HD, stride, out);
    };
    once(&mut scores, &mut out);
    let flops = 4.0 * (G * HD * LEN) as f64;
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let mut reps = 0u32;
        while t.elapsed() < Duration::from_millis(10) {
            once(&mut scores, &mut out);
            reps += 1;
        }
        best = best.max(flops * f64::from(reps) / t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    best * threads.max(1) as f64 / 1e9
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
        assert!(
            s.attention_gflops.is_finite() && s.attention_gflops > 0.1,
            "{s:?}"
        );
        // Every probed type the kernels take was timed, Q8_0 among them.
        for ty in strata_engine::synth::WRITABLE {
            let g = s.matmul_gflops_by_type.get(ty.name());
            assert!(
                g.is_some_and(|g| g.is_finite() && *g > 0.1),
                "{ty:?}: {s:?}"
            );
        }
        let (total, avail) = memory();
        assert!(total > 0 && avail > 0 && avail <= total);
    }
}
