//! One forward step of a Llama-family or Gemma 3 decoder over a shard.
//!
//! The step takes a batch of tokens (the whole prompt during prefill, one token during decode) at
//! consecutive positions, appends their keys and values to the cache, and leaves either the hidden
//! states (a pipeline stage that is not last) or the last token's logits over the shard's
//! vocabulary rows. Partial sums of tensor-parallel ranks meet in [`Collective::all_reduce_sum`]
//! after the attention output and FFN down projections, the only two places a layer needs them
//! (Gemma's post-attention and post-FFN norms come after the reduction).

use std::sync::atomic::{AtomicUsize, Ordering};

use strata_gguf::GgufFile;
use strata_kernels::attn::{self, Flavour};
use strata_kernels::formats::dequantize_row;
use strata_kernels::{QMatrix, QuantActs, ThreadPool, matmul, matmul_multi, ops};

use crate::weights::Weights;
use crate::{Error, KvCache, ModelConfig, Result, ShardSpec};

/// Why an exchange between ranks failed (the data plane's error, kept opaque here).
pub type CommError = Box<dyn std::error::Error + Send + Sync>;

/// Which dimension a tensor-parallel all-gather assembles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// Attention outputs, one block of query heads per rank (`q_heads * head_dim` columns).
    QHeads,
    /// FFN activations, one block of FFN columns per rank.
    Ffn,
    /// Model-width vectors, one block of rows per rank ([`crate::Combine::Gather`]).
    Embd,
}

/// How the tensor-parallel ranks of a stage combine their work. The single-process engine uses
/// [`NoComm`]. Every rank of a group must make the same calls in the same order.
pub trait Collective {
    /// Replaces `x` on every rank with the element-wise sum over ranks, summed in the same order
    /// on every rank (so all ranks keep identical activations).
    fn all_reduce_sum(&mut self, x: &mut [f32]) -> std::result::Result<(), CommError>;

    /// Assembles `dst` (`rows` rows of the whole `axis`) from every rank's block `src` (`rows`
    /// rows of this rank's part of `axis`).
    fn all_gather(
        &mut self,
        axis: Axis,
        rows: usize,
        src: &[f32],
        dst: &mut [f32],
    ) -> std::result::Result<(), CommError>;
}

/// The collective of a single rank: nothing to combine.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoComm;

impl Collective for NoComm {
    fn all_reduce_sum(&mut self, _x: &mut [f32]) -> std::result::Result<(), CommError> {
        Ok(())
    }

    fn all_gather(
        &mut self,
        _axis: Axis,
        _rows: usize,
        src: &[f32],
        dst: &mut [f32],
    ) -> std::result::Result<(), CommError> {
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }
}

/// What a forward step starts from.
#[derive(Debug, Clone, Copy)]
pub enum StageInput<'a> {
    /// Token ids (first pipeline stage).
    Tokens(&'a [u32]),
    /// Hidden states from the previous stage, `n * n_embd` values.
    Hidden(&'a [f32]),
}

/// A loaded shard of a model.
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    spec: ShardSpec,
    weights: Weights,
    flavour: Flavour,
}

/// Reusable buffers of the forward pass, sized for the largest batch seen so far.
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    /// All-gathered tensor-parallel blocks (attention outputs, FFN activations, projections).
    gathered: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    acts: QuantActs,
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// Per-thread attention scores: `MAX_GROUP` rows of the padded context each.
    scores: Vec<f32>,
    /// Runs of query heads sharing a KV head: (first, end, KV head).
    runs: Vec<(usize, usize, usize)>,
    /// Which sequence and position each row of the step belongs to.
    rows: Rows,
}

/// The sequence (index into the step's caches) and position of every row of a step.
#[derive(Debug, Default)]
struct Rows {
    seq: Vec<usize>,
    pos: Vec<usize>,
}

impl Rows {
    fn fill(&mut self, items: impl Iterator<Item = (usize, usize)>) {
        self.seq.clear();
        self.pos.clear();
        for (seq, pos) in items {
            self.seq.push(seq);
            self.pos.push(pos);
        }
    }
}

