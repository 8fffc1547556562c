//! Shard plans: which layers, heads, FFN columns, model-width rows and vocabulary rows each rank
//! owns, for tensor, pipeline and hybrid parallelism.
//!
//! Ranks are ordered stage by stage: stage 0's tensor-parallel group first (rank 0 is always in
//! it), then stage 1's, and so on. Splits follow each rank's weight (its relative memory or
//! speed) and are measured in bytes of weights actually streamed per token, so a stage that also
//! holds the LM head (a third of SmolLM2's bytes) gets fewer layers. Within a tensor-parallel
//! group every dimension is split by weight on its own, since each stretch of work between two
//! exchanges must be balanced by itself.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use strata_engine::{Combine, ExpertSplit, ModelConfig, ShardSpec};
use strata_gguf::GgufFile;

use crate::{Error, Result};

/// How ranks divide a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Every rank works on every layer; partial results are exchanged twice or four times per
    /// layer. Pays off on fast links.
    Tensor,
    /// Each rank holds a range of layers and passes hidden states on. Pays off on slow links.
    Pipeline,
    /// Pipeline stages of `tp` tensor-parallel ranks each.
    Hybrid {
        /// Ranks per stage.
        tp: usize,
    },
    /// For a mixture of experts: every rank owns a share of every MoE layer's experts, and the
    /// group exchanges the outputs of each token's chosen experts (an all-gather per MoE
    /// layer); attention, dense layers and the LM head are tensor-parallel as under `Tensor`.
    Expert,
}

/// How tensor-parallel ranks combine work (see [`strata_engine::Combine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CombineStyle {
    /// Row-parallel output projections and all-gathers: bit-identical to one process.
    Gather,
    /// Partial sums and all-reduces: half the exchanges, not bit-identical.
    Reduce,
}

/// Column blocks of each member of a tensor-parallel group, for its all-gathers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupParts {
    /// Attention-output columns (query heads x head width) of each member.
    pub q: Vec<Range<usize>>,
    /// FFN columns of each member.
    pub ffn: Vec<Range<usize>>,
    /// Model-width rows of each member (gather style).
    pub embd: Vec<Range<usize>>,
    /// Key columns (owned KV heads x head width) of each member, for models that normalise
    /// whole K rows (OLMo 2). Absent from plans made before it existed.
    #[serde(default)]
    pub kv: Vec<Range<usize>>,
    /// Columns of every expert's FFN of each member (tensor parallelism of a mixture).
    #[serde(default)]
    pub ffn_exp: Vec<Range<usize>>,
}

/// One rank's part of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlan {
    /// Pipeline stage.
    pub stage: usize,
    /// What the rank loads and computes.
    pub spec: ShardSpec,
}

/// A whole plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Strategy it was made for.
    pub strategy: Strategy,
    /// Per rank, in rank order.
    pub ranks: Vec<RankPlan>,
    /// Ranks of each stage, in group order.
    pub stages: Vec<Vec<usize>>,
    /// Column blocks of each stage's group.
    pub parts: Vec<GroupParts>,
}

impl Plan {
    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// The stage of `rank` and its members.
    pub fn group_of(&self, rank: usize) -> &[usize] {
        &self.stages[self.ranks[rank].stage]
    }

    /// A human-readable table of the plan.
    pub fn describe(&self, cfg: &ModelConfig) -> String {
        let mut s = String::new();
        for (r, rp) in self.ranks.iter().enumerate() {
            let sp = &rp.spec;
            s.push_str(&format!(
                "rank {r}: stage {} layers {:?} query heads {:?} ffn {:?} embd {:?} vocab {}\n",
                rp.stage,
                sp.layers,
                sp.q_heads,
                sp.ffn,
                sp.embd_rows(cfg),
                if sp.is_last_stage(cfg) {
                    format!("{:?}", sp.vocab)
                } else {
                    "-".into()
                }
            ));
        }
        s
    }
}

/// What a row of a decode step costs each layer, and the LM head: the weights it multiplies
/// (its multiply-adds). Pipeline stages are balanced on these: stages overlap only when many
/// sequences step, and a batched step on a CPU is bound by its multiply-adds, not by the
/// bytes (on SmolLM2, whose 8-bit LM head takes 1.7x the bytes per weight of its 5-bit
/// layers, bytes put 22 layers on the first of two stages and multiply-adds 19); one
/// sequence's step takes every stage in turn, however they split.
struct Costs {
    layer: Vec<f64>,
    head: f64,
}

