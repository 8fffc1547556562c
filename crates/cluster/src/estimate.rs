//! What a placement delivers to its users: room for KV cache (how many contexts of a length
//! fit), prefill speed and time to first token, decode speed for one stream and for many,
//! and power and energy per token. Built on the planner's step cost, so capacity planning
//! and placement never disagree.
//!
//! The assumptions, stated once: decoding reads every weight a step uses once (the shared
//! parts, and of a mixture the experts any of the step's tokens picked, routing taken as
//! uniform) plus each stream's cache, at the node's bandwidth; prefill is the same step over a
//! chunk of the prompt, so it is compute-bound wherever the node's compute is known; a
//! pipeline keeps one group of streams per stage in flight, each group's next step starting
//! as soon as its last is back, and a prompt's chunks go through it one after another; KV room is what the nodes' memory holds
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
            logits: streams,
        })?;
    // Prefill: chunks of the prompt, each attending on average to half the prompt.
    let known = used.iter().all(|n| n.flops > 0.0);
    let (prefill, ttft) = if known && work.prompt > 0 {
        let chunk = PREFILL_CHUNK.min(work.prompt);
        // Of a prompt's chunks, the last alone computes logits (one row); the others none.
        let t = step(Load {
            streams: chunk,
            depth: work.prompt / 2,
            sequences: 1,
            logits: usize::from(chunk >= work.prompt),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::{Request, StrategyChoice, place};

    fn node(id: &str) -> Node {
        Node {
            id: id.into(),
            memory_available: 100_000_000_000,
            mem_bandwidth: 100e9,
            flops: 10e12,
            power_watts: 100.0,
            ..Node::default()
        }
    }

    fn dense() -> ModelFacts {
        ModelFacts {
            name: "dense".into(),
            weight_bytes: 10_000_000_000,
            token_bytes: 10_000_000_000,
            params: 10_000_000_000,
            token_params: 10_000_000_000,
            kv_bytes_per_token: 100_000,
            n_layer: 32,
            n_head: 32,
            n_embd: 4096,
            n_ff: 14336,
            q_width: 4096,
            default_context: 4096,
            ..ModelFacts::default()
        }
    }

    fn plan(m: &ModelFacts, nodes: &[Node], strategy: StrategyChoice) -> Placement {
        let links = crate::hardware::full_mesh(nodes, 5e-6, 10e9);
        let req = Request {
            context: 4096,
            strategy: Some(strategy),
            nodes: Some(nodes.iter().map(|n| n.id.clone()).collect()),
            ..Request::default()
        };
        place(m, nodes, &links, &req).unwrap()
    }

    fn run(m: &ModelFacts, nodes: &[Node], p: &Placement, streams: usize) -> Estimate {
        let links = crate::hardware::full_mesh(nodes, 5e-6, 10e9);
        let work = Workload {
            context: 4096,
            prompt: 1024,
            streams,
        };
        estimate(m, nodes, &links, p, &work).unwrap()
    }

    /// One node: 10 GB at 100 GB/s is 10 tok/s alone; 8 streams share the weight reads, so
    /// the step barely slows and the aggregate is near 8x; prefill is compute-bound; KV room
    /// and energy follow from memory and power.
    #[test]
    fn batching_shares_the_weight_reads_and_prefill_is_bound_by_compute() {
        let m = dense();
        let nodes = [node("a")];
        let p = plan(&m, &nodes, StrategyChoice::Single);
        let e = run(&m, &nodes, &p, 8);
        assert!((e.decode_tok_s - 10.0).abs() < 0.01, "{}", e.decode_tok_s);
        assert!(e.decode_aggregate_tok_s > 7.0 * e.decode_tok_s);
        // 20 GFLOP a token at 10 TFLOP/s: at most 500 tok/s of prefill.
        let pp = e.prefill_tok_s.unwrap();
        assert!(pp < 500.0 && pp > 300.0, "{pp}");
        let room = 100_000_000_000 - 10_000_000_000 - NODE_OVERHEAD;
        assert_eq!(e.kv_room_bytes, room);
        assert_eq!(e.contexts_that_fit, room / (100_000 * 4096));
        let j = e.joules_per_token.unwrap();
        assert!((j - 100.0 / e.decode_aggregate_tok_s).abs() < 1e-9);
    }

    /// Each matrix is priced at its weight type's measured rate, and a prefill chunk runs
    /// the LM head for one row only, where a decode step runs it for every row.
    #[test]
    fn compute_follows_each_weight_type_and_prefill_skips_the_head() {
        // 8 G body weights in Q4_0 (twice the node's Q8_0 rate), a 2 G head in Q8_0.
        let m = ModelFacts {
            head_params: 2_000_000_000,
            head_type: "Q8_0".into(),
            token_params_by_type: [("Q4_0".to_string(), 8e9)].into(),
            ..dense()
        };
        // Memory fast enough that compute bounds every step.
        let fast = Node {
            flops_by_type: [("Q4_0".to_string(), 20e12), ("Q8_0".to_string(), 10e12)].into(),
            mem_bandwidth: 100e12,
            ..node("a")
        };
        let p = plan(&m, std::slice::from_ref(&fast), StrategyChoice::Single);
        let work = Workload {
            context: 4096,
            prompt: 512,
            streams: 64,
        };
        let e = estimate(&m, std::slice::from_ref(&fast), &[], &p, &work).unwrap();
        // Prefill: 16 GFLOP of Q4_0 a token at 20 TFLOP/s (0.8 ms), the head once per
        // chunk (0.4 ms), attention over 256 positions at 10 TFLOP/s (0.013 ms a token).
        let attn = 4.0 * 4096.0 * 32.0 * 256.0 / 10e12;
        let want = 512.0 / (512.0 * (0.8e-3 + attn) + 0.4e-3);
        let pp = e.prefill_tok_s.unwrap();
        assert!((pp / want - 1.0).abs() < 1e-6, "{pp} vs {want}");
        // Decode, 64 streams: compute-bound, every row through the head too.
        let attn = 4.0 * 4096.0 * 32.0 * 512.0 / 10e12;
        let want = 1.0 / (0.8e-3 + 0.4e-3 + attn);
        let agg = e.decode_aggregate_tok_s;
        assert!((agg / want - 1.0).abs() < 1e-6, "{agg} vs {want}");
        // Priced at the one rate (older facts), both are slower.
        let one_rate = Node {
            mem_bandwidth: 100e12,
            ..node("a")
        };
        let plain = estimate(&dense(), &[one_rate], &[], &p, &work).unwrap();
        assert!(plain.prefill_tok_s.unwrap() < 0.6 * pp);
        assert!(plain.decode_aggregate_tok_s < 0.7 * agg);
        // Attention's fixed part: 1 us per head, row and layer adds 32 x 32 us to every row.
        let fixed = Node {
            attn_fixed: 1e-6,
            ..fast.clone()
        };
        let e = estimate(&m, std::slice::from_ref(&fixed), &[], &p, &work).unwrap();
        let want = 1.0 / (0.8e-3 + 0.4e-3 + attn + 32.0 * 32.0 * 1e-6);
        let agg = e.decode_aggregate_tok_s;
        assert!((agg / want - 1.0).abs() < 1e-6, "{agg} vs {want}");
        // The engine's measured cost per row beside the products (1 ns per element of
        // 4096 + 14336 + 4096 widths, 32 layers: 0.72 ms) replaces attention's fixed part, and
        // adds to the step whatever bounds the products: every decode row pays it, a prefill
        // chunk once.
        let timed = Node {
            row_cost: 1e-9,
            ..fixed
        };
        let e = estimate(&m, std::slice::from_ref(&timed), &[], &p, &work).unwrap();
        let rows = 32.0 * (4096.0 + 14336.0 + 4096.0) * 1e-9;
        let want = 1.0 / (0.8e-3 + 0.4e-3 + attn + rows);
        let agg = e.decode_aggregate_tok_s;
        assert!((agg / want - 1.0).abs() < 1e-6, "{agg} vs {want}");
        let pattn = 4.0 * 4096.0 * 32.0 * 256.0 / 10e12;
        let want = 512.0 / (512.0 * (0.8e-3 + pattn) + 0.4e-3 + rows);
        let pp = e.prefill_tok_s.unwrap();
        assert!((pp / want - 1.0).abs() < 1e-6, "{pp} vs {want}");
        // Memory-bound, one stream: still added.
        let slow = Node {
            mem_bandwidth: 100e9,
            ..timed
        };
        let one = estimate(&m, std::slice::from_ref(&slow), &[], &p, &work).unwrap();
        let want = 1.0 / (10e9 / 100e9 + rows);
        assert!(
            (one.decode_tok_s / want - 1.0).abs() < 1e-6,
            "{}",
            one.decode_tok_s
        );
        // Kernels that take weights in at one row slower than memory delivers them bound a
        // single stream instead: 8 G Q4_0 weights at 40 G/s and the 2 G head at 10 G/s (0.4 s
        // against memory's 0.1 s); types measured faster leave it to memory.
        let slow_kernels = Node {
            stream_by_type: [("Q4_0".to_string(), 40e9), ("Q8_0".to_string(), 10e9)].into(),
            ..slow.clone()
        };
        let one = estimate(&m, std::slice::from_ref(&slow_kernels), &[], &p, &work).unwrap();
        let want = 1.0 / (0.4 + rows);
        assert!((one.decode_tok_s / want - 1.0).abs() < 1e-6, "{one:?}");
        let fast_kernels = Node {
            stream_by_type: [("Q4_0".to_string(), 1e15), ("Q8_0".to_string(), 1e15)].into(),
            ..slow
        };
        let one = estimate(&m, std::slice::from_ref(&fast_kernels), &[], &p, &work).unwrap();
        let want = 1.0 / (10e9 / 100e9 + rows);
        assert!((one.decode_tok_s / want - 1.0).abs() < 1e-6, "{one:?}");
    }

    /// A mixture's step reads more experts as streams grow, but never more than all of them.
    #[test]
    fn a_mixture_reads_more_experts_per_step_as_streams_grow() {
        let m = ModelFacts {
            moe: true,
            n_expert: 64,
            n_used: 4,
            expert_bytes: 9_000_000_000,
            token_bytes: 1_562_500_000,
            token_params: 1_562_500_000,
            ..dense()
        };
        let nodes = [node("a")];
        let p = plan(&m, &nodes, StrategyChoice::Single);
        let one = run(&m, &nodes, &p, 1);
        let many = run(&m, &nodes, &p, 64);
        // 64 streams touch nearly every expert: the step reads close to all 10 GB (0.1 s),
        // plus each stream's 1024 cached positions (6.6 GB, 0.066 s).
        let step = 64.0 / many.decode_aggregate_tok_s;
        assert!(step > 0.155 && step < 0.17, "{step}");
        assert!(many.decode_aggregate_tok_s < 64.0 * one.decode_tok_s);
    }

    /// A pipeline overlaps different sequences' steps, never one prompt's chunks.
    #[test]
    fn a_pipeline_overlaps_streams_but_not_one_prompt() {
        let m = dense();
        let nodes = [node("a"), node("b")];
        let p = plan(&m, &nodes, StrategyChoice::Pipeline);
        let single = plan(&m, &nodes[..1], StrategyChoice::Single);
        let e = run(&m, &nodes, &p, 2);
        let alone = run(&m, &nodes[..1], &single, 2);
        // One stream goes through both stages in turn: no faster than one node.
        assert!(e.decode_tok_s <= alone.decode_tok_s * 1.001);
        // Two streams, one group each, keep both stages busy (each group's next step starts
        // on stage 1 while the other's is on stage 2): twice one stream's rate, less the
        // hand-offs, which the trip of a group through both stages still pays.
        let gain = e.decode_aggregate_tok_s / e.decode_tok_s;
        assert!(gain > 1.9 && gain < 2.0, "{gain}");
        // One prompt's chunks take the stages one after another.
        let (pp, pp1) = (e.prefill_tok_s.unwrap(), alone.prefill_tok_s.unwrap());
        assert!(pp <= pp1 * 1.001 && pp > pp1 * 0.9, "{pp} vs {pp1}");
    }
}
