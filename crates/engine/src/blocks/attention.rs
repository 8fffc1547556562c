//! Self-attention with one head width for keys, values and queries (every family but
//! DeepSeek's): the Q/K/V projections, per-head norms, RoPE, the KV cache, then grouped-query
//! attention, which scores each cached key once for all the query heads that share it. The
//! scoring loop ([`Blocks::attend`]) is shared with [`super::latent`], whose one latent KV head
//! is read the same way.

use strata_kernels::attn;
use strata_kernels::{QMatrix, matmul_multi, ops};

use super::{Blocks, CombineMode, add_bias, gather, mm, rotate};
use crate::Result;
use crate::model::{Axis, grow};
use crate::weights::{AttnProj, LayerWeights};

/// Most rows a step prefetches the cache lines of before storing their keys and values: a
/// decode batch (beyond it, a prefill chunk, whose consecutive positions share lines).
const PREFETCH_ROWS: usize = 64;

/// What the attention of one layer computes: which heads, which rows, in which order.
#[derive(Clone, Copy)]
pub(super) struct AttnJob {
    /// Layer index within the shard, and globally.
    pub(super) li: usize,
    pub(super) gl: usize,
    /// Local query heads, the first one's global index, and the first local KV head's.
    pub(super) n_q: usize,
    pub(super) q0: usize,
    pub(super) kv0: usize,
    /// Query heads per KV head.
    pub(super) group: usize,
    /// The first row whose output is needed.
    pub(super) t_first: usize,
    pub(super) order: attn::DotOrder,
}

impl AttnJob {
    /// The local KV head that local query head `h` reads (the cache holds this shard's KV heads,
    /// from the one its first query head reads).
    fn kv_head(&self, h: usize) -> usize {
        (self.q0 + h) / self.group - self.kv0
    }
}

/// Masks keys `window` or more positions before `query_pos` (exp(-inf) = 0) in a score row
/// that starts at position `first`, keeping the row's layout so the softmax sums in ggml's
/// blocks.
fn mask_window(sc: &mut [f32], first: usize, query_pos: usize, window: Option<usize>) {
    if let Some(w) = window {
        for (p, v) in (first..).zip(sc.iter_mut()) {
            if query_pos - p >= w {
                *v = f32::NEG_INFINITY;
            }
        }
    }
}

/// The first key position a query at `query_pos` needs scored: 0 without a window; with one,
/// the window's start rounded down to a whole [`attn::MAX_STEP`]. Every position before it
/// is masked, so its probability is exactly zero: skipping whole blocks of them changes no
/// softmax block sum (ggml sums blocks of 8 or 16 from position 0, and a block of zeros adds
/// 0 in f64) and no accumulator of the weighted sum (every order's step divides
/// `MAX_STEP`, so each position keeps its lane, and a zero weight leaves a lane as it was).
/// The output is bit for bit that of scoring the whole row, at the window's cost instead of
/// the context's (Gemma 3's window layers: 512 positions of a 32k context).
fn window_start(query_pos: usize, window: Option<usize>) -> usize {
    #[cfg(test)]
    if tests::WHOLE_ROWS.load(std::sync::atomic::Ordering::Relaxed) {
        return 0;
    }
    match window {
        Some(w) => (query_pos + 1).saturating_sub(w) / attn::MAX_STEP * attn::MAX_STEP,
        None => 0,
    }
}

/// A raw pointer threads write disjoint regions through.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: every use writes only the (token, head) regions the writing thread claimed from an
// atomic counter; no two threads claim the same region.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

impl Blocks<'_, '_> {
    /// Queries already scaled (Gemma) meet a softmax scale of 1; Granite sets its own.
    fn softmax_scale(&self) -> f32 {
        if self.cfg.query_scale.is_some() {
            1.0
        } else {
            self.cfg
                .attn_scale
                .unwrap_or_else(|| 1.0 / (self.cfg.head_dim as f32).sqrt())
        }
    }