fn costs(file: &GgufFile, cfg: &ModelConfig) -> Costs {
    let (layers, head) = strata_engine::streamed_params(file, cfg);
    Costs {
        layer: layers.into_iter().map(|b| b as f64).collect(),
        head: head as f64,
    }
}

/// Splits `0..total` into `weights.len()` contiguous, non-empty ranges proportional to
/// `weights`, with inner boundaries on multiples of `align`.
pub fn split(total: usize, weights: &[f64], align: usize) -> Result<Vec<Range<usize>>> {
    let n = weights.len();
    let units = total / align;
    if n == 0 || units < n || weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return Err(Error::Plan(format!(
            "cannot split {total} (in steps of {align}) {n} ways with weights {weights:?}"
        )));
    }
    let sum: f64 = weights.iter().sum();
    let mut out = Vec::with_capacity(n);
    let (mut start, mut acc) = (0usize, 0.0);
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        let end_units = if i + 1 == n {
            units
        } else {
            let ideal = (acc / sum * units as f64).round() as usize;
            // Leave at least one unit for every later range, take at least one.
            ideal.clamp(start / align + 1, units - (n - i - 1))
        };
        let end = if i + 1 == n { total } else { end_units * align };
        out.push(start..end);
        start = end;
    }
    Ok(out)
}

/// Builds the plan for `world` ranks with relative `weights` (one per rank; `None` is equal).
pub fn make_plan(
    file: &GgufFile,
    cfg: &ModelConfig,
    strategy: Strategy,
    world: usize,
    weights: Option<&[f64]>,
    style: CombineStyle,
) -> Result<Plan> {
    let ones = vec![1.0; world];
    let w = weights.unwrap_or(&ones);
    if w.len() != world {
        return Err(Error::Plan(format!(
            "{} weights given for {world} ranks",
            w.len()
        )));
    }
    let tp = match strategy {
        Strategy::Tensor | Strategy::Expert => world,
        Strategy::Pipeline => 1,
        Strategy::Hybrid { tp } => tp,
    };
    let by_expert = strategy == Strategy::Expert;
    if by_expert && cfg.moe.is_none() {
        return Err(Error::Plan(format!(
            "{} has no experts to split: use --strategy tensor, pipeline or hybrid",
            cfg.arch
        )));
    }
    if world == 0 || tp == 0 || !world.is_multiple_of(tp) {
        return Err(Error::Plan(format!(
            "{world} ranks cannot form stages of {tp} tensor-parallel ranks"
        )));
    }
    if tp > 1 && cfg.moe.is_some() && style == CombineStyle::Reduce {
        return Err(Error::Plan(format!(
            "{} is a mixture of experts, whose tensor-parallel split keeps one process's sums \
             only: use --tp-combine gather (the default)",
            cfg.arch
        )));
    }
    let n_stages = world / tp;
    if n_stages > cfg.n_layer {
        return Err(Error::Plan(format!(
            "{n_stages} pipeline stages for {} layers",
            cfg.n_layer
        )));
    }
    if tp > cfg.n_head {
        return Err(Error::Plan(format!(
            "{tp}-way tensor parallelism needs at least {tp} query heads; the model has {}",
            cfg.n_head
        )));
    }
    let c = costs(file, cfg);
    let stages: Vec<Vec<usize>> = (0..n_stages)
        .map(|s| (s * tp..(s + 1) * tp).collect())
        .collect();
    let stage_w: Vec<f64> = stages
        .iter()
        .map(|g| g.iter().map(|&r| w[r]).sum())
        .collect();
    let layers = split_layers(&c, &stage_w)?;

    let mut ranks = Vec::with_capacity(world);
    let mut parts = Vec::with_capacity(n_stages);
    for (s, group) in stages.iter().enumerate() {
        let gw: Vec<f64> = group.iter().map(|&r| w[r]).collect();
        let last = s + 1 == n_stages;
        let heads = split(cfg.n_head, &gw, 1)?;
        let vocab = split(cfg.n_vocab, &gw, 32)?;
        let embd = match style {
            CombineStyle::Gather => split(cfg.n_embd, &gw, 32)?,
            CombineStyle::Reduce => vec![0..cfg.n_embd; group.len()],
        };
        // Each stretch of work between two exchanges is balanced on its own: a rank that
        // finishes early only waits at the next exchange, so evening out totals across
        // stretches (more FFN columns for the rank with fewer heads) would not help.
        let ffn = split(cfg.n_ff, &gw, 32)?;
        // Experts by weight, the shared expert (always active) on the last member; or, under
        // tensor parallelism, every expert's columns by weight.
        let experts = match (by_expert, cfg.moe) {
            (true, Some(m)) => Some(split(m.n_expert, &gw, 1)?),
            _ => None,
        };
        let ffn_exp = match (by_expert, cfg.moe) {
            (false, Some(m)) if group.len() > 1 => Some(split(m.n_ff_exp, &gw, 32)?),
            _ => None,
        };
        for i in 0..group.len() {
            ranks.push(RankPlan {
                stage: s,
                spec: ShardSpec {
                    layers: layers[s].clone(),
                    q_heads: heads[i].clone(),
                    ffn: ffn[i].clone(),
                    vocab: if last {
                        vocab[i].clone()
                    } else {
                        0..cfg.n_vocab
                    },
                    combine: match style {
                        CombineStyle::Gather => Combine::Gather {
                            embd: embd[i].clone(),
                        },
                        CombineStyle::Reduce => Combine::Reduce,
                    },
                    experts: experts.as_ref().map(|parts| ExpertSplit {
                        parts: parts.clone(),
                        me: i,
                        shared_owner: group.len() - 1,
                    }),
                    ffn_exp: ffn_exp.as_ref().map(|cols| cols[i].clone()),
                },
            });
        }
        let (hd, vd) = (cfg.head_dim, cfg.v_head_dim());
        parts.push(GroupParts {
            q: heads.iter().map(|r| r.start * vd..r.end * vd).collect(),
            kv: ranks[ranks.len() - group.len()..]
                .iter()
                .map(|rp| {
                    let owned = rp.spec.owned_kv_heads(cfg);
                    owned.start * hd..owned.end * hd
                })
                .collect(),
            ffn,
            embd,
            ffn_exp: ffn_exp.unwrap_or_default(),
        });
    }
    for rp in &ranks {
        rp.spec
            .validate(cfg)
            .map_err(|e| Error::Plan(e.to_string()))?;
    }
    Ok(Plan {
        strategy,
        ranks,
        stages,
        parts,
    })
}

