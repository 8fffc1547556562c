//! `gemma3`: Gemma 3. Embeddings scaled by `sqrt(n_embd)`, per-head Q/K RMSNorm, queries
//! scaled by `1 / sqrt(head_dim)` before attention (softmax scale 1), NEOX RoPE with a base of
//! its own for the sliding-window layers (five of every six), RMSNorms on the attention and FFN
//! outputs before they join the residual stream, GeGLU.

use super::{Family, LayerTensors};
use crate::blocks::Blocks;
use crate::config::{FfnAct, Hparams, SlidingWindow};
use crate::weights::LayerWeights;
use crate::{ModelConfig, Result};

pub(crate) struct Gemma3;

impl Family for Gemma3 {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.embed_scale = Some((cfg.n_embd as f32).sqrt());
        cfg.query_scale = Some(1.0 / (cfg.head_dim as f32).sqrt());
        cfg.rope_neox = true;
        cfg.ffn_act = FfnAct::Gelu;
        cfg.swa = match hp.opt_u32("attention.sliding_window")? {
            Some(window) if window > 0 => Some(SlidingWindow {
                window,
                pattern: hp.opt_u32("attention.sliding_window_pattern")?.unwrap_or(6),
                rope_base: hp.opt_f32("rope.freq_base_swa")?.unwrap_or(10_000.0),
                // llama.cpp leaves the window layers unscaled (a 27B's factor 8 is global only).
                rope_freq_scale: 1.0,
                rope_scaled: true,
            }),
            _ => None,
        };
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            qk_norm: true,
            post_norms: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        super::post_norm_layer(b, lw)
    }
}
