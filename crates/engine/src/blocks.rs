//! The shared pieces decoder layers are built from: RMSNorm, attention (Q/K/V fused or not,
//! biases, per-head Q/K norms, RoPE, grouped-query attention over the KV cache, sliding
//! windows), the gated feed-forward block, post-norms and the residual add.
//!
//! A family's layer ([`crate::models::Family::layer`]) is a few calls on [`Blocks`]. The blocks
//! hide the shard: each computes the rank's heads or FFN columns and performs the exchange its
//! [`crate::Combine`] mode needs, so a block's output is always full model-width rows,
//! identical on every rank. Every operation rounds where ggml rounds, so outputs stay bit for
//! bit llama.cpp's.
//!
//! Data flow: `x` is the residual stream (`live` rows), `xn` a block's input, `proj` a block's
//! output (rows `out_first..` of the stream). On the last layer of a prefill only the last row
//! is needed after attention ("trim", as llama.cpp's `inp_out_ids`): attention then outputs one
//! row and [`Blocks::residual`] leaves one live row.

use strata_kernels::attn::{self, Flavour};
use strata_kernels::{QMatrix, QuantActs, ThreadPool, matmul, matmul_multi, ops};

use crate::config::{ExpertGroups, FfnAct, Gating};
use crate::kv_cache::Caches;
use crate::model::{Axis, Collective, Model, Rows, Scratch, grow};
use crate::weights::{
    AttnProj, FfnWeights, GatedFfn, LayerWeights, MlaQuery, MlaWeights, SharedExpert,
};
use crate::{Combine, Error, ExpertSplit, ModelConfig, Result, ShardSpec};

/// Most rows a step prefetches the cache lines of before storing their keys and values: a
/// decode batch (beyond it, a prefill chunk, whose consecutive positions share lines).
const PREFETCH_ROWS: usize = 64;

/// One step's state as it passes through the layers of a shard.
pub(crate) struct Blocks<'a, 'c> {
    pub(crate) cfg: &'a ModelConfig,
    pub(crate) spec: &'a ShardSpec,
    pub(crate) flavour: Flavour,
    pub(crate) pool: &'a ThreadPool,
    pub(crate) caches: Caches<'a, 'c>,
    pub(crate) s: &'a mut Scratch,
    pub(crate) rows: &'a Rows,
    pub(crate) order: attn::DotOrder,
    pub(crate) comm: &'a mut dyn Collective,
    /// Layer index within the shard.
    pub(crate) li: usize,
    /// Whether only the last row continues after this layer's attention.
    pub(crate) trim: bool,
    /// Rows of `x` still computed.
    pub(crate) live: usize,
    /// The first row of `x` that `proj` row 0 belongs to.
    out_first: usize,
    /// Rows of the block output.
    out_rows: usize,
    /// Whether the block output is in `gathered` (an all-gathered model width) rather than
    /// `proj`.
    out_gathered: bool,
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

/// `gate = act(x gate) * (x up)` for `rows` rows of `x` (`gate` and `up` hold `rows` rows of
/// the FFN's width after).
#[allow(clippy::too_many_arguments)]
fn gated(
    pool: &ThreadPool,
    acts: &mut QuantActs,
    x: &[f32],
    rows: usize,
    f: &GatedFfn,
    (gate, up): (&mut Vec<f32>, &mut Vec<f32>),
    act: FfnAct,
    flavour: Flavour,
) {
    let e = x.len() / rows.max(1);
    let ff = f.gate.rows();
    acts.quantize(f.gate.ggml_type(), x, rows, e);
    if f.up.ggml_type() == f.gate.ggml_type() {
        grow(gate, rows * ff);
        grow(up, rows * ff);
        matmul_multi(
            pool,
            acts,
            &mut [
                (&f.gate, &mut gate[..rows * ff]),
                (&f.up, &mut up[..rows * ff]),
            ],
        );
    } else {
        mm(pool, &f.gate, acts, gate);
        acts.quantize(f.up.ggml_type(), x, rows, e);
        mm(pool, &f.up, acts, up);
    }
    add_bias(gate, f.gate_b.as_deref(), rows);
    add_bias(up, f.up_b.as_deref(), rows);
    match act {
        FfnAct::Silu => ops::swiglu(&mut gate[..rows * ff], &up[..rows * ff], flavour),
        FfnAct::Gelu => ops::geglu(&mut gate[..rows * ff], &up[..rows * ff]),
        FfnAct::SwigluOai => ops::swiglu_oai(&mut gate[..rows * ff], &up[..rows * ff]),
    }
}

/// A whole gated FFN over `rows` rows of `x` without any exchange (an expert's, a shared
/// expert's): [`gated`], then the down projection (and its bias) into `out`.
#[allow(clippy::too_many_arguments)]
fn gated_down(
    pool: &ThreadPool,
    acts: &mut QuantActs,
    x: &[f32],
    rows: usize,
    f: &GatedFfn,
    (gate, up): (&mut Vec<f32>, &mut Vec<f32>),
    act: FfnAct,
    flavour: Flavour,
    out: &mut Vec<f32>,
) {
    gated(pool, acts, x, rows, f, (&mut *gate, up), act, flavour);
    let ff = f.gate.rows();
    acts.quantize(f.down.ggml_type(), &gate[..rows * ff], rows, ff);
    mm(pool, &f.down, acts, out);
    add_bias(out, f.down_b.as_deref(), rows);
}

/// DeepSeek V3's group-limited routing over one row's selection scores: each group of
/// `n_expert / count` experts is scored by the sum of its two best scores (ggml's `sum_rows`,
/// in f64), and the experts of all but the `used` best groups are masked to -inf.
fn mask_groups(
    select: &mut [f32],
    g: ExpertGroups,
    order: &mut Vec<u32>,
    group_scores: &mut Vec<f32>,
) {
    let per = select.len() / g.count;
    group_scores.clear();
    for grp in select.chunks_exact(per) {
        order.clear();
        order.extend(0..per as u32);
        order.sort_unstable_by(|&a, &b| grp[b as usize].total_cmp(&grp[a as usize]));
        let best = f64::from(grp[order[0] as usize]) + f64::from(grp[order[1] as usize]);
        group_scores.push(best as f32);
    }
    order.clear();
    order.extend(0..g.count as u32);
    order.sort_unstable_by(|&a, &b| group_scores[b as usize].total_cmp(&group_scores[a as usize]));
    for &dropped in &order[g.used..] {
        let d = dropped as usize;
        select[d * per..(d + 1) * per].fill(f32::NEG_INFINITY);
    }
}

/// RoPE with the family's pairing (halves, or adjacent elements) and the step's tables.
fn rotate(cfg: &ModelConfig, x: &mut [f32], cos: &[f32], sin: &[f32]) {
    if cfg.rope_neox {
        ops::rope_apply_neox(x, cos, sin);
    } else {
        ops::rope_apply(x, cos, sin);
    }
}

/// The experts (from expert `first` on) that choices were routed to, with the span of their
/// choices in the grouped order (`starts[x]..starts[x + 1]`).
fn routed<'e>(
    experts: &'e [GatedFfn],
    first: usize,
    starts: &[usize],
) -> impl Iterator<Item = (&'e GatedFfn, usize, usize)> {
    experts
        .iter()
        .enumerate()
        .map(move |(i, f)| (f, starts[first + i], starts[first + i + 1]))
        .filter(|&(_, a, b)| a < b)
}

