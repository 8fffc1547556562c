//! What the planner takes in and gives back: the facts of a model, the nodes and links of a
//! cluster as measured, the request, the load a step carries, and the placement or the reason
//! there is none. Serialised between nodes and in `strata plan --json`, so fields only ever
//! gain defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_engine::ModelConfig;
use strata_gguf::GgufFile;

/// Memory a rank needs beyond its share of weights and cache (binary, buffers, tokenizer).
pub(crate) const NODE_OVERHEAD: u64 = 64 << 20;

/// What the planner needs to know about a model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelFacts {
    /// Display name.
    pub name: String,
    /// Bytes of weights held in memory (all layers, every expert, and the LM head).
    pub weight_bytes: u64,
    /// Bytes of weights read per decoded token: the held bytes for a dense model; a mixture of
    /// experts reads only its used experts (0 in facts from older nodes: the held bytes).
    #[serde(default)]
    pub token_bytes: u64,
    /// A mixture of experts (older nodes: dense).
    #[serde(default)]
    pub moe: bool,
    /// Experts per MoE layer (0 for a dense model).
    #[serde(default)]
    pub n_expert: usize,
    /// Experts each token uses (0 for a dense model).
    #[serde(default)]
    pub n_used: usize,
    /// Of which the LM head.
    pub head_bytes: u64,
    /// Of the held bytes, a mixture's routed experts (0 for a dense model, and in facts from
    /// older nodes).
    #[serde(default)]
    pub expert_bytes: u64,
    /// Weights, counted (0 in facts from older nodes).
    #[serde(default)]
    pub params: u64,
    /// Weights a token uses: all of a dense model's, a mixture's shared parts and chosen
    /// experts (0 in facts from older nodes).
    #[serde(default)]
    pub token_params: u64,
    /// Of `token_params`, the LM head's: a decode step multiplies every row by it, a prefill
    /// chunk only the row whose logits it wants (0 from older nodes: priced as every row's).
    #[serde(default)]
    pub head_params: u64,
    /// The LM head's weight type, ggml's name (empty: unknown, priced at the node's one rate).
    #[serde(default)]
    pub head_type: String,
    /// Of `token_params` but the head's, how many in each weight type (ggml's names; a
    /// mixture's experts counted at the share a token uses): each is priced at its own type's
    /// measured rate, which differ by up to 2x (empty for cards and facts from older nodes:
    /// all at the node's one rate).
    #[serde(default)]
    pub token_params_by_type: BTreeMap<String, f64>,
    /// KV-cache bytes per context position, whole model.
    pub kv_bytes_per_token: u64,
    /// Decoder layers.
    pub n_layer: usize,
    /// Query heads (the most tensor-parallel ranks a stage can have).
    pub n_head: usize,
    /// Model width.
    pub n_embd: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Attention output width (query heads x head width).
    pub q_width: usize,
    /// The context a request that names none gets (the trained one, at most 8192), as
    /// `serve` and `run` use.
    #[serde(default)]
    pub default_context: usize,
}

impl ModelFacts {
    /// Bytes read per decoded token.
    pub fn read_per_token(&self) -> f64 {
        if self.token_bytes == 0 {
            self.weight_bytes as f64
        } else {
            self.token_bytes as f64
        }
    }

    /// Weights a token uses, for its FLOPs (two per weight); facts without the count take
    /// one weight per byte read, the rate of an 8-bit model.
    pub fn active_params(&self) -> f64 {
        if self.token_params == 0 {
            self.read_per_token()
        } else {
            self.token_params as f64
        }
    }

