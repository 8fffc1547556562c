//! The placement planner: given a model and the measured cluster, choose the nodes, the kind of
//! parallelism and the split, and predict the decode speed. Pure and deterministic: the same
//! inputs (in any order) give the same placement.
//!
//! The cost model is the one decoding obeys: a token streams every weight byte once, so a rank's
//! compute time is its share of the bytes over its node's measured memory bandwidth; tensor
//! parallelism adds, per layer, four exchanges (gather style) whose cost is the link latency plus
//! the bytes over the link bandwidth; a pipeline adds one hand-off per stage per token and runs
//! the stages one after another. Shares follow measured speed, capped by each node's memory
//! (water-filling), so a slow node gets less work instead of dragging the instance down.

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
    fn rate(&self, ty: &str) -> f64 {
        self.flops_by_type
            .get(ty)
            .copied()
            .filter(|r| *r > 0.0)
            .unwrap_or(self.flops)
    }

    /// Attention's throughput, FLOP/s.
    fn attention_rate(&self) -> f64 {
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
    /// clearly faster, see [`SPLIT_MARGIN`]).
    pub nodes: Option<Vec<String>>,
    /// Use the fewest nodes that hold the model (the fastest set of that size), however much
    /// faster more would be: what `strata plan` shows a buyer as the smallest cluster.
    #[serde(default)]
    pub fewest: bool,
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

struct Cluster<'a> {
    nodes: BTreeMap<&'a str, &'a Node>,
    links: BTreeMap<(&'a str, &'a str), &'a Link>,
}

impl<'a> Cluster<'a> {
    fn new(nodes: &'a [Node], links: &'a [Link]) -> Cluster<'a> {
        let mut l = BTreeMap::new();
        for link in links {
            let key = if link.a <= link.b {
                (link.a.as_str(), link.b.as_str())
            } else {
                (link.b.as_str(), link.a.as_str())
            };
            l.insert(key, link);
        }
        Cluster {
            nodes: nodes.iter().map(|n| (n.id.as_str(), n)).collect(),
            links: l,
        }
    }

    /// Latency and bandwidth between two nodes; an unmeasured link counts as very slow.
    fn link(&self, a: &str, b: &str) -> (f64, f64) {
        let key = if a <= b { (a, b) } else { (b, a) };
        self.links
            .get(&key)
            .map_or((1.0, 1e6), |l| (l.latency, l.bandwidth))
    }
}

impl Request {
    /// Bytes of cache the instance reserves over all its nodes: every sequence's KV cache
    /// for the whole context, and the prefix cache's budget.
    pub fn cache_bytes(&self, m: &ModelFacts) -> f64 {
        m.kv_bytes_per_token as f64 * self.context as f64 * self.sequences.max(1) as f64
            + self.prefix_cache as f64
    }
}

/// Bytes a node needs for `share` of the model with `cache` bytes of cache over all nodes.
fn need(m: &ModelFacts, share: f64, cache: f64) -> u64 {
    let total = m.weight_bytes as f64 + cache;
    // A float beyond u64 saturates in the cast; the sum saturates too, so an absurd context
    // reads as "needs more than there is", never wraps to a small number.
    ((share * total).ceil() as u64).saturating_add(NODE_OVERHEAD)
}

