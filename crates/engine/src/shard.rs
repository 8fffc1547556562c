//! Which part of a model one worker owns.
//!
//! A shard is a pipeline stage (a layer range) and, within it, a tensor-parallel slice: a range of
//! key/value head groups (with their query heads), a range of FFN columns, and a range of
//! vocabulary rows for the LM head. Slices need not be even, so 3 KV heads can split 2 + 1.
//! The single-process engine runs the full shard.

use std::ops::Range;

use crate::{Error, ModelConfig, Result};

/// The part of a model a worker computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSpec {
    /// Decoder layers this stage runs.
    pub layers: Range<usize>,
    /// Key/value heads (and their query-head groups) this rank owns in each layer.
    pub kv_heads: Range<usize>,
    /// FFN inner columns this rank owns (a multiple of 32 at both ends, or the full range).
    pub ffn: Range<usize>,
    /// Vocabulary rows of the LM head this rank owns (last stage only).
    pub vocab: Range<usize>,
}

impl ShardSpec {
    /// The whole model in one shard.
    pub fn full(cfg: &ModelConfig) -> ShardSpec {
        ShardSpec {
            layers: 0..cfg.n_layer,
            kv_heads: 0..cfg.n_head_kv,
            ffn: 0..cfg.n_ff,
            vocab: 0..cfg.n_vocab,
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
        if !ok(&self.kv_heads, cfg.n_head_kv) {
            return Err(bad("KV head", &self.kv_heads, cfg.n_head_kv));
        }
        if !ok(&self.ffn, cfg.n_ff) {
            return Err(bad("FFN", &self.ffn, cfg.n_ff));
        }
        if !ok(&self.vocab, cfg.n_vocab) {
            return Err(bad("vocabulary", &self.vocab, cfg.n_vocab));
        }
        let aligned = |x: usize| x.is_multiple_of(32) || x == cfg.n_ff;
        if !aligned(self.ffn.start) || !aligned(self.ffn.end) {
            return Err(Error::InvalidShard(format!(
                "FFN range {:?} must start and end on a multiple of 32",
                self.ffn
            )));
        }
        Ok(())
    }

    /// Query heads this rank owns.
    pub fn q_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        self.kv_heads.start * cfg.group()..self.kv_heads.end * cfg.group()
    }

    /// Whether this shard owns the whole width of every layer (no all-reduce needed).
    pub fn is_full_width(&self, cfg: &ModelConfig) -> bool {
        self.kv_heads == (0..cfg.n_head_kv) && self.ffn == (0..cfg.n_ff)
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