    /// Facts read from a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> strata_engine::Result<ModelFacts> {
        let cfg = ModelConfig::from_gguf(file)?;
        // Memory holds every expert of a mixture, not just the ones a token uses.
        let (layers, head) = strata_engine::held_bytes(file, &cfg);
        let layers: u64 = layers.iter().sum();
        let (read, _) = strata_engine::streamed_bytes(file, &cfg);
        let read: u64 = read.iter().sum();
        // Weights counted from the tensor shapes: a token multiplies by every matrix but the
        // embedding table (one row looked up, unless it doubles as the LM head) and, of a
        // mixture's routed experts, the chosen share.
        let used = cfg
            .moe
            .map_or(1.0, |m| m.n_used as f64 / m.n_expert.max(1) as f64);
        let tied = file.tensor("output.weight").is_none();
        let head_name = if tied {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        let (mut params, mut token_params, mut expert_bytes) = (0u64, 0.0f64, 0u64);
        let (mut head_params, mut head_type) = (0u64, String::new());
        let mut by_type: BTreeMap<String, f64> = BTreeMap::new();
        for t in file.tensors() {
            let n = t.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d));
            params = params.saturating_add(n);
            let (used_here, is_head) = if t.name.contains("_exps") {
                expert_bytes = expert_bytes.saturating_add(t.n_bytes);
                (n as f64 * used, false)
            } else if t.name == head_name {
                (n as f64, true)
            } else if t.name != "token_embd.weight" {
                (n as f64, false)
            } else {
                continue;
            };
            token_params += used_here;
            if is_head {
                head_params = n;
                head_type = t.ggml_type.name().to_string();
            } else if t.dims.len() >= 2 {
                // Norm vectors and biases are not multiplied as matrices.
                *by_type.entry(t.ggml_type.name().to_string()).or_default() += used_here;
            }
        }
        Ok(ModelFacts {
            name: file
                .metadata()
                .get_str("general.name")
                .unwrap_or("model")
                .to_string(),
            weight_bytes: layers + head,
            token_bytes: read + head,
            moe: cfg.moe.is_some(),
            n_expert: cfg.moe.map_or(0, |m| m.n_expert),
            n_used: cfg.moe.map_or(0, |m| m.n_used),
            head_bytes: head,
            expert_bytes,
            params,
            token_params: token_params as u64,
            head_params,
            head_type,
            token_params_by_type: by_type,
            // strata keeps keys and values as f16, as llama.cpp's default cache does.
            kv_bytes_per_token: (2
                * cfg.n_layer
                * cfg.n_head_kv
                * (cfg.head_dim + cfg.cache_v_dim())) as u64,
            n_layer: cfg.n_layer,
            n_head: cfg.n_head,
            n_embd: cfg.n_embd,
            n_ff: cfg.n_ff,
            q_width: cfg.attn_out_width(),
            default_context: cfg.default_context(),
        })
    }
}

/// A node as measured (or, for hardware not at hand, as its class is known to perform).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Stable node id.
    pub id: String,
    /// Memory the node can give to models, bytes.
    pub memory_available: u64,
    /// Measured memory read bandwidth, bytes per second: what decoding runs at.
    pub mem_bandwidth: f64,
    /// Matrix-multiply throughput a prefill reaches, FLOP/s (0: unknown, and no prefill
    /// prediction).
    #[serde(default)]
    pub flops: f64,
    /// Measured matrix-multiply throughput per weight type (ggml's names), FLOP/s; a type
    /// missing here runs at `flops`.
    #[serde(default)]
    pub flops_by_type: BTreeMap<String, f64>,
    /// Attention's throughput over the KV cache, FLOP/s of the part that grows with the
    /// positions read (0: at `flops`).
    #[serde(default)]
    pub attn_flops: f64,
    /// Attention's fixed part, seconds per query head per decoded row per layer: what a pass
    /// costs before it reads a position, most of attention at a chat turn's short context
    /// (0: unknown, none).
    #[serde(default)]
    pub attn_fixed: f64,
    /// What a decoded row costs beyond its matrix products and attention's depth, seconds per
    /// row, per layer, per element of the layer's widths (model, FFN, attention output): the
    /// key/value store, norms, RoPE, quantising, gating, attention's fixed part. Measured by
    /// timing the engine itself; it replaces `attn_fixed`, which it includes (0: unknown,
    /// `attn_fixed` alone). Serial work beside the products, so it adds to a step whether
    /// memory or compute bounds them; charged per sequence a step advances (a prefill chunk's
    /// rows share their cache lines).
    #[serde(default)]
    pub row_cost: f64,
    /// Weights per second the node's matmul kernels take in per weight type (ggml's names)
    /// at one activation row, streaming them from memory: where the kernels, not the memory,
    /// bound a single stream's decode (a type missing here, and every type when empty: the
    /// bandwidth alone).
    #[serde(default)]
    pub stream_by_type: BTreeMap<String, f64>,
    /// The machine the node runs on (empty: its own). Nodes on one machine share its memory
    /// bus: working at once, they read at most `machine_bandwidth` together.
    #[serde(default)]
    pub machine: String,
    /// The machine's memory read bandwidth with every core reading, bytes per second (0:
    /// unknown, the node's own figure stands).
    #[serde(default)]
    pub machine_bandwidth: f64,
    /// What every exchange costs this node per peer beyond the link itself, seconds: posting
    /// a message and noticing its arrival (microseconds on a CPU spinning on shared memory,
    /// tens of microseconds where a GPU must finish its queued work first).
    #[serde(default)]
    pub message_overhead: f64,
    /// Power drawn while serving, watts (0: unknown).
    #[serde(default)]
    pub power_watts: f64,
    /// Accelerators inside the node working as one tensor-parallel group over their own
    /// fabric (0 or 1: one); their exchanges cost `message_overhead` per peer each.
    #[serde(default)]
    pub devices: usize,
}

