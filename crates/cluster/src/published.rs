//! Published cluster measurements and the planner's predictions of them. The rows and their
//! sources are in `data/published.json`; the planner predicts each from the presets and cards
//! with the same class constants as every other plan, so the comparison checks the constants
//! rather than fitting them.

use serde::{Deserialize, Serialize};

use crate::cards::cards;
use crate::hardware::{Presets, parse_nodes, presets};
use crate::placement::{Combine, Request, StrategyChoice, place};

/// One published measurement.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Row {
    /// Card and quantisation.
    pub model: String,
    /// The nodes, as `--nodes` takes them.
    pub nodes: String,
    /// The link preset.
    pub link: String,
    /// The strategy the run used.
    pub strategy: String,
    /// How its tensor-parallel groups combined.
    pub combine: Combine,
    /// The engine that ran it, for the reader (the class of its nodes' presets is what the
    /// prediction uses).
    #[serde(default)]
    pub engine: String,
    /// Published single-stream decode speed, tokens per second.
    pub tok_s: f64,
    /// Held to the 25 % bound (false: shown with the reason).
    #[serde(default = "yes")]
    pub judged: bool,
    /// Why a row is not judged.
    #[serde(default)]
    pub why: String,
    /// Where the figure comes from.
    pub source: String,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct File {
    rows: Vec<Row>,
}

/// A row with the planner's prediction.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Checked {
    /// The row.
    pub row: Row,
    /// Predicted single-stream decode, tokens per second.
    pub predicted_tok_s: f64,
    /// `predicted / published - 1`.
    pub error: f64,
}

/// How far a judged prediction may be from its published figure.
pub const BOUND: f64 = 0.25;

/// The published rows.
pub fn rows() -> Vec<Row> {
    // Part of the crate and checked by its tests: a broken file is a build defect.
    #[allow(clippy::expect_used)]
    let f: File = serde_json::from_str(include_str!("../data/published.json"))
        .expect("data/published.json parses");
    f.rows
}

/// Predicts one row with the shipped constants.
pub fn check_row(row: &Row) -> Result<Checked, String> {
    check_row_with(row, presets())
}

/// The one hardware class of a row's nodes (the fit is per class, so a row must not mix
/// classes).
pub fn class_of(row: &Row, p: &Presets) -> Result<String, String> {
    let items = parse_nodes(&row.nodes).map_err(|e| e.to_string())?;
    let mut class: Option<&str> = None;
    for (_, name) in &items {
        let c = p.node(name).map_err(|e| e.to_string())?.class.as_str();
        match class {
            Some(k) if k != c => {
                return Err(format!("{} mixes the classes {k} and {c}", row.nodes));
            }
            _ => class = Some(c),
        }
    }
    class
        .map(str::to_string)
        .ok_or_else(|| format!("{} names no node", row.nodes))
}

/// Nodes a row runs on.
pub fn node_count(row: &Row) -> Result<usize, String> {
    let items = parse_nodes(&row.nodes).map_err(|e| e.to_string())?;
    Ok(items.iter().map(|(n, _)| n).sum())
}

/// Predicts one row with the constants of `p`.
pub fn check_row_with(row: &Row, p: &Presets) -> Result<Checked, String> {
    let (facts, _) = cards().resolve(&row.model).map_err(|e| e.to_string())?;
    let link = p.link(&row.link).map_err(|e| e.to_string())?;
    let items = parse_nodes(&row.nodes).map_err(|e| e.to_string())?;
    let (nodes, links) = p
        .cluster(
            &items,
            link.latency_us * 1e-6,
            link.bandwidth_gbit * 1e9 / 8.0,
            None,
        )
        .map_err(|e| e.to_string())?;
    let strategy = match row.strategy.as_str() {
        "single" => StrategyChoice::Single,
        "tensor" => StrategyChoice::Tensor,
        "pipeline" => StrategyChoice::Pipeline,
        "expert" => StrategyChoice::Expert,
        other => return Err(format!("unknown strategy {other}")),
    };
    let req = Request {
        context: 4096,
        combine: row.combine,
        strategy: Some(strategy),
        nodes: Some(nodes.iter().map(|n| n.id.clone()).collect()),
        fewest: false,
        // The published runs served one stream; nothing is reserved beyond its context.
        sequences: 1,
        prefix_cache: 0,
    };
    let p = place(&facts, &nodes, &links, &req).map_err(|e| e.to_string())?;
    Ok(Checked {
        row: row.clone(),
        predicted_tok_s: p.predicted_decode_tok_s,
        error: p.predicted_decode_tok_s / row.tok_s - 1.0,
    })
}

/// Every row with its prediction.
pub fn check() -> Result<Vec<Checked>, String> {
    rows().iter().map(check_row).collect()
}

/// The comparison as a Markdown table.
pub fn table(checked: &[Checked]) -> String {
    let mut s = String::from(
        "| model | nodes | link | strategy | engine | published tok/s | predicted tok/s | error |\n\
         | --- | --- | --- | --- | --- | ---: | ---: | ---: |\n",
    );
    for c in checked {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:+.0} %{} |\n",
            c.row.model,
            c.row.nodes,
            c.row.link,
            c.row.strategy,
            c.row.engine,
            c.row.tok_s,
            c.predicted_tok_s,
            c.error * 100.0,
            if c.row.judged { "" } else { " (not judged)" }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The planner's one set of constants predicts every judged published figure within
    /// 25 %; a miss names the row and the error.
    #[test]
    fn published_cluster_results_are_predicted_within_a_quarter() {
        let checked = check().unwrap();
        println!("{}", table(&checked));
        let misses: Vec<String> = checked
            .iter()
            .filter(|c| c.row.judged && c.error.abs() > BOUND)
            .map(|c| {
                format!(
                    "{} on {}: published {:.1}, predicted {:.1} ({:+.0} %)",
                    c.row.model,
                    c.row.nodes,
                    c.row.tok_s,
                    c.predicted_tok_s,
                    c.error * 100.0
                )
            })
            .collect();
        assert!(misses.is_empty(), "missed rows:\n{}", misses.join("\n"));
        assert!(checked.iter().filter(|c| c.row.judged).count() >= 7);
        for c in checked.iter().filter(|c| !c.row.judged) {
            assert!(
                !c.row.why.is_empty(),
                "{} is not judged and says not why",
                c.row.model
            );
        }
    }
}
