//! Models described without their weights: a card holds the shapes that decide memory and
//! speed (layers, widths, heads, experts), and a quantisation gives bytes per weight. Cards
//! for the models people build clusters for ship in `data/cards.json`; a user's own card is
//! the same JSON object in a file. Every card is checked for numbers that contradict each
//! other before anything is predicted from it.

use std::sync::OnceLock;

use serde::Deserialize;

use crate::placement::ModelFacts;

/// Why a card cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CardError {
    /// No card has this id.
    #[error("unknown model card {name:?}; known: {known} (each as ID or ID:QUANT)")]
    Unknown {
        /// The id given.
        name: String,
        /// The cards there are.
        known: String,
    },
    /// No quantisation has this name.
    #[error("unknown quantisation {name:?}; known: {known}")]
    UnknownQuant {
        /// The name given.
        name: String,
        /// The quantisations there are.
        known: String,
    },
    /// The card's numbers do not add up.
    #[error("model card {id}: {why}")]
    Contradiction {
        /// The card.
        id: String,
        /// What does not add up.
        why: String,
    },
    /// The card file is not a card.
    #[error("reading the model card: {0}")]
    Parse(String),
}

/// A quantisation: bits per weight.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Quant {
    /// Bits per weight outside a mixture's experts (scales included).
    pub bits: f64,
    /// Bits per weight of a mixture's routed experts.
    pub expert_bits: f64,
    /// Only for mixtures of experts.
    #[serde(default)]
    pub moe_only: bool,
    /// What it is.
    pub about: String,
}

/// Multi-head latent attention shapes (DeepSeek V3 style).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
pub struct Mla {
    /// Query compression rank (0: queries not compressed).
    pub q_lora: usize,
    /// Key/value compression rank: what the cache holds per position, with the rope part.
    pub kv_lora: usize,
    /// Per-head query/key width without position encoding.
    pub qk_nope: usize,
    /// Per-head width with position encoding (shared by all heads for keys).
    pub qk_rope: usize,
    /// Per-head value width.
    pub v_head: usize,
}

/// A model card.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Card {
    /// Card id (`--model ID:QUANT`).
    pub id: String,
    /// Display name.
    pub name: String,
    /// The quantisation the release ships in (used when the id names none).
    pub native: String,
    /// Parameters as the release states them, billions.
    pub params_b: f64,
    /// Parameters a token uses as the release states them, billions.
    pub active_params_b: f64,
    /// Decoder layers.
    pub layers: usize,
    /// Model width.
    pub embd: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query/key width per head.
    pub head_dim: usize,
    /// Dense FFN width.
    pub ffn: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// The LM head is the embedding table.
    pub tied_embeddings: bool,
    /// Trained context.
    pub context: usize,
    /// Routed experts per MoE layer (0: dense).
    #[serde(default)]
    pub experts: usize,
    /// Experts each token uses.
    #[serde(default)]
    pub experts_used: usize,
    /// Each expert's FFN width.
    #[serde(default)]
    pub expert_ffn: usize,
    /// Shared experts per MoE layer (each `expert_ffn` wide).
    #[serde(default)]
    pub shared_experts: usize,
    /// Leading layers with a dense FFN before the MoE layers.
    #[serde(default)]
    pub dense_layers: usize,
    /// Latent attention shapes, if the model uses it.
    #[serde(default)]
    pub mla: Option<Mla>,
    /// Where the numbers come from.
    #[serde(default)]
    pub source: String,
}

/// The cards file.
#[derive(Clone, Debug, Deserialize)]
pub struct Cards {
    /// What the file holds.
    pub about: String,
    /// Quantisations by name.
    pub quants: std::collections::BTreeMap<String, Quant>,
    /// The cards.
    pub models: Vec<Card>,
}