impl Node {
    /// Matrix-multiply throughput on weights of type `ty` (ggml's name), FLOP/s.
    pub(super) fn rate(&self, ty: &str) -> f64 {
        self.flops_by_type
            .get(ty)
            .copied()
            .filter(|r| *r > 0.0)
            .unwrap_or(self.flops)
    }

    /// Attention's throughput, FLOP/s.
    pub(super) fn attention_rate(&self) -> f64 {
        if self.attn_flops > 0.0 {
            self.attn_flops
        } else {
            self.flops
        }
    }
}

/// A measured link between two nodes (symmetric).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
    /// One-way latency, seconds.
    pub latency: f64,
    /// Bandwidth, bytes per second.
    pub bandwidth: f64,
}

/// The kind of parallelism of a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyChoice {
    /// One node.
    Single,
    /// Every node on every layer.
    Tensor,
    /// Each node a range of layers.
    Pipeline,
    /// Pipeline stages of `tp` tensor-parallel nodes.
    Hybrid {
        /// Nodes per stage.
        tp: usize,
    },
    /// A mixture of experts split by expert across the nodes (attention tensor-parallel).
    Expert,
}

impl StrategyChoice {
    /// The strategy in plain words, on `n` nodes.
    pub fn describe(self, n: usize) -> String {
        match self {
            StrategyChoice::Single => "one node".into(),
            StrategyChoice::Tensor => format!("tensor parallel over {n} nodes"),
            StrategyChoice::Pipeline => format!("a pipeline of {n} nodes"),
            StrategyChoice::Hybrid { tp } => format!(
                "a pipeline of {} stages, each {tp} nodes tensor parallel",
                n / tp.max(1)
            ),
            StrategyChoice::Expert => format!("experts split over {n} nodes"),
        }
    }

    /// The strategy's name as `--strategy` spells it.
    pub fn name(self) -> &'static str {
        match self {
            StrategyChoice::Single => "single",
            StrategyChoice::Tensor => "tensor",
            StrategyChoice::Pipeline => "pipeline",
            StrategyChoice::Hybrid { .. } => "hybrid",
            StrategyChoice::Expert => "expert",
        }
    }
}

/// How a tensor-parallel group puts its partial results together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Combine {
    /// Row-parallel projections and four all-gathers a layer: bit for bit one process's
    /// output (what strata's cluster loads use).
    #[default]
    Gather,
    /// Partial sums and two all-reduces a layer (as vLLM and MLX do): half the exchanges.
    Reduce,
}

