//! `smollm3`: SmolLM3. Llama's layer, except that every fourth layer (3, 7, 11, ...) applies no
//! RoPE at all ("NoPE"): those layers see positions only through the causal mask. llama.cpp
//! fixes the step at 4 for the architecture rather than reading it from the file, and so does
//! strata.

use super::{Family, LayerTensors};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{ModelConfig, Result};

pub(crate) struct SmolLm3;

/// Layers `il` with `(il + 1) % NO_ROPE_STEP == 0` skip RoPE.
const NO_ROPE_STEP: usize = 4;

impl Family for SmolLm3 {
    fn configure(&self, _hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.no_rope_step = Some(NO_ROPE_STEP);
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors::default()
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        super::pre_norm_layer(b, lw)
    }
}