/// The cards shipped with strata.
pub fn cards() -> &'static Cards {
    static C: OnceLock<Cards> = OnceLock::new();
    C.get_or_init(|| {
        // Part of the crate and checked by its tests: a broken file is a build defect.
        #[allow(clippy::expect_used)]
        serde_json::from_str(include_str!("../data/cards.json")).expect("data/cards.json parses")
    })
}

/// Parameter counts a card's shapes make: (all, per token, routed experts).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counts {
    /// Every weight.
    pub params: f64,
    /// Weights a token multiplies by.
    pub token: f64,
    /// Of `params`, the routed experts.
    pub experts: f64,
    /// Of `params`, the LM head.
    pub head: f64,
}

impl Card {
    /// Whether this is a mixture of experts.
    pub fn moe(&self) -> bool {
        self.experts > 0
    }

    /// Counts the weights from the shapes.
    pub fn counts(&self) -> Counts {
        let (d, l) = (self.embd as f64, self.layers as f64);
        let attn = match self.mla {
            Some(m) => {
                let h = self.heads as f64;
                let qk = (m.qk_nope + m.qk_rope) as f64;
                let q = if m.q_lora > 0 {
                    d * m.q_lora as f64 + m.q_lora as f64 * h * qk
                } else {
                    d * h * qk
                };
                q + d * (m.kv_lora + m.qk_rope) as f64
                    + m.kv_lora as f64 * h * (m.qk_nope + m.v_head) as f64
                    + h * m.v_head as f64 * d
            }
            None => {
                let q = (self.heads * self.head_dim) as f64;
                let kv = (self.kv_heads * self.head_dim) as f64;
                d * (q + 2.0 * kv) + q * d
            }
        };
        let dense_ffn = 3.0 * d * self.ffn as f64;
        let expert = 3.0 * d * self.expert_ffn as f64;
        let (mut params, mut token, mut experts) = (attn * l, attn * l, 0.0);
        if self.moe() {
            let dense = self.dense_layers as f64;
            let sparse = l - dense;
            let shared = self.shared_experts as f64 * expert + d * self.experts as f64;
            params += dense * dense_ffn + sparse * (self.experts as f64 * expert + shared);
            token += dense * dense_ffn + sparse * (self.experts_used as f64 * expert + shared);
            experts = sparse * self.experts as f64 * expert;
        } else {
            params += l * dense_ffn;
            token += l * dense_ffn;
        }
        let table = self.vocab as f64 * d;
        // The head multiplies every token; the embedding table is only looked up.
        params += if self.tied_embeddings {
            table
        } else {
            2.0 * table
        };
        token += table;
        Counts {
            params,
            token,
            experts,
            head: table,
        }
    }

