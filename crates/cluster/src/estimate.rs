//! What a placement delivers to its users: room for KV cache (how many contexts of a length
//! fit), prefill speed and time to first token, decode speed for one stream and for many,
//! and power and energy per token. Built on the planner's step cost, so capacity planning
//! and placement never disagree.
//!
//! The assumptions, stated once: decoding reads every weight a step uses once (the shared
//! parts, and of a mixture the experts any of the step's tokens picked, routing taken as
//! uniform) plus each stream's cache, at the node's bandwidth; prefill is the same step over a
//! chunk of the prompt, so it is compute-bound wherever the node's compute is known; a
//! pipeline keeps one micro-batch of streams per stage in flight, and a prompt's chunks go
//! through it one after another; KV room is what the nodes' memory holds
//! beyond the weights and a fixed overhead per node.

use serde::{Deserialize, Serialize};

use crate::placement::{Link, Load, ModelFacts, NODE_OVERHEAD, Node, Placement, predict_step};

/// Prompt tokens one prefill step computes.
pub const PREFILL_CHUNK: usize = 512;

/// What the users will ask of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Context length each stream may reach.
    pub context: usize,
    /// Prompt length, for prefill and time to first token, and the depth decoding runs at.
    pub prompt: usize,
    /// Concurrent streams.
    pub streams: usize,
}

/// The placement's predicted service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Memory of the placement's nodes, bytes.
    pub memory_bytes: u64,
    /// Weights, bytes.
    pub weight_bytes: u64,
    /// Memory left for KV cache, bytes.
    pub kv_room_bytes: u64,
    /// KV cache one full context takes, bytes.
    pub kv_bytes_per_context: u64,
    /// Contexts of `context` positions that fit at once.
    pub contexts_that_fit: u64,
    /// One stream's decode speed at the start of its context, tokens per second.
    pub decode_tok_s: f64,
    /// Streams the N-stream figures use (the asked number, at most what fits).
    pub streams: usize,
    /// All streams' tokens per second together, each `prompt` positions deep.
    pub decode_aggregate_tok_s: f64,
    /// Each stream's share of it.
    pub decode_per_stream_tok_s: f64,
    /// Prompt tokens per second (`None` where a node's compute is unknown).
    pub prefill_tok_s: Option<f64>,
    /// Time to first token of a `prompt`-token prompt, seconds.
    pub ttft_s: Option<f64>,
    /// Power of the placement's nodes while decoding, watts (`None` if a node's is unknown).
    pub power_watts: Option<f64>,
    /// Energy per generated token at the N-stream rate, joules.
    pub joules_per_token: Option<f64>,
    /// Energy per million generated tokens at the N-stream rate, kWh.
    pub kwh_per_million_tokens: Option<f64>,
}

/// Predicts what `placement` serves under `work`.
pub fn estimate(
    model: &ModelFacts,
    nodes: &[Node],
    links: &[Link],
    placement: &Placement,
    work: &Workload,
) -> Option<Estimate> {
    let used: Vec<&Node> = placement
        .nodes
        .iter()
        .map(|id| nodes.iter().find(|n| &n.id == id))
        .collect::<Option<_>>()?;
    let memory = used
        .iter()
        .fold(0u64, |a, n| a.saturating_add(n.memory_available));
    let overhead = NODE_OVERHEAD.saturating_mul(used.len() as u64);
    let room = memory
        .saturating_sub(model.weight_bytes)
        .saturating_sub(overhead);
    let per_context = model
        .kv_bytes_per_token
        .saturating_mul(work.context as u64)
        .max(1);
    let fit = room / per_context;
    let step = |load: Load| predict_step(model, nodes, links, placement, load);
    let one = 1.0 / step(Load::ONE)?;
    let streams = work.streams.clamp(1, fit.clamp(1, 1 << 20) as usize);
    let depth = work.prompt.min(work.context);
    let many = streams as f64
        / step(Load {
            streams,
            depth,
            sequences: streams,
        })?;
    // Prefill: chunks of the prompt, each attending on average to half the prompt.
    let known = used.iter().all(|n| n.flops > 0.0);
    let (prefill, ttft) = if known && work.prompt > 0 {
        let chunk = PREFILL_CHUNK.min(work.prompt);
        let t = step(Load {
            streams: chunk,
            depth: work.prompt / 2,
            sequences: 1,
        })?;
        let rate = chunk as f64 / t;
        (Some(rate), Some(work.prompt as f64 / rate + 1.0 / one))
    } else {
        (None, None)
    };
    let power = used
        .iter()
        .all(|n| n.power_watts > 0.0)
        .then(|| used.iter().map(|n| n.power_watts).sum::<f64>());
    let joules = power.map(|w| w / many);
    Some(Estimate {
        memory_bytes: memory,
        weight_bytes: model.weight_bytes,
        kv_room_bytes: room,
        kv_bytes_per_context: per_context,
        contexts_that_fit: fit,
        decode_tok_s: one,
        streams,
        decode_aggregate_tok_s: many,
        decode_per_stream_tok_s: many / streams as f64,
        prefill_tok_s: prefill,
        ttft_s: ttft,
        power_watts: power,
        joules_per_token: joules,
        kwh_per_million_tokens: joules.map(|j| j * 1e6 / 3.6e6),
    })
}