impl Scratch {
    /// Logits of the last token over the shard's vocabulary rows (after a last-stage step); after
    /// [`Model::forward_batch`], one such row per sequence, back to back.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Mutable logits (samplers apply penalties in place).
    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }

    /// Hidden states after a non-last stage step, `n * n_embd` values.
    pub fn hidden(&self) -> &[f32] {
        &self.x
    }
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// What the attention of one layer computes: which heads, which rows, in which order.
#[derive(Clone, Copy)]
struct AttnJob {
    /// Layer index within the shard, and globally.
    li: usize,
    gl: usize,
    /// Local query heads, the first one's global index, and the first local KV head's.
    n_q: usize,
    q0: usize,
    kv0: usize,
    /// Query heads per KV head.
    group: usize,
    /// The first row whose output is needed.
    t_first: usize,
    order: attn::DotOrder,
}

impl AttnJob {
    /// The local KV head that local query head `h` reads (the cache holds this shard's KV heads,
    /// from the one its first query head reads).
    fn kv_head(&self, h: usize) -> usize {
        (self.q0 + h) / self.group - self.kv0
    }
}

/// Runs `f(thread, unit)` for every unit of `0..units`, the pool's threads claiming them from a
/// shared counter (units vary in cost, so a static split would leave threads idle).
fn run_units(pool: &ThreadPool, units: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let next = AtomicUsize::new(0);
    pool.run(&|tid| {
        loop {
            let u = next.fetch_add(1, Ordering::Relaxed);
            if u >= units {
                break;
            }
            f(tid, u);
        }
    });
}

