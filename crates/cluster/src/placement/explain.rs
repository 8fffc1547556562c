//! The placement in words, for `strata plan` and a load's answer: what the model needs, why
//! these nodes, the predicted speed, the strategies not chosen, and how the work is shared.

use super::types::{ModelFacts, Node, Placement, Request, StrategyChoice};

/// Why `p` was chosen for `m` on `nodes`, in words.
pub(super) fn explain(
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
