//! Model hyper-parameters read from GGUF metadata.
//!
//! The keys every decoder has (widths, heads, norms, RoPE) are read here; what only one family
//! says is read by that family's file in [`crate::models`]. Every value that sizes a buffer or
//! enters the arithmetic is checked before a tensor is touched, so a file whose metadata
//! contradicts itself is refused with the key that is wrong.

use strata_gguf::GgufFile;

use crate::models::{self, Arch};
use crate::{Error, Result};

/// The mixture of experts of every layer: a router picks `n_used` of `n_expert` gated FFNs per
/// token and weighs their outputs by its probabilities.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each token uses (`expert_used_count`).
    pub n_used: usize,
    /// FFN width of one expert (`expert_feed_forward_length`).
    pub n_ff_exp: usize,
    /// The chosen experts' probabilities are divided by their sum (Qwen3-MoE).
    pub norm_weights: bool,
    /// The weights are then multiplied by this (`expert_weights_scale`; 1: not at all).
    pub weights_scale: f32,
    /// How the router's logits become the chosen experts and their weights.
    pub gating: Gating,
    /// FFN width of the shared expert every token also runs (Qwen2-MoE, DeepSeek), if the
    /// family has one.
    pub n_ff_shexp: Option<usize>,
    /// The experts are split into groups and a token chooses among the best groups only
    /// (DeepSeek V3's group-limited routing).
    pub groups: Option<ExpertGroups>,
    /// The first this many layers have a dense FFN (`leading_dense_block_count`, DeepSeek).
    pub dense_lead: usize,
}

/// Group-limited routing: each group is scored by the sum of its two best (selection)
/// probabilities, and only the `used` best groups' experts may be chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertGroups {
    /// Groups of equal size the experts are split into (`expert_group_count`).
    pub count: usize,
    /// Groups a token may choose from (`expert_group_used_count`).
    pub used: usize,
}

impl Moe {
    /// Whether layer `il` has a mixture of experts (rather than a leading dense FFN).
    pub fn is_moe_layer(&self, il: usize) -> bool {
        il >= self.dense_lead
    }
}

/// Multi-head latent attention (DeepSeek V2/V3, Kimi K2), in the absorbed form llama.cpp runs:
/// keys and values are one compressed latent row per token (plus a shared RoPE part), each
/// query head is projected into the latent space, and each head's output is projected back out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mla {
    /// Rank of the query compression (`attention.q_lora_rank`); none: queries are projected
    /// directly (DeepSeek V2 Lite).
    pub q_lora: Option<usize>,
    /// Rank of the key/value compression (`attention.kv_lora_rank`): the latent row's width.
    pub kv_lora: usize,
    /// Per-head query/key width without RoPE (`key_length_mla - rope dims`).
    pub nope: usize,
    /// Per-head value width after decompression (`value_length_mla`).
    pub v_head: usize,
    /// DeepSeek's `mscale_all_dim` (`rope.scaling.yarn_log_multiplier / 0.1`; 0: none), which
    /// enters the softmax scale.
    pub yarn_log_mul: f32,
}

impl Mla {
    /// Width of a query head as projected (`nope` plus the rotated part).
    pub fn q_head(&self, rope_dims: usize) -> usize {
        self.nope + rope_dims
    }
}

/// How a router's logits choose experts and weigh them (llama.cpp's `expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over all experts; the most probable ones, weighted by their probabilities
    /// (Qwen3-MoE).
    Softmax,
    /// The largest logits choose; a softmax over just those weighs them (gpt-oss).
    SoftmaxWeight,
    /// A sigmoid of each logit (DeepSeek V3, Kimi K2); a per-expert bias may steer the choice
    /// without entering the weights.
    Sigmoid,
}