    /// Checks that the card's numbers agree with each other.
    pub fn validate(&self) -> Result<(), CardError> {
        let bad = |why: String| {
            Err(CardError::Contradiction {
                id: self.id.clone(),
                why,
            })
        };
        let sizes = [
            ("layers", self.layers),
            ("embd", self.embd),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("vocab", self.vocab),
            ("context", self.context),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} is 0"));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads cannot share {} key/value heads evenly",
                self.heads, self.kv_heads
            ));
        }
        if self.moe() {
            if self.experts_used == 0 || self.experts_used > self.experts {
                return bad(format!(
                    "a token uses {} of {} experts",
                    self.experts_used, self.experts
                ));
            }
            if self.expert_ffn == 0 {
                return bad("a mixture of experts needs expert_ffn".into());
            }
            if self.dense_layers >= self.layers {
                return bad(format!(
                    "{} dense layers leave none of {} for experts",
                    self.dense_layers, self.layers
                ));
            }
        } else if self.experts_used > 0 || self.shared_experts > 0 || self.dense_layers > 0 {
            return bad("expert fields without experts".into());
        }
        if !self.moe() && self.ffn == 0 {
            return bad("ffn is 0".into());
        }
        let c = self.counts();
        // A release's stated counts agree with its shapes to a few percent (biases, norms
        // and extra heads make up the rest); beyond 10 % a number is wrong.
        for (what, stated, made) in [
            ("parameters", self.params_b, c.params / 1e9),
            ("active parameters", self.active_params_b, c.token / 1e9),
        ] {
            if stated <= 0.0 || (made / stated - 1.0).abs() > 0.10 {
                return bad(format!(
                    "the card says {stated}B {what} but its layers and widths make {made:.1}B"
                ));
            }
        }
        if self.active_params_b > self.params_b {
            return bad(format!(
                "{}B active parameters exceed {}B in all",
                self.active_params_b, self.params_b
            ));
        }
        Ok(())
    }

    /// The planner's facts for this card at `quant`, with strata's KV cache (f16 keys and
    /// values; latent attention caches its compressed rows).
    pub fn facts(&self, quant_name: &str, quant: &Quant) -> Result<ModelFacts, CardError> {
        self.validate()?;
        if quant.moe_only && !self.moe() {
            return Err(CardError::Contradiction {
                id: self.id.clone(),
                why: format!("{quant_name} quantises a mixture's experts, and this model is dense"),
            });
        }
        let c = self.counts();
        let bytes = |params: f64, bits: f64| (params * bits / 8.0) as u64;
        let experts = bytes(c.experts, quant.expert_bits);
        let rest = bytes(c.params - c.experts, quant.bits);
        let used = if self.moe() {
            self.experts_used as f64 / self.experts as f64
        } else {
            0.0
        };
        let token_experts = (c.experts * used * quant.expert_bits / 8.0) as u64;
        // A token reads every non-expert weight except the embedding table.
        let token_rest = bytes(c.token - c.experts * used, quant.bits);
        let kv_per_layer = match self.mla {
            Some(m) => 2 * m.kv_lora + m.qk_rope,
            None => 2 * self.kv_heads * self.head_dim,
        };
        let q_width = match self.mla {
            Some(m) => self.heads * m.v_head,
            None => self.heads * self.head_dim,
        };
        Ok(ModelFacts {
            name: format!("{}:{quant_name}", self.id),
            weight_bytes: experts + rest,
            token_bytes: token_experts + token_rest,
            moe: self.moe(),
            n_expert: self.experts,
            n_used: self.experts_used,
            head_bytes: bytes(c.head, quant.bits),
            expert_bytes: experts,
            params: c.params as u64,
            token_params: c.token as u64,
            head_params: c.head as u64,
            head_type: String::new(),
            token_params_by_type: Default::default(),
            kv_bytes_per_token: (2 * self.layers * kv_per_layer) as u64,
            n_layer: self.layers,
            n_head: self.heads,
            n_embd: self.embd,
            n_ff: if self.moe() {
                self.expert_ffn * self.experts_used
            } else {
                self.ffn
            },
            q_width,
            default_context: self.context.min(8192),
        })
    }
}

