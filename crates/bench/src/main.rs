//! `strata-bench`: the speed harnesses behind BENCHMARKS.md, kept out of the `strata` binary
//! users install.
//!
//! - `engine`: one process's prefill and decode speed, side by side with llama.cpp's
//!   `llama-bench` on the same GGUF, against the memory-bandwidth roofline.
//! - `scaling`: one process against two ranks of each strategy and transport, and llama.cpp's
//!   RPC backend.
//! - `cluster`: a cluster of real `strata node` processes on this machine served through the
//!   OpenAI API, beside the planner's predictions.
//!
//! The harnesses that start processes run the `strata` binary next to this one (the same
//! `cargo build` puts both in one directory), or the one `STRATA_BIN` names.

mod cluster;
mod engine;
mod scaling;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Subcommand;

/// strata-bench: measure strata's speed against llama.cpp and the hardware's limits.
#[derive(Debug, clap::Parser)]
#[command(name = "strata-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Single-node prefill and decode tok/s against llama.cpp and the memory roofline.
    #[command(allow_negative_numbers = true)]
    Engine(engine::EngineArgs),
    /// Sharded speed: 1 process vs 2 ranks (tensor, pipeline; shm, tcp), a link-latency sweep,
    /// and llama.cpp's RPC backend.
    #[command(allow_negative_numbers = true)]
    Scaling(scaling::ScalingArgs),
    /// Serving speed of a cluster through the OpenAI API: N nodes on this machine over
    /// emulated links, each strategy, 1/4/16 concurrent clients, against one node and
    /// llama.cpp's RPC backend, beside the planner's predictions.
    Cluster(cluster::ClusterArgs),
}

/// The `strata` binary the process-starting harnesses run: `STRATA_BIN`, or the one beside
/// this executable.
pub(crate) fn strata_exe() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().context("finding the strata-bench binary")?;
    let exe = me.with_file_name(format!("strata{}", std::env::consts::EXE_SUFFIX));
    if !exe.is_file() {
        bail!(
            "no strata binary at {}: build it (cargo build --release -p strata) or set STRATA_BIN",
            exe.display()
        );
    }
    Ok(exe)
}

fn main() -> ExitCode {
    let cli = match strata::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = match cli.cmd {
        Command::Engine(a) => engine::engine(a),
        Command::Scaling(a) => scaling::scaling(a),
        Command::Cluster(a) => cluster::cluster(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` puts the whole context chain on one line.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
