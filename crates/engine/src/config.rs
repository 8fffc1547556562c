//! Model hyper-parameters read from GGUF metadata.

use strata_gguf::GgufFile;

use crate::{Error, Result};

/// The decoder architectures the engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama and its relatives (SmolLM2): RMSNorm, RoPE on adjacent pairs, SwiGLU.
    Llama,
    /// Gemma 3: scaled embeddings, per-head Q/K norms, NEOX RoPE with a separate base for
    /// sliding-window layers, norms after attention and FFN, GeGLU.
    Gemma3,
}

/// Hyper-parameters of a Llama-family decoder.
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
}

impl ModelConfig {
    /// Whether layer `il` uses the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa
            .as_ref()
            .is_some_and(|w| w.pattern == 0 || il % w.pattern < w.pattern - 1)
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
}

impl ModelConfig {
    /// Reads the configuration of the model in `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let md = file.metadata();
        let arch = md.get_str("general.architecture")?.to_string();
        let kind = match arch.as_str() {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            _ => return Err(Error::UnsupportedArchitecture(arch)),
        };
        let key = |k: &str| format!("{arch}.{k}");
        let n_embd = md.get_u32(&key("embedding_length"))? as usize;
        let n_head = md.get_u32(&key("attention.head_count"))? as usize;
        let n_head_kv = match md.get(&key("attention.head_count_kv")) {
            Some(_) => md.get_u32(&key("attention.head_count_kv"))? as usize,
            None => n_head,
        };
        let opt_u32 = |k: &str| -> Result<Option<usize>> {
            match md.get(&key(k)) {
                Some(_) => Ok(Some(md.get_u32(&key(k))? as usize)),
                None => Ok(None),
            }
        };
        let key_length = opt_u32("attention.key_length")?;
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
        if head_dim == 0
            || head_dim > 4096
            || opt_u32("attention.value_length")?.is_some_and(|v| v != head_dim)
        {
            return Err(Error::InvalidModel(format!(
                "head width {head_dim} is unsupported (keys and values must be equally wide)"
            )));
        }
        let rope_dims = match md.get(&key("rope.dimension_count")) {
            Some(_) => md.get_u32(&key("rope.dimension_count"))? as usize,
            None => head_dim,
        };
        let rope_base = match md.get(&key("rope.freq_base")) {
            Some(_) => md.get_f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let embd = file.require_tensor("token_embd.weight")?;
        let n_vocab = embd.n_rows();
        let cfg = ModelConfig {
            n_layer: md.get_u32(&key("block_count"))? as usize,
            n_embd,
            n_ff: md.get_u32(&key("feed_forward_length"))? as usize,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train: md.get_u32(&key("context_length"))? as usize,
            rms_eps: md.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_base,
            rope_dims,
            tied_embeddings: file.tensor("output.weight").is_none(),
            embed_scale: (kind == Arch::Gemma3).then(|| (n_embd as f32).sqrt()),
            query_scale: (kind == Arch::Gemma3).then(|| 1.0 / (head_dim as f32).sqrt()),
            rope_neox: kind == Arch::Gemma3,
            swa: match (kind, opt_u32("attention.sliding_window")?) {
                (Arch::Gemma3, Some(window)) if window > 0 => Some(SlidingWindow {
                    window,
                    pattern: opt_u32("attention.sliding_window_pattern")?.unwrap_or(6),
                    rope_base: match md.get(&key("rope.freq_base_swa")) {
                        Some(_) => md.get_f32(&key("rope.freq_base_swa"))?,
                        None => 10_000.0,
                    },
                }),
                _ => None,
            },
            kind,
            arch,
        };
        // Every layer has at least nine tensors; a count beyond that is a corrupt header, and
        // must be refused before anything is sized by it.
        if cfg.n_layer == 0 || cfg.n_layer > file.tensors().len() / 9 {
            return Err(Error::InvalidModel(format!(
                "block count {} does not match the file's {} tensors",
                cfg.n_layer,
                file.tensors().len()
            )));
        }
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
        if rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(Error::InvalidModel(format!(
                "rope dimension count {rope_dims} does not fit head width {head_dim}"
            )));
        }
        Ok(cfg)
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}

/// Bytes of weight matrices a decode step streams, read from the file's tensor table: one entry
/// per layer, and the LM head. Planners balance shards with these figures.
pub fn streamed_bytes(file: &strata_gguf::GgufFile, cfg: &ModelConfig) -> (Vec<u64>, u64) {
    let bytes = |name: &str| {
        file.tensor(name)
            .map_or(0, |t| (t.n_rows() * t.row_bytes()) as u64)
    };
    const MATRICES: [&str; 7] = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    let layers = (0..cfg.n_layer)
        .map(|l| {
            MATRICES
                .iter()
                .map(|s| bytes(&format!("blk.{l}.{s}.weight")))
                .sum()
        })
        .collect();
    let head = if cfg.tied_embeddings {
        bytes("token_embd.weight")
    } else {
        bytes("output.weight")
    };
    (layers, head)
}
