//! Sharded execution: one model across several ranks (processes, possibly on several hosts),
//! each holding only its shard.
//!
//! [`make_plan`] divides a model for tensor, pipeline or hybrid parallelism; a [`Rank`] loads its
//! shard and runs steps in lockstep with the others over a [`strata_net::Communicator`]; rank 0
//! drives sequences through a [`ShardedBatch`], the `strata_engine::Sequences` engine of a
//! sharded model. The engine computes; this crate decides who
//! computes what and moves the results.
#![warn(missing_docs)]

mod error;
mod launch;
mod plan;
mod proto;
mod rank;
mod sequences;

pub use error::{Error, Result};
pub use launch::{TOKEN_ENV, worker_command};
pub use plan::{CombineStyle, GroupParts, Plan, RankPlan, Strategy, make_plan, split};
pub use rank::{Assignment, Rank, Shard, local_pair, numerics_name};
pub use sequences::{CommFigures, ShardedBatch};