/// Shares proportional to bandwidth, each capped by what the node's memory can hold
/// (water-filling); `None` if the nodes cannot hold the model together.
fn shares(m: &ModelFacts, nodes: &[&Node], cache: f64) -> Option<Vec<f64>> {
    let total = m.weight_bytes as f64 + cache;
    let cap: Vec<f64> = nodes
        .iter()
        .map(|n| (n.memory_available.saturating_sub(NODE_OVERHEAD)) as f64 / total)
        .collect();
    let mut share = vec![0.0; nodes.len()];
    let mut fixed = vec![false; nodes.len()];
    let mut left = 1.0f64;
    loop {
        let free_bw: f64 = (0..nodes.len())
            .filter(|&i| !fixed[i])
            .map(|i| nodes[i].mem_bandwidth)
            .sum();
        if free_bw <= 0.0 {
            return (left <= 1e-9).then_some(share);
        }
        let mut capped = false;
        for i in 0..nodes.len() {
            if !fixed[i] {
                let s = left * nodes[i].mem_bandwidth / free_bw;
                if s > cap[i] {
                    share[i] = cap[i];
                    fixed[i] = true;
                    capped = true;
                }
            }
        }
        if capped {
            left = 1.0 - share.iter().sum::<f64>();
            if left < -1e-9 {
                return None;
            }
            continue;
        }
        for i in 0..nodes.len() {
            if !fixed[i] {
                share[i] = left * nodes[i].mem_bandwidth / free_bw;
            }
        }
        return Some(share);
    }
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

/// Prices steps of one placement: the model, the cluster, how tensor groups combine.
struct Cost<'c, 'a> {
    c: &'c Cluster<'a>,
    m: &'c ModelFacts,
    combine: Combine,
}

impl Cost<'_, '_> {
    /// Weight bytes one step of `streams` tokens reads, whole model: the shared parts once,
    /// and of a mixture's experts those any token picked (`1 - (1 - used/experts)^streams`
    /// of them, routing taken as uniform).
    fn step_bytes(&self, streams: usize) -> f64 {
        let m = self.m;
        let read = m.read_per_token();
        if m.expert_bytes == 0 || m.n_expert == 0 {
            return read;
        }
        let p = m.n_used as f64 / m.n_expert as f64;
        let experts = m.expert_bytes as f64;
        let fixed = (read - experts * p).max(0.0);
        fixed + experts * (1.0 - (1.0 - p).powi(streams.min(1 << 20) as i32))
    }

    /// Seconds `node` takes for `frac` of the model's work on `load`: bound by its memory
    /// bandwidth (weights and cache read) or its compute, whichever is slower.
    fn compute(&self, node: &Node, frac: f64, layers: f64, load: Load) -> f64 {
        let m = self.m;
        // A node of several devices splits its work among them and combines, as a
        // tensor-parallel group does, over a fabric whose latency its overhead covers.
        let inside = if node.devices > 1 {
            let per_layer = self.combine.exchanges_per_layer() as f64;
            per_layer
                * layers
                * m.n_layer as f64
                * (node.devices - 1) as f64
                * node.message_overhead
        } else {
            0.0
        };
        let n = load.streams as f64;
        let kv = m.kv_bytes_per_token as f64 * load.depth as f64 * n;
        // Every weight passes through the kernels once a step: at the memory's pace, or at
        // the kernels' own where they take weights in slower than memory delivers them.
        let weights = (self.step_bytes(load.streams) / node.mem_bandwidth).max(self.stream(node));
        let mem = frac * (weights + kv / node.mem_bandwidth);
        // A decode row pays `row_cost` in full (its sequence's cache lines are cold); a
        // prefill chunk's rows share theirs, and pay it once.
        let width = (m.n_embd + m.n_ff + m.q_width) as f64;
        let cold = load.sequences.clamp(1, load.streams.max(1)) as f64;
        let rows = frac * cold * m.n_layer as f64 * width * node.row_cost;
        if node.flops <= 0.0 {
            return mem + inside + rows;
        }
        // Two FLOPs per weight a token uses, each matrix at its weight type's rate; the LM
        // head only for the rows whose logits the step wants; attention's two products over
        // the cache at attention's rate, and its fixed part per head (within `row_cost` where
        // that was measured).
        let head = m.head_params as f64;
        let body = if m.token_params_by_type.is_empty() {
            2.0 * (m.active_params() - head).max(0.0) / node.flops
        } else {
            m.token_params_by_type
                .iter()
                .map(|(ty, p)| 2.0 * p / node.rate(ty))
                .sum()
        };
        let head = 2.0 * head / node.rate(&m.head_type);
        let fixed = if node.row_cost > 0.0 {
            0.0
        } else {
            node.attn_fixed
        };
        let attn = 4.0 * (m.q_width * m.n_layer) as f64 * load.depth as f64 / node.attention_rate()
            + (m.n_head * m.n_layer) as f64 * fixed;
        let logits = load.logits.min(load.streams) as f64;
        let comp = frac * (n * (body + attn) + logits * head);
        mem.max(comp) + inside + rows
    }

    /// Seconds the node's kernels take to stream one token's weights at one row, at each
    /// type's measured rate (0 where nothing was measured: memory bounds it).
    fn stream(&self, node: &Node) -> f64 {
        let m = self.m;
        let rate = |ty: &str| node.stream_by_type.get(ty).copied().filter(|r| *r > 0.0);
        let body: f64 = m
            .token_params_by_type
            .iter()
            .filter_map(|(ty, p)| rate(ty).map(|r| p / r))
            .sum();
        body + rate(&m.head_type).map_or(0.0, |r| m.head_params as f64 / r)
    }

    /// Seconds of one exchange among `group` carrying `bytes` from each rank: the slowest
    /// link's latency and transfer, plus each node's per-peer overhead.
    fn exchange(&self, group: &[&Node], bytes: f64) -> f64 {
        let k = group.len();
        let overhead = group.iter().map(|n| n.message_overhead).fold(0.0, f64::max);
        let mut worst = 0.0f64;
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                let (lat, bw) = self.c.link(&a.id, &b.id);
                worst = worst.max(lat + bytes / bw);
            }
        }
        worst + (k - 1) as f64 * overhead
    }

    /// Seconds of one tensor-parallel group doing `layers` (a fraction) of every layer.
    fn tensor(&self, group: &[&Node], shares: &[f64], layers: f64, load: Load) -> f64 {
        let m = self.m;
        let sum: f64 = shares.iter().sum();
        let compute = group
            .iter()
            .zip(shares)
            .map(|(n, s)| self.compute(n, s / sum * layers, layers, load))
            .fold(0.0, f64::max);
        if group.len() == 1 {
            return compute;
        }
        let k = group.len() as f64;
        let n = load.streams as f64;
        // Gather: each rank sends its block of every layer's four products to every other
        // rank. Reduce: each all-reduce moves 2(k-1)/k of the model width (a ring).
        let (exchanges, bytes) = match self.combine {
            Combine::Gather => (
                4.0,
                4.0 * n * (m.q_width + m.n_ff + 2 * m.n_embd) as f64 / 4.0 * (k - 1.0) / k,
            ),
            Combine::Reduce => (2.0, 4.0 * n * m.n_embd as f64 * 2.0 * (k - 1.0) / k),
        };
        compute + exchanges * layers * m.n_layer as f64 * self.exchange(group, bytes)
    }

    /// Seconds of expert parallelism over `group`: each rank reads its share of the
    /// per-token bytes (the attention and dense parts split as under tensor parallelism, the
    /// experts by count), and every layer makes three exchanges (the attention heads', the
    /// model width's, and the all-gather of the chosen experts' outputs: `n_used` model-width
    /// rows per token, plus the shared expert's row).
    fn expert(&self, group: &[&Node], shares: &[f64], load: Load) -> f64 {
        let m = self.m;
        let sum: f64 = shares.iter().sum();
        let compute = group
            .iter()
            .zip(shares)
            .map(|(n, s)| self.compute(n, s / sum, 1.0, load))
            .fold(0.0, f64::max);
        if group.len() == 1 {
            return compute;
        }
        let k = group.len() as f64;
        let rows = (m.n_used + 1) as f64;
        let bytes = 4.0 * load.streams as f64 * (m.q_width as f64 + (1.0 + rows) * m.n_embd as f64)
            / 3.0
            * (k - 1.0)
            / k;
        compute + 3.0 * m.n_layer as f64 * self.exchange(group, bytes)
    }

    /// Predicted seconds of one step of `strategy` over `nodes` (rank order) with `weights`.
    /// A pipeline steps its sequences in up to one group per stage, which follow each other
    /// through the stages and keep them all busy (see the end).
    fn step(&self, nodes: &[&Node], strategy: StrategyChoice, weights: &[f64], load: Load) -> f64 {
        let tp = match strategy {
            StrategyChoice::Single => return self.compute(nodes[0], 1.0, 1.0, load),
            StrategyChoice::Tensor => nodes.len(),
            StrategyChoice::Pipeline => 1,
            StrategyChoice::Hybrid { tp } => tp.max(1),
            StrategyChoice::Expert => {
                let shared = shared_bus(nodes);
                let nodes: Vec<&Node> = shared.iter().collect();
                return self.expert(&nodes, weights, load);
            }
        };
        let n_stages = (nodes.len() / tp).max(1);
        let in_flight = load.sequences.min(load.streams).clamp(1, n_stages);
        // Ranks that work at the same time share their machines' memory buses: a tensor group
        // always, a pipeline's stages while several groups are in flight (one stream's trip
        // takes the stages in turn, each with the bus to itself).
        let shared;
        let concurrent: Vec<&Node>;
        let nodes = if tp > 1 || in_flight > 1 {
            shared = shared_bus(nodes);
            concurrent = shared.iter().collect();
            &concurrent[..]
        } else {
            nodes
        };
        let micro = Load {
            streams: load.streams.div_ceil(in_flight),
            depth: load.depth,
            sequences: load.sequences.div_ceil(in_flight),
            logits: load.logits.div_ceil(in_flight),
        };
        let total_w: f64 = weights.iter().sum();
        let mut stages = Vec::with_capacity(n_stages);
        for s in 0..n_stages {
            let group = &nodes[s * tp..(s + 1) * tp];
            let w = &weights[s * tp..(s + 1) * tp];
            let frac = w.iter().sum::<f64>() / total_w;
            stages.push(self.tensor(group, w, frac, micro));
        }
        if n_stages == 1 {
            return stages[0];
        }
        // Hand-offs: hidden state to each next stage, candidates back to rank 0 (priced as
        // a hidden row).
        let hidden = (4 * self.m.n_embd * micro.streams) as f64;
        let hand: Vec<f64> = (0..n_stages)
            .map(|s| {
                let a = nodes[s * tp];
                let b = nodes[((s + 1) % n_stages) * tp];
                self.exchange(&[a, b], hidden)
            })
            .collect();
        // The scheduler steps the sequences in one group per stage, each group submitted
        // again as soon as its rows are sampled: a stage takes the groups in turn, so the
        // busiest one bounds the rate (each group once per round), and so does one group's
        // trip through every stage and hand-off (it cannot start its next step before its
        // last is back). One stream is the trip alone.
        let busiest = stages.iter().fold(0.0f64, |a, &b| a.max(b));
        let trip: f64 = stages.iter().sum::<f64>() + hand.iter().sum::<f64>();
        trip.max(in_flight as f64 * busiest)
    }
}