impl Cards {
    /// The facts of `spec` (`ID` or `ID:QUANT`).
    pub fn resolve(&self, spec: &str) -> Result<(ModelFacts, &Card), CardError> {
        let (id, quant) = match spec.split_once(':') {
            Some((id, q)) => (id, Some(q)),
            None => (spec, None),
        };
        let card = self
            .models
            .iter()
            .find(|c| c.id.eq_ignore_ascii_case(id))
            .ok_or_else(|| CardError::Unknown {
                name: spec.to_string(),
                known: self
                    .models
                    .iter()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let qname = quant.unwrap_or(&card.native).to_ascii_lowercase();
        let q = self.quant(&qname)?;
        Ok((card.facts(&qname, q)?, card))
    }

    /// The quantisation called `name`.
    pub fn quant(&self, name: &str) -> Result<&Quant, CardError> {
        self.quants
            .get(name)
            .ok_or_else(|| CardError::UnknownQuant {
                name: name.to_string(),
                known: self.quants.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// A user's card from JSON text: a card object, with `"quant"` naming the quantisation
    /// (default: the card's `native`).
    pub fn from_json(&self, text: &str) -> Result<ModelFacts, CardError> {
        #[derive(Deserialize)]
        struct UserCard {
            #[serde(default)]
            quant: Option<String>,
            #[serde(flatten)]
            card: serde_json::Value,
        }
        let u: UserCard =
            serde_json::from_str(text).map_err(|e| CardError::Parse(e.to_string()))?;
        let card: Card =
            serde_json::from_value(u.card).map_err(|e| CardError::Parse(e.to_string()))?;
        let qname = u.quant.unwrap_or_else(|| card.native.clone());
        let q = self.quant(&qname)?;
        card.facts(&qname, q)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_shipped_card_adds_up_in_every_quantisation() {
        let c = cards();
        for card in &c.models {
            card.validate().unwrap();
            for (name, q) in &c.quants {
                if q.moe_only && !card.moe() {
                    continue;
                }
                let f = card.facts(name, q).unwrap();
                assert!(f.token_bytes <= f.weight_bytes, "{}:{name}", card.id);
                assert!(f.expert_bytes < f.weight_bytes);
            }
        }
    }

    #[test]
    fn card_sizes_match_what_the_releases_weigh() {
        let c = cards();
        let gb = |spec: &str| c.resolve(spec).unwrap().0.weight_bytes as f64 / 1e9;
        // Llama 3.3 70B in 16 bits is 141 GB; DeepSeek V3.1 in 8 bits about 713 GB; gpt-oss
        // 120B as shipped (MXFP4 experts) about 65 GB.
        assert!(
            (gb("llama-3.3-70b:f16") - 141.0).abs() < 3.0,
            "{}",
            gb("llama-3.3-70b:f16")
        );
        assert!(
            (gb("deepseek-v3.1") - 713.0).abs() < 15.0,
            "{}",
            gb("deepseek-v3.1")
        );
        assert!(
            (gb("gpt-oss-120b") - 65.0).abs() < 3.0,
            "{}",
            gb("gpt-oss-120b")
        );
        let (f, _) = c.resolve("qwen3-235b-a22b:q8").unwrap();
        // 22B active in 8.5 bits.
        assert!(
            (f.token_bytes as f64 / 1e9 - 23.0).abs() < 1.5,
            "{}",
            f.token_bytes
        );
    }

    #[test]
    fn contradictions_and_unknown_names_are_named() {
        let c = cards();
        let e = c.resolve("llama-4-9000b").unwrap_err().to_string();
        assert!(
            e.contains("unknown model card") && e.contains("llama-3.3-70b"),
            "{e}"
        );
        let e = c.resolve("llama-3.3-70b:q3").unwrap_err().to_string();
        assert!(
            e.contains("unknown quantisation \"q3\"") && e.contains("q4"),
            "{e}"
        );
        let e = c.resolve("llama-3.3-70b:mxfp4").unwrap_err().to_string();
        assert!(e.contains("dense"), "{e}");
        let mut card = c.models[0].clone();
        card.params_b = 35.0;
        let e = card.validate().unwrap_err().to_string();
        assert!(
            e.contains("says 35B parameters but its layers and widths make 70."),
            "{e}"
        );
        card.params_b = 70.6;
        card.kv_heads = 7;
        assert!(card.validate().unwrap_err().to_string().contains("evenly"));
        let text = r#"{"id": "mine", "name": "Mine", "native": "q4", "params_b": 8.0,
            "active_params_b": 8.0, "layers": 32, "embd": 4096, "heads": 32, "kv_heads": 8,
            "head_dim": 128, "ffn": 14336, "vocab": 128256, "tied_embeddings": false,
            "context": 8192, "quant": "q8"}"#;
        let f = c.from_json(text).unwrap();
        assert_eq!(f.name, "mine:q8");
        assert!(
            c.from_json(&text.replace("\"layers\": 32", "\"layers\": 4"))
                .is_err()
        );
        assert!(c.from_json(&text.replace("\"embd\"", "\"width\"")).is_err());
    }
}
