//! The cost model, the one decoding obeys: a token streams every weight byte once, so a rank's
//! compute time is its share of the bytes over its node's measured memory bandwidth; tensor
//! parallelism adds, per layer, four exchanges (gather style) whose cost is the link latency plus
//! the bytes over the link bandwidth; a pipeline adds one hand-off per stage per token and runs
//! the stages one after another. Shares follow measured speed, capped by each node's memory
//! (water-filling), so a slow node gets less work instead of dragging the instance down.

use std::collections::BTreeMap;

use super::types::{
    Combine, Link, Load, ModelFacts, NODE_OVERHEAD, Node, Placement, StrategyChoice,
};

/// The nodes and links of a cluster, looked up by id.
pub(super) struct Cluster<'a> {
    pub(super) nodes: BTreeMap<&'a str, &'a Node>,
    pub(super) links: BTreeMap<(&'a str, &'a str), &'a Link>,
}

impl<'a> Cluster<'a> {
    pub(super) fn new(nodes: &'a [Node], links: &'a [Link]) -> Cluster<'a> {
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
    pub(super) fn link(&self, a: &str, b: &str) -> (f64, f64) {
        let key = if a <= b { (a, b) } else { (b, a) };
        self.links
            .get(&key)
            .map_or((1.0, 1e6), |l| (l.latency, l.bandwidth))
    }
}

/// Bytes a node needs for `share` of the model with `cache` bytes of cache over all nodes.
pub(super) fn need(m: &ModelFacts, share: f64, cache: f64) -> u64 {
    let total = m.weight_bytes as f64 + cache;
    // A float beyond u64 saturates in the cast; the sum saturates too, so an absurd context
    // reads as "needs more than there is", never wraps to a small number.
    ((share * total).ceil() as u64).saturating_add(NODE_OVERHEAD)
}

/// Shares proportional to bandwidth, each capped by what the node's memory can hold
/// (water-filling); `None` if the nodes cannot hold the model together.
pub(super) fn shares(m: &ModelFacts, nodes: &[&Node], cache: f64) -> Option<Vec<f64>> {
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

/// Prices steps of one placement: the model, the cluster, how tensor groups combine.
pub(super) struct Cost<'c, 'a> {
    pub(super) c: &'c Cluster<'a>,
    pub(super) m: &'c ModelFacts,
    pub(super) combine: Combine,
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
    pub(super) fn step(
        &self,
        nodes: &[&Node],
        strategy: StrategyChoice,
        weights: &[f64],
        load: Load,
    ) -> f64 {
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