/// Hyper-parameters of a decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: String,
    /// The architecture, parsed.
    pub kind: Arch,
    /// Decoder layers.
    pub n_layer: usize,
    /// Hidden width.
    pub n_embd: usize,
    /// FFN inner width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub n_vocab: usize,
    /// Trained context length.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// Dimensions of a head that RoPE rotates.
    pub rope_dims: usize,
    /// Linear RoPE scaling: positions are multiplied by this (`1 / rope.scaling.factor`).
    pub rope_freq_scale: f32,
    /// Multiplies RoPE's cosines and sines: `rope.scaling.attn_factor` (Phi-3's LongRoPE), and
    /// with YaRN the magnitude correction llama.cpp derives from the scale (see `Yarn`).
    pub rope_attn_factor: f32,
    /// YaRN scaling (`rope.scaling.type = yarn`), if the model uses it.
    pub yarn: Option<Yarn>,
    /// The context the model was trained for before any extension: LongRoPE's long factors apply
    /// beyond it, its short ones within (`rope.scaling.original_context_length`).
    pub rope_ctx_orig: usize,
    /// Whether the LM head reuses the token embedding.
    pub tied_embeddings: bool,
    /// Factor applied to token embeddings (Gemma: `sqrt(n_embd)`).
    pub embed_scale: Option<f32>,
    /// Factor applied to queries before attention (Gemma: `1 / sqrt(head_dim)`); when set, the
    /// softmax scale is 1.
    pub query_scale: Option<f32>,
    /// RoPE rotates halves (`x[i]`, `x[i + d/2]`) rather than adjacent pairs.
    pub rope_neox: bool,
    /// Sliding-window attention: window length, layer pattern and RoPE base of those layers.
    pub swa: Option<SlidingWindow>,
    /// The gated activation of the feed-forward block.
    pub ffn_act: FfnAct,
    /// Attention scores become `cap * tanh(score / cap)` before the softmax (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// The logits become `cap * tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Layers `il` with `(il + 1) % step == 0` apply no RoPE (SmolLM3's NoPE layers; 1: none).
    pub no_rope_step: Option<usize>,
    /// The softmax scale of the attention scores, when not `1 / sqrt(head_dim)` (Granite).
    pub attn_scale: Option<f32>,
    /// Each block's output is multiplied by this before it joins the residual stream (Granite).
    pub residual_scale: Option<f32>,
    /// The logits are multiplied by this (Granite: `1 / logit_scale`).
    pub logit_factor: Option<f32>,
    /// Q and K are RMS-normalised over whole rows, all heads together, before RoPE (OLMo 2),
    /// rather than per head.
    pub qk_norm_rows: bool,
    /// Queries are multiplied by a factor growing with the position (Llama 4's attention
    /// temperature, which Mistral 3 uses).
    pub attn_temperature: Option<AttnTemperature>,
    /// A mixture of experts in place of the dense feed-forward block (Qwen3-MoE).
    pub moe: Option<Moe>,
    /// Multi-head latent attention in place of per-head keys and values (DeepSeek): the cache
    /// then holds one `head_dim`-wide key row per token, of which the values are the first
    /// `kv_lora` elements.
    pub mla: Option<Mla>,
}

/// YaRN's parameters (llama.cpp's `yarn_*` hyper-parameters): besides the linear scale, the
/// fast-rotating dimensions keep their angles along a ramp, and cosines and sines are scaled.
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    /// How much of the unscaled angle the ramp mixes in (1 for YaRN).
    pub ext_factor: f32,
    /// The ramp's ends, in rotations over the original context (`beta_fast`, `beta_slow`).
    pub beta: (f32, f32),
    /// `rope.scaling.yarn_log_multiplier` (DeepSeek's and Mistral's `mscale_all_dim`; 0: none).
    pub log_mul: f32,
    /// The magnitude's numerator uses `log_mul` too, unless it is 1 (llama.cpp's DeepSeek V2
    /// special case, where the correction then cancels).
    pub mscale_is_log_mul: bool,
}