/// Bytes of an expert's three matrices (what running it reads).
fn expert_bytes(f: &GatedFfn) -> u64 {
    [&f.gate, &f.up, &f.down]
        .iter()
        .map(|q| (q.rows() * q.row_bytes()) as u64)
        .sum()
}

/// Copies the rows of `xn` (`e` wide) that the choices `entries` (`row * k + slot`) route to an
/// expert into `input`, in order.
fn gather_rows(input: &mut Vec<f32>, xn: &[f32], entries: &[u32], k: usize, e: usize) {
    grow(input, entries.len() * e);
    for (j, &i) in entries.iter().enumerate() {
        let r = i as usize / k;
        input[j * e..(j + 1) * e].copy_from_slice(&xn[r * e..(r + 1) * e]);
    }
}

/// Places an expert's output rows (`w` wide, one per choice in `entries`) at their choices.
fn scatter_rows(outputs: &mut [f32], rows: &[f32], entries: &[u32], w: usize) {
    for (j, &i) in entries.iter().enumerate() {
        let i = i as usize;
        outputs[i * w..(i + 1) * w].copy_from_slice(&rows[j * w..(j + 1) * w]);
    }
}

/// All-gathers `rows` rows of this rank's block `src` of `axis` into `dst` (grown to whole
/// rows of `full`), and returns the whole rows.
fn gather<'d>(
    comm: &mut dyn Collective,
    axis: Axis,
    rows: usize,
    src: &[f32],
    dst: &'d mut Vec<f32>,
    full: usize,
) -> Result<&'d [f32]> {
    grow(dst, rows * full);
    comm.all_gather(axis, rows, src, &mut dst[..rows * full])
        .map_err(Error::Collective)?;
    Ok(&dst[..rows * full])
}

fn grow_u32(v: &mut Vec<u32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0);
    }
}

fn mm(pool: &ThreadPool, w: &QMatrix, acts: &QuantActs, out: &mut Vec<f32>) {
    grow(out, acts.n() * w.rows());
    matmul(pool, w, acts, &mut out[..acts.n() * w.rows()]);
}

