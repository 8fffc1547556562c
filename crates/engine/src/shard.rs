//! Which part of a model one worker owns.
//!
//! A shard is a pipeline stage (a layer range) and, within it, a tensor-parallel slice: a range of
//! query heads (with the key/value heads they read), a range of FFN columns, and a range of
//! vocabulary rows for the LM head. Slices need not be even, and a key/value head whose query
//! heads fall on two ranks is computed on both (cheap: it is one head of K and V), so SmolLM2's
//! 9 query heads over 3 KV heads split 5 + 4, and Gemma 3 270M's 4 query heads over its single
//! KV head split at all.
//! The single-process engine runs the full shard.
//!
//! Tensor-parallel ranks combine their work in one of two ways ([`Combine`]). `Gather` keeps
//! every output element's arithmetic exactly as in one process (each rank computes whole dot
//! products for a slice of output rows, and slices are all-gathered), so sharded greedy output is
//! token-for-token the single-process output; it needs four exchanges per layer. `Reduce` is
//! the classic Megatron split (each rank computes partial sums over its slice of the inputs and
//! the partial sums are all-reduced): two exchanges per layer, but the floating-point sums are
//! grouped differently from one process, so outputs may drift apart after many tokens.

use std::ops::Range;

use crate::{Error, ModelConfig, Result};

/// The part of a model a worker computes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardSpec {
    /// Decoder layers this stage runs.
    pub layers: Range<usize>,
    /// Query heads this rank owns in each layer (it also computes the key/value heads they use).
    pub q_heads: Range<usize>,
    /// FFN inner columns this rank owns (a multiple of 32 at both ends, or the full range).
    pub ffn: Range<usize>,
    /// Vocabulary rows of the LM head this rank owns (last stage only).
    pub vocab: Range<usize>,
    /// How tensor-parallel partial results are combined.
    pub combine: Combine,
    /// How the group splits every mixture-of-experts layer by expert (expert parallelism);
    /// none: this rank runs every expert. Absent from plans made before it existed.
    #[serde(default)]
    pub experts: Option<ExpertSplit>,
    /// Under tensor parallelism of a mixture of experts: the columns of every expert's FFN this
    /// rank owns (multiples of 32 at both ends); none: all of them.
    #[serde(default)]
    pub ffn_exp: Option<Range<usize>>,
}

/// Expert parallelism within a tensor-parallel group: each member owns a contiguous range of
/// every MoE layer's experts (and one of them the shared expert), computes the outputs of the
/// choices routed to them, and the group all-gathers those outputs; every member then sums
/// each row's outputs in the router's order, exactly as one process does.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExpertSplit {
    /// Each member's experts, in group order: contiguous, covering every expert.
    pub parts: Vec<Range<usize>>,
    /// This rank's position in the group.
    pub me: usize,
    /// The member that runs the shared expert (if the model has one).
    pub shared_owner: usize,
}

impl ExpertSplit {
    /// The experts this rank owns.
    pub fn mine(&self) -> Range<usize> {
        self.parts[self.me].clone()
    }

    /// Whether this rank runs the shared expert.
    pub fn owns_shared(&self) -> bool {
        self.me == self.shared_owner
    }
}

/// How a tensor-parallel rank's attention-output and FFN-down projections are split.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Combine {
    /// Each rank owns these rows of the model width: it computes complete outputs for them from
    /// all-gathered inputs, and the outputs are all-gathered. Bit-identical to one process.
    Gather {
        /// Rows of `n_embd` this rank computes (multiples of 32 at both ends, or the full range).
        embd: Range<usize>,
    },
    /// Each rank computes partial sums over its own heads and FFN columns, all-reduced.
    Reduce,
}

impl ShardSpec {
    /// The whole model in one shard.
    pub fn full(cfg: &ModelConfig) -> ShardSpec {
        ShardSpec {
            layers: 0..cfg.n_layer,
            q_heads: 0..cfg.n_head,
            ffn: 0..cfg.n_ff,
            vocab: 0..cfg.n_vocab,
            combine: Combine::Gather {
                embd: 0..cfg.n_embd,
            },
            experts: None,
            ffn_exp: None,
        }
    }