/// Llama 4's attention temperature: queries at position `p` are multiplied by
/// `ln(floor(p / floor_scale) + 1) * scale + 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnTemperature {
    /// `attention.temperature_scale`.
    pub scale: f32,
    /// Positions per step of the temperature (the original context length).
    pub floor_scale: usize,
}

impl AttnTemperature {
    /// The factor of the queries at position `pos`, computed as llama.cpp's input does (the
    /// logarithm and the sums in f64, the result rounded to f32).
    pub fn factor(&self, pos: usize) -> f32 {
        let steps = (pos as f32 / self.floor_scale as f32).floor();
        ((f64::from(steps) + 1.0).ln() * f64::from(self.scale) + 1.0) as f32
    }
}

/// The gated activation of a feed-forward block: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SiLU (SwiGLU): Llama, Qwen, Phi, Mistral, DeepSeek.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    Gelu,
    /// gpt-oss's clamped SwiGLU with a sigmoid slope and `up + 1` (see
    /// [`strata_kernels::ops::swiglu_oai`]).
    SwigluOai,
}

/// Which layers attend through a sliding window, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// A key at distance `window` or more from the query is masked.
    pub window: usize,
    /// Every `pattern`-th layer (the last of each group) attends globally.
    pub pattern: usize,
    /// RoPE base of the sliding-window layers.
    pub rope_base: f32,
    /// Linear RoPE scale of the sliding-window layers (llama.cpp's `rope_freq_scale_train_swa`:
    /// Gemma 2 keeps the model's, Gemma 3 and OLMo 2 use 1).
    pub rope_freq_scale: f32,
    /// Whether YaRN and the attention factor apply on the sliding-window layers too (OLMo 2
    /// rotates them plainly).
    pub rope_scaled: bool,
}

/// The most context positions a model gets when none is asked for: a trained context of
/// 128k would otherwise reserve gigabytes of KV cache per sequence on a small machine.
pub const DEFAULT_CONTEXT_CAP: usize = 8192;

impl ModelConfig {
    /// The context every command uses when none is given (`run`, `serve`, `load`, `plan`):
    /// the trained context, at most [`DEFAULT_CONTEXT_CAP`].
    pub fn default_context(&self) -> usize {
        self.n_ctx_train.clamp(1, DEFAULT_CONTEXT_CAP)
    }

    /// Whether layer `il` uses the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa
            .as_ref()
            .is_some_and(|w| w.pattern == 0 || il % w.pattern < w.pattern - 1)
    }

    /// Whether layer `il` applies RoPE.
    pub fn uses_rope(&self, il: usize) -> bool {
        self.no_rope_step
            .is_none_or(|step| step == 0 || !(il + 1).is_multiple_of(step))
    }

    /// RoPE base of layer `il`.
    pub fn rope_base_of(&self, il: usize) -> f32 {
        match &self.swa {
            Some(w) if self.is_swa(il) => w.rope_base,
            _ => self.rope_base,
        }
    }

    /// Width of all query heads together.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_width(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of one head's attention output (the input of the output projection): the head
    /// width, or MLA's decompressed value width.
    pub fn v_head_dim(&self) -> usize {
        self.mla.map_or(self.head_dim, |m| m.v_head)
    }

    /// Width of one value row in the cache (MLA: the latent row).
    pub fn cache_v_dim(&self) -> usize {
        self.mla.map_or(self.head_dim, |m| m.kv_lora)
    }

    /// Width of all heads' attention outputs together (the output projection's input).
    pub fn attn_out_width(&self) -> usize {
        self.n_head * self.v_head_dim()
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}

/// The metadata of one architecture: keys are named without the `ARCH.` prefix.
pub(crate) struct Hparams<'a> {
    md: &'a strata_gguf::Metadata,
    arch: &'a str,
}

