//! One forward step of a decoder over a shard: the embedding, the family's layers (see
//! [`crate::models`] and [`crate::blocks`]) and the LM head.
//!
//! The step takes a batch of tokens (the whole prompt during prefill, one token during decode) at
//! consecutive positions, appends their keys and values to the cache, and leaves either the hidden
//! states (a pipeline stage that is not last) or the last token's logits over the shard's
//! vocabulary rows. Partial sums of tensor-parallel ranks meet in [`Collective::all_reduce_sum`]
//! after the attention output and FFN down projections, the only two places a layer needs them
//! (Gemma's post-attention and post-FFN norms come after the reduction).

use strata_gguf::GgufFile;
use strata_kernels::attn::{self, Flavour};
use strata_kernels::formats::dequantize_row;
use strata_kernels::{QuantActs, ThreadPool, matmul, ops};

use crate::blocks::Blocks;
use crate::kv_cache::Caches;
use crate::weights::Weights;
use crate::{Error, KvCache, ModelConfig, Result, ShardSpec};

/// Why an exchange between ranks failed (the data plane's error, kept opaque here).
pub type CommError = Box<dyn std::error::Error + Send + Sync>;

/// Which dimension a tensor-parallel all-gather assembles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// Attention outputs, one block of query heads per rank (`q_heads * head_dim` columns).
    QHeads,
    /// Keys, one block of KV heads per rank ([`crate::ShardSpec::owned_kv_heads`] x head width
    /// columns; OLMo 2 normalises whole K rows).
    KvHeads,
    /// FFN activations, one block of FFN columns per rank.
    Ffn,
    /// Model-width vectors, one block of rows per rank ([`crate::Combine::Gather`]).
    Embd,
    /// Expert FFN activations, one block of every expert's columns per rank.
    ExpertFfn,
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

    /// Assembles `dst` from every rank's `src`, member `i` of the group contributing
    /// `counts[i]` values, in group order (expert parallelism's exchange, whose sizes every
    /// member derives from the same routing).
    fn all_gather_varying(
        &mut self,
        counts: &[usize],
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

    fn all_gather_varying(
        &mut self,
        _counts: &[usize],
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
    /// Bytes of expert weights the steps since the last [`Scratch::take_expert_bytes`] ran
    /// (each expert that received rows counts once per step).
    pub(crate) expert_bytes: u64,
    pub(crate) x: Vec<f32>,
    pub(crate) xn: Vec<f32>,
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) att: Vec<f32>,
    pub(crate) proj: Vec<f32>,
    /// All-gathered tensor-parallel blocks (attention outputs, FFN activations, projections).
    pub(crate) gathered: Vec<f32>,
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    pub(crate) logits: Vec<f32>,
    pub(crate) acts: QuantActs,
    pub(crate) rope_cos: Vec<f32>,
    pub(crate) rope_sin: Vec<f32>,
    /// Per-thread attention scores: `MAX_GROUP` rows of the padded context each.
    pub(crate) scores: Vec<f32>,
    /// Runs of query heads sharing a KV head: (first, end, KV head).
    pub(crate) runs: Vec<(usize, usize, usize)>,
    /// Which sequence and position each row of the step belongs to.
    pub(crate) rows: Rows,
    /// The mixture of experts' working state.
    pub(crate) moe: MoeScratch,
    /// Values of [`Scratch::embeddings`] the last [`Model::embed`] left in `xn`.
    pub(crate) embedded: usize,
}