/// `nodes` as they read memory working at once: nodes on one machine split its bandwidth with
/// every core reading (`machine_bandwidth`) in proportion to their own figures, where their
/// own figures add up to more.
fn shared_bus(nodes: &[&Node]) -> Vec<Node> {
    nodes
        .iter()
        .map(|n| {
            let mut n = (*n).clone();
            if n.machine.is_empty() || n.machine_bandwidth <= 0.0 {
                return n;
            }
            let together: f64 = nodes
                .iter()
                .filter(|o| o.machine == n.machine)
                .map(|o| o.mem_bandwidth)
                .sum();
            if together > n.machine_bandwidth {
                n.mem_bandwidth *= n.machine_bandwidth / together;
            }
            n
        })
        .collect()
}

/// Predicted decode tokens per second of a placement on a cluster.
pub fn predict_decode(
    model: &ModelFacts,
    nodes: &[Node],
    links: &[Link],
    placement: &Placement,
) -> Option<f64> {
    predict_step(model, nodes, links, placement, Load::ONE).map(|t| 1.0 / t)
}

/// Predicted seconds of one step of `load` on a placement (`None` if the placement names a
/// node the cluster lacks).
pub fn predict_step(
    model: &ModelFacts,
    nodes: &[Node],
    links: &[Link],
    placement: &Placement,
    load: Load,
) -> Option<f64> {
    let c = Cluster::new(nodes, links);
    let order: Option<Vec<&Node>> = placement
        .nodes
        .iter()
        .map(|id| c.nodes.get(id.as_str()).copied())
        .collect();
    let order = order?;
    let cost = Cost {
        c: &c,
        m: model,
        combine: placement.combine,
    };
    Some(cost.step(&order, placement.strategy, &placement.weights, load))
}

