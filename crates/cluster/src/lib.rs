//! The cluster layer of strata: the placement planner, which decides where a model instance
//! runs (which nodes, which parallelism, how uneven) from measured node and link figures and
//! predicts how fast it will decode; and capacity planning on top of it, for hardware and
//! models not at hand (presets with sources, model cards, the service a placement delivers,
//! and the published measurements that keep its constants honest).
#![warn(missing_docs)]

pub mod cards;
mod estimate;
pub mod fit;
pub mod hardware;
mod placement;
pub mod published;

pub use estimate::{Estimate, PREFILL_CHUNK, Workload, estimate};
pub use placement::{
    Combine, Link, Load, ModelFacts, Node, Placement, PlacementError, Request, SPLIT_MARGIN,
    StrategyChoice, place, predict_decode, predict_step,
};
