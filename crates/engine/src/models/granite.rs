//! `granite`: IBM Granite 3 (dense). Llama's layer with four multipliers from the file: token
//! embeddings times `embedding_scale`, attention scores times `attention.scale` (instead of
//! `1 / sqrt(head_dim)`), each block's output times `residual_scale` before it joins the residual
//! stream, and the logits divided by `logit_scale` (as llama.cpp does it: times the f32
//! `1 / logit_scale`). `rope.scaling.finetuned = false` switches RoPE off.

use super::{Family, LayerTensors};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct Granite;

impl Family for Granite {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        // llama.cpp treats a zero (or absent) multiplier as "not set".
        let factor = |key: &str| -> Result<Option<f32>> {
            match hp.opt_f32(key)? {
                Some(v) if v != 0.0 => hp.positive_f32(key, v).map(Some),
                _ => Ok(None),
            }
        };
        cfg.embed_scale = factor("embedding_scale")?;
        cfg.attn_scale = factor("attention.scale")?;
        cfg.residual_scale = factor("residual_scale")?;
        let logit_scale = factor("logit_scale")?.ok_or_else(|| {
            Error::InvalidModel(format!(
                "{}.logit_scale is missing or zero; Granite needs it",
                cfg.arch
            ))
        })?;
        cfg.logit_factor = Some(1.0 / logit_scale);
        if hp.opt_bool("rope.scaling.finetuned")? == Some(false) {
            cfg.no_rope_step = Some(1);
        }
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors::default()
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        super::pre_norm_layer(b, lw)
    }
}