/// Groups of nodes joined by links fast enough for tensor parallelism to pay: connected
/// components over links whose latency is under `threshold`.
fn islands<'a>(c: &Cluster<'a>, nodes: &[&'a Node], threshold: f64) -> Vec<Vec<&'a Node>> {
    let mut seen = vec![false; nodes.len()];
    let mut out = Vec::new();
    for i in 0..nodes.len() {
        if seen[i] {
            continue;
        }
        let mut group = vec![i];
        seen[i] = true;
        let mut at = 0;
        while at < group.len() {
            let g = group[at];
            for j in 0..nodes.len() {
                if !seen[j] && c.link(&nodes[g].id, &nodes[j].id).0 < threshold {
                    seen[j] = true;
                    group.push(j);
                }
            }
            at += 1;
        }
        group.sort_unstable();
        out.push(group.into_iter().map(|k| nodes[k]).collect());
    }
    out
}

/// How much faster than the best placement on fewer nodes a placement on more must be
/// predicted to be to win: each node added is one more that can fail and more traffic, for a
/// prediction that may be off by this much.
pub const SPLIT_MARGIN: f64 = 1.15;

/// Candidate (strategy, rank order) pairs for a set of nodes.
fn candidates<'a>(
    c: &Cluster<'a>,
    m: &ModelFacts,
    nodes: &[&'a Node],
) -> Vec<(StrategyChoice, Vec<&'a Node>)> {
    if nodes.len() == 1 {
        return vec![(StrategyChoice::Single, nodes.to_vec())];
    }
    let mut out = Vec::new();
    if m.moe {
        // A mixture splits by layers, by experts, or by every expert's columns (each rank
        // needs a query head too).
        if nodes.len() <= m.n_layer {
            out.push((StrategyChoice::Pipeline, nodes.to_vec()));
        }
        if nodes.len() <= m.n_head.min(m.n_expert) {
            out.push((StrategyChoice::Expert, nodes.to_vec()));
        }
        if nodes.len() <= m.n_head {
            out.push((StrategyChoice::Tensor, nodes.to_vec()));
        }
        return out;
    }
    if nodes.len() <= m.n_head {
        out.push((StrategyChoice::Tensor, nodes.to_vec()));
    }
    if nodes.len() <= m.n_layer {
        out.push((StrategyChoice::Pipeline, nodes.to_vec()));
    }
    // Hybrid: tensor parallel inside groups of fast links, pipeline across them. Try the
    // latencies that separate the groups.
    let mut lats: Vec<f64> = Vec::new();
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            lats.push(c.link(&a.id, &b.id).0);
        }
    }
    lats.sort_by(f64::total_cmp);
    lats.dedup();
    for &threshold in &lats {
        let groups = islands(c, nodes, threshold * 1.000_001);
        let tp = groups[0].len();
        if groups.len() > 1
            && tp > 1
            && tp <= m.n_head
            && groups.len() <= m.n_layer
            && groups.iter().all(|g| g.len() == tp)
        {
            let order: Vec<&Node> = groups.into_iter().flatten().collect();
            if !out.iter().any(|(s, _)| *s == StrategyChoice::Hybrid { tp }) {
                out.push((StrategyChoice::Hybrid { tp }, order));
            }
        }
    }
    out
}