    /// Checks the ranges against the model.
    pub fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        let bad = |what: &str, r: &Range<usize>, max: usize| {
            Error::InvalidShard(format!("{what} range {r:?} is empty or exceeds 0..{max}"))
        };
        let ok = |r: &Range<usize>, max: usize| r.start < r.end && r.end <= max;
        if !ok(&self.layers, cfg.n_layer) {
            return Err(bad("layer", &self.layers, cfg.n_layer));
        }
        if !ok(&self.q_heads, cfg.n_head) {
            return Err(bad("query head", &self.q_heads, cfg.n_head));
        }
        if !ok(&self.ffn, cfg.n_ff) {
            return Err(bad("FFN", &self.ffn, cfg.n_ff));
        }
        if !ok(&self.vocab, cfg.n_vocab) {
            return Err(bad("vocabulary", &self.vocab, cfg.n_vocab));
        }
        // Slices start and end on multiples of 32 rows, so each slice keeps the row grouping
        // (and with it the kernel, and the arithmetic) of the whole matrix.
        let aligned = |r: &Range<usize>, max: usize| {
            let on32 = |x: usize| x.is_multiple_of(32) || x == max;
            on32(r.start) && on32(r.end)
        };
        if !aligned(&self.ffn, cfg.n_ff) {
            return Err(Error::InvalidShard(format!(
                "FFN range {:?} must start and end on a multiple of 32",
                self.ffn
            )));
        }
        if let (Some(cols), Some(moe)) = (&self.ffn_exp, cfg.moe) {
            if !ok(cols, moe.n_ff_exp) || !aligned(cols, moe.n_ff_exp) {
                return Err(Error::InvalidShard(format!(
                    "expert FFN range {cols:?} must be inside 0..{} on multiples of 32",
                    moe.n_ff_exp
                )));
            }
            if self.experts.is_some() || self.combine == Combine::Reduce {
                return Err(Error::InvalidShard(
                    "a mixture of experts splits its experts' columns only with \
                     --tp-combine gather, and not together with an expert split"
                        .into(),
                ));
            }
        }
        if cfg.moe.is_some()
            && self.experts.is_none()
            && self.ffn_exp.is_none()
            && (self.q_heads != (0..cfg.n_head)
                || self.ffn != (0..cfg.n_ff)
                || self.vocab != (0..cfg.n_vocab))
        {
            return Err(Error::InvalidShard(format!(
                "{} is a mixture of experts: its shards need an expert split or a split of \
                 its experts' columns",
                cfg.arch
            )));
        }
        if let Some(x) = &self.experts {
            let Some(moe) = cfg.moe else {
                return Err(Error::InvalidShard(format!(
                    "an expert split for {}, which has no experts",
                    cfg.arch
                )));
            };
            let contiguous = x.parts.first().is_some_and(|p| p.start == 0)
                && x.parts.last().is_some_and(|p| p.end == moe.n_expert)
                && x.parts.windows(2).all(|w| w[0].end == w[1].start)
                && x.parts.iter().all(|p| p.start <= p.end);
            if !contiguous || x.me >= x.parts.len() || x.shared_owner >= x.parts.len() {
                return Err(Error::InvalidShard(format!(
                    "expert split {:?} (member {}, shared expert on {}) does not cover the {} \
                     experts once, in order",
                    x.parts, x.me, x.shared_owner, moe.n_expert
                )));
            }
        }
        if !aligned(&self.vocab, cfg.n_vocab) {
            return Err(Error::InvalidShard(format!(
                "vocabulary range {:?} must start and end on a multiple of 32",
                self.vocab
            )));
        }
        if let Combine::Gather { embd } = &self.combine
            && (!ok(embd, cfg.n_embd) || !aligned(embd, cfg.n_embd))
        {
            return Err(Error::InvalidShard(format!(
                "model-width range {embd:?} must be inside 0..{} on multiples of 32",
                cfg.n_embd
            )));
        }
        Ok(())
    }

    /// Key/value heads this rank computes: those its query heads read.
    pub fn kv_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        let g = cfg.group();
        self.q_heads.start / g..self.q_heads.end.div_ceil(g)
    }

    /// The key/value heads this rank contributes to an all-gather of whole K rows: those whose
    /// first query head it owns. Across a group these ranges are disjoint and cover every KV
    /// head (a rank may own none), while [`kv_heads`](Self::kv_heads) may overlap.
    pub fn owned_kv_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        let g = cfg.group();
        self.q_heads.start.div_ceil(g)..self.q_heads.end.div_ceil(g)
    }

    /// Whether this shard owns the whole width of every layer (no all-reduce needed).
    pub fn is_full_width(&self, cfg: &ModelConfig) -> bool {
        self.q_heads == (0..cfg.n_head)
            && self.ffn == (0..cfg.n_ff)
            && match &self.combine {
                Combine::Gather { embd } => *embd == (0..cfg.n_embd),
                Combine::Reduce => true,
            }
    }

    /// Rows of the model width this rank's output projections produce.
    pub fn embd_rows(&self, cfg: &ModelConfig) -> Range<usize> {
        match &self.combine {
            Combine::Gather { embd } => embd.clone(),
            Combine::Reduce => 0..cfg.n_embd,
        }
    }

    /// Whether this stage embeds tokens (the first stage).
    pub fn is_first_stage(&self) -> bool {
        self.layers.start == 0
    }

    /// Whether this stage computes logits (the last stage).
    pub fn is_last_stage(&self, cfg: &ModelConfig) -> bool {
        self.layers.end == cfg.n_layer
    }
}
