//! What a node tells the cluster about itself: who it is, how much memory it can give, and how
//! fast it measured itself. The planner trusts measurements, not labels: two boxes with the same
//! core count can differ twofold in memory bandwidth, which is what decoding runs on.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_kernels::{GgmlType, QuantActs, ThreadPool};

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
    /// Measured attention throughput over an f16 cache, GFLOP/s of the part that grows with
    /// the positions read (0 from older nodes).
    #[serde(default)]
    pub attention_gflops: f64,
    /// Measured fixed part of attention, microseconds per query head per decoded row per layer
    /// (0 from older nodes).
    #[serde(default)]
    pub attention_fixed_us: f64,
    /// Measured cost of a decoded row outside the matrix products and attention's part that
    /// grows with depth, nanoseconds per row, per layer, per element of the layer's widths
    /// (model, FFN and attention output); see [`row_cost_s`] (0 from older nodes).
    #[serde(default)]
    pub row_cost_ns: f64,
    /// Measured memory read bandwidth, bytes per second (all cores).
    pub mem_bandwidth: f64,
    /// Billions of weights per second the matmul kernels take in per weight type at one
    /// activation row with the weights streaming from memory, as single-stream decoding reads
    /// them (see [`stream_gweights_of`]; empty from older nodes: decoding at `mem_bandwidth`).
    #[serde(default)]
    pub stream_gweights_by_type: BTreeMap<String, f64>,
    /// The machine this node runs on ([`machine_id`]; empty from older nodes): nodes on one
    /// machine share its memory bus.
    #[serde(default)]
    pub machine: String,
    /// The machine's memory read bandwidth with every core reading, bytes per second (0 from
    /// older nodes).
    #[serde(default)]
    pub machine_bandwidth: f64,
    /// What each exchange of a decode step costs this node beyond the link's own figures,
    /// microseconds ([`strata_net::exchange_overhead`]; 0 from older nodes).
    #[serde(default)]
    pub exchange_overhead_us: f64,
    /// Where this node's HTTP API listens (as the node sees it).
    pub api_addr: String,
    /// Unix time the node started.
    pub started_at: u64,
    /// `--memory-limit`, bytes, if one was given.
    #[serde(default)]
    pub memory_limit: Option<u64>,
}

/// Memory figures from `/proc/meminfo`: (total, available) in bytes.
#[cfg(not(target_os = "macos"))]
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

/// Memory figures from the kernel (`hw.memsize` and the VM statistics; see
/// [`crate::host::memory`]): (total, available) in bytes.
#[cfg(target_os = "macos")]
pub fn memory() -> (u64, u64) {
    crate::host::memory()
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
    /// Attention over an f16 cache, GFLOP/s of the part that grows with depth.
    pub attention_gflops: f64,
    /// Attention's fixed part, microseconds per query head per row per layer.
    pub attention_fixed_us: f64,
    /// A decoded row's cost beyond matrix products and attention's depth, nanoseconds per
    /// row, layer and element of width.
    pub row_cost_ns: f64,
    /// Memory read bandwidth, bytes per second.
    pub mem_bandwidth: f64,
    /// One-row matmul from memory per weight type, billions of weights per second.
    pub stream_gweights_by_type: BTreeMap<String, f64>,
    /// Memory read bandwidth with every core of the machine reading, bytes per second.
    pub machine_bandwidth: f64,
    /// An exchange's cost after reading other data beyond a back-to-back one, microseconds.
    pub exchange_overhead_us: f64,
}

/// What identifies this machine among the nodes: `/etc/machine-id` (the same in every network
/// namespace and container sharing the host's), else the host name.
#[cfg(not(target_os = "macos"))]
pub fn machine_id() -> String {
    std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(crate::identity::hostname)
}

/// What identifies this machine among the nodes: its hardware UUID (`gethostuuid`, the one
/// System Information shows), else the host name.
#[cfg(target_os = "macos")]
pub fn machine_id() -> String {
    crate::host::host_uuid().unwrap_or_else(crate::identity::hostname)
}

/// Passes of each read-bandwidth figure of [`bandwidths`].
const BANDWIDTH_PASSES: usize = 6;