impl Hparams<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required unsigned integer.
    pub(crate) fn u32(&self, k: &str) -> Result<usize> {
        Ok(self.md.get_u32(&self.key(k))? as usize)
    }

    /// An optional unsigned integer.
    pub(crate) fn opt_u32(&self, k: &str) -> Result<Option<usize>> {
        match self.md.get(&self.key(k)) {
            Some(_) => Ok(Some(self.u32(k)?)),
            None => Ok(None),
        }
    }

    /// An optional boolean.
    pub(crate) fn opt_bool(&self, k: &str) -> Result<Option<bool>> {
        match self.md.get(&self.key(k)) {
            Some(_) => Ok(Some(self.md.get_bool(&self.key(k))?)),
            None => Ok(None),
        }
    }

    /// An optional float.
    pub(crate) fn opt_f32(&self, k: &str) -> Result<Option<f32>> {
        match self.md.get(&self.key(k)) {
            Some(_) => Ok(Some(self.md.get_f32(&self.key(k))?)),
            None => Ok(None),
        }
    }

    /// An optional string.
    pub(crate) fn opt_str(&self, k: &str) -> Result<Option<&str>> {
        match self.md.get(&self.key(k)) {
            Some(_) => Ok(Some(self.md.get_str(&self.key(k))?)),
            None => Ok(None),
        }
    }

    /// A float that must be finite and positive, or the model is refused naming the key.
    pub(crate) fn positive_f32(&self, k: &str, value: f32) -> Result<f32> {
        if value.is_finite() && value > 0.0 {
            Ok(value)
        } else {
            Err(Error::InvalidModel(format!(
                "{} is {value}; it must be a finite positive number",
                self.key(k)
            )))
        }
    }
}

impl ModelConfig {
    /// Reads the configuration of the model in `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let md = file.metadata();
        let arch = md.get_str("general.architecture")?.to_string();
        let kind = Arch::parse(&arch)?;
        let hp = Hparams { md, arch: &arch };
        let n_embd = hp.u32("embedding_length")?;
        let n_head = hp.u32("attention.head_count")?;
        let n_head_kv = hp.opt_u32("attention.head_count_kv")?.unwrap_or(n_head);
        let key_length = hp.opt_u32("attention.key_length")?;
        if n_head == 0
            || n_head_kv == 0
            || !n_head.is_multiple_of(n_head_kv)
            || (key_length.is_none() && !n_embd.is_multiple_of(n_head))
        {
            return Err(Error::InvalidModel(format!(
                "{n_head} heads, {n_head_kv} KV heads and width {n_embd} are inconsistent"
            )));
        }
        let head_dim = key_length.unwrap_or(n_embd / n_head);
        // Under MLA the cached value is the first `kv_lora_rank` elements of the key row.
        let mla_value = kind == Arch::Deepseek2;
        if head_dim == 0
            || head_dim > 4096
            || hp
                .opt_u32("attention.value_length")?
                .is_some_and(|v| v != head_dim && !(mla_value && v < head_dim))
        {
            return Err(Error::InvalidModel(format!(
                "head width {head_dim} is unsupported (keys and values must be equally wide)"
            )));
        }
        let rope_dims = hp.opt_u32("rope.dimension_count")?.unwrap_or(head_dim);
        let rope_base = hp.opt_f32("rope.freq_base")?.unwrap_or(10_000.0);
        let rope_base = hp.positive_f32("rope.freq_base", rope_base)?;
        let rms_eps = md.get_f32(&hp.key("attention.layer_norm_rms_epsilon"))?;
        let rms_eps = hp.positive_f32("attention.layer_norm_rms_epsilon", rms_eps)?;
        let (rope_freq_scale, yarn) = rope_scaling(&hp)?;
        let rope_attn_factor = match hp.opt_f32("rope.scaling.attn_factor")? {
            Some(f) => hp.positive_f32("rope.scaling.attn_factor", f)?,
            None => 1.0,
        };
        let n_ctx_train = hp.u32("context_length")?;
        let rope_ctx_orig = hp
            .opt_u32("rope.scaling.original_context_length")?
            .unwrap_or(n_ctx_train);
        let embd = file.require_tensor("token_embd.weight")?;
        let n_vocab = embd.n_rows();
        let mut cfg = ModelConfig {
            n_layer: hp.u32("block_count")?,
            n_embd,
            n_ff: hp.u32("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_dims,
            rope_freq_scale,
            rope_attn_factor,
            yarn,
            rope_ctx_orig,
            tied_embeddings: file.tensor("output.weight").is_none(),
            embed_scale: None,
            query_scale: None,
            rope_neox: false,
            swa: None,
            attn_softcap: None,
            final_softcap: None,
            no_rope_step: None,
            attn_scale: None,
            residual_scale: None,
            logit_factor: None,
            attn_temperature: None,
            moe: None,
            mla: None,
            qk_norm_rows: false,
            ffn_act: FfnAct::Silu,
            kind,
            arch: arch.clone(),
        };
        models::family(kind).configure(&hp, &mut cfg)?;
        if let Some(y) = &cfg.yarn {
            cfg.rope_attn_factor = yarn_attn_factor(y, cfg.rope_freq_scale, rope_attn_factor);
        }
        models::family(kind).finish(&mut cfg);
        // Before anything is sized by the block count: the family's own tensor lists bound it
        // and name what a layer lacks.
        models::check_layers(file, &cfg)?;
        if cfg.n_ff == 0 || n_embd == 0 {
            return Err(Error::InvalidModel(format!(
                "width {n_embd} and FFN width {} must be positive",
                cfg.n_ff
            )));
        }
        if embd.row_len() != n_embd {
            return Err(Error::InvalidModel(format!(
                "token_embd.weight rows are {} wide, model width is {n_embd}",
                embd.row_len()
            )));
        }
        if rope_dims == 0 || rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(Error::InvalidModel(format!(
                "{arch}.rope.dimension_count {rope_dims} does not fit head width {head_dim}"
            )));
        }
        if let Some(w) = &cfg.swa {
            hp.positive_f32("rope.freq_base_swa", w.rope_base)?;
        }
        Ok(cfg)
    }
}

