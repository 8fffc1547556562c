//! `olmo2`: OLMo 2 (and OLMo 3, which llama.cpp loads as `olmo2`). No norms before attention
//! and FFN: each block reads the residual stream as it is, and its output is RMS-normed before
//! it joins the stream (`post_attention_norm`, `post_ffw_norm`). Q and K are RMS-normed over
//! whole rows (all heads together, `attn_q_norm` n_embd wide) before RoPE, which rotates NEOX
//! halves. With a sliding
//! window (OLMo 3), three layers of every four attend through it and rotate plainly (no YaRN,
//! no scale), as llama.cpp's graph does; the fourth is global.

use super::{Family, LayerTensors};
use crate::blocks::Blocks;
use crate::config::{Hparams, SlidingWindow};
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct Olmo2;

impl Family for Olmo2 {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.qk_norm_rows = true;
        cfg.rope_neox = true;
        if cfg.head_dim * cfg.n_head != cfg.n_embd {
            // llama.cpp sizes the Q norm by the model width.
            return Err(Error::InvalidModel(format!(
                "{}.attention.key_length {} x {} heads must equal the width {}",
                cfg.arch, cfg.head_dim, cfg.n_head, cfg.n_embd
            )));
        }
        if let Some(window) = hp.opt_u32("attention.sliding_window")?
            && window > 0
        {
            let rope_base = match hp.opt_f32("rope.freq_base_swa")? {
                Some(b) => hp.positive_f32("rope.freq_base_swa", b)?,
                None => cfg.rope_base,
            };
            cfg.swa = Some(SlidingWindow {
                window,
                pattern: hp.opt_u32("attention.sliding_window_pattern")?.unwrap_or(4),
                rope_base,
                rope_freq_scale: 1.0,
                rope_scaled: false,
            });
        }
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            post_norms: true,
            qk_norm_rows: true,
            no_pre_norms: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        super::post_norm_layer(b, lw)
    }
}