    /// The sliding window of global layer `gl`, if it has one.
    fn window(&self, gl: usize) -> Option<usize> {
        let cfg = self.cfg;
        cfg.swa
            .as_ref()
            .filter(|_| cfg.is_swa(gl))
            .map(|w| w.window)
    }

    /// Self-attention of the normed rows `xn`: Q/K/V projections (with biases when the layer has
    /// them), per-head Q/K norms, RoPE, the query scale, the KV cache, grouped attention, the
    /// output projection and this shard's exchange. The output rows land in `proj`.
    pub(crate) fn attention(&mut self, lw: &LayerWeights) -> Result<()> {
        let qkv = match &lw.attn {
            AttnProj::Heads(h) => h,
            AttnProj::Latent(m) => return self.latent_attention(lw, m),
        };
        let cfg = self.cfg;
        let n = self.live;
        let (e, hd) = (cfg.n_embd, cfg.head_dim);
        let n_q = qkv.wq.rows() / hd;
        let n_kv = qkv.wk.rows() / hd;
        let group = cfg.group();
        let q0 = self.spec.q_heads.start;
        let kv0 = q0 / group;
        let half = cfg.rope_dims / 2;
        let li = self.li;
        let pool = self.pool;
        let s = &mut *self.s;

        // Decode rows each store one position per head, down a column of scattered lines:
        // start fetching them now, so the projections below hide the wait (a prefill chunk's
        // positions share their lines, and stream).
        if n <= PREFETCH_ROWS {
            for t in 0..n {
                self.caches
                    .get(self.rows.seq[t])
                    .prefetch_store(li, self.rows.pos[t]);
            }
        }
        s.acts.quantize(qkv.wq.ggml_type(), &s.xn[..n * e], n, e);
        let same = |m: &QMatrix| m.ggml_type() == qkv.wq.ggml_type();
        if same(&qkv.wk) && same(&qkv.wv) {
            grow(&mut s.q, n * qkv.wq.rows());
            grow(&mut s.k, n * qkv.wk.rows());
            grow(&mut s.v, n * qkv.wv.rows());
            matmul_multi(
                pool,
                &s.acts,
                &mut [
                    (&qkv.wq, &mut s.q[..n * qkv.wq.rows()]),
                    (&qkv.wk, &mut s.k[..n * qkv.wk.rows()]),
                    (&qkv.wv, &mut s.v[..n * qkv.wv.rows()]),
                ],
            );
        } else {
            mm(pool, &qkv.wq, &s.acts, &mut s.q);
            s.acts.quantize(qkv.wk.ggml_type(), &s.xn[..n * e], n, e);
            mm(pool, &qkv.wk, &s.acts, &mut s.k);
            s.acts.quantize(qkv.wv.ggml_type(), &s.xn[..n * e], n, e);
            mm(pool, &qkv.wv, &s.acts, &mut s.v);
        }
        add_bias(&mut s.q, qkv.bq.as_deref(), n);
        add_bias(&mut s.k, qkv.bk.as_deref(), n);
        add_bias(&mut s.v, qkv.bv.as_deref(), n);
        if cfg.qk_norm_rows {
            self.qk_norm_rows(lw, n, n_q, n_kv)?;
        }
        let s = &mut *self.s;
        let head_norms = !cfg.qk_norm_rows;

        // Per-head norms, RoPE, the query scale, then rounding to f16 where llama.cpp stores or
        // converts to f16 (the K/V cache, and Q when it meets the f16 keys).
        let gl = self.spec.layers.start + li;
        let table = if cfg.is_swa(gl) { n } else { 0 };
        let use_rope = cfg.uses_rope(gl);
        let flavour = self.flavour;
        let rope = |x: &mut [f32], c: &[f32], sn: &[f32]| {
            if use_rope {
                rotate(cfg, flavour, x, c, sn);
            }
        };
        let rows = self.rows;
        let rounds = self.order.scores().rounds_operand();
        for t in 0..n {
            let at = (table + t) * half;
            let (c, sn) = (&s.rope_cos[at..at + half], &s.rope_sin[at..at + half]);
            let temperature = cfg.attn_temperature.as_ref().map(|a| a.factor(rows.pos[t]));
            for h in 0..n_q {
                let q = &mut s.q[(t * n_q + h) * hd..(t * n_q + h + 1) * hd];
                if let Some(w) = lw.q_norm.as_deref().filter(|_| head_norms) {
                    ops::rms_norm_in_place(q, w, cfg.rms_eps);
                }
                rope(&mut q[..cfg.rope_dims], c, sn);
                if let Some(f) = cfg.query_scale {
                    ops::scale(q, f);
                }
                if let Some(f) = temperature {
                    ops::scale(q, f);
                }
                // llama.cpp converts the queries to the f16 of the cache, except where its
                // aarch64 tinyBLAS takes them as f32 (a batch).
                if rounds {
                    ops::round_f16_slice(q);
                }
            }
            for h in 0..n_kv {
                let k = &mut s.k[(t * n_kv + h) * hd..(t * n_kv + h + 1) * hd];
                if let Some(w) = lw.k_norm.as_deref().filter(|_| head_norms) {
                    ops::rms_norm_in_place(k, w, cfg.rms_eps);
                }
                rope(&mut k[..cfg.rope_dims], c, sn);
                let v = &s.v[(t * n_kv + h) * hd..(t * n_kv + h + 1) * hd];
                self.caches
                    .get_mut(rows.seq[t])
                    .store(li, h, rows.pos[t], k, v);
            }
        }

        // With `trim`, only the last token's attention output is needed.
        let t_first = if self.trim { n - 1 } else { 0 };
        let n_out = n - t_first;
        grow(&mut self.s.att, n_out * n_q * hd);
        let job = AttnJob {
            li,
            gl,
            n_q,
            q0,
            kv0,
            group,
            t_first,
            order: self.order,
        };
        self.attend(&job, lw.sinks.as_deref());
        self.attn_output(lw, n, t_first, n_q)
    }