/// Masks keys `window` or more positions before `query_pos` (exp(-inf) = 0), keeping the
/// row's layout so the softmax sums in ggml's blocks.
fn mask_window(sc: &mut [f32], query_pos: usize, window: Option<usize>) {
    if let Some(w) = window {
        for (p, v) in sc.iter_mut().enumerate() {
            if query_pos - p >= w {
                *v = f32::NEG_INFINITY;
            }
        }
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

fn mm(pool: &ThreadPool, w: &QMatrix, acts: &QuantActs, out: &mut Vec<f32>) {
    grow(out, acts.n() * w.rows());
    matmul(pool, w, acts, &mut out[..acts.n() * w.rows()]);
}

impl Model {
    /// Loads shard `spec` of the model in `file`.
    pub fn load(file: &GgufFile, spec: ShardSpec) -> Result<Model> {
        let cfg = ModelConfig::from_gguf(file)?;
        let weights = Weights::load(file, &cfg, &spec)?;
        Ok(Model {
            cfg,
            spec,
            weights,
            flavour: Flavour::native(),
        })
    }

    /// Which llama.cpp build's attention arithmetic to reproduce (default: the one llama.cpp
    /// would be built as on this CPU).
    pub fn set_flavour(&mut self, flavour: Flavour) {
        self.flavour = flavour;
    }

    /// Loads the whole model.
    pub fn load_full(file: &GgufFile) -> Result<Model> {
        let cfg = ModelConfig::from_gguf(file)?;
        let spec = ShardSpec::full(&cfg);
        let weights = Weights::load(file, &cfg, &spec)?;
        Ok(Model {
            cfg,
            spec,
            weights,
            flavour: Flavour::native(),
        })
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Bytes of weights one decode step streams from memory (the roofline's denominator).
    pub fn streamed_bytes_per_token(&self) -> usize {
        self.weights.streamed_bytes()
    }

    /// The shard this model holds.
    pub fn spec(&self) -> &ShardSpec {
        &self.spec
    }

    /// A KV cache for this shard holding `n_ctx` positions.
    pub fn new_cache(&self, n_ctx: usize) -> Result<KvCache> {
        KvCache::new(
            self.spec.layers.len(),
            self.spec.kv_heads(&self.cfg).len(),
            n_ctx,
            self.cfg.head_dim,
        )
    }

    /// Runs one step over `n` tokens at positions `cache.len()..cache.len() + n`.
    ///
    /// After it, `scratch.logits()` holds the last token's logits (last stage) or
    /// `scratch.hidden()` the hidden states (other stages).
    pub fn forward(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        scratch: &mut Scratch,
        input: StageInput<'_>,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let n = match input {
            StageInput::Tokens(t) => t.len(),
            StageInput::Hidden(h) => h.len() / self.cfg.n_embd,
        };
        if n == 0 {
            return Err(Error::EmptyPrompt);
        }
        let pos0 = cache.len();
        if pos0 + n > cache.capacity() {
            return Err(Error::ContextOverflow {
                needed: pos0 + n,
                limit: cache.capacity(),
            });
        }
        let mut rows = std::mem::take(&mut scratch.rows);
        rows.fill((pos0..pos0 + n).map(|p| (0, p)));
        // ggml sums attention products in a different order for one token than for a batch.
        let order = if n == 1 {
            self.flavour.single()
        } else {
            self.flavour.batch()
        };
        // Only the last token's row feeds the logits, so the last stage's last layer skips the
        // other rows after attention (as llama.cpp does).
        let trim = self.spec.is_last_stage(&self.cfg) && n > 1;
        let mut caches = [cache];
        let res = self.step(pool, &mut caches, scratch, &rows, input, order, trim, comm);
        scratch.rows = rows;
        res?;
        caches[0].advance(n);
        Ok(())
    }

    /// Runs one decode step for several independent sequences at once: token `tokens[i]` is
    /// appended to sequence `caches[i]`. Every weight matrix is read once for the whole batch,
    /// which is what makes serving many streams cheaper than serving them one by one.
    ///
    /// Each row's arithmetic is the same as a one-token [`Model::forward`] on its own cache
    /// (the matrix kernels treat rows independently and every row uses the single-token
    /// attention order), so a sequence's tokens do not depend on what it is batched with.
    /// After it, `scratch.logits()` holds one row of logits per sequence. Full-width shards
    /// only (the batch is not exchanged between ranks).
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        caches: &mut [&mut KvCache],
        scratch: &mut Scratch,
        tokens: &[u32],
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if tokens.len() != caches.len() {
            return Err(Error::InvalidShard(format!(
                "a batch of {} tokens for {} sequences",
                tokens.len(),
                caches.len()
            )));
        }
        if !self.spec.is_full_width(&self.cfg) || !self.spec.is_last_stage(&self.cfg) {
            return Err(Error::InvalidShard(
                "batched decoding needs the whole model in one process".into(),
            ));
        }
        for c in caches.iter() {
            if c.len() >= c.capacity() {
                return Err(Error::ContextOverflow {
                    needed: c.len() + 1,
                    limit: c.capacity(),
                });
            }
        }
        let mut rows = std::mem::take(&mut scratch.rows);
        rows.fill(caches.iter().enumerate().map(|(i, c)| (i, c.len())));
        let order = self.flavour.single();
        let res = self.step(
            pool,
            caches,
            scratch,
            &rows,
            StageInput::Tokens(tokens),
            order,
            false,
            &mut NoComm,
        );
        scratch.rows = rows;
        res?;
        for c in caches.iter_mut() {
            c.advance(1);
        }
        Ok(())
    }

    /// Queries already scaled (Gemma) meet a softmax scale of 1.
    fn softmax_scale(&self) -> f32 {
        if self.cfg.query_scale.is_some() {
            1.0
        } else {
            1.0 / (self.cfg.head_dim as f32).sqrt()
        }
    }

    /// The sliding window of global layer `gl`, if it has one.
    fn window(&self, gl: usize) -> Option<usize> {
        let cfg = &self.cfg;
        cfg.swa
            .as_ref()
            .filter(|_| cfg.is_swa(gl))
            .map(|w| w.window)
    }

    /// Scores, softmax and the weighted sum of values for every (token, KV head): the query heads
    /// sharing a KV head are scored and summed together, so each key and value row is loaded
    /// once for all of them. Each token reads its own sequence's cache.
    fn attend(
        &self,
        pool: &ThreadPool,
        caches: &[&mut KvCache],
        s: &mut Scratch,
        rows: &Rows,
        job: &AttnJob,
    ) {
        let hd = self.cfg.head_dim;
        let (li, n_q, t_first, order) = (job.li, job.n_q, job.t_first, job.order);
        let n_out = rows.pos.len() - t_first;
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
        let capacity = caches.iter().map(|c| c.capacity()).max().unwrap_or(0);
        let stride = capacity.div_ceil(attn::MAX_STEP) * attn::MAX_STEP;
        let slot = attn::MAX_GROUP * stride;
        grow(&mut s.scores, n_threads * slot);
        let score_base = SyncPtr(s.scores.as_mut_ptr());
        let att = SyncPtr(s.att.as_mut_ptr());
        let scale = self.softmax_scale();
        let window = self.window(job.gl);
        let runs = &s.runs;
        let units = n_out * runs.len();
        let q = &s.q;
        let flavour = self.flavour;
        run_units(pool, units, &|tid, u| {
            let (run, tt) = (u % runs.len(), u / runs.len());
            let (h0, h1, kvh) = runs[run];
            let (t, g) = (t_first + tt, h1 - h0);
            let (cache, query_pos) = (&*caches[rows.seq[t]], rows.pos[t]);
            let len = query_pos + 1;
            let lenp = attn::padded_len(order, len);
            // SAFETY: thread `tid` alone uses score slot `tid` (`MAX_GROUP` rows of
            // `stride >= lenp` floats), inside the buffer grown above.
            let sc =
                unsafe { std::slice::from_raw_parts_mut(score_base.get().add(tid * slot), slot) };
            let qg = &q[(t * n_q + h0) * hd..(t * n_q + h1) * hd];
            let keys = cache.keys(li, kvh, len);
            attn::scores_grouped(order, qg, hd, keys, len, scale, sc, stride);
            for row in sc.chunks_exact_mut(stride).take(g) {
                let row = &mut row[..lenp];
                mask_window(&mut row[..len], query_pos, window);
                ops::softmax(&mut row[..len], flavour);
                // llama.cpp converts the probabilities to f16 before the product with V.
                ops::round_f16_slice(&mut row[..len]);
                // Padded positions weigh nothing.
                row[len..].fill(0.0);
            }
            // SAFETY: unit u owns the output rows of heads h0..h1 of token tt, inside the
            // buffer grown by the caller.
            let o = unsafe {
                std::slice::from_raw_parts_mut(att.get().add((tt * n_q + h0) * hd), g * hd)
            };
            let (vt, vs) = (cache.values_t(li, kvh), cache.value_stride());
            attn::weighted_sum_grouped(order, sc, stride, vt, vs, hd, lenp, o);
        });
    }

    /// The layers and head of one step over `rows` (validated by the caller). With `trim`,
    /// only the last row continues after the last layer's attention.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        pool: &ThreadPool,
        caches: &mut [&mut KvCache],
        scratch: &mut Scratch,
        rows: &Rows,
        input: StageInput<'_>,
        order: attn::DotOrder,
        trim: bool,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let e = cfg.n_embd;
        let n = rows.pos.len();
        grow(&mut scratch.x, n * e);
        match input {
            StageInput::Tokens(tokens) => {
                let embd = self.weights.embd.as_ref().ok_or_else(|| {
                    Error::InvalidShard("tokens given to a stage without the embedding".into())
                })?;
                for (t, &id) in tokens.iter().enumerate() {
                    if id as usize >= cfg.n_vocab {
                        return Err(Error::BadToken {
                            id,
                            vocab: cfg.n_vocab,
                        });
                    }
                    let row = embd.row(id as usize).ok_or_else(|| {
                        Error::InvalidShard("the token embedding is not row-addressable".into())
                    })?;
                    let x = &mut scratch.x[t * e..(t + 1) * e];
                    dequantize_row(embd.ggml_type(), row, x);
                    if let Some(f) = cfg.embed_scale {
                        ops::scale(x, f);
                    }
                }
            }
            StageInput::Hidden(h) => scratch.x[..n * e].copy_from_slice(&h[..n * e]),
        }

        self.fill_rope(scratch, &rows.pos);
        let last_layer = self.spec.layers.len() - 1;
        let mut live = n;
        for (li, lw) in self.weights.layers.iter().enumerate() {
            let trim_here = trim && li == last_layer;
            self.attention(pool, caches, scratch, rows, li, lw, order, trim_here, comm)?;
            if trim_here {
                scratch.x.copy_within((n - 1) * e..n * e, 0);
                live = 1;
            }
            self.ffn(pool, scratch, lw, live, comm)?;
        }

        if let Some((norm, head)) = &self.weights.head {
            // One row of logits per sequence: the last row when trimmed or single, every row of
            // a multi-sequence batch.
            let (first, count) = if caches.len() > 1 {
                (0, live)
            } else {
                (live - 1, 1)
            };
            let x = &scratch.x[first * e..(first + count) * e];
            grow(&mut scratch.xn, count * e);
            for (src, dst) in x.chunks_exact(e).zip(scratch.xn.chunks_exact_mut(e)) {
                ops::rms_norm(src, norm, cfg.rms_eps, dst);
            }
            scratch
                .acts
                .quantize(head.ggml_type(), &scratch.xn[..count * e], count, e);
            scratch.logits.resize(count * head.rows(), 0.0);
            matmul(pool, head, &scratch.acts, &mut scratch.logits);
        }
        Ok(())
    }

    /// RoPE tables for the rows at positions `pos`: one for the model's base and, with a
    /// sliding window, one for the window layers' base (after the first `n * half` entries).
    fn fill_rope(&self, s: &mut Scratch, pos: &[usize]) {
        let n = pos.len();
        let half = self.cfg.rope_dims / 2;
        let bases: &[f32] = match &self.cfg.swa {
            Some(w) => &[self.cfg.rope_base, w.rope_base],
            None => &[self.cfg.rope_base],
        };
        grow(&mut s.rope_cos, bases.len() * n * half);
        grow(&mut s.rope_sin, bases.len() * n * half);
        for (bi, &base) in bases.iter().enumerate() {
            for (t, &p) in pos.iter().enumerate() {
                let at = (bi * n + t) * half;
                ops::rope_table(
                    p,
                    self.cfg.rope_dims,
                    base,
                    &mut s.rope_cos[at..at + half],
                    &mut s.rope_sin[at..at + half],
                );
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        pool: &ThreadPool,
        caches: &mut [&mut KvCache],
        s: &mut Scratch,
        rows: &Rows,
        li: usize,
        lw: &crate::weights::LayerWeights,
        order: attn::DotOrder,
        trim: bool,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let n = rows.pos.len();
        let (e, hd) = (cfg.n_embd, cfg.head_dim);
        let n_q = lw.wq.rows() / hd;
        let n_kv = lw.wk.rows() / hd;
        let group = cfg.group();
        let q0 = self.spec.q_heads.start;
        let kv0 = q0 / group;
        let half = cfg.rope_dims / 2;

        grow(&mut s.xn, n * e);
        for t in 0..n {
            ops::rms_norm(
                &s.x[t * e..(t + 1) * e],
                &lw.attn_norm,
                cfg.rms_eps,
                &mut s.xn[t * e..(t + 1) * e],
            );
        }
        s.acts.quantize(lw.wq.ggml_type(), &s.xn[..n * e], n, e);
        let same = |m: &QMatrix| m.ggml_type() == lw.wq.ggml_type();
        if same(&lw.wk) && same(&lw.wv) {
            grow(&mut s.q, n * lw.wq.rows());
            grow(&mut s.k, n * lw.wk.rows());
            grow(&mut s.v, n * lw.wv.rows());
            matmul_multi(
                pool,
                &s.acts,
                &mut [
                    (&lw.wq, &mut s.q[..n * lw.wq.rows()]),
                    (&lw.wk, &mut s.k[..n * lw.wk.rows()]),
                    (&lw.wv, &mut s.v[..n * lw.wv.rows()]),
                ],
            );
        } else {
            mm(pool, &lw.wq, &s.acts, &mut s.q);
            s.acts.quantize(lw.wk.ggml_type(), &s.xn[..n * e], n, e);
            mm(pool, &lw.wk, &s.acts, &mut s.k);
            s.acts.quantize(lw.wv.ggml_type(), &s.xn[..n * e], n, e);
            mm(pool, &lw.wv, &s.acts, &mut s.v);
        }

        // Per-head norms (Gemma 3), RoPE, the query scale, then rounding to f16 where llama.cpp
        // stores or converts to f16 (the K/V cache, and Q when it meets the f16 keys).
        let gl = self.spec.layers.start + li;
        let table = if cfg.is_swa(gl) { n } else { 0 };
        let rope = |x: &mut [f32], c: &[f32], sn: &[f32]| {
            if cfg.rope_neox {
                ops::rope_apply_neox(x, c, sn);
            } else {
                ops::rope_apply(x, c, sn);
            }
        };
        for t in 0..n {
            let at = (table + t) * half;
            let (c, sn) = (&s.rope_cos[at..at + half], &s.rope_sin[at..at + half]);
            for h in 0..n_q {
                let q = &mut s.q[(t * n_q + h) * hd..(t * n_q + h + 1) * hd];
                if let Some(w) = &lw.q_norm {
                    ops::rms_norm_in_place(q, w, cfg.rms_eps);
                }
                rope(&mut q[..cfg.rope_dims], c, sn);
                if let Some(f) = cfg.query_scale {
                    ops::scale(q, f);
                }
                ops::round_f16_slice(q);
            }
            for h in 0..n_kv {
                let k = &mut s.k[(t * n_kv + h) * hd..(t * n_kv + h + 1) * hd];
                if let Some(w) = &lw.k_norm {
                    ops::rms_norm_in_place(k, w, cfg.rms_eps);
                }
                rope(&mut k[..cfg.rope_dims], c, sn);
                let v = &s.v[(t * n_kv + h) * hd..(t * n_kv + h + 1) * hd];
                caches[rows.seq[t]].store(li, h, rows.pos[t], k, v);
            }
        }

        // With `trim`, only the last token's attention output is needed.
        let t_first = if trim { n - 1 } else { 0 };
        let n_out = n - t_first;
        grow(&mut s.att, n_out * n_q * hd);
        let job = AttnJob {
            li,
            gl,
            n_q,
            q0,
            kv0,
            group,
            t_first,
            order,
        };
        self.attend(pool, caches, s, rows, &job);

        let width = n_q * hd;
        let combine = self.combine_mode();
        let att_in: &[f32] = if combine.gather_heads {
            let full = cfg.q_width();
            grow(&mut s.gathered, n_out * full);
            comm.all_gather(
                crate::Axis::QHeads,
                n_out,
                &s.att[..n_out * width],
                &mut s.gathered[..n_out * full],
            )
            .map_err(Error::Collective)?;
            &s.gathered[..n_out * full]
        } else {
            &s.att[..n_out * width]
        };
        s.acts.quantize(
            lw.wo.ggml_type(),
            att_in,
            n_out,
            att_in.len() / n_out.max(1),
        );
        mm(pool, &lw.wo, &s.acts, &mut s.proj);
        let proj = combine_output(
            comm,
            &combine,
            &mut s.proj,
            &mut s.gathered,
            n_out,
            lw.wo.rows(),
            e,
        )?;
        if let Some(w) = &lw.attn_post_norm {
            for row in proj.chunks_exact_mut(e) {
                ops::rms_norm_in_place(row, w, cfg.rms_eps);
            }
        }
        for (tt, row) in proj.chunks_exact(e).enumerate() {
            let t = t_first + tt;
            ops::add_assign(&mut s.x[t * e..(t + 1) * e], row);
        }
        Ok(())
    }

    /// The SwiGLU feed-forward block over the first `rows` rows of `s.x`, added in place.
    fn ffn(
        &self,
        pool: &ThreadPool,
        s: &mut Scratch,
        lw: &crate::weights::LayerWeights,
        rows: usize,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let e = self.cfg.n_embd;
        let ff = lw.w_gate.rows();
        grow(&mut s.xn, rows * e);
        for t in 0..rows {
            ops::rms_norm(
                &s.x[t * e..(t + 1) * e],
                &lw.ffn_norm,
                self.cfg.rms_eps,
                &mut s.xn[t * e..(t + 1) * e],
            );
        }
        s.acts
            .quantize(lw.w_gate.ggml_type(), &s.xn[..rows * e], rows, e);
        if lw.w_up.ggml_type() == lw.w_gate.ggml_type() {
            grow(&mut s.gate, rows * ff);
            grow(&mut s.up, rows * ff);
            matmul_multi(
                pool,
                &s.acts,
                &mut [
                    (&lw.w_gate, &mut s.gate[..rows * ff]),
                    (&lw.w_up, &mut s.up[..rows * ff]),
                ],
            );
        } else {
            mm(pool, &lw.w_gate, &s.acts, &mut s.gate);
            s.acts
                .quantize(lw.w_up.ggml_type(), &s.xn[..rows * e], rows, e);
            mm(pool, &lw.w_up, &s.acts, &mut s.up);
        }
        match self.cfg.kind {
            crate::Arch::Llama => {
                ops::swiglu(&mut s.gate[..rows * ff], &s.up[..rows * ff], self.flavour)
            }
            crate::Arch::Gemma3 => ops::geglu(&mut s.gate[..rows * ff], &s.up[..rows * ff]),
        }
        let combine = self.combine_mode();
        let act: &[f32] = if combine.gather_ffn {
            let full = self.cfg.n_ff;
            grow(&mut s.gathered, rows * full);
            comm.all_gather(
                crate::Axis::Ffn,
                rows,
                &s.gate[..rows * ff],
                &mut s.gathered[..rows * full],
            )
            .map_err(Error::Collective)?;
            &s.gathered[..rows * full]
        } else {
            &s.gate[..rows * ff]
        };
        s.acts
            .quantize(lw.w_down.ggml_type(), act, rows, act.len() / rows.max(1));
        mm(pool, &lw.w_down, &s.acts, &mut s.proj);
        let proj = combine_output(
            comm,
            &combine,
            &mut s.proj,
            &mut s.gathered,
            rows,
            lw.w_down.rows(),
            e,
        )?;
        if let Some(w) = &lw.ffn_post_norm {
            for row in proj.chunks_exact_mut(e) {
                ops::rms_norm_in_place(row, w, self.cfg.rms_eps);
            }
        }
        for (t, row) in proj.chunks_exact(e).enumerate() {
            ops::add_assign(&mut s.x[t * e..(t + 1) * e], row);
        }
        Ok(())
    }

    /// Which exchanges this shard's layers need.
    fn combine_mode(&self) -> CombineMode {
        let cfg = &self.cfg;
        match &self.spec.combine {
            crate::Combine::Gather { embd } => CombineMode {
                gather_heads: self.spec.q_heads != (0..cfg.n_head),
                gather_ffn: self.spec.ffn != (0..cfg.n_ff),
                gather_embd: *embd != (0..cfg.n_embd),
                reduce: false,
            },
            crate::Combine::Reduce => CombineMode {
                gather_heads: false,
                gather_ffn: false,
                gather_embd: false,
                reduce: !self.spec.is_full_width(cfg),
            },
        }
    }
}

/// The exchanges a layer of one shard makes.
struct CombineMode {
    gather_heads: bool,
    gather_ffn: bool,
    gather_embd: bool,
    reduce: bool,
}

/// Turns this rank's output-projection result (`rows` rows in `proj`) into the full model-width
/// rows every rank adds to its residual stream.
fn combine_output<'a>(
    comm: &mut dyn Collective,
    mode: &CombineMode,
    proj: &'a mut [f32],
    gathered: &'a mut Vec<f32>,
    rows: usize,
    part: usize,
    e: usize,
) -> Result<&'a mut [f32]> {
    if mode.gather_embd {
        grow(gathered, rows * e);
        comm.all_gather(
            crate::Axis::Embd,
            rows,
            &proj[..rows * part],
            &mut gathered[..rows * e],
        )
        .map_err(Error::Collective)?;
        return Ok(&mut gathered[..rows * e]);
    }
    let out = &mut proj[..rows * e];
    if mode.reduce {
        comm.all_reduce_sum(out).map_err(Error::Collective)?;
    }
    Ok(out)
}
