//! `qwen3`: Qwen3 dense models. Llama's layer with an RMSNorm over every head of Q and K
//! before RoPE (on NEOX halves); heads may be wider than `n_embd / n_head`
//! (`attention.key_length`).

use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{ModelConfig, Result};

pub(crate) struct Qwen3;

impl Family for Qwen3 {
    fn configure(&self, _hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.rope_neox = true;
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            qk_norm: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