/// Chooses where and how to run `model` on the cluster.
pub fn place(
    model: &ModelFacts,
    nodes: &[Node],
    links: &[Link],
    req: &Request,
) -> Result<Placement, PlacementError> {
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    let c = Cluster::new(nodes, links);
    let cost = Cost {
        c: &c,
        m: model,
        combine: req.combine,
    };
    // Sorted by id: the input order never matters.
    let all: Vec<&Node> = c.nodes.values().copied().collect();
    let pool: Vec<&Node> = match &req.nodes {
        Some(ids) => {
            let mut v = Vec::new();
            for id in ids {
                let n = c
                    .nodes
                    .get(id.as_str())
                    .ok_or_else(|| PlacementError::UnknownNode(id.clone()))?;
                if !v.iter().any(|x: &&Node| x.id == n.id) {
                    v.push(*n);
                }
            }
            v.sort_by(|a, b| a.id.cmp(&b.id));
            v
        }
        None => all,
    };
    if let Some(s) = req.strategy
        && s != StrategyChoice::Single
        && pool.len() < 2
    {
        // Splitting needs somewhere to split to: say so rather than quietly run on one node.
        return Err(PlacementError::Infeasible(format!(
            "--strategy {} splits a model over two or more nodes, and {} has one ({}); \
             leave --strategy out to run it there, or describe more nodes",
            s.name(),
            if req.nodes.is_some() {
                "the --nodes list"
            } else {
                "the cluster"
            },
            pool[0].id
        )));
    }
    let available = pool
        .iter()
        .fold(0u64, |a, n| a.saturating_add(n.memory_available));
    let cache = req.cache_bytes(model);
    let needed_all = need(model, 1.0, cache);
    if shares(model, &pool, cache).is_none() {
        let extra = NODE_OVERHEAD.saturating_mul(pool.len().saturating_sub(1) as u64);
        let needed = needed_all.saturating_add(extra);
        return Err(PlacementError::DoesNotFit {
            model: model.name.clone(),
            needed,
            available,
            missing: needed.saturating_sub(available),
        });
    }
    // Among the sets of nodes that fit (all of the requested ones, if the request names them),
    // the fastest predicted; more nodes only where they are predicted clearly faster
    // ([`SPLIT_MARGIN`]) than the best of fewer, since every node added is one more that can
    // fail and more traffic for a prediction that may be off.
    // A forced multi-node strategy starts at two nodes: tensor parallel on one node is no
    // request anyone makes.
    let multi = req
        .strategy
        .is_some_and(|s| s != StrategyChoice::Single && pool.len() > 1);
    let sizes: Vec<usize> = if req.nodes.is_some() {
        vec![pool.len()]
    } else {
        (if multi { 2 } else { 1 }..=pool.len()).collect()
    };
    let mut best: Option<Placement> = None;
    let mut fewest: Option<(usize, f64)> = None;
    for k in sizes {
        let mut best_k: Option<Placement> = None;
        for set in subsets(&pool, k) {
            if shares(model, &set, cache).is_none() {
                continue;
            }
            for (strategy, order) in candidates(&c, model, &set) {
                if req.strategy.is_some_and(|s| s != strategy && set.len() > 1) {
                    continue;
                }
                let Some(weights) = shares(model, &order, cache) else {
                    continue;
                };
                let t = cost.step(&order, strategy, &weights, Load::ONE);
                let tok_s = 1.0 / t;
                let better = best_k
                    .as_ref()
                    .is_none_or(|b| tok_s > b.predicted_decode_tok_s * (1.0 + 1e-9));
                if better {
                    best_k = Some(Placement {
                        nodes: order.iter().map(|n| n.id.clone()).collect(),
                        strategy,
                        combine: req.combine,
                        weights,
                        predicted_decode_tok_s: tok_s,
                        considered: Vec::new(),
                        explanation: String::new(),
                    });
                }
            }
        }
        let Some(b) = best_k else {
            continue;
        };
        fewest.get_or_insert((k, b.predicted_decode_tok_s));
        if req.fewest {
            best = Some(b);
            break;
        }
        if best
            .as_ref()
            .is_none_or(|a| b.predicted_decode_tok_s > a.predicted_decode_tok_s * SPLIT_MARGIN)
        {
            best = Some(b);
        }
    }
    let mut p = best.ok_or_else(|| {
        PlacementError::Infeasible(format!(
            "no placement of {} with {:?} on {} node(s)",
            model.name,
            req.strategy,
            pool.len()
        ))
    })?;
    // What the other strategies on the same nodes would predict, for the explanation.
    let chosen: Vec<&Node> = p
        .nodes
        .iter()
        .filter_map(|id| c.nodes.get(id.as_str()).copied())
        .collect();
    let mut chosen_sorted = chosen.clone();
    chosen_sorted.sort_by(|a, b| a.id.cmp(&b.id));
    for (s, order) in candidates(&c, model, &chosen_sorted) {
        if let Some(w) = shares(model, &order, cache) {
            p.considered
                .push((s, 1.0 / cost.step(&order, s, &w, Load::ONE)));
        }
    }
    p.explanation = explain(model, &p, &chosen, req, fewest);
    Ok(p)
}