/// Read bandwidth with `pool`'s threads reading, and with every core of the machine reading
/// (the same figure when the pool is every core): the best of six passes each over one 128 MB
/// buffer, the two kinds in turn, so both come from the same moments. The planner splits the
/// machine's figure among the nodes of one machine that work at once, so their ratio matters
/// as much as either: taken apart, on a VM whose speed flips every second or so, they could
/// come from different states (the EPYC's two co-located tensor ranks were once priced at
/// 1.09x one node and ran at 1.33x).
pub fn bandwidths(pool: &ThreadPool) -> (f64, f64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let probe = strata_kernels::membw::ReadProbe::new(128 << 20);
    let every = (pool.n_threads() < cores).then(|| ThreadPool::new(cores));
    let (mut mine, mut machine) = (0f64, 0f64);
    for _ in 0..BANDWIDTH_PASSES {
        mine = mine.max(probe.pass(pool));
        if let Some(every) = &every {
            machine = machine.max(probe.pass(every));
        }
    }
    (mine, machine.max(mine))
}

/// Measures matmul throughput (per weight type), attention throughput and memory bandwidth on
/// `threads` threads.
pub fn measure_speed(threads: usize) -> Speed {
    let pool = ThreadPool::new(threads.max(1));
    let (mem_bandwidth, machine_bandwidth) = bandwidths(&pool);
    let by_type = matmul_gflops_by_type(&pool);
    let attention = attention_speed(pool.n_threads());
    let row_cost = row_cost_s(pool.n_threads(), &attention);
    let stream_gweights_by_type = stream_gweights_by_type(&pool);
    Speed {
        exchange_overhead_us: exchange_overhead_us().unwrap_or(0.0),
        machine_bandwidth,
        stream_gweights_by_type,
        matmul_gflops: q8_0_gflops(&by_type),
        matmul_gflops_by_type: by_type,
        attention_gflops: attention.gflops,
        attention_fixed_us: attention.fixed_s * 1e6,
        row_cost_ns: row_cost * 1e9,
        mem_bandwidth,
    }
}

/// [`strata_net::exchange_overhead`] in microseconds; `None` when it cannot run (a machine
/// without shared memory or loopback). A node then publishes 0 and the planner prices its
/// exchanges by the links alone; a measured 0 (no overhead to see) stays a measurement.
pub fn exchange_overhead_us() -> Option<f64> {
    strata_net::exchange_overhead().ok().map(|s| s * 1e6)
}

/// What a decoded row costs the engine besides its matrix products and the part of attention
/// that grows with depth, seconds per row, per layer, per element of the layer's widths (the
/// model's, the FFN's and the attention output's): storing its keys and values, norms, RoPE,
/// quantising and gating it, and attention's passes at a short context. The engine's own
/// batched step on a small model less the same step's products timed alone
/// ([`strata_engine::probe`]), less attention's depth at `attention`'s rate; 0 when the probe
/// cannot run.
pub fn row_cost_s(threads: usize, attention: &AttentionSpeed) -> f64 {
    let Ok(p) = strata_engine::probe::decode_step(threads, Duration::from_millis(20)) else {
        return 0.0;
    };
    let (embd, ff, q) = p.widths;
    let per_row = (p.step_s - p.products_s) / p.rows as f64 / p.layers as f64;
    let depth = if attention.gflops > 0.0 {
        4.0 * q as f64 * p.depth / (attention.gflops * 1e9)
    } else {
        0.0
    };
    ((per_row - depth) / (embd + ff + q) as f64).max(0.0)
}

/// The headline matmul figure of a [`matmul_gflops_by_type`] map: Q8_0's, the rate the planner
/// gives a type without its own.
pub fn q8_0_gflops(by_type: &BTreeMap<String, f64>) -> f64 {
    by_type.get(GgmlType::Q8_0.name()).copied().unwrap_or(0.0)
}

/// Rounds of [`matmul_gflops_by_type`]: each round gives every type one slice, the types in
/// turn.
const MATMUL_ROUNDS: usize = 6;
/// One type's slice of a round.
const MATMUL_SLICE: Duration = Duration::from_millis(10);