/// `rope.scaling.*`: the linear frequency scale (llama.cpp applies `1 / factor` whatever the
/// type says) and, for YaRN, its defaults (families that read the YaRN keys set them in their
/// `configure`, as llama.cpp's do); or a refusal naming a scaling type not implemented.
fn rope_scaling(hp: &Hparams<'_>) -> Result<(f32, Option<Yarn>)> {
    let factor = match hp.opt_f32("rope.scaling.factor")? {
        Some(f) => f,
        None => hp.opt_f32("rope.scale_linear")?.unwrap_or(0.0),
    };
    let yarn = match hp.opt_str("rope.scaling.type")? {
        // llama.cpp never scales when the type says so, whatever the factor.
        Some("none") => return Ok((1.0, None)),
        // llama.cpp runs LongRoPE (Phi-3) as linear scaling: its factors are tensors.
        None | Some("linear") | Some("longrope") => None,
        Some("yarn") => Some(Yarn {
            ext_factor: 1.0,
            beta: (32.0, 1.0),
            log_mul: 0.0,
            mscale_is_log_mul: false,
        }),
        Some(other) => {
            return Err(Error::InvalidModel(format!(
                "{} = {other:?} is not supported (supported: none, linear, yarn, longrope)",
                hp.key("rope.scaling.type")
            )));
        }
    };
    if factor == 0.0 {
        return Ok((1.0, yarn));
    }
    Ok((1.0 / hp.positive_f32("rope.scaling.factor", factor)?, yarn))
}

