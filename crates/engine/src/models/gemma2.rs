//! `gemma2`: Gemma 2. Gemma 3's layer without the per-head Q/K norms, plus soft-capping:
//! attention scores pass through `cap * tanh(score / cap)` before the softmax, and so do the
//! final logits. Every other layer (the even ones) attends through a sliding window (4096 unless
//! the file says otherwise) with the global RoPE base; queries are scaled by `1 / sqrt(head_dim)`
//! (by `1 / sqrt(n_embd / n_head)` for the 46-layer 27B, as llama.cpp and the reference do).

use super::{Family, LayerTensors};
use crate::blocks::Blocks;
use crate::config::{FfnAct, Hparams, SlidingWindow};
use crate::weights::LayerWeights;
use crate::{ModelConfig, Result};

pub(crate) struct Gemma2;

/// llama.cpp's defaults when the file has no soft-capping keys.
const ATTN_SOFTCAP: f32 = 50.0;
const FINAL_SOFTCAP: f32 = 30.0;

impl Family for Gemma2 {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.embed_scale = Some((cfg.n_embd as f32).sqrt());
        let width = if cfg.n_layer == 46 {
            cfg.n_embd / cfg.n_head
        } else {
            cfg.head_dim
        };
        cfg.query_scale = Some(1.0 / (width as f32).sqrt());
        cfg.rope_neox = true;
        cfg.ffn_act = FfnAct::Gelu;
        let rope_base = match hp.opt_f32("rope.freq_base_swa")? {
            Some(b) => hp.positive_f32("rope.freq_base_swa", b)?,
            None => cfg.rope_base,
        };
        cfg.swa = Some(SlidingWindow {
            window: hp.opt_u32("attention.sliding_window")?.unwrap_or(4096),
            pattern: hp.opt_u32("attention.sliding_window_pattern")?.unwrap_or(2),
            rope_base,
            rope_freq_scale: cfg.rope_freq_scale,
            rope_scaled: true,
        });
        let cap = |key: &str, default: f32| -> Result<f32> {
            hp.positive_f32(key, hp.opt_f32(key)?.unwrap_or(default))
        };
        cfg.attn_softcap = Some(cap("attn_logit_softcapping", ATTN_SOFTCAP)?);
        cfg.final_softcap = Some(cap("final_logit_softcapping", FINAL_SOFTCAP)?);
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            post_norms: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        super::post_norm_layer(b, lw)
    }
}