/// The matmul probe (see [`matmul_gflops_of`]) for every weight type strata writes (the types
/// GGUF models store their matrices in), by ggml name: GFLOP/s over all of a type's slices,
/// the types taking turns through six rounds of 10 ms slices. Each figure is thus spread over
/// the whole probe (about a second) rather than taken in one burst: on the EPYC VM the speed
/// flips between two states a second or so apart (Q4_1 55-59 against 65-74 GFLOP/s), and the
/// best of three 15 ms rounds of one burst read one state or the other, moving the planner's
/// figures by a fifth from one probe to the next while benchmarks of minutes average both.
/// The planner prices any other type at the Q8_0 rate.
pub fn matmul_gflops_by_type(pool: &ThreadPool) -> BTreeMap<String, f64> {
    let mut probes: Vec<(GgmlType, MatmulProbe)> = strata_engine::synth::WRITABLE
        .iter()
        .filter_map(|&ty| MatmulProbe::new(pool, ty).map(|p| (ty, p)))
        .collect();
    for _ in 0..MATMUL_ROUNDS {
        for (_, p) in &mut probes {
            p.slice(pool, MATMUL_SLICE);
        }
    }
    probes
        .iter()
        .map(|(ty, p)| (ty.name().to_string(), p.gflops()))
        .filter(|(_, g)| *g > 0.0)
        .collect()
}

/// [`stream_gweights_of`] for every weight type strata writes, by ggml name.
pub fn stream_gweights_by_type(pool: &ThreadPool) -> BTreeMap<String, f64> {
    strata_engine::synth::WRITABLE
        .iter()
        .map(|&ty| (ty.name().to_string(), stream_gweights_of(pool, ty)))
        .filter(|(_, g)| *g > 0.0)
        .collect()
}

