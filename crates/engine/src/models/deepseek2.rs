//! `deepseek2`: DeepSeek V2 / V2.5 / V3 / R1 and Kimi K2. A pre-norm layer whose attention is
//! multi-head latent attention in the absorbed form llama.cpp runs (one compressed key/value
//! row per token in the cache, queries projected into that latent space, each head's output
//! decompressed before the output projection; RoPE on adjacent pairs of a separate part of each
//! head), RoPE scaled by YaRN with DeepSeek's magnitude correction folded into the softmax
//! scale. The first `leading_dense_block_count` layers have a dense FFN; the others a mixture
//! of experts (softmax or sigmoid routing, optionally limited to the best expert groups and
//! steered by a per-expert selection bias) plus shared experts every token runs.

use super::qwen3moe::read_moe;
use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::{ExpertGroups, Gating, Hparams, Mla};
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct Deepseek2;

impl Family for Deepseek2 {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        let arch = cfg.arch.clone();
        let bad = |what: String| Err(Error::InvalidModel(format!("{arch}: {what}")));
        let (Some(k_mla), Some(v_mla)) = (
            hp.opt_u32("attention.key_length_mla")?,
            hp.opt_u32("attention.value_length_mla")?,
        ) else {
            return bad(
                "attention.key_length_mla and value_length_mla are missing: the file predates \
                 multi-head latent attention in GGUF (re-convert it with a current llama.cpp)"
                    .into(),
            );
        };
        let kv_lora = hp.u32("attention.kv_lora_rank")?;
        let q_lora = hp.opt_u32("attention.q_lora_rank")?.filter(|&r| r > 0);
        let rope = cfg.rope_dims;
        if cfg.n_head_kv != 1
            || kv_lora == 0
            || cfg.head_dim != kv_lora + rope
            || k_mla <= rope
            || v_mla == 0
            || v_mla > 4096
            || k_mla > 4096
        {
            return bad(format!(
                "the latent attention's sizes are inconsistent: {} KV heads (must be 1), key \
                 width {} (must be kv_lora_rank {kv_lora} + rope dims {rope}), key_length_mla \
                 {k_mla} (must exceed the rope dims), value_length_mla {v_mla}",
                cfg.n_head_kv, cfg.head_dim
            ));
        }
        if hp
            .opt_f32("attention.temperature_scale")?
            .is_some_and(|t| t != 0.0)
        {
            return bad(
                "attention.temperature_scale (Mistral Large 3's attention temperature) is not \
                 supported yet"
                    .into(),
            );
        }
        let log_mul = match hp.opt_f32("rope.scaling.yarn_log_multiplier")? {
            // The conversion stores 0.1 * mscale_all_dim; llama.cpp divides it back out.
            Some(m) if m.is_finite() && m >= 0.0 => m / 0.1,
            Some(m) => return bad(format!("rope.scaling.yarn_log_multiplier is {m}")),
            None => 0.0,
        };
        if let Some(y) = &mut cfg.yarn
            && log_mul != 0.0
        {
            y.log_mul = log_mul;
            y.mscale_is_log_mul = true;
        }
        cfg.mla = Some(Mla {
            q_lora,
            kv_lora,
            nope: k_mla - rope,
            v_head: v_mla,
            yarn_log_mul: log_mul,
        });

        let mut moe = read_moe(hp, cfg, false)?;
        moe.norm_weights = hp.opt_bool("expert_weights_norm")?.unwrap_or(false);
        moe.gating = match hp.opt_u32("expert_gating_func")?.unwrap_or(0) {
            // Unset: DeepSeek V2's softmax, except GLM 4.7 Lite (recognised as llama.cpp does).
            0 if matches!(cfg.n_layer, 47 | 48) && cfg.n_vocab == 154_880 => Gating::Sigmoid,
            0 | 1 => Gating::Softmax,
            2 => Gating::Sigmoid,
            3 => Gating::SoftmaxWeight,
            g => return bad(format!("expert_gating_func {g} is not supported")),
        };
        let shared = hp.u32("expert_shared_count")?;
        moe.n_ff_shexp = (shared > 0).then_some(moe.n_ff_exp * shared);
        moe.dense_lead = hp.opt_u32("leading_dense_block_count")?.unwrap_or(0);
        if moe.dense_lead > cfg.n_layer {
            return bad(format!(
                "leading_dense_block_count {} exceeds the {} layers",
                moe.dense_lead, cfg.n_layer
            ));
        }
        let count = hp.opt_u32("expert_group_count")?.unwrap_or(0);
        let used = hp.opt_u32("expert_group_used_count")?.unwrap_or(0);
        if count > 1 {
            if !moe.n_expert.is_multiple_of(count)
                || used == 0
                || used > count
                || moe.n_used > used * (moe.n_expert / count)
                || moe.n_expert / count < 2
            {
                return bad(format!(
                    "expert_group_count {count} and expert_group_used_count {used} do not fit \
                     {} experts of which {} are used",
                    moe.n_expert, moe.n_used
                ));
            }
            moe.groups = Some(ExpertGroups { count, used });
        }
        cfg.moe = Some(moe);
        Ok(())
    }

    /// The softmax scale llama.cpp's DeepSeek graph derives from the final YaRN attention
    /// factor, in its float order: the factor's own correction undone, DeepSeek's applied, and
    /// squared into the scale of the absorbed key width.
    fn finish(&self, cfg: &mut ModelConfig) {
        let Some(m) = cfg.mla else { return };
        let ln = (1.0f32 / cfg.rope_freq_scale).ln();
        let attn_factor_org = cfg.rope_attn_factor * (1.0f32 + 0.1f32 * ln);
        let mscale = attn_factor_org * (1.0f32 + 0.1f32 * m.yarn_log_mul * ln);
        let k_width = (m.nope + cfg.rope_dims) as f32;
        cfg.attn_scale = Some(1.0f32 * mscale * mscale / k_width.sqrt());
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors {
            moe: true,
            mla: true,
            ..LayerTensors::default()
        }
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}