/// Buffers of a mixture-of-experts block, kept across steps.
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    /// Router logits, then probabilities: `n_expert` per row.
    pub(crate) probs: Vec<f32>,
    /// Experts sorted by probability (one row's worth).
    pub(crate) order: Vec<u32>,
    /// One row's selection scores (the probabilities plus any selection bias, with the
    /// experts of unchosen groups masked), and its groups' scores.
    pub(crate) select: Vec<f32>,
    pub(crate) group_scores: Vec<f32>,
    /// Each row's chosen experts and their weights: `n_used` per row, best first.
    pub(crate) chosen: Vec<u32>,
    pub(crate) weight: Vec<f32>,
    /// `row * n_used + slot` of every choice, grouped by expert, and where each group starts.
    pub(crate) grouped: Vec<u32>,
    pub(crate) starts: Vec<usize>,
    /// Where the next choice of each expert goes while grouping.
    pub(crate) fill: Vec<usize>,
    /// The rows routed to one expert, and its outputs.
    pub(crate) input: Vec<f32>,
    pub(crate) down: Vec<f32>,
    /// Every choice's output: `n_used` model-width rows per row.
    pub(crate) outputs: Vec<f32>,
    /// The shared expert's contribution to each row.
    pub(crate) shared: Vec<f32>,
    /// Tensor parallelism: every choice's activations over this rank's expert columns, and
    /// over all of them (all-gathered), in grouped order.
    pub(crate) act: Vec<f32>,
    pub(crate) act_full: Vec<f32>,
    /// Expert parallelism: each member's share of the exchange, this rank's, and all of it.
    pub(crate) counts: Vec<usize>,
    pub(crate) send: Vec<f32>,
    pub(crate) recv: Vec<f32>,
}

/// The sequence (index into the step's caches) and position of every row of a step.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    pub(crate) seq: Vec<usize>,
    pub(crate) pos: Vec<usize>,
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
    /// Bytes of expert weights run since the last call (see the field), and a fresh count.
    pub fn take_expert_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.expert_bytes)
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

    /// Every row's hidden state after the output norm, after [`Model::embed`].
    pub fn embeddings(&self) -> &[f32] {
        &self.xn[..self.embedded]
    }
}

/// Which pass [`Model::forward_to`] runs over one sequence's tokens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Prefill or decode: the logits after the last token.
    Logits,
    /// Every row's normed hidden state ([`Model::embed`]).
    Embed,
}

/// What a step leaves after its layers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// Logits of the last row only; the last layer skips the other rows after attention (a
    /// prompt's prefill, as llama.cpp does it).
    LastRow,
    /// Logits of one row per sequence (the last row of a single sequence).
    Rows,
    /// Every row's hidden state after the output norm, and no logits.
    Embeddings,
    /// Logits of every row (drafted tokens, scored in one pass).
    EveryRow,
}

/// An error unless every slot `pick` names is one of `slots` and none is named twice.
fn check_pick(slots: usize, pick: &[usize]) -> Result<()> {
    if let Some(&bad) = pick.iter().find(|&&i| i >= slots) {
        return Err(Error::InvalidShard(format!(
            "a batch names slot {bad} of {slots}"
        )));
    }
    for (i, a) in pick.iter().enumerate() {
        if pick[..i].contains(a) {
            return Err(Error::InvalidShard(format!("a batch names slot {a} twice")));
        }
    }
    Ok(())
}