/// Contiguous layer ranges per stage, balancing bytes (the LM head counts on the last stage).
fn split_layers(c: &Costs, stage_w: &[f64]) -> Result<Vec<Range<usize>>> {
    let n = c.layer.len();
    let s = stage_w.len();
    let total: f64 = c.layer.iter().sum::<f64>() + c.head;
    let wsum: f64 = stage_w.iter().sum();
    let mut out = Vec::with_capacity(s);
    let (mut start, mut acc_w, mut acc_bytes) = (0usize, 0.0, 0.0);
    for (i, w) in stage_w.iter().enumerate() {
        acc_w += w;
        if i + 1 == s {
            out.push(start..n);
            break;
        }
        let target = total * acc_w / wsum;
        let mut end = start;
        // Take layers while that brings this stage closer to its share.
        while end < n - (s - i - 1) && (end == start || (acc_bytes + c.layer[end] / 2.0) < target) {
            acc_bytes += c.layer[end];
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_proportional_aligned_and_complete() {
        let r = split(1536, &[1.0, 1.0], 32).expect("split");
        assert_eq!(r, vec![0..768, 768..1536]);
        let r = split(3, &[1.0, 1.0], 1).expect("split");
        assert_eq!(r, vec![0..2, 2..3]);
        let r = split(49152, &[3.0, 1.0], 32).expect("split");
        assert_eq!(r, vec![0..36864, 36864..49152]);
        let r = split(100, &[1.0, 1.0, 1.0], 32).expect("split");
        assert_eq!(r, vec![0..32, 32..64, 64..100]);
        assert!(split(3, &[1.0; 4], 1).is_err());
        assert!(split(64, &[1.0, 0.0], 32).is_err());
    }
}