    /// The output projection of the attention outputs in `att` (`n_q` heads of
    /// [`crate::ModelConfig::v_head_dim`] for rows `t_first..n`), with this shard's exchanges and the
    /// bias; the rows land in `proj` (or `gathered`).
    pub(super) fn attn_output(
        &mut self,
        lw: &LayerWeights,
        n: usize,
        t_first: usize,
        n_q: usize,
    ) -> Result<()> {
        let cfg = self.cfg;
        let pool = self.pool;
        let n_out = n - t_first;
        let s = &mut *self.s;
        let width = n_q * cfg.v_head_dim();
        let combine = CombineMode::of(cfg, self.spec);
        let att_in: &[f32] = if combine.gather_heads {
            let full = cfg.attn_out_width();
            let src = &s.att[..n_out * width];
            gather(
                &mut *self.comm,
                Axis::QHeads,
                n_out,
                src,
                &mut s.gathered,
                full,
            )?
        } else {
            &s.att[..n_out * width]
        };
        s.acts.quantize(
            lw.wo.ggml_type(),
            att_in,
            n_out,
            att_in.len() / n_out.max(1),
        );
        // llama.cpp projects every row before it drops all but the last: follow its order.
        s.acts.as_rows_of(n, t_first);
        mm(pool, &lw.wo, &s.acts, &mut s.proj);
        self.combine_output(&combine, n_out, lw.wo.rows())?;
        if let Some(b) = lw.bo.as_deref() {
            // The bias of whole rows, added once they are whole (on every rank alike).
            let s = &mut *self.s;
            let out = if self.out_gathered {
                &mut s.gathered
            } else {
                &mut s.proj
            };
            add_bias(out, Some(b), n_out);
        }
        self.out_first = t_first;
        self.out_rows = n_out;
        Ok(())
    }