pub(crate) fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
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

    /// The llama.cpp build whose arithmetic this model reproduces.
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Bytes of weights one decode step streams from memory (the roofline's denominator).
    pub fn streamed_bytes_per_token(&self) -> usize {
        self.weights.streamed_bytes()
    }

    /// Bytes of the weights every step reads whatever the routing: all but the experts.
    pub fn fixed_bytes_per_step(&self) -> usize {
        self.weights.fixed_bytes()
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
            (self.cfg.head_dim, self.cfg.cache_v_dim()),
        )
    }

    /// Rows of a stage's input (tokens, or hidden states of the model's width); none is an
    /// error.
    fn input_rows(&self, input: &StageInput<'_>) -> Result<usize> {
        let n = match input {
            StageInput::Tokens(t) => t.len(),
            StageInput::Hidden(h) => h.len() / self.cfg.n_embd,
        };
        if n == 0 {
            return Err(Error::EmptyPrompt);
        }
        Ok(n)
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
        self.forward_to(pool, cache, scratch, input, comm, Pass::Logits)
    }

    /// Runs the whole model over `tokens` (appended to `cache`) for their embeddings: every
    /// row's hidden state after the output norm, as llama.cpp's `result_norm` (what its
    /// embedding paths pool). After it, [`Scratch::embeddings`] holds `tokens.len()` rows.
    pub fn embed(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        scratch: &mut Scratch,
        tokens: &[u32],
    ) -> Result<()> {
        self.whole("embeddings without links need")?;
        self.forward_to(
            pool,
            cache,
            scratch,
            StageInput::Tokens(tokens),
            &mut NoComm,
            Pass::Embed,
        )
    }

    /// Appends drafted tokens to several sequences in one pass and leaves a row of logits for
    /// each token: `counts[i]` of `tokens` (back to back) go to `slots[pick[i]]` (`pick`
    /// distinct), and `scratch.logits()` holds their rows in the same order, row `j` of a
    /// sequence the logits that follow its first `j + 1` tokens here. Each row is bit for bit
    /// what [`Model::forward`] gives when the tokens come one at a time (every product and
    /// every row's attention in the one-token order), whatever else is in the pass. This is
    /// what verifies speculative drafts: the weights are read once for all of them.
    pub fn verify(
        &self,
        pool: &ThreadPool,
        slots: &mut [KvCache],
        pick: &[usize],
        counts: &[usize],
        scratch: &mut Scratch,
        tokens: &[u32],
    ) -> Result<()> {
        self.whole("verification without links needs")?;
        if pick.len() != counts.len() || counts.iter().sum::<usize>() != tokens.len() {
            return Err(Error::InvalidShard(format!(
                "a verification of {} tokens in {} parts for {} sequences",
                tokens.len(),
                counts.len(),
                pick.len()
            )));
        }
        if tokens.is_empty() || counts.contains(&0) {
            return Err(Error::EmptyPrompt);
        }
        check_pick(slots.len(), pick)?;
        for (&s, &n) in pick.iter().zip(counts) {
            let c = &slots[s];
            if c.len() + n > c.capacity() {
                return Err(Error::ContextOverflow {
                    needed: c.len() + n,
                    limit: c.capacity(),
                });
            }
        }
        let mut rows = std::mem::take(&mut scratch.rows);
        rows.fill(pick.iter().enumerate().flat_map(|(i, &s)| {
            let at = slots[s].len();
            (at..at + counts[i]).map(move |p| (i, p))
        }));
        scratch.acts.set_rows_independent(true);
        let res = self.step(
            pool,
            Caches::Slots {
                all: &mut *slots,
                pick,
            },
            scratch,
            &rows,
            StageInput::Tokens(tokens),
            self.flavour.single(),
            Out::EveryRow,
            &mut NoComm,
        );
        scratch.acts.set_rows_independent(false);
        scratch.rows = rows;
        res?;
        for (&s, &n) in pick.iter().zip(counts) {
            slots[s].advance(n);
        }
        Ok(())
    }

    /// [`Model::embed`] on a shard: runs `input` (tokens on the first stage, hidden states on
    /// later ones) through this shard's layers, appended to `cache`, its tensor-parallel group
    /// exchanging partial results through `comm`. After it, the last stage's
    /// [`Scratch::embeddings`] holds every row's state after the output norm (each rank of a
    /// tensor group holds the whole residual, so each has the whole vector), and an earlier
    /// stage's [`Scratch::hidden`] every row's hidden state for the next.
    pub fn embed_stage(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        scratch: &mut Scratch,
        input: StageInput<'_>,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        self.forward_to(pool, cache, scratch, input, comm, Pass::Embed)
    }

    /// An error unless this is the whole model (`what` needs it in one process).
    fn whole(&self, what: &str) -> Result<()> {
        if self.spec.is_full_width(&self.cfg) && self.spec.is_last_stage(&self.cfg) {
            Ok(())
        } else {
            Err(Error::InvalidShard(format!(
                "{what} the whole model in one process"
            )))
        }
    }

    /// [`Model::forward`] or [`Model::embed`], as `pass` says.
    fn forward_to(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        scratch: &mut Scratch,
        input: StageInput<'_>,
        comm: &mut dyn Collective,
        pass: Pass,
    ) -> Result<()> {
        let n = self.input_rows(&input)?;
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
        let out = match pass {
            Pass::Embed => Out::Embeddings,
            Pass::Logits if self.spec.is_last_stage(&self.cfg) && n > 1 => Out::LastRow,
            Pass::Logits => Out::Rows,
        };
        let mut caches = [cache];
        let res = self.step(
            pool,
            Caches::Refs(&mut caches),
            scratch,
            &rows,
            input,
            order,
            out,
            comm,
        );
        scratch.rows = rows;
        res?;
        caches[0].advance(n);
        Ok(())
    }

    /// Runs one decode step for several independent sequences at once: token `tokens[i]` is
    /// appended to the sequence in `slots[pick[i]]` (`pick` distinct). Every weight matrix is
    /// read once for the whole batch, which is what makes serving many streams cheaper than
    /// serving them one by one; the caches are not gathered, so a warm step allocates nothing.
    ///
    /// Each row's arithmetic is the same as a one-token [`Model::forward`] on its own cache
    /// (the matrix kernels treat rows independently and every row uses the single-token
    /// attention order), so a sequence's tokens do not depend on what it is batched with.
    /// After it, `scratch.logits()` holds one row of logits per sequence. The whole model
    /// only; a shard runs batches through its links with [`Model::forward_batch_slots`].
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        slots: &mut [KvCache],
        pick: &[usize],
        scratch: &mut Scratch,
        tokens: &[u32],
    ) -> Result<()> {
        self.whole("batched decoding without links needs")?;
        self.forward_batch_slots(
            pool,
            slots,
            pick,
            scratch,
            StageInput::Tokens(tokens),
            &mut NoComm,
        )
    }

    /// [`Model::forward_batch`] on a shard: row `i` of `input` (a token on the first stage, a
    /// hidden state on later ones) is appended to `slots[pick[i]]` (`pick` distinct), and the
    /// shard's tensor-parallel group exchanges the whole batch's partial results through
    /// `comm`, one exchange for every row. After it, `scratch.hidden()` holds every row's
    /// hidden state (earlier stages) or `scratch.logits()` one row of this shard's logits per
    /// sequence (the last stage).
    pub fn forward_batch_slots(
        &self,
        pool: &ThreadPool,
        slots: &mut [KvCache],
        pick: &[usize],
        scratch: &mut Scratch,
        input: StageInput<'_>,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        check_pick(slots.len(), pick)?;
        self.forward_rows(
            pool,
            Caches::Slots { all: slots, pick },
            scratch,
            input,
            comm,
        )
    }

    fn forward_rows(
        &self,
        pool: &ThreadPool,
        mut caches: Caches<'_, '_>,
        scratch: &mut Scratch,
        input: StageInput<'_>,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let n = self.input_rows(&input)?;
        if n != caches.len() {
            return Err(Error::InvalidShard(format!(
                "a batch of {n} rows for {} sequences",
                caches.len()
            )));
        }
        for i in 0..n {
            let c = caches.get(i);
            if c.len() >= c.capacity() {
                return Err(Error::ContextOverflow {
                    needed: c.len() + 1,
                    limit: c.capacity(),
                });
            }
        }
        let mut rows = std::mem::take(&mut scratch.rows);
        rows.fill((0..n).map(|i| (i, caches.get(i).len())));
        let order = self.flavour.single();
        // Every row's products in a one-token order too (llama.cpp picks other kernels for
        // batches of some formats).
        scratch.acts.set_rows_independent(true);
        let res = self.step(
            pool,
            caches.reborrow(),
            scratch,
            &rows,
            input,
            order,
            Out::Rows,
            comm,
        );
        scratch.acts.set_rows_independent(false);
        scratch.rows = rows;
        res?;
        for i in 0..n {
            caches.get_mut(i).advance(1);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        pool: &ThreadPool,
        caches: Caches<'_, '_>,
        scratch: &mut Scratch,
        rows: &Rows,
        input: StageInput<'_>,
        order: attn::DotOrder,
        out: Out,
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

        let ctx = (0..caches.len())
            .map(|i| caches.get(i).capacity())
            .max()
            .unwrap_or(0);
        self.fill_rope(scratch, &rows.pos, ctx);
        let family = crate::models::family(cfg.kind);
        let last_layer = self.spec.layers.len() - 1;
        let n_caches = caches.len();
        let mut b = Blocks::new(self, pool, caches, scratch, rows, order, comm);
        for (li, lw) in self.weights.layers.iter().enumerate() {
            b.li = li;
            b.trim = out == Out::LastRow && li == last_layer;
            family.layer(&mut b, lw)?;
        }
        let live = b.live;

        if let (Some((norm, _)), Out::Embeddings) = (&self.weights.head, out) {
            grow(&mut scratch.xn, n * e);
            for (src, dst) in scratch.x[..n * e]
                .chunks_exact(e)
                .zip(scratch.xn.chunks_exact_mut(e))
            {
                ops::rms_norm(src, norm, cfg.rms_eps, dst);
            }
            scratch.embedded = n * e;
        } else if let Some((norm, head)) = &self.weights.head {
            // One row of logits per sequence: the last row when trimmed or single, every row of
            // a multi-sequence batch.
            let (first, count) = if n_caches > 1 || out == Out::EveryRow {
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
            if let Some(f) = cfg.logit_factor {
                ops::scale(&mut scratch.logits, f);
            }
            if let Some(cap) = cfg.final_softcap {
                ops::softcap(&mut scratch.logits, cap, self.flavour);
            }
        }
        Ok(())
    }

    /// RoPE tables for the rows at positions `pos`: one for the model's base and, with a
    /// sliding window, one for the window layers' base (after the first `n * half` entries).
    /// LongRoPE models take their long factors when the context (`ctx` positions) exceeds the
    /// original one, as llama.cpp decides by its context size.
    fn fill_rope(&self, s: &mut Scratch, pos: &[usize], ctx: usize) {
        let factors = self.weights.rope_factors.as_deref().or_else(|| {
            self.weights.rope_long_short.as_ref().map(|(long, short)| {
                if ctx > self.cfg.rope_ctx_orig {
                    long.as_slice()
                } else {
                    short.as_slice()
                }
            })
        });
        let n = pos.len();
        let cfg = &self.cfg;
        let half = cfg.rope_dims / 2;
        let global = ops::RopeFreqs {
            n_dims: cfg.rope_dims,
            base: cfg.rope_base,
            freq_scale: cfg.rope_freq_scale,
            factors,
            mscale: cfg.rope_attn_factor,
            ext_factor: cfg.yarn.as_ref().map_or(0.0, |y| y.ext_factor),
            beta: cfg.yarn.as_ref().map_or((32.0, 1.0), |y| y.beta),
            n_ctx_orig: cfg.rope_ctx_orig,
        };
        let window = cfg.swa.as_ref().map(|w| ops::RopeFreqs {
            base: w.rope_base,
            freq_scale: w.rope_freq_scale,
            mscale: if w.rope_scaled { global.mscale } else { 1.0 },
            ext_factor: if w.rope_scaled {
                global.ext_factor
            } else {
                0.0
            },
            ..global
        });
        let both = [global, window.unwrap_or(global)];
        let tables = &both[..if window.is_some() { 2 } else { 1 }];
        grow(&mut s.rope_cos, tables.len() * n * half);
        grow(&mut s.rope_sin, tables.len() * n * half);
        for (bi, freqs) in tables.iter().enumerate() {
            for (t, &p) in pos.iter().enumerate() {
                let at = (bi * n + t) * half;
                ops::rope_table(
                    p,
                    freqs,
                    &mut s.rope_cos[at..at + half],
                    &mut s.rope_sin[at..at + half],
                );
            }
        }
    }
}
