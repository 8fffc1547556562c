//! The engine timed on itself: a batched decode step of a small random-weight model, for the
//! planner's price of what a decoded row costs outside the matrix products.
//!
//! The planner prices matrix products from a matmul probe (within a few percent of the real
//! shapes) and attention from an attention probe, but a batched step also stores each row's
//! keys and values (a scattered column of lines per head), normalises, rotates, quantises and
//! gates every row, and passes through attention colder than a probe keeps it: on SmolLM2 with
//! 16 streams that was about a quarter of the step, and the planner over-predicted batched
//! rates by 45-85 % without it. Rather than model each of those, the probe times the engine's
//! own step, and the same step's matrix products alone (same kernels, same shapes, timed in
//! turn with the steps so both see the same machine): the difference is what the rows cost
//! besides.

use std::time::{Duration, Instant};

use strata_gguf::{GgmlType, GgufFile};
use strata_kernels::formats::quantize_weights;
use strata_kernels::{QMatrix, QuantActs, ThreadPool, WeightBytes, matmul};

use crate::synth::{SynthSpec, byte_vocabulary, synth};
use crate::{Arch, Batch, Model, Result};

/// Decoder layers of the probe model. Its working set (17 MB of weights, 16 sequences' caches)
/// must outgrow the caches a real model's outgrows: on the 2-core Xeon the engine's cost per
/// row and layer outside the products was 12-45 us with 4 layers (warm and erratic) and the
/// same 48-56 us with 8, 16 and 30 (SmolLM2's count).
const LAYERS: usize = 8;
/// Rows the timed steps carry: the batch the planner's many-stream figures are about.
pub const ROWS: usize = 16;
/// Prompt length of each probe sequence: a chat turn's shallow cache.
const PROMPT: usize = 32;
/// Rounds of each kind the probe takes.
const ROUNDS: usize = 9;
/// Weight type of every matrix (one type, so one probed matmul rate prices them).
pub const WEIGHT_TYPE: GgmlType = GgmlType::Q4_1;

/// A timed decode step of the probe model and what it computed.
#[derive(Clone, Debug, PartialEq)]
pub struct StepProbe {
    /// Seconds of one step of [`ROWS`] rows (of the median round, by the difference below).
    pub step_s: f64,
    /// Seconds of the same step's matrix products alone, every layer's and the LM head's,
    /// timed right after the steps of the same round.
    pub products_s: f64,
    /// Rows per step.
    pub rows: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Cached positions each row's attention read, averaged over the timed steps.
    pub depth: f64,
    /// Weights each row multiplies (every layer's matrices and the LM head), all of
    /// [`WEIGHT_TYPE`].
    pub row_params: u64,
    /// Model width, FFN width and attention output width (query heads x head width).
    pub widths: (usize, usize, usize),
}

/// Builds the probe model (SmolLM2's widths: 576 wide, FFN 1536, 9 query and 3 key/value
/// heads of 64) and times batched decode steps on `threads` threads, and their matrix
/// products alone, in turn over nine rounds of at least `round` each (the median of five
/// moved the row cost on the EPYC VM between 2.8 and 9.6 ns from one probe to the next).
pub fn decode_step(threads: usize, round: Duration) -> Result<StepProbe> {
    let (embd, ff, heads) = (576, 1536, 9);
    let spec = SynthSpec {
        arch: Arch::Llama,
        layers: LAYERS,
        embd,
        ff,
        heads,
        kv_heads: 3,
        head_dim: None,
        ty: WEIGHT_TYPE,
        tensor_types: Vec::new(),
        seed: 11,
        sliding_window: None,
        chat_template: None,
        pooling: None,
        experts: None,
    };
    let vocab = GgufFile::from_bytes(byte_vocabulary())?;
    let file = GgufFile::from_bytes(synth(&spec, &vocab)?)?;
    let model = Model::load_full(&file)?;
    let cfg = model.config().clone();
    let (layers, head) = crate::streamed_params(&file, &cfg);
    let row_params = layers.iter().sum::<u64>() + head;
    let n_vocab = cfg.n_vocab as u32;
    let mut batch = Batch::new(model, threads.max(1), ROWS, 512)?;
    let mut slots = Vec::with_capacity(ROWS);
    for s in 0..ROWS {
        let prompt: Vec<u32> = (0..PROMPT)
            .map(|i| ((s * 31 + i * 7) as u32) % n_vocab)
            .collect();
        slots.push(batch.start(&prompt)?.0);
    }
    let mut steps: Vec<_> = slots.iter().map(|&s| (s, 5u32)).collect();
    let mut step = |batch: &mut Batch, i: usize| -> Result<()> {
        for (k, s) in steps.iter_mut().enumerate() {
            s.1 = ((i * 13 + k * 5) as u32) % n_vocab;
        }
        batch.step(&steps)?;
        Ok(())
    };
    let mut taken = 0usize;
    for _ in 0..3 {
        step(&mut batch, taken)?;
        taken += 1;
    }
    let mut products = Products::new(&cfg, LAYERS, threads.max(1))?;
    // Rounds of steps and of products alone in turn, so a burst of load from elsewhere hits a
    // round's pair alike; the median round by their difference.
    let mut rounds: Vec<(f64, f64)> = Vec::with_capacity(ROUNDS);
    let (mut depth_sum, mut timed) = (0.0, 0usize);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let mut reps = 0u32;
        // The context stays short (the cache holds 512 positions).
        while (reps < 2 || t.elapsed() < round) && PROMPT + taken < 480 {
            depth_sum += (PROMPT + taken) as f64;
            timed += 1;
            step(&mut batch, taken)?;
            taken += 1;
            reps += 1;
        }
        let step_s = t.elapsed().as_secs_f64() / f64::from(reps.max(1));
        rounds.push((step_s, products.time(round)));
    }
    rounds.sort_by(|a, b| (a.0 - a.1).total_cmp(&(b.0 - b.1)));
    let (step_s, products_s) = rounds[rounds.len() / 2];
    for s in slots {
        batch.release(s);
    }
    Ok(StepProbe {
        step_s,
        products_s,
        rows: ROWS,
        layers: LAYERS,
        depth: depth_sum / timed.max(1) as f64,
        row_params,
        widths: (embd, ff, heads * (embd / heads)),
    })
}

