//! `qwen3moe`: Qwen3's mixture-of-experts models (Qwen3-30B-A3B, 235B-A22B, Qwen3-Coder). The
//! Qwen3 layer (per-head Q/K RMSNorm, NEOX RoPE) with a mixture of experts in place of the
//! FFN: a softmax router over `expert_count` experts picks `expert_used_count` per token, whose
//! probabilities are renormalised to sum to one.

use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::{Gating, Hparams, Moe};
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct Qwen3Moe;

impl Family for Qwen3Moe {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.rope_neox = true;
        cfg.moe = Some(read_moe(hp, cfg, true)?);
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            qk_norm: true,
            moe: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}

/// The expert keys every MoE family has, checked against each other (`norm_weights`: the
/// family renormalises the chosen experts' probabilities).
pub(crate) fn read_moe(hp: &Hparams<'_>, cfg: &ModelConfig, norm_weights: bool) -> Result<Moe> {
    let n_expert = hp.u32("expert_count")?;
    let n_used = hp.u32("expert_used_count")?;
    if n_expert == 0 || n_expert > 4096 || n_used == 0 || n_used > n_expert {
        return Err(Error::InvalidModel(format!(
            "{}.expert_count {n_expert} and expert_used_count {n_used} are inconsistent (need \
             1 <= used <= count <= 4096)",
            cfg.arch
        )));
    }
    let n_ff_exp = match hp.opt_u32("expert_feed_forward_length")? {
        Some(f) => f,
        None => cfg.n_ff / n_used,
    };
    if n_ff_exp == 0 {
        return Err(Error::InvalidModel(format!(
            "{}.expert_feed_forward_length must be positive",
            cfg.arch
        )));
    }
    let weights_scale = match hp.opt_f32("expert_weights_scale")? {
        // llama.cpp leaves the weights alone at 0 and 1.
        None => 1.0,
        Some(v) if v == 0.0 || v == 1.0 => 1.0,
        Some(v) => hp.positive_f32("expert_weights_scale", v)?,
    };
    Ok(Moe {
        n_expert,
        n_used,
        n_ff_exp,
        norm_weights,
        weights_scale,
        gating: Gating::Softmax,
        n_ff_shexp: None,
        groups: None,
        dense_lead: 0,
    })
}
