//! The placement planner: given a model and the measured cluster, choose the nodes, the kind of
//! parallelism and the split, and predict the decode speed. Pure and deterministic: the same
//! inputs (in any order) give the same placement.
//!
//! Four parts, each its own module so the cost model can be read (and checked against
//! measurements) without the search around it: [`types`], what goes in and comes out;
//! [`cost`], the prediction of a step's time; [`search`], which sets of nodes and strategies
//! are tried and which wins; and [`explain`], the placement in words.

mod cost;
mod explain;
mod search;
mod types;

pub use cost::{predict_decode, predict_step};
pub use search::{SPLIT_MARGIN, place};
pub(crate) use types::NODE_OVERHEAD;
pub use types::{
    Combine, Link, Load, ModelFacts, Node, Placement, PlacementError, Request, StrategyChoice,
};
