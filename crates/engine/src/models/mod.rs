//! The decoder families, one file each.
//!
//! A family says three things, in the manner of llama.cpp's per-architecture files: which
//! metadata keys of its own it reads ([`Family::configure`]), which per-layer tensors it needs
//! beyond the common set ([`Family::tensors`]), and how one layer composes the shared blocks
//! of [`crate::blocks`] ([`Family::layer`]). Everything a family leaves to the shared blocks
//! (fused or separate Q/K/V, biases, grouped-query attention, sliding windows, sharding and
//! the exchanges between ranks) works for every family alike.
//!
//! Adding a family: write `models/NAME.rs` with a unit struct implementing [`Family`], add a
//! variant to [`Arch`] and a line to [`FAMILIES`], and add a parity test against llama.cpp
//! (`strata synth --arch NAME` writes a model of it; `scripts/make-reference.py` makes the
//! reference).

mod deepseek2;
mod gemma2;
mod gemma3;
mod gpt_oss;
mod granite;
mod llama;
mod mistral3;
mod olmo2;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;
mod smollm3;
mod tensors;

pub(crate) use tensors::{check_known_tensors, check_layers};

use crate::blocks::Blocks;
use crate::config::Hparams;
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

/// The decoder architectures the engine runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama and its relatives (SmolLM2, Mistral): RMSNorm, RoPE on adjacent pairs, SwiGLU.
    Llama,
    /// Gemma 2: Gemma 3's layer without Q/K norms, with soft-capped attention scores and
    /// logits and a sliding window on every other layer.
    Gemma2,
    /// Gemma 3: scaled embeddings, per-head Q/K norms, NEOX RoPE with a separate base for
    /// sliding-window layers, norms after attention and FFN, GeGLU.
    Gemma3,
    /// Qwen2 and Qwen2.5: Llama's layer with Q/K/V biases and NEOX RoPE.
    Qwen2,
    /// Qwen3 (dense): per-head Q/K RMSNorm, NEOX RoPE, no biases.
    Qwen3,
    /// Phi-3 / Phi-3.5 (dense): fused QKV and gate/up tensors, NEOX RoPE with LongRoPE factors,
    /// the query scaled before the scores.
    Phi3,
    /// SmolLM3: Llama's layer with RoPE left out of every fourth layer.
    SmolLm3,
    /// Granite 3 (dense): Llama's layer with embedding, attention, residual and logit
    /// multipliers.
    Granite,
    /// Mistral 3 (dense): Llama's layer with YaRN's own keys and an attention temperature that
    /// grows with the position.
    Mistral3,
    /// OLMo 2 / OLMo 3: norms after attention and FFN only, Q/K norms over whole rows.
    Olmo2,
    /// Qwen3-MoE: Qwen3's attention, a softmax-routed mixture of experts for the FFN.
    Qwen3Moe,
    /// gpt-oss: biased attention with sinks and alternating sliding windows, a mixture of
    /// biased experts with a clamped SwiGLU (MXFP4 in the released files).
    GptOss,
    /// OLMoE: OLMo 2's whole-row Q/K norms in a pre-norm layer, a softmax-routed mixture of
    /// experts whose probabilities are not renormalised.
    Olmoe,
    /// Qwen2-MoE: Qwen2's attention, a softmax-routed mixture of experts plus a gated shared
    /// expert.
    Qwen2Moe,
    /// DeepSeek V2/V3 and Kimi K2: multi-head latent attention, leading dense layers, then a
    /// mixture of experts (sigmoid or softmax routing, group-limited, with a selection bias)
    /// plus shared experts.
    Deepseek2,
}

/// Every family: its `general.architecture` name and its variant.
const FAMILIES: &[(&str, Arch)] = &[
    ("llama", Arch::Llama),
    ("gemma2", Arch::Gemma2),
    ("gemma3", Arch::Gemma3),
    ("qwen2", Arch::Qwen2),
    ("qwen3", Arch::Qwen3),
    ("phi3", Arch::Phi3),
    ("smollm3", Arch::SmolLm3),
    ("granite", Arch::Granite),
    ("mistral3", Arch::Mistral3),
    ("olmo2", Arch::Olmo2),
    ("qwen3moe", Arch::Qwen3Moe),
    ("gpt-oss", Arch::GptOss),
    ("olmoe", Arch::Olmoe),
    ("qwen2moe", Arch::Qwen2Moe),
    ("deepseek2", Arch::Deepseek2),
];

