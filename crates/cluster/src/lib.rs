//! The cluster layer of strata. For now: the placement planner, which decides where a model
//! instance runs (which nodes, which parallelism, how uneven) from measured node and link
//! figures, and predicts how fast it will decode. Discovery, membership and instance lifecycle
//! build on it.
#![warn(missing_docs)]

mod placement;

pub use placement::{
    Link, ModelFacts, Node, Placement, PlacementError, Request, StrategyChoice, place,
    predict_decode,
};
