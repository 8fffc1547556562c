//! `phi3`: Phi-3 and Phi-3.5 (dense). Llama's pre-norm layer with fused tensors (one `attn_qkv`,
//! one `ffn_up` holding the gate's rows then the up projection's), RoPE on NEOX halves with
//! LongRoPE's per-frequency factors and magnitude (`rope_factors_long` / `_short`,
//! `rope.scaling.attn_factor`), and the query scaled by `1 / sqrt(head width)` before the scores
//! rather than inside the softmax, as llama.cpp's graph for it does (the rounding differs).

use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{ModelConfig, Result};

pub(crate) struct Phi3;

impl Family for Phi3 {
    fn configure(&self, _hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.rope_neox = true;
        cfg.query_scale = Some(1.0 / (cfg.head_dim as f32).sqrt());
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors::default()
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