impl Arch {
    /// The architecture named `name`, or an error listing the supported ones.
    pub fn parse(name: &str) -> Result<Arch> {
        FAMILIES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, a)| a)
            .ok_or_else(|| Error::UnsupportedArchitecture {
                arch: name.to_string(),
                supported: Arch::supported(),
            })
    }

    /// The supported names, comma-separated (for messages and `strata models`).
    pub fn supported() -> String {
        FAMILIES
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The GGUF name of this architecture.
    pub fn name(self) -> &'static str {
        FAMILIES
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("?", |(n, _)| n)
    }
}

/// Per-layer tensors a family needs beyond the common set (norms before attention and FFN,
/// Q/K/V fused or not, the output projection, gate/up fused or not, down).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LayerTensors {
    /// `attn_q_norm` and `attn_k_norm`: an RMSNorm over each head of Q and K.
    pub(crate) qk_norm: bool,
    /// `post_attention_norm` and `post_ffw_norm`: RMSNorms of the block outputs.
    pub(crate) post_norms: bool,
    /// `attn_q_norm` and `attn_k_norm` over whole Q and K rows, all heads together (OLMo 2).
    pub(crate) qk_norm_rows: bool,
    /// No `attn_norm` and `ffn_norm`: blocks read the residual stream as it is (OLMo 2).
    pub(crate) no_pre_norms: bool,
    /// A mixture of experts (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`) instead of the dense FFN.
    pub(crate) moe: bool,
    /// `attn_sinks`: one sink logit per query head (gpt-oss).
    pub(crate) sinks: bool,
    /// The FFN's input norm is stored as `post_attention_norm` (gpt-oss) rather than `ffn_norm`.
    pub(crate) ffn_norm_post_attention: bool,
    /// Multi-head latent attention (`attn_q_a`, `attn_q_a_norm`, `attn_q_b` or `attn_q`,
    /// `attn_kv_a_mqa`, `attn_kv_a_norm`, `attn_k_b`, `attn_v_b`) instead of Q/K/V.
    pub(crate) mla: bool,
}

impl LayerTensors {
    /// The name (after `blk.N.`) of the FFN's input norm.
    pub(crate) fn ffn_norm_tensor(&self) -> &'static str {
        if self.ffn_norm_post_attention {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        }
    }
}

/// One decoder family.
pub(crate) trait Family: Sync {
    /// Reads this family's own metadata into `cfg` (the common keys are already read).
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()>;

    /// The per-layer tensors it needs beyond the common set.
    fn tensors(&self) -> LayerTensors;

    /// Settles what depends on values computed after [`Family::configure`] (the YaRN
    /// attention factor).
    fn finish(&self, _cfg: &mut ModelConfig) {}

    /// One decoder layer over the live rows of the residual stream.
    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()>;
}

/// The implementation of `arch`.
pub(crate) fn family(arch: Arch) -> &'static dyn Family {
    match arch {
        Arch::Llama => &llama::Llama,
        Arch::Gemma2 => &gemma2::Gemma2,
        Arch::Gemma3 => &gemma3::Gemma3,
        Arch::Qwen2 => &qwen2::Qwen2,
        Arch::Qwen3 => &qwen3::Qwen3,
        Arch::Phi3 => &phi3::Phi3,
        Arch::SmolLm3 => &smollm3::SmolLm3,
        Arch::Granite => &granite::Granite,
        Arch::Mistral3 => &mistral3::Mistral3,
        Arch::Olmo2 => &olmo2::Olmo2,
        Arch::Qwen3Moe => &qwen3moe::Qwen3Moe,
        Arch::GptOss => &gpt_oss::GptOss,
        Arch::Olmoe => &olmoe::Olmoe,
        Arch::Qwen2Moe => &qwen2moe::Qwen2Moe,
        Arch::Deepseek2 => &deepseek2::Deepseek2,
    }
}

/// The layer most families share: pre-norm attention and pre-norm FFN, each added to the
/// residual stream.
pub(crate) fn pre_norm_layer(b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
    b.norm(lw.attn_norm.as_deref());
    b.attention(lw)?;
    b.residual();
    b.norm(lw.ffn_norm.as_deref());
    b.ffn(lw)?;
    b.residual();
    Ok(())
}

/// The Gemma and OLMo 2 layer: each block's output RMS-normed again before it joins the
/// residual stream (OLMo 2 has no norms before the blocks, and the blocks then read the stream
/// as it is).
pub(crate) fn post_norm_layer(b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
    b.norm(lw.attn_norm.as_deref());
    b.attention(lw)?;
    b.post_norm(lw.attn_post_norm.as_deref());
    b.residual();
    b.norm(lw.ffn_norm.as_deref());
    b.ffn(lw)?;
    b.post_norm(lw.ffn_post_norm.as_deref());
    b.residual();
    Ok(())
}