/// Adds `bias` to each of the first `rows` rows of `x` (ggml's broadcast `ggml_add`).
fn add_bias(x: &mut [f32], bias: Option<&[f32]>, rows: usize) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()).take(rows) {
            ops::add_assign(row, b);
        }
    }
}

impl<'a, 'c> Blocks<'a, 'c> {
    /// The state of a step over `rows` (the residual stream already holds their inputs).
    pub(crate) fn new(
        model: &'a Model,
        pool: &'a ThreadPool,
        caches: Caches<'a, 'c>,
        s: &'a mut Scratch,
        rows: &'a Rows,
        order: attn::DotOrder,
        comm: &'a mut dyn Collective,
    ) -> Self {
        Blocks {
            cfg: model.config(),
            spec: model.spec(),
            flavour: model.flavour(),
            pool,
            caches,
            s,
            rows,
            order,
            comm,
            li: 0,
            trim: false,
            live: rows.pos.len(),
            out_first: 0,
            out_rows: 0,
            out_gathered: false,
        }
    }
}

impl Blocks<'_, '_> {
    /// `xn = rms_norm(x) * w` for every live row; with no weights (a layer without pre-norms),
    /// `xn = x`.
    pub(crate) fn norm(&mut self, w: Option<&[f32]>) {
        let e = self.cfg.n_embd;
        let s = &mut *self.s;
        grow(&mut s.xn, self.live * e);
        let Some(w) = w else {
            s.xn[..self.live * e].copy_from_slice(&s.x[..self.live * e]);
            return;
        };
        for (src, dst) in s.x[..self.live * e]
            .chunks_exact(e)
            .zip(s.xn.chunks_exact_mut(e))
        {
            ops::rms_norm(src, w, self.cfg.rms_eps, dst);
        }
    }

    /// RMSNorm of the block output in place (Gemma's post-attention and post-FFN norms).
    pub(crate) fn post_norm(&mut self, w: Option<&[f32]>) {
        let e = self.cfg.n_embd;
        if let Some(w) = w {
            let out = if self.out_gathered {
                &mut self.s.gathered
            } else {
                &mut self.s.proj
            };
            for row in out[..self.out_rows * e].chunks_exact_mut(e) {
                ops::rms_norm_in_place(row, w, self.cfg.rms_eps);
            }
        }
    }

