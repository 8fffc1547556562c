//! `qwen2moe`: Qwen1.5-MoE and Qwen2-57B-A14B. Qwen2's attention (Q/K/V biases, NEOX RoPE); the
//! FFN is a softmax-routed mixture of experts whose probabilities are used as they are, plus a
//! shared expert every token runs, its output scaled by a sigmoid gate of its own.

use super::qwen3moe::read_moe;
use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct Qwen2Moe;

impl Family for Qwen2Moe {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.rope_neox = true;
        if cfg.q_width() != cfg.n_embd {
            return Err(Error::InvalidModel(format!(
                "{}: the query width {} must equal the width {}",
                cfg.arch,
                cfg.q_width(),
                cfg.n_embd
            )));
        }
        let mut moe = read_moe(hp, cfg, false)?;
        // llama.cpp reads no weight scale for this family.
        moe.weights_scale = 1.0;
        let shexp = hp
            .opt_u32("expert_shared_feed_forward_length")?
            .filter(|&n| n > 0)
            .unwrap_or(cfg.n_ff);
        moe.n_ff_shexp = Some(shexp);
        cfg.moe = Some(moe);
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            moe: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