impl Combine {
    /// Exchanges per layer of a tensor-parallel group.
    pub fn exchanges_per_layer(self) -> usize {
        match self {
            Combine::Gather => 4,
            Combine::Reduce => 2,
        }
    }
}

/// What is asked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Context positions of each sequence's KV cache.
    pub context: usize,
    /// Sequences the instance decodes together, each reserving a KV cache of `context`
    /// positions up front (as an instance's slots do; older requests and 0: one).
    #[serde(default)]
    pub sequences: usize,
    /// Bytes of prefix cache the instance may keep over all its nodes (older requests: none).
    #[serde(default)]
    pub prefix_cache: u64,
    /// How tensor-parallel groups combine their results (older requests: gather).
    #[serde(default)]
    pub combine: Combine,
    /// Force a strategy (default: the fastest predicted).
    pub strategy: Option<StrategyChoice>,
    /// Use exactly these nodes (default: the fastest predicted set; more nodes only where
    /// clearly faster, see [`SPLIT_MARGIN`](super::SPLIT_MARGIN)).
    pub nodes: Option<Vec<String>>,
    /// Use the fewest nodes that hold the model (the fastest set of that size), however much
    /// faster more would be: what `strata plan` shows a buyer as the smallest cluster.
    #[serde(default)]
    pub fewest: bool,
}

impl Request {
    /// Bytes of cache the instance reserves over all its nodes: every sequence's KV cache
    /// for the whole context, and the prefix cache's budget.
    pub fn cache_bytes(&self, m: &ModelFacts) -> f64 {
        m.kv_bytes_per_token as f64 * self.context as f64 * self.sequences.max(1) as f64
            + self.prefix_cache as f64
    }
}

/// The planner's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// Nodes in rank order (rank 0 first; stage by stage for a hybrid).
    pub nodes: Vec<String>,
    /// The parallelism.
    pub strategy: StrategyChoice,
    /// How its tensor-parallel groups combine results (older placements: gather).
    #[serde(default)]
    pub combine: Combine,
    /// Each rank's relative share of the work.
    pub weights: Vec<f64>,
    /// Predicted single-stream decode speed, tokens per second.
    pub predicted_decode_tok_s: f64,
    /// Every strategy considered for these nodes, with its prediction.
    pub considered: Vec<(StrategyChoice, f64)>,
    /// Why this placement, in words.
    pub explanation: String,
}

/// Why no placement exists.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    /// The cluster has no nodes.
    #[error("the cluster has no nodes")]
    NoNodes,
    /// A node named in the request is not in the cluster.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// Not enough memory, even on every node together.
    #[error(
        "{model} needs {} (weights, KV and prefix caches, per-node overhead), the nodes offer {}: {} missing",
        gb(*needed), gb(*available), gb(*missing)
    )]
    DoesNotFit {
        /// The model.
        model: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        available: u64,
        /// The difference.
        missing: u64,
    },
    /// The forced strategy cannot run on these nodes.
    #[error("{0}")]
    Infeasible(String),
}

/// Bytes in decimal gigabytes, as memory is sold.
fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// The work of one step: `streams` tokens (sequences decoding together, or a prefill chunk)
/// whose attention reads `depth` cached positions each, from `sequences` independent
/// sequences.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Tokens the step computes (sequences decoding together, or a prefill chunk's tokens).
    pub streams: usize,
    /// Cached positions each token's attention reads.
    pub depth: usize,
    /// Independent sequences among the tokens: a pipeline overlaps different sequences'
    /// steps, never one sequence's (its next chunk waits for this one).
    pub sequences: usize,
    /// Rows whose logits the step computes (through the LM head): every row of a decode
    /// step, one of a prefill chunk (at most `streams`).
    pub logits: usize,
}

impl Load {
    /// One stream at the start of its context: what single-stream decode predictions use.
    pub const ONE: Load = Load {
        streams: 1,
        depth: 0,
        sequences: 1,
        logits: 1,
    };
}