/// A `rows x cols` matrix of weight type `ty` for timing the kernels: deterministic values in
/// [-0.5, 0.5), quantised as a model's would be and prepared as the engine prepares its
/// weights (the node's matmul probe times the same kind of matrix).
pub fn matrix(ty: GgmlType, rows: usize, cols: usize) -> strata_kernels::Result<QMatrix> {
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let bytes = quantize_weights(ty, &w);
    QMatrix::new(ty, rows, cols, WeightBytes::Owned(bytes)).map(QMatrix::prepared)
}

/// A decode step's matrix products on their own: one layer's matrices (the engine's shapes
/// and weight type), prepared as the engine prepares them, times [`ROWS`] activation rows,
/// quantised where the engine quantises them (once for q, k and v, once for gate and up), for
/// every layer, then the LM head.
struct Products {
    pool: ThreadPool,
    /// q, k, v, o, gate, up, down, the head.
    mats: Vec<QMatrix>,
    /// `(matrix, quantise its input first)`, in the order a step runs them.
    order: Vec<(usize, bool)>,
    x: Vec<f32>,
    acts: QuantActs,
    out: Vec<f32>,
}

impl Products {
    fn new(cfg: &crate::ModelConfig, layers: usize, threads: usize) -> Result<Products> {
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let q = cfg.n_head * cfg.head_dim;
        let kv = cfg.n_head_kv * cfg.head_dim;
        let shapes = [
            (q, e),
            (kv, e),
            (kv, e),
            (e, q),
            (ff, e),
            (ff, e),
            (e, ff),
            (cfg.n_vocab, e),
        ];
        let mats = shapes
            .iter()
            .map(|&(rows, cols)| {
                matrix(WEIGHT_TYPE, rows, cols).map_err(|source| crate::Error::Kernel {
                    tensor: format!("probe {rows}x{cols}"),
                    source,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let layer = [
            (0, true),
            (1, false),
            (2, false),
            (3, true),
            (4, true),
            (5, false),
            (6, true),
        ];
        let mut order: Vec<(usize, bool)> = (0..layers).flat_map(|_| layer).collect();
        order.push((7, true));
        let widest = shapes.iter().map(|s| s.1).max().unwrap_or(0);
        let tallest = shapes.iter().map(|s| s.0).max().unwrap_or(0);
        Ok(Products {
            pool: ThreadPool::new(threads),
            mats,
            order,
            x: (0..ROWS * widest)
                .map(|i| ((i % 17) as f32 - 8.0) * 0.1)
                .collect(),
            acts: QuantActs::new(),
            out: vec![0f32; ROWS * tallest],
        })
    }

    /// Seconds of one step's products: the mean over at least `round`.
    fn time(&mut self, round: Duration) -> f64 {
        let Products {
            pool,
            mats,
            order,
            x,
            acts,
            out,
        } = self;
        let mut once = || {
            for &(i, quantise) in order.iter() {
                let m = &mats[i];
                if quantise {
                    acts.quantize(WEIGHT_TYPE, &x[..ROWS * m.cols()], ROWS, m.cols());
                }
                matmul(pool, m, acts, &mut out[..ROWS * m.rows()]);
            }
        };
        let t = Instant::now();
        let mut reps = 0u32;
        while reps < 2 || t.elapsed() < round {
            once();
            reps += 1;
        }
        std::hint::black_box(&*out);
        t.elapsed().as_secs_f64() / f64::from(reps)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The probe runs the real engine and reports what it ran: a positive time, and the
    /// weights a row multiplies counted from the model's own matrices.
    #[test]
    fn the_probe_times_a_real_batched_step() {
        let p = decode_step(1, Duration::from_millis(5)).unwrap();
        assert!(p.step_s.is_finite() && p.step_s > 0.0, "{p:?}");
        // The products are most of a step, and not all of it.
        assert!(
            p.products_s > 0.2 * p.step_s && p.products_s < p.step_s,
            "{p:?}"
        );
        assert_eq!((p.rows, p.layers), (ROWS, LAYERS));
        // Per layer q (576x576), k and v (192x576 each), o (576x576), gate, up and down
        // (1536x576 each); the LM head is the 262-token vocabulary by 576.
        let per_layer = 576 * 576 * 2 + 192 * 576 * 2 + 1536 * 576 * 3;
        assert_eq!(p.row_params, (LAYERS * per_layer + 262 * 576) as u64);
        assert!(p.depth > PROMPT as f64 && p.depth < 480.0, "{p:?}");
        assert_eq!(p.widths, (576, 1536, 576));
    }
}
