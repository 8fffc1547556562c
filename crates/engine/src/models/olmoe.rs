//! `olmoe`: AllenAI's OLMoE. Llama's pre-norm layer with Q and K RMS-normed over whole rows
//! (all heads together, as OLMo 2 does) before NEOX RoPE, and a mixture of experts whose
//! softmax router's probabilities are used as they are (not renormalised).

use super::qwen3moe::read_moe;
use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct Olmoe;

impl Family for Olmoe {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.qk_norm_rows = true;
        cfg.rope_neox = true;
        if cfg.q_width() != cfg.n_embd || cfg.kv_width() != cfg.n_embd {
            // llama.cpp sizes both norms by the model width.
            return Err(Error::InvalidModel(format!(
                "{}: query and key widths ({} and {}) must equal the width {}",
                cfg.arch,
                cfg.q_width(),
                cfg.kv_width(),
                cfg.n_embd
            )));
        }
        cfg.moe = Some(read_moe(hp, cfg, false)?);
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            qk_norm_rows: true,
            moe: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
