//! The search: every set of nodes that holds the model (smallest first), every strategy that
//! can run on each, priced by the cost model; more nodes win only where clearly faster.

use super::cost::{Cluster, Cost, need, shares};
use super::explain::explain;
use super::types::{
    Link, Load, ModelFacts, NODE_OVERHEAD, Node, Placement, PlacementError, Request, StrategyChoice,
};

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
