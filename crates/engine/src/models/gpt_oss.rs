//! `gpt-oss`: OpenAI's gpt-oss 20B and 120B. A pre-norm layer (the FFN's norm is stored as
//! `post_attention_norm`) whose attention has Q/K/V and output biases, NEOX RoPE (YaRN in the
//! released files), a sliding window on every other layer (the even ones) and a learned sink
//! logit per head; the FFN is a mixture of experts whose router and experts carry biases,
//! chosen by the largest router logits and weighted by a softmax over just those, with the
//! clamped SwiGLU gpt-oss was trained with.

use super::qwen3moe::read_moe;
use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::{FfnAct, Gating, Hparams, SlidingWindow};
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct GptOss;

impl Family for GptOss {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        cfg.rope_neox = true;
        cfg.ffn_act = FfnAct::SwigluOai;
        // llama.cpp scales the scores by the rotated width, which is the head width in every
        // released file.
        cfg.attn_scale = Some(1.0 / (cfg.rope_dims as f32).sqrt());
        let window = hp.u32("attention.sliding_window")?;
        if window == 0 {
            return Err(Error::InvalidModel(format!(
                "{}.attention.sliding_window must be positive",
                cfg.arch
            )));
        }
        let rope_base = match hp.opt_f32("rope.freq_base_swa")? {
            Some(b) => hp.positive_f32("rope.freq_base_swa", b)?,
            None => cfg.rope_base,
        };
        cfg.swa = Some(SlidingWindow {
            window,
            pattern: hp.opt_u32("attention.sliding_window_pattern")?.unwrap_or(2),
            rope_base,
            rope_freq_scale: cfg.rope_freq_scale,
            rope_scaled: true,
        });
        let mut moe = read_moe(hp, cfg, false)?;
        // llama.cpp reads no weight scale for this family.
        moe.weights_scale = 1.0;
        moe.gating = Gating::SoftmaxWeight;
        cfg.moe = Some(moe);
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            moe: true,
            sinks: true,
            ffn_norm_post_attention: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