fn explain(
    m: &ModelFacts,
    p: &Placement,
    nodes: &[&Node],
    req: &Request,
    fewest: Option<(usize, f64)>,
) -> String {
    let gb = |b: u64| b as f64 / 1e9;
    let sequences = req.sequences.max(1);
    let mut s = format!(
        "{} needs {:.2} GB of weights plus {:.2} GB of KV cache for {} positions",
        m.name,
        gb(m.weight_bytes),
        gb(m.kv_bytes_per_token
            .saturating_mul(req.context as u64)
            .saturating_mul(sequences as u64)),
        req.context
    );
    if sequences > 1 {
        s.push_str(&format!(" in each of {sequences} sequences"));
    }
    if req.prefix_cache > 0 {
        s.push_str(&format!(
            " and up to {:.2} GB of prefix cache",
            gb(req.prefix_cache)
        ));
    }
    s.push_str("; ");
    if m.moe && m.n_expert > 0 {
        // A mixture holds every expert but reads only the chosen ones per token.
        s.push_str(&format!(
            "a token reads {:.2} GB of them ({} of {} experts per layer, plus the shared parts); ",
            m.read_per_token() / 1e9,
            m.n_used,
            m.n_expert
        ));
    }
    if req.nodes.is_some() {
        s.push_str(&format!("the nodes asked for are {}", p.nodes.join(", ")));
    } else if nodes.len() == 1 {
        s.push_str(&format!("it fits on {} alone", nodes[0].id));
    } else if let Some(forced) = req.strategy {
        s.push_str(&format!(
            "--strategy {} splits it over {}",
            forced.name(),
            p.nodes.join(", ")
        ));
    } else {
        match fewest {
            Some((k, tok_s)) if k < nodes.len() => s.push_str(&format!(
                "{} node{} could hold it ({tok_s:.0} tok/s predicted), and {} over {} is \
                 predicted {:.1}x that",
                k,
                if k == 1 { "" } else { "s" },
                p.strategy.name(),
                p.nodes.join(", "),
                p.predicted_decode_tok_s / tok_s
            )),
            _ => s.push_str(&format!(
                "the fewest nodes that hold it are {}",
                p.nodes.join(", ")
            )),
        }
    }
    s.push_str(&format!(
        ". On {}, one stream is predicted to decode {:.0} tok/s",
        p.strategy.describe(p.nodes.len()),
        p.predicted_decode_tok_s
    ));
    let others: Vec<String> = p
        .considered
        .iter()
        .filter(|(st, _)| *st != p.strategy)
        .map(|(st, t)| format!("{} {t:.0}", st.describe(p.nodes.len())))
        .collect();
    if !others.is_empty() {
        s.push_str(&format!(
            " (the same nodes as {}: {})",
            if others.len() == 1 {
                "the other strategy"
            } else {
                "other strategies"
            },
            others.join(", ")
        ));
    }
    if p.strategy == StrategyChoice::Expert {
        s.push_str(
            "; expert parallelism: each node reads its share of every layer's experts, and the \
             chosen experts' outputs are all-gathered once per layer (three exchanges a layer, \
             against four when every expert's columns are split)",
        );
    }
    if nodes.len() > 1 {
        let w: Vec<String> = p
            .nodes
            .iter()
            .zip(&p.weights)
            .map(|(n, w)| format!("{n} {:.0} %", 100.0 * w))
            .collect();
        s.push_str(&format!(
            "; shares follow measured speed within memory: {}",
            w.join(", ")
        ));
    }
    s.push('.');
    s
}

/// All `k`-element subsets of `items`, in lexicographic order (at most 4096: on a large
/// cluster the first sets, over the lowest node ids, are enough).
fn subsets<'a>(items: &[&'a Node], k: usize) -> Vec<Vec<&'a Node>> {
    let n = items.len();
    let mut out = Vec::new();
    if k == 0 || k > n {
        return out;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        out.push(idx.iter().map(|&i| items[i]).collect());
        let Some(i) = (0..k).rev().find(|&i| idx[i] < n - k + i) else {
            return out;
        };
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
        if out.len() >= 4096 {
            return out;
        }
    }
}