    /// Adds the block output to the residual stream; after a trimmed attention, only the last
    /// row stays live (moved to row 0).
    pub(crate) fn residual(&mut self) {
        let e = self.cfg.n_embd;
        let scale = self.cfg.residual_scale;
        let s = &mut *self.s;
        let out = if self.out_gathered {
            &mut s.gathered
        } else {
            &mut s.proj
        };
        for (tt, row) in out[..self.out_rows * e].chunks_exact_mut(e).enumerate() {
            let t = self.out_first + tt;
            if let Some(f) = scale {
                ops::scale(row, f);
            }
            ops::add_assign(&mut s.x[t * e..(t + 1) * e], row);
        }
        if self.out_first > 0 {
            s.x.copy_within(self.out_first * e..(self.out_first + 1) * e, 0);
            self.live = self.out_rows;
            self.out_first = 0;
        }
    }

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
        let rope = |x: &mut [f32], c: &[f32], sn: &[f32]| {
            if use_rope {
                rotate(cfg, x, c, sn);
            }
        };
        let rows = self.rows;
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
                ops::round_f16_slice(q);
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
    /// [`ModelConfig::v_head_dim`] for rows `t_first..n`), with this shard's exchanges and the
    /// bias; the rows land in `proj` (or `gathered`).
    fn attn_output(
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

    /// Multi-head latent attention as llama.cpp's DeepSeek graph runs it (absorbed): the
    /// queries (directly, or through a normed low rank), the latent row (normed) and the
    /// shared rotated key part; each head's un-rotated query projected into the latent space
    /// and joined to its rotated part; the latent row and rotated key cached as one key, its
    /// latent part doubling as the value; grouped attention of every head over that single
    /// KV head; each head's latent output decompressed into its values; then the output
    /// projection. Every product is ggml's, head by head where it multiplies 3-D tensors.
    fn latent_attention(&mut self, lw: &LayerWeights, m: &MlaWeights) -> Result<()> {
        let cfg = self.cfg;
        let Some(mla) = cfg.mla else {
            return Err(Error::InvalidModel(
                "latent attention without its sizes".into(),
            ));
        };
        let n = self.live;
        let (e, rope) = (cfg.n_embd, cfg.rope_dims);
        let (qh, kl, vh, nope) = (mla.q_head(rope), mla.kv_lora, mla.v_head, mla.nope);
        let kw = cfg.head_dim;
        let n_q = m.k_b.len();
        let half = rope / 2;
        let li = self.li;
        let gl = self.spec.layers.start + li;
        let pool = self.pool;
        let s = &mut *self.s;
        let xn = &s.xn[..n * e];

        // Queries, `qh` per head: `nope` elements, then the rotated ones.
        match &m.q {
            MlaQuery::Direct(wq) => {
                s.acts.quantize(wq.ggml_type(), xn, n, e);
                mm(pool, wq, &s.acts, &mut s.up);
            }
            MlaQuery::Lora { a, norm, b } => {
                let r = a.rows();
                s.acts.quantize(a.ggml_type(), xn, n, e);
                mm(pool, a, &s.acts, &mut s.gate);
                for row in s.gate[..n * r].chunks_exact_mut(r) {
                    ops::rms_norm_in_place(row, norm, cfg.rms_eps);
                }
                s.acts.quantize(b.ggml_type(), &s.gate[..n * r], n, r);
                mm(pool, b, &s.acts, &mut s.up);
            }
        }
        // The latent row (normed) and the shared key part (rotated): the cached key.
        s.acts.quantize(m.kv_a.ggml_type(), xn, n, e);
        mm(pool, &m.kv_a, &s.acts, &mut s.k);
        let rows = self.rows;
        for t in 0..n {
            let (c, sn) = (
                &s.rope_cos[t * half..(t + 1) * half],
                &s.rope_sin[t * half..(t + 1) * half],
            );
            let k = &mut s.k[t * kw..(t + 1) * kw];
            ops::rms_norm_in_place(&mut k[..kl], &m.kv_a_norm, cfg.rms_eps);
            rotate(cfg, &mut k[kl..], c, sn);
            let (k, v) = (&s.k[t * kw..(t + 1) * kw], &s.k[t * kw..t * kw + kl]);
            self.caches
                .get_mut(rows.seq[t])
                .store(li, 0, rows.pos[t], k, v);
        }
        // Each head's query: its un-rotated part through `attn_k_b` into the latent space,
        // then its rotated part, rounded to f16 where it meets the f16 keys.
        grow(&mut s.q, n * n_q * kw);
        grow(&mut s.gate, n * nope);
        for (h, kb) in m.k_b.iter().enumerate() {
            for t in 0..n {
                let src = (t * n_q + h) * qh;
                s.gate[t * nope..(t + 1) * nope].copy_from_slice(&s.up[src..src + nope]);
            }
            s.acts
                .quantize(kb.ggml_type(), &s.gate[..n * nope], n, nope);
            mm(pool, kb, &s.acts, &mut s.v);
            for t in 0..n {
                let dst = (t * n_q + h) * kw;
                s.q[dst..dst + kl].copy_from_slice(&s.v[t * kl..(t + 1) * kl]);
            }
        }
        for t in 0..n {
            let (c, sn) = (
                &s.rope_cos[t * half..(t + 1) * half],
                &s.rope_sin[t * half..(t + 1) * half],
            );
            for h in 0..n_q {
                let src = (t * n_q + h) * qh + nope;
                let dst = &mut s.q[(t * n_q + h) * kw..(t * n_q + h + 1) * kw];
                dst[kl..].copy_from_slice(&s.up[src..src + rope]);
                rotate(cfg, &mut dst[kl..], c, sn);
                ops::round_f16_slice(dst);
            }
        }

        // Every head reads the one latent KV head.
        let t_first = if self.trim { n - 1 } else { 0 };
        let n_out = n - t_first;
        grow(&mut self.s.att, n_out * n_q * kl);
        let job = AttnJob {
            li,
            gl,
            n_q,
            q0: self.spec.q_heads.start,
            kv0: 0,
            group: cfg.n_head,
            t_first,
            order: self.order,
        };
        self.attend(&job, None);

        // Each head's latent output through `attn_v_b` (llama.cpp decompresses every row
        // before it drops all but the last: follow its kernel choice).
        let s = &mut *self.s;
        grow(&mut s.gate, n_out * kl);
        grow(&mut s.v, n_out * n_q * vh);
        for (h, vb) in m.v_b.iter().enumerate() {
            for tt in 0..n_out {
                let src = (tt * n_q + h) * kl;
                s.gate[tt * kl..(tt + 1) * kl].copy_from_slice(&s.att[src..src + kl]);
            }
            s.acts
                .quantize(vb.ggml_type(), &s.gate[..n_out * kl], n_out, kl);
            s.acts.as_rows_of(n, t_first);
            mm(pool, vb, &s.acts, &mut s.up);
            for tt in 0..n_out {
                let dst = (tt * n_q + h) * vh;
                s.v[dst..dst + vh].copy_from_slice(&s.up[tt * vh..(tt + 1) * vh]);
            }
        }
        grow(&mut s.att, n_out * n_q * vh);
        s.att[..n_out * n_q * vh].copy_from_slice(&s.v[..n_out * n_q * vh]);
        self.attn_output(lw, n, t_first, n_q)
    }

    /// OLMo 2's Q and K norms, over whole rows (every head together) of the `n` rows in `q` and
    /// `k`, which hold this rank's `n_q` query and `n_kv` KV heads. A rank with a slice of the
    /// heads all-gathers the whole rows to compute each row's factor exactly as one process
    /// does, then scales its own slice; every rank of a group makes the same exchanges (all
    /// shard heads, or none does).
    fn qk_norm_rows(&mut self, lw: &LayerWeights, n: usize, n_q: usize, n_kv: usize) -> Result<()> {
        let (Some(qw), Some(kw)) = (lw.q_norm.as_deref(), lw.k_norm.as_deref()) else {
            return Ok(());
        };
        let cfg = self.cfg;
        let hd = cfg.head_dim;
        let spec = self.spec;
        let kv = spec.kv_heads(cfg);
        // Each KV head travels from the one rank that owns it; others may hold copies.
        let owned = spec.owned_kv_heads(cfg);
        let sharded = spec.q_heads != (0..cfg.n_head);
        let eps = cfg.rms_eps;
        let q = RowNorm {
            axis: Axis::QHeads,
            local: n_q * hd,
            full: cfg.q_width(),
            first: spec.q_heads.start * hd,
            owned: 0..n_q * hd,
            sharded,
            eps,
        };
        let k = RowNorm {
            axis: Axis::KvHeads,
            local: n_kv * hd,
            full: cfg.kv_width(),
            first: kv.start * hd,
            owned: (owned.start - kv.start) * hd..(owned.end - kv.start) * hd,
            sharded,
            eps,
        };
        let s = &mut *self.s;
        q.apply(&mut *self.comm, n, &mut s.q, qw, &mut s.up, &mut s.gathered)?;
        k.apply(&mut *self.comm, n, &mut s.k, kw, &mut s.up, &mut s.gathered)
    }

    /// Scores, softmax and the weighted sum of values for every (token, KV head): the query heads
    /// sharing a KV head are scored and summed together, so each key and value row is loaded
    /// once for all of them. Each token reads its own sequence's cache.
    fn attend(&mut self, job: &AttnJob, sinks: Option<&[f32]>) {
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
                attn::scores_grouped(order, qg, hd, keys, n, scale, out, stride);
            }
            let sc = &mut sc[first..];
            for (i, row) in sc.chunks_mut(stride).take(g).enumerate() {
                let (len, lenp) = (len - first, lenp - first);
                let row = &mut row[..lenp];
                if let Some(cap) = softcap {
                    ops::softcap(&mut row[..len], cap);
                }
                mask_window(&mut row[..len], first, query_pos, window);
                let sink = sinks.map(|k| k[job.q0 + h0 + i]);
                ops::softmax(&mut row[..len], sink, flavour);
                // llama.cpp converts the probabilities to f16 before the product with V.
                ops::round_f16_slice(&mut row[..len]);
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

    /// The gated feed-forward block (`down(act(gate(xn)) * up(xn))`) over the live rows; the
    /// output rows land in `proj`.
    pub(crate) fn ffn(&mut self, lw: &LayerWeights) -> Result<()> {
        match &lw.ffn {
            FfnWeights::Dense(f) => self.dense_ffn(f),
            FfnWeights::Moe {
                router,
                router_b,
                select_b,
                experts,
                first,
                shared,
            } => self.moe_ffn(
                router,
                (router_b.as_deref(), select_b.as_deref()),
                (experts, *first),
                shared.as_deref(),
            ),
        }
    }

    fn dense_ffn(&mut self, f: &GatedFfn) -> Result<()> {
        let rows = self.live;
        let e = self.cfg.n_embd;
        let ff = f.gate.rows();
        let s = &mut *self.s;
        gated(
            self.pool,
            &mut s.acts,
            &s.xn[..rows * e],
            rows,
            f,
            (&mut s.gate, &mut s.up),
            self.cfg.ffn_act,
            self.flavour,
        );
        let combine = CombineMode::of(self.cfg, self.spec);
        let act: &[f32] = if combine.gather_ffn {
            let full = self.cfg.n_ff;
            let src = &s.gate[..rows * ff];
            gather(&mut *self.comm, Axis::Ffn, rows, src, &mut s.gathered, full)?
        } else {
            &s.gate[..rows * ff]
        };
        s.acts
            .quantize(f.down.ggml_type(), act, rows, act.len() / rows.max(1));
        mm(self.pool, &f.down, &s.acts, &mut s.proj);
        self.combine_output(&combine, rows, f.down.rows())?;
        self.out_first = 0;
        self.out_rows = rows;
        Ok(())
    }

    /// A mixture of experts, as llama.cpp's `build_moe_ffn` computes it: router logits (an
    /// ordinary product), their softmax (ggml's operator), the `n_used` most probable experts
    /// (best first) with their probabilities, renormalised and scaled if the family says so;
    /// then each expert's FFN over the rows routed to it (llama.cpp's `mul_mat_id`: the rows
    /// form one batch, which picks the kernel, and never tinyBLAS), each output times its
    /// weight, and a row's outputs summed in choice order.
    fn moe_ffn(
        &mut self,
        router: &QMatrix,
        (router_b, select_b): (Option<&[f32]>, Option<&[f32]>),
        (experts, first): (&[GatedFfn], usize),
        shared: Option<&SharedExpert>,
    ) -> Result<()> {
        let rows = self.live;
        let e = self.cfg.n_embd;
        let Some(moe) = self.cfg.moe else {
            return Err(Error::InvalidModel("experts without expert counts".into()));
        };
        let (nx, k) = (moe.n_expert, moe.n_used);
        let s = &mut *self.s;
        let m = &mut s.moe;
        s.acts
            .quantize(router.ggml_type(), &s.xn[..rows * e], rows, e);
        mm(self.pool, router, &s.acts, &mut m.probs);
        add_bias(&mut m.probs, router_b, rows);
        grow_u32(&mut m.chosen, rows * k);
        grow(&mut m.weight, rows * k);
        for r in 0..rows {
            let p = &mut m.probs[r * nx..(r + 1) * nx];
            match moe.gating {
                Gating::Softmax => ops::softmax_op(p, self.flavour),
                // ggml_sigmoid: `1 / (1 + expf(-x))`.
                Gating::Sigmoid => p.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
                Gating::SoftmaxWeight => {}
            }
            // The choice follows the probabilities plus any selection bias, within the best
            // groups; the weights are the probabilities themselves.
            m.select.clear();
            m.select.extend_from_slice(p);
            if let Some(b) = select_b {
                ops::add_assign(&mut m.select, b);
            }
            if let Some(g) = moe.groups {
                mask_groups(&mut m.select, g, &mut m.order, &mut m.group_scores);
            }
            let sel = &m.select;
            m.order.clear();
            m.order.extend(0..nx as u32);
            m.order
                .sort_unstable_by(|&a, &b| sel[b as usize].total_cmp(&sel[a as usize]));
            let w = &mut m.weight[r * k..(r + 1) * k];
            for (slot, &x) in m.order[..k].iter().enumerate() {
                m.chosen[r * k + slot] = x;
                w[slot] = p[x as usize];
            }
            if moe.gating == Gating::SoftmaxWeight {
                // ggml's soft_max over the chosen logits only.
                ops::softmax_op(w, self.flavour);
            }
            if moe.norm_weights {
                // ggml_sum_rows (in f64), clamped to the smallest f16 normal, then a division.
                let sum = w.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
                let sum = sum.max(6.103_515_6e-5);
                for v in w.iter_mut() {
                    *v /= sum;
                }
            }
            if moe.weights_scale != 1.0 {
                for v in w.iter_mut() {
                    *v *= moe.weights_scale;
                }
            }
        }
        // Group the choices by expert, rows in order (a counting sort, as ggml groups them).
        m.starts.clear();
        m.starts.resize(nx + 1, 0);
        for &x in &m.chosen[..rows * k] {
            m.starts[x as usize + 1] += 1;
        }
        for x in 0..nx {
            m.starts[x + 1] += m.starts[x];
        }
        grow_u32(&mut m.grouped, rows * k);
        m.fill.clear();
        m.fill.extend_from_slice(&m.starts);
        for (i, &x) in m.chosen[..rows * k].iter().enumerate() {
            m.grouped[m.fill[x as usize]] = i as u32;
            m.fill[x as usize] += 1;
        }
        // Under tensor parallelism each rank computes its columns of every expert's gate and up,
        // the group all-gathers the activations, and each rank projects them onto its rows of
        // the model width; otherwise every output is whole.
        let cfg = self.cfg;
        let tp = self.spec.ffn_exp.is_some();
        let ew = if tp {
            self.spec.embd_rows(cfg).len()
        } else {
            e
        };
        grow(&mut m.outputs, rows * k * ew);
        s.acts.set_mul_mat_id(true);
        // Each routed expert's activations (its gate and up over its rows), in grouped order;
        // then, all-gathered under tensor parallelism, its down projection.
        let n_ent = rows * k;
        let lf = experts.first().map_or(0, |f| f.gate.rows());
        grow(&mut m.act, n_ent * lf);
        for (f, a, b) in routed(experts, first, &m.starts) {
            let c = b - a;
            s.expert_bytes += expert_bytes(f);
            gather_rows(&mut m.input, &s.xn, &m.grouped[a..b], k, e);
            gated(
                self.pool,
                &mut s.acts,
                &m.input[..c * e],
                c,
                f,
                (&mut s.gate, &mut s.up),
                cfg.ffn_act,
                self.flavour,
            );
            m.act[a * lf..b * lf].copy_from_slice(&s.gate[..c * lf]);
        }
        let (act, ff): (&[f32], usize) = if tp {
            let ff = moe.n_ff_exp;
            let src = &m.act[..n_ent * lf];
            let all = gather(
                &mut *self.comm,
                Axis::ExpertFfn,
                n_ent,
                src,
                &mut m.act_full,
                ff,
            )?;
            (all, ff)
        } else {
            (&m.act, lf)
        };
        for (f, a, b) in routed(experts, first, &m.starts) {
            let c = b - a;
            s.acts
                .quantize(f.down.ggml_type(), &act[a * ff..b * ff], c, ff);
            mm(self.pool, &f.down, &s.acts, &mut m.down);
            add_bias(&mut m.down, f.down_b.as_deref(), c);
            scatter_rows(&mut m.outputs, &m.down, &m.grouped[a..b], ew);
        }
        s.acts.set_mul_mat_id(false);
        let has_shared = moe.n_ff_shexp.is_some();
        if let Some(x) = shared {
            self.shared_expert(x);
        }
        if let Some(split) = &self.spec.experts {
            self.exchange_experts(split, has_shared)?;
        }
        let s = &mut *self.s;
        let m = &mut s.moe;
        grow(&mut s.proj, rows * ew);
        for r in 0..rows {
            let out = &mut s.proj[r * ew..(r + 1) * ew];
            for slot in 0..k {
                let i = r * k + slot;
                let w = m.weight[i];
                let y = &m.outputs[i * ew..(i + 1) * ew];
                if slot == 0 {
                    for (o, &v) in out.iter_mut().zip(y) {
                        *o = v * w;
                    }
                } else {
                    for (o, &v) in out.iter_mut().zip(y) {
                        *o += v * w;
                    }
                }
            }
            // The shared expert's contribution joins after the routed ones (ggml_add).
            if has_shared {
                ops::add_assign(out, &m.shared[r * ew..(r + 1) * ew]);
            }
        }
        self.out_first = 0;
        self.out_rows = rows;
        if tp {
            // This rank's rows of the model width, all-gathered into whole rows.
            let mode = CombineMode::of(cfg, self.spec);
            return self.combine_output(&mode, rows, ew);
        }
        self.out_gathered = false;
        self.out_first = 0;
        self.out_rows = rows;
        Ok(())
    }

    /// Expert parallelism's exchange: every member sends the outputs of the choices routed to
    /// its experts (grouped by expert, in the order all members derive from the same routing)
    /// and, on its owner, the shared expert's contributions; every member places what it
    /// receives where one process would have computed it.
    fn exchange_experts(&mut self, split: &ExpertSplit, has_shared: bool) -> Result<()> {
        let (rows, e) = (self.live, self.cfg.n_embd);
        let m = &mut self.s.moe;
        let shared_len = |member: usize| {
            if has_shared && member == split.shared_owner {
                rows * e
            } else {
                0
            }
        };
        m.counts.clear();
        for (i, p) in split.parts.iter().enumerate() {
            m.counts
                .push((m.starts[p.end] - m.starts[p.start]) * e + shared_len(i));
        }
        let mine = split.mine();
        m.send.clear();
        for &i in &m.grouped[m.starts[mine.start]..m.starts[mine.end]] {
            let i = i as usize;
            m.send.extend_from_slice(&m.outputs[i * e..(i + 1) * e]);
        }
        if shared_len(split.me) > 0 {
            m.send.extend_from_slice(&m.shared[..rows * e]);
        }
        let total = m.counts.iter().sum::<usize>();
        grow(&mut m.recv, total);
        self.comm
            .all_gather_varying(&m.counts, &m.send, &mut m.recv[..total])
            .map_err(Error::Collective)?;
        if has_shared {
            grow(&mut m.shared, rows * e);
        }
        let mut at = 0;
        for (member, p) in split.parts.iter().enumerate() {
            for &i in &m.grouped[m.starts[p.start]..m.starts[p.end]] {
                let i = i as usize;
                m.outputs[i * e..(i + 1) * e].copy_from_slice(&m.recv[at..at + e]);
                at += e;
            }
            let n = shared_len(member);
            m.shared[..n].copy_from_slice(&m.recv[at..at + n]);
            at += n;
        }
        Ok(())
    }

    /// A shared expert's contributions into `moe.shared`, as llama.cpp's graphs compute them:
    /// the FFN over every row, times `silu(g) / g` (a sigmoid by ggml's operators) of the row's
    /// gate logit `g` when the model has a gate (Qwen2-MoE).
    fn shared_expert(&mut self, x: &SharedExpert) {
        let rows = self.live;
        let e = self.cfg.n_embd;
        let s = &mut *self.s;
        let m = &mut s.moe;
        if let Some(g) = &x.gate {
            s.acts.quantize(g.ggml_type(), &s.xn[..rows * e], rows, e);
            mm(self.pool, g, &s.acts, &mut m.probs);
            for v in &mut m.probs[..rows] {
                // ggml_silu of a one-element row: the scalar `x / (1 + expf(-x))`.
                let silu = *v / (1.0 + (-*v).exp());
                *v = silu / *v;
            }
        }
        gated_down(
            self.pool,
            &mut s.acts,
            &s.xn[..rows * e],
            rows,
            &x.ffn,
            (&mut s.gate, &mut s.up),
            FfnAct::Silu,
            self.flavour,
            &mut m.down,
        );
        // The model width, or this rank's rows of it under tensor parallelism.
        let w = x.ffn.down.rows();
        grow(&mut m.shared, rows * w);
        for r in 0..rows {
            let y = &m.down[r * w..(r + 1) * w];
            let out = &mut m.shared[r * w..(r + 1) * w];
            match x.gate {
                Some(_) => {
                    let g = m.probs[r];
                    for (o, &v) in out.iter_mut().zip(y) {
                        *o = v * g;
                    }
                }
                None => out.copy_from_slice(y),
            }
        }
    }

    /// Turns this rank's output-projection result (`rows` rows of `part` values in `proj`) into
    /// the full model-width rows every rank adds to its residual stream (all-gathered into
    /// `gathered`, or all-reduced in place in `proj`).
    fn combine_output(&mut self, mode: &CombineMode, rows: usize, part: usize) -> Result<()> {
        let e = self.cfg.n_embd;
        let s = &mut *self.s;
        self.out_gathered = mode.gather_embd;
        if mode.gather_embd {
            let src = &s.proj[..rows * part];
            gather(&mut *self.comm, Axis::Embd, rows, src, &mut s.gathered, e)?;
            return Ok(());
        }
        if mode.reduce {
            self.comm
                .all_reduce_sum(&mut s.proj[..rows * e])
                .map_err(Error::Collective)?;
        }
        Ok(())
    }
}

/// An RMSNorm over whole rows of which a rank holds a slice (OLMo 2's Q and K norms).
struct RowNorm {
    /// The axis the slices are gathered along.
    axis: Axis,
    /// Width of this rank's slice, and of a whole row.
    local: usize,
    full: usize,
    /// Where the slice starts in a whole row (and in the norm's weights).
    first: usize,
    /// The part of the slice this rank sends (the others send the rest of the row).
    owned: std::ops::Range<usize>,
    /// Whether the group shards the heads (else every rank holds whole rows).
    sharded: bool,
    /// The norm's epsilon.
    eps: f32,
}

impl RowNorm {
    /// Normalises the `n` rows of slices in `x` with weights `w` (a whole row's): directly when
    /// the rank holds whole rows, else from the all-gathered rows (`send` and `gathered` are
    /// scratch).
    fn apply(
        &self,
        comm: &mut dyn Collective,
        n: usize,
        x: &mut [f32],
        w: &[f32],
        send: &mut Vec<f32>,
        gathered: &mut Vec<f32>,
    ) -> Result<()> {
        let (x, eps) = (&mut x[..n * self.local], self.eps);
        if !self.sharded {
            for row in x.chunks_exact_mut(self.full) {
                ops::rms_norm_in_place(row, w, eps);
            }
            return Ok(());
        }
        let width = self.owned.len();
        grow(send, n * width);
        for (dst, src) in send[..n * width]
            .chunks_exact_mut(width.max(1))
            .zip(x.chunks_exact(self.local))
        {
            dst.copy_from_slice(&src[self.owned.clone()]);
        }
        grow(gathered, n * self.full);
        comm.all_gather(
            self.axis,
            n,
            &send[..n * width],
            &mut gathered[..n * self.full],
        )
        .map_err(Error::Collective)?;
        let w = &w[self.first..self.first + self.local];
        for (row, whole) in x
            .chunks_exact_mut(self.local)
            .zip(gathered.chunks_exact(self.full))
        {
            ops::scale_by(row, ops::rms_scale(whole, eps), w);
        }
        Ok(())
    }
}

/// The exchanges a layer of one shard makes.
struct CombineMode {
    gather_heads: bool,
    gather_ffn: bool,
    gather_embd: bool,
    reduce: bool,
}

impl CombineMode {
    fn of(cfg: &ModelConfig, spec: &ShardSpec) -> CombineMode {
        match &spec.combine {
            Combine::Gather { embd } => CombineMode {
                gather_heads: spec.q_heads != (0..cfg.n_head),
                gather_ffn: spec.ffn != (0..cfg.n_ff),
                gather_embd: *embd != (0..cfg.n_embd),
                reduce: false,
            },
            Combine::Reduce => CombineMode {
                gather_heads: false,
                gather_ffn: false,
                gather_embd: false,
                reduce: !spec.is_full_width(cfg),
            },
        }
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