/// Billions of weights of `ty` per second the matmul kernels take in at one activation row
/// from a matrix of 64 MiB (twice a large server core complex's L3, so it streams from
/// memory): the best of two passes. A single stream's decode reads every weight once per
/// token at this rate or at the memory's bandwidth, whichever is slower. On an AVX2 EPYC the
/// kernels at one row stay below the bandwidth a plain read reaches on one thread, and the
/// planner priced single-stream decode a quarter too fast on bandwidth alone. One quantised
/// tile repeated down the rows: the kernels' speed does not depend on the values.
pub fn stream_gweights_of(pool: &ThreadPool, ty: GgmlType) -> f64 {
    const COLS: usize = 2048;
    const TILE_ROWS: usize = 64;
    const BYTES: usize = 64 << 20;
    let w: Vec<f32> = (0..TILE_ROWS * COLS)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let tile = strata_kernels::formats::quantize_weights(ty, &w);
    if tile.is_empty() {
        return 0.0;
    }
    let reps = (BYTES / tile.len()).max(1);
    let rows = TILE_ROWS * reps;
    let bytes = tile.repeat(reps);
    let Ok(m) =
        strata_kernels::QMatrix::new(ty, rows, COLS, strata_kernels::WeightBytes::Owned(bytes))
            .map(strata_kernels::QMatrix::prepared)
    else {
        return 0.0;
    };
    let x: Vec<f32> = (0..COLS).map(|i| ((i % 17) as f32 - 8.0) * 0.1).collect();
    let mut acts = QuantActs::new();
    let mut out = vec![0f32; rows];
    acts.quantize(ty, &x, 1, COLS);
    // A first pass touches every page; then the best of two.
    strata_kernels::matmul(pool, &m, &acts, &mut out);
    let mut best = f64::MAX;
    for _ in 0..2 {
        let t = Instant::now();
        strata_kernels::matmul(pool, &m, &acts, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    (rows * COLS) as f64 / best / 1e9
}

/// Weights of `ty` (512 x 1024, in cache: the kernel's own speed) times 32 activation rows,
/// quantising the activations each time as a prefill does: the best of `rounds` rounds of
/// `round` each, GFLOP/s (0 if the kernels do not take the type).
pub fn matmul_gflops_of(pool: &ThreadPool, ty: GgmlType, rounds: usize, round: Duration) -> f64 {
    let Some(mut p) = MatmulProbe::new(pool, ty) else {
        return 0.0;
    };
    (0..rounds)
        .map(|_| p.slice(pool, round))
        .fold(0.0, f64::max)
}

/// The matmul probe of one weight type, timed in slices: weights of the type (512 x 1024, in
/// cache: the kernel's own speed) times 32 activation rows, quantising the activations each
/// time as a prefill does.
struct MatmulProbe {
    ty: GgmlType,
    w: strata_kernels::QMatrix,
    x: Vec<f32>,
    acts: QuantActs,
    out: Vec<f32>,
    /// FLOPs and seconds of every slice so far.
    flops: f64,
    secs: f64,
}

impl MatmulProbe {
    const ROWS: usize = 512;
    const COLS: usize = 1024;
    const N: usize = 32;

    /// The probe of `ty`, warmed up by one product; `None` if the kernels do not take the type.
    fn new(pool: &ThreadPool, ty: GgmlType) -> Option<MatmulProbe> {
        let w = strata_engine::probe::matrix(ty, Self::ROWS, Self::COLS).ok()?;
        let x = (0..Self::N * Self::COLS)
            .map(|i| ((i % 17) as f32 - 8.0) * 0.1)
            .collect();
        let mut p = MatmulProbe {
            ty,
            w,
            x,
            acts: QuantActs::new(),
            out: vec![0f32; Self::N * Self::ROWS],
            flops: 0.0,
            secs: 0.0,
        };
        p.product(pool);
        Some(p)
    }

    fn product(&mut self, pool: &ThreadPool) {
        self.acts.quantize(self.ty, &self.x, Self::N, Self::COLS);
        strata_kernels::matmul(pool, &self.w, &self.acts, &mut self.out);
        std::hint::black_box(&self.out);
    }

    /// Runs products for at least `round`; this slice's GFLOP/s.
    fn slice(&mut self, pool: &ThreadPool, round: Duration) -> f64 {
        let t = Instant::now();
        let mut reps = 0u32;
        while t.elapsed() < round {
            self.product(pool);
            reps += 1;
        }
        let secs = t.elapsed().as_secs_f64();
        let flops = 2.0 * (Self::ROWS * Self::COLS * Self::N) as f64 * f64::from(reps);
        self.flops += flops;
        self.secs += secs;
        flops / secs / 1e9
    }

    /// GFLOP/s over every slice so far.
    fn gflops(&self) -> f64 {
        if self.secs > 0.0 {
            self.flops / self.secs / 1e9
        } else {
            0.0
        }
    }
}

/// What decode attention costs here: a part that grows with the cached positions a token
/// reads, and a part that does not (per head and row: the query's setup, the softmax's and the
/// weighted sum's passes, the tails of short rows), which dominates at the short contexts of
/// chat turns (on SmolLM2 with 16 streams about 40 positions deep, the fixed part was most of
/// attention's tenth of a step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpeed {
    /// Throughput of the part that grows with depth (the two products), GFLOP/s.
    pub gflops: f64,
    /// The fixed part, seconds per query head per row per layer.
    pub fixed_s: f64,
}

/// Decode attention as the engine runs it, for one query group (three heads of 64 sharing a
/// key/value head): the new position's key and value stored (f16, the value down its
/// column), scores, softmax, and the weighted sum of the values, over 16 and over 1,024
/// cached positions; the line through the two gives the fixed part and the rate. The cache is
/// laid out as the engine's (values transposed in tiles of 256 positions) and spread over
/// more memory than a core's caches hold, as a batch's cache is, so the fixed part includes
/// fetching a short context's scattered value rows. Timed on one thread and scaled by
/// `threads` (the engine spreads head groups and sequences over its threads).
pub fn attention_speed(threads: usize) -> AttentionSpeed {
    const SHORT: usize = 16;
    const LONG: usize = 1024;
    let (short, long) = (attention_pass(SHORT), attention_pass(LONG));
    let per_position = ((long - short) / (LONG - SHORT) as f64).max(1e-15);
    let fixed = (short - per_position * SHORT as f64).max(0.0);
    let threads = threads.max(1) as f64;
    AttentionSpeed {
        gflops: 4.0 * (PROBE_GROUP * PROBE_HEAD_DIM) as f64 / per_position * threads / 1e9,
        fixed_s: fixed / PROBE_GROUP as f64 / threads,
    }
}

/// Query heads per key/value head in the attention probe (SmolLM2's grouping).
const PROBE_GROUP: usize = 3;
/// Head width in the attention probe.
const PROBE_HEAD_DIM: usize = 64;

/// Seconds of one group's attention pass over `len` cached positions on this thread (a
/// multiple of the kernels' step): the best of three rounds, each pass on the next of copies
/// spanning 24 MiB. Value rows are a tile apart when `len` fits a tile, as in the engine; a
/// longer context's rows are whole (the engine reads its tiles as runs one after another).
fn attention_pass(len: usize) -> f64 {
    use strata_kernels::attn;
    const HD: usize = PROBE_HEAD_DIM;
    const G: usize = PROBE_GROUP;
    // The engine's value tiles are prefix-cache blocks.
    const TILE: usize = strata_engine::prefix::BLOCK;
    let flavour = attn::Flavour::native();
    let order = flavour.single();
    let lenp = attn::padded_len(order, len);
    let vs = lenp.max(TILE);
    let copy = lenp * HD + HD * vs;
    let copies = ((24usize << 20) / (2 * copy)).max(2);
    let mut cache: Vec<half::f16> = (0..copies * copy)
        .map(|i| half::f16::from_f32(((i * 31) % 97) as f32 / 97.0 - 0.5))
        .collect();
    let q: Vec<f32> = (0..G * HD)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.05)
        .collect();
    let new: Vec<f32> = (0..HD).map(|i| (i as f32 - 32.0) * 0.01).collect();
    let mut scores = vec![0f32; G * lenp];
    let mut out = vec![0f32; G * HD];
    let mut next = 0usize;
    let mut once = |scores: &mut [f32], out: &mut [f32]| {
        let c = &mut cache[next * copy..(next + 1) * copy];
        next = (next + 1) % copies;
        let (keys, values) = c.split_at_mut(lenp * HD);
        // The new position (the last): its key in place, its value down the column.
        let last = len - 1;
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(
            &mut keys[last * HD..(last + 1) * HD],
            &new,
        );
        for (d, &x) in new.iter().enumerate() {
            values[d * vs + last] = half::f16::from_f32(x);
        }
        attn::scores_grouped(order, &q, HD, keys, len, 0.125, scores, lenp);
        for row in scores.chunks_mut(lenp) {
            strata_kernels::ops::softmax(&mut row[..len], None, flavour);
            strata_kernels::ops::round_f16_slice(&mut row[..len]);
        }
        attn::weighted_sum_grouped(order, scores, lenp, values, vs, HD, lenp, out);
    };
    once(&mut scores, &mut out);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        let mut reps = 0u32;
        while t.elapsed() < Duration::from_millis(10) {
            once(&mut scores, &mut out);
            reps += 1;
        }
        best = best.min(t.elapsed().as_secs_f64() / f64::from(reps));
    }
    std::hint::black_box(&out);
    best
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
        // A pass has a cost of its own (well under a millisecond per head here).
        assert!(
            s.attention_fixed_us.is_finite() && (0.0..1000.0).contains(&s.attention_fixed_us),
            "{s:?}"
        );
        // Every core reading together reads at least what the node's threads do.
        assert!(
            s.machine_bandwidth.is_finite() && s.machine_bandwidth >= s.mem_bandwidth,
            "{s:?}"
        );
        // An exchange after reading other data costs something finite, in microseconds
        // (under 0.1 s even on a test machine whose cores are busy with other tests).
        assert!(
            s.exchange_overhead_us.is_finite() && (0.0..1e5).contains(&s.exchange_overhead_us),
            "{s:?}"
        );
        // The engine's own step costs something beyond its products (a row stores its keys
        // and values at least), well under a microsecond per element here.
        assert!(
            s.row_cost_ns.is_finite() && s.row_cost_ns > 0.0 && s.row_cost_ns < 1000.0,
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
        // And streamed at one row, at some billions of weights a second.
        for ty in strata_engine::synth::WRITABLE {
            let g = s.stream_gweights_by_type.get(ty.name());
            assert!(
                g.is_some_and(|g| g.is_finite() && *g > 0.05),
                "{ty:?}: {s:?}"
            );
        }
        let (total, avail) = memory();
        assert!(total > 0 && avail > 0 && avail <= total);
    }
}
