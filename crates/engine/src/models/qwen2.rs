//! `qwen2`: Qwen2 and Qwen2.5. Llama's layer with biases on Q, K and V (read by the shared
//! loader whenever a file has them) and RoPE on NEOX halves.

use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{ModelConfig, Result};

pub(crate) struct Qwen2;

impl Family for Qwen2 {
    fn configure(&self, _hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.rope_neox = true;
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors::default()
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
