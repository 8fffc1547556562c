//! `llama`: Llama 1-3, SmolLM2, Mistral and the many fine-tunes that keep Llama's layout.
//! RMSNorm before attention and FFN, RoPE on adjacent pairs (optionally with Llama 3's
//! per-frequency factors, `rope_freqs.weight`), SwiGLU.

use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{ModelConfig, Result};

pub(crate) struct Llama;

impl Family for Llama {
    fn configure(&self, _hp: &Hparams<'_>, _cfg: &mut ModelConfig) -> Result<()> {
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors::default()
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