    /// Scores, softmax and the weighted sum of values for every (token, KV head): the query heads
    /// sharing a KV head are scored and summed together, so each key and value row is loaded
    /// once for all of them. Each token reads its own sequence's cache.
    pub(super) fn attend(&mut self, job: &AttnJob, sinks: Option<&[f32]>) {
        let (hd, vd) = (self.cfg.head_dim, self.cfg.cache_v_dim());
        let (li, n_q, t_first, order) = (job.li, job.n_q, job.t_first, job.order);
        let rows = self.rows;
        let n_out = rows.pos.len() - t_first;
        let scale = self.softmax_scale();
        let window = self.window(job.gl);
        let softcap = self.cfg.attn_softcap;
        let flavour = self.flavour;
        let pool = self.pool;
        let caches = &self.caches;
        let s = &mut *self.s;
        // Runs of consecutive local query heads that read the same KV head, at most
        // `MAX_GROUP` long (a shard's head range may start or end inside a group).
        s.runs.clear();
        for h in 0..n_q {
            let kvh = job.kv_head(h);
            match s.runs.last_mut() {
                Some(r) if r.2 == kvh && r.1 - r.0 < attn::MAX_GROUP => r.1 = h + 1,
                _ => s.runs.push((h, h + 1, kvh)),
            }
        }

        let n_threads = pool.n_threads();
        // Per thread, one padded score row per head of a run, sized for the whole context so a
        // growing sequence never reallocates.
        let capacity = (0..caches.len())
            .map(|i| caches.get(i).capacity())
            .max()
            .unwrap_or(0);
        let stride = capacity.div_ceil(attn::MAX_STEP) * attn::MAX_STEP;
        let slot = attn::MAX_GROUP * stride;
        grow(&mut s.scores, n_threads * slot);
        let score_base = SyncPtr(s.scores.as_mut_ptr());
        let att = SyncPtr(s.att.as_mut_ptr());
        let runs = &s.runs;
        let units = n_out * runs.len();
        let q = &s.q;
        pool.run_units(units, &|tid, u| {
            let (run, tt) = (u % runs.len(), u / runs.len());
            let (h0, h1, kvh) = runs[run];
            let (t, g) = (t_first + tt, h1 - h0);
            let (cache, query_pos) = (caches.get(rows.seq[t]), rows.pos[t]);
            let len = query_pos + 1;
            let lenp = attn::padded_len(order, len);
            // SAFETY: thread `tid` alone uses score slot `tid` (`MAX_GROUP` rows of
            // `stride >= lenp` floats), inside the buffer grown above.
            let sc =
                unsafe { std::slice::from_raw_parts_mut(score_base.get().add(tid * slot), slot) };
            let qg = &q[(t * n_q + h0) * hd..(t * n_q + h1) * hd];
            // Rows hold positions `first..lenp` at their own offsets (`first` is a multiple
            // of every order's step, so `lenp - first` stays whole steps).
            let first = window_start(query_pos, window);
            // The keys come in runs (shared prefix blocks, then the sequence's own); each
            // score is its own dot product, so scoring run by run changes nothing.
            for (pos, keys) in cache.key_runs(li, kvh, first, len) {
                let n = keys.len() / hd;
                let out = &mut sc[pos..];
                attn::scores_grouped(order.scores(), qg, hd, keys, n, scale, out, stride);
            }
            let sc = &mut sc[first..];
            for (i, row) in sc.chunks_mut(stride).take(g).enumerate() {
                let (len, lenp) = (len - first, lenp - first);
                let row = &mut row[..lenp];
                if let Some(cap) = softcap {
                    ops::softcap(&mut row[..len], cap, flavour);
                }
                mask_window(&mut row[..len], first, query_pos, window);
                let sink = sinks.map(|k| k[job.q0 + h0 + i]);
                ops::softmax(&mut row[..len], sink, flavour);
                // llama.cpp converts the probabilities to f16 before the product with V
                // (except where its aarch64 tinyBLAS takes them as f32).
                if order.rounds_operand() {
                    ops::round_f16_slice(&mut row[..len]);
                }
                // Padded positions weigh nothing.
                row[len..].fill(0.0);
            }
            // SAFETY: unit u owns the output rows of heads h0..h1 of token tt, inside the
            // buffer grown by the caller.
            let o = unsafe {
                std::slice::from_raw_parts_mut(att.get().add((tt * n_q + h0) * vd), g * vd)
            };
            let runs = cache.value_runs(li, kvh, first, lenp);
            attn::weighted_sum_runs(order, sc, stride, runs, vd, o);
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, Ordering};

    use strata_gguf::{GgmlType, GgufFile};
    use strata_kernels::attn::Flavour;

    use crate::synth::{SynthSpec, synth};
    use crate::{Arch, Generator};

    /// Scores every position of a window layer's rows, as before windows were skipped. Other
    /// tests running meanwhile take the same path, which by the claim under test gives them
    /// the same bits.
    pub(super) static WHOLE_ROWS: AtomicBool = AtomicBool::new(false);

    /// Prompt logits and the logits of `steps` greedy decode steps.
    fn run(
        path: &std::path::Path,
        flavour: Flavour,
        prompt: &[u32],
        steps: usize,
    ) -> Vec<Vec<f32>> {
        let mut g = Generator::load(path, 2, Some(1024)).unwrap();
        g.set_flavour(flavour);
        let mut out = vec![g.prompt_logits(prompt).unwrap()];
        for _ in 0..steps {
            let t = strata_kernels::ops::argmax(out.last().unwrap()) as u32;
            out.push(g.decode_logits(t).unwrap().to_vec());
        }
        out
    }

    #[test]
    fn skipping_the_keys_before_a_window_changes_no_bit() {
        let base = strata_store::Store::from_env()
            .unwrap()
            .ensure("smollm2-135m-instruct")
            .unwrap();
        let base = GgufFile::open(&base).unwrap();
        // Head widths of 64 and 256 (the grouped SIMD kernels of both orders), windows that
        // are and are not whole steps; prompts long enough that whole steps fall out of the
        // window in prefill (batch order) and in decoding (single-token order).
        // gpt-oss adds sinks to the softmax.
        for (arch, head_dim, window) in [
            (Arch::Gemma3, 64, 40),
            (Arch::Gemma2, 256, 128),
            (Arch::GptOss, 64, 100),
        ] {
            let spec = SynthSpec {
                arch,
                layers: 2,
                embd: 256,
                ff: 512,
                heads: 4,
                kv_heads: 2,
                head_dim: Some(head_dim),
                ty: GgmlType::Q8_0,
                tensor_types: Vec::new(),
                seed: 5,
                sliding_window: Some(window),
                chat_template: None,
                pooling: None,
                experts: (arch == Arch::GptOss).then_some((4, 2)),
            };
            let path = std::env::temp_dir().join(format!(
                "strata-window-{arch:?}-{}.gguf",
                std::process::id()
            ));
            std::fs::write(&path, synth(&spec, &base).unwrap()).unwrap();
            let prompt: Vec<u32> = (0..300u32).map(|i| (i * 7919) % 4000 + 100).collect();
            for flavour in [Flavour::Avx512, Flavour::Avx2] {
                WHOLE_ROWS.store(false, Ordering::Relaxed);
                let skipped = run(&path, flavour, &prompt, 40);
                WHOLE_ROWS.store(true, Ordering::Relaxed);
                let whole = run(&path, flavour, &prompt, 40);
                WHOLE_ROWS.store(false, Ordering::Relaxed);
                for (i, (a, b)) in skipped.iter().zip(&whole).enumerate() {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(
                        bits(a) == bits(b),
                        "{arch:?} hd {head_dim} window {window} {flavour:?}: logits {i} differ"
                    );
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}