/// The magnitude llama.cpp gives YaRN's cosines and sines before ggml's own correction, as
/// `llama_context` computes it in f32 without fused multiply-adds (libllama is built for the
/// baseline x86-64, and Rust never contracts either): `mscale(factor) / mscale_all_dims(factor)` when the model has a log
/// multiplier, else `mscale(factor)`, divided by the `1 + 0.1 ln(factor)` that ggml multiplies
/// back in, times `rope.scaling.attn_factor`.
fn yarn_attn_factor(y: &Yarn, freq_scale: f32, attn_factor: f32) -> f32 {
    if y.ext_factor == 0.0 {
        return attn_factor;
    }
    let mscale = |scale: f32, m: f32| -> f32 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1f32 * m * scale.ln() + 1.0
        }
    };
    let factor = 1.0 / freq_scale;
    let mut f = if y.log_mul != 0.0 {
        let m = if y.mscale_is_log_mul && y.log_mul != 1.0 {
            y.log_mul
        } else {
            1.0
        };
        mscale(factor, m) / mscale(factor, y.log_mul)
    } else {
        mscale(factor, 1.0)
    };
    f *= 1.0 / (1.0 + 0.1f32 * factor.ln());
    f * attn_factor
}

/// Bytes of weight matrices a decode step streams, read from the file's tensor table: one entry
/// per layer, and the LM head. A mixture of experts streams its router and, on average, the
/// used share of its experts. The planner prices a step's memory traffic with these figures.
pub fn streamed_bytes(file: &strata_gguf::GgufFile, cfg: &ModelConfig) -> (Vec<u64>, u64) {
    matrix_sizes(file, cfg, true, |t| (t.n_rows() * t.row_bytes()) as u64)
}

/// Weights of the matrices a decode step uses for each row, per layer and the LM head (of a
/// mixture, the used share of its experts): the multiply-adds a row costs, whatever the
/// weights' types. A batched step on a CPU is bound by these, not by the bytes.
pub fn streamed_params(file: &strata_gguf::GgufFile, cfg: &ModelConfig) -> (Vec<u64>, u64) {
    matrix_sizes(file, cfg, true, |t| (t.n_rows() * t.row_len()) as u64)
}

/// Bytes of weight matrices a shard holding every layer keeps in memory (all experts of a
/// mixture), per layer, and the LM head.
pub fn held_bytes(file: &strata_gguf::GgufFile, cfg: &ModelConfig) -> (Vec<u64>, u64) {
    matrix_sizes(file, cfg, false, |t| (t.n_rows() * t.row_bytes()) as u64)
}

/// `size` of each layer's weight matrices and of the LM head; of a mixture's experts, with
/// `per_token`, the share a token uses.
fn matrix_sizes(
    file: &strata_gguf::GgufFile,
    cfg: &ModelConfig,
    per_token: bool,
    size: impl Fn(&strata_gguf::TensorInfo) -> u64,
) -> (Vec<u64>, u64) {
    let bytes = |name: &str| file.tensor(name).map_or(0, &size);
    const MATRICES: [&str; 18] = [
        "attn_q",
        "attn_q_a",
        "attn_q_b",
        "attn_kv_a_mqa",
        "attn_k_b",
        "attn_v_b",
        "attn_k",
        "attn_v",
        "attn_qkv",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
        "ffn_gate_inp",
        "ffn_gate_inp_shexp",
        "ffn_gate_shexp",
        "ffn_up_shexp",
        "ffn_down_shexp",
    ];
    const EXPERTS: [&str; 3] = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];
    let layers = (0..cfg.n_layer)
        .map(|l| {
            let dense: u64 = MATRICES
                .iter()
                .map(|s| bytes(&format!("blk.{l}.{s}.weight")))
                .sum();
            let experts: u64 = EXPERTS
                .iter()
                .map(|s| bytes(&format!("blk.{l}.{s}.weight")))
                .sum();
            let experts = match (per_token, cfg.moe) {
                (true, Some(m)) => experts * m.n_used as u64 / m.n_expert as u64,
                _ => experts,
            };
            dense + experts
        })
        .collect();
    let head = if cfg.tied_embeddings {
        bytes("token_embd.weight")
    } else {
        bytes("output.weight")
    };
    (layers, head)
}
