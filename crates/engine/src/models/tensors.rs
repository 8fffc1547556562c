//! The tensors a layer of each family must hold and those it may hold, derived from the
//! family's [`LayerTensors`], in the manner of llama.cpp's `load_arch_tensors` (each tensor
//! declared, the optional ones marked).
//!
//! Two load-time checks read these lists. [`check_layers`] refuses a block count the file's
//! tensors cannot fill before anything is sized by it, and names the first tensor a layer
//! lacks; the bound it starts from is the family's smallest layer (Phi-3's has six tensors:
//! fused `attn_qkv` and `ffn_up`), not a count shared by every family.
//! [`check_known_tensors`] refuses a tensor no list names: a feature this engine does not
//! implement, which running without would answer wrongly.

use std::collections::HashSet;

use strata_gguf::GgufFile;

use super::LayerTensors;
use crate::{Error, ModelConfig, Result};

/// One requirement of a layer (tensor names after `blk.N.`).
#[derive(Clone, Copy, Debug)]
enum Need {
    /// This tensor.
    One(&'static str),
    /// Any one of these sets of tensors, each whole.
    AnyOf(&'static [&'static [&'static str]]),
}

impl Need {
    /// The fewest tensors that meet it.
    fn fewest(self) -> usize {
        match self {
            Need::One(_) => 1,
            Need::AnyOf(alts) => alts.iter().map(|a| a.len()).min().unwrap_or(0),
        }
    }

    /// Every tensor it names.
    fn names(self) -> Vec<&'static str> {
        match self {
            Need::One(t) => vec![t],
            Need::AnyOf(alts) => alts.iter().flat_map(|a| a.iter().copied()).collect(),
        }
    }

    /// Whether a layer holding the tensors `has` says it holds meets it.
    fn met(self, has: &dyn Fn(&str) -> bool) -> bool {
        match self {
            Need::One(t) => has(t),
            Need::AnyOf(alts) => alts.iter().any(|a| a.iter().all(|t| has(t))),
        }
    }

    /// The requirement as a phrase for a message.
    fn describe(self) -> String {
        match self {
            Need::One(t) => t.to_string(),
            Need::AnyOf(alts) => alts
                .iter()
                .map(|a| a.join(" + "))
                .collect::<Vec<_>>()
                .join(" or "),
        }
    }
}

/// Q, K and V: one fused tensor whose rows are Q's, K's, then V's (llama.cpp's converter
/// writes Phi-3 so), or three.
const QKV: Need = Need::AnyOf(&[
    &["attn_qkv.weight"],
    &["attn_q.weight", "attn_k.weight", "attn_v.weight"],
]);
const QKV_OPTIONAL: &[&str] = &["attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_qkv.bias"];
/// Multi-head latent attention's query: direct, or through a low-rank pair with a norm.
const MLA_Q: Need = Need::AnyOf(&[
    &["attn_q.weight"],
    &["attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight"],
]);
const MLA_KV: &[&str] = &[
    "attn_kv_a_mqa.weight",
    "attn_kv_a_norm.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
];
/// A dense FFN's gate may be fused into `ffn_up` (its rows first; Phi-3).
const DENSE: &[&str] = &["ffn_up.weight", "ffn_down.weight"];
const DENSE_OPTIONAL: &[&str] = &["ffn_gate.weight"];
const EXPERTS: &[&str] = &[
    "ffn_gate_inp.weight",
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
];
/// Biases (gpt-oss), DeepSeek's selection bias, and the shared experts (Qwen2-MoE, DeepSeek:
/// the loader asks for them when the family's metadata says it has them).
const EXPERTS_OPTIONAL: &[&str] = &[
    "ffn_gate_inp.bias",
    "ffn_gate_exps.bias",
    "ffn_up_exps.bias",
    "ffn_down_exps.bias",
    "exp_probs_b.bias",
    "ffn_gate_inp_shexp.weight",
    "ffn_gate_shexp.weight",
    "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
];
/// Tensors outside the layers a model may hold (the LM head is the embedding when `output` is
/// absent; RoPE factors of Llama 3 and of LongRoPE).
const MODEL_OPTIONAL: &[&str] = &[
    "output.weight",
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
];
const MODEL_REQUIRED: &[&str] = &["token_embd.weight", "output_norm.weight"];

impl LayerTensors {
    /// What a layer of the family must hold (`moe`: a layer with a mixture of experts).
    fn needs(&self, moe: bool) -> Vec<Need> {
        let mut v = vec![Need::One("attn_output.weight")];
        if self.mla {
            v.push(MLA_Q);
            v.extend(MLA_KV.iter().map(|&t| Need::One(t)));
        } else {
            v.push(QKV);
        }
        if !self.no_pre_norms {
            v.push(Need::One("attn_norm.weight"));
            v.push(Need::One(self.ffn_norm_tensor()));
        }
        if self.sinks {
            v.push(Need::One("attn_sinks.weight"));
        }
        if self.qk_norm || self.qk_norm_rows {
            v.extend([
                Need::One("attn_q_norm.weight"),
                Need::One("attn_k_norm.weight"),
            ]);
        }
        if self.post_norms {
            v.extend([
                Need::One("post_attention_norm.weight"),
                Need::One("post_ffw_norm.weight"),
            ]);
        }
        let ffn = if moe { EXPERTS } else { DENSE };
        v.extend(ffn.iter().map(|&t| Need::One(t)));
        v
    }

    /// What a layer of the family may hold beyond [`LayerTensors::needs`].
    fn optional(&self, moe: bool) -> Vec<&'static str> {
        let mut v = vec!["attn_output.bias"];
        if !self.mla {
            v.extend(QKV_OPTIONAL);
        }
        v.extend(if moe {
            EXPERTS_OPTIONAL
        } else {
            DENSE_OPTIONAL
        });
        v
    }

    /// The fewest tensors any layer of the family holds (a mixture family's leading layers
    /// may be dense).
    pub(crate) fn fewest_per_layer(&self) -> usize {
        let count = |moe| self.needs(moe).into_iter().map(Need::fewest).sum::<usize>();
        if self.moe {
            count(true).min(count(false))
        } else {
            count(false)
        }
    }
}

/// Whether layer `l` of `cfg` has a mixture of experts.
fn is_moe_layer(cfg: &ModelConfig, family: &LayerTensors, l: usize) -> bool {
    family.moe && cfg.moe.is_some_and(|m| m.is_moe_layer(l))
}

/// Refuses a block count of zero or beyond what the file's tensors can fill (checked first,
/// from the count alone, so a corrupt header sizes nothing), then names the first tensor a
/// layer or the model lacks.
pub(crate) fn check_layers(file: &GgufFile, cfg: &ModelConfig) -> Result<()> {
    let family = super::family(cfg.kind).tensors();
    let fewest = family.fewest_per_layer().max(1);
    let in_layers = file.tensors().len().saturating_sub(MODEL_REQUIRED.len());
    if cfg.n_layer == 0 || cfg.n_layer > in_layers / fewest {
        return Err(Error::InvalidModel(format!(
            "block count {} does not match the file's {} tensors (a {} layer has at least {fewest})",
            cfg.n_layer,
            file.tensors().len(),
            cfg.arch,
        )));
    }
    let names: HashSet<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    for t in MODEL_REQUIRED {
        if !names.contains(t) {
            return Err(Error::InvalidModel(format!("tensor {t} is missing")));
        }
    }
    for l in 0..cfg.n_layer {
        let has = |t: &str| names.contains(format!("blk.{l}.{t}").as_str());
        for need in family.needs(is_moe_layer(cfg, &family, l)) {
            if !need.met(&has) {
                return Err(Error::InvalidModel(format!(
                    "block count {}, but layer {l} lacks {} (a {} layer needs it)",
                    cfg.n_layer,
                    need.describe(),
                    cfg.arch,
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a tensor that no part of the family names (an output bias, a feature this engine
/// does not implement, a layer beyond the block count).
pub(crate) fn check_known_tensors(file: &GgufFile, cfg: &ModelConfig) -> Result<()> {
    let family = super::family(cfg.kind).tensors();
    let layer_names = |moe: bool| -> HashSet<&'static str> {
        let mut s: HashSet<&str> = family
            .needs(moe)
            .into_iter()
            .flat_map(Need::names)
            .collect();
        s.extend(family.optional(moe));
        s
    };
    let (dense, experts) = (layer_names(false), layer_names(true));
    for t in file.tensors() {
        let name = t.name.as_str();
        let known = MODEL_REQUIRED.contains(&name)
            || MODEL_OPTIONAL.contains(&name)
            || name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(l, what)| {
                    l.parse::<usize>().is_ok_and(|l| {
                        let set = if is_moe_layer(cfg, &family, l) {
                            &experts
                        } else {
                            &dense
                        };
                        l < cfg.n_layer && set.contains(what)
                    })
                });
        if !known {
            return Err(Error::InvalidModel(format!(
                "tensor {name} is not part of strata's {} model (a feature this engine does not \
                 implement, or a corrupt file)",
                cfg.arch
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{Arch, family};

    #[test]
    fn a_fused_phi3_layer_has_six_tensors() {
        // attn_norm, attn_qkv, attn_output, ffn_norm, ffn_up (gate and up), ffn_down: a
        // 32-layer Phi-3 file holds 32 * 6 + 3 = 195 tensors.
        assert_eq!(family(Arch::Phi3).tensors().fewest_per_layer(), 6);
        let fewest = family(Arch::Phi3).tensors().fewest_per_layer();
        assert!(32 <= (195 - MODEL_REQUIRED.len()) / fewest);
    }

    #[test]
    fn families_with_more_parts_need_more_tensors_a_layer() {
        let n = |a| family(a).tensors().fewest_per_layer();
        assert_eq!(n(Arch::Llama), 6);
        assert_eq!(n(Arch::Qwen3), 8);
        assert_eq!(n(Arch::Gemma3), 10);
        // OLMo 2 has no norms before the blocks, only after them and on Q and K.
        assert_eq!(n(Arch::Olmo2), 8);
    }
}
