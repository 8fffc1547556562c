//! The `strata` binary. Only `strata models` exists so far; the other subcommands are wired
//! in as their crates land.

mod cmd_models;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// strata: a distributed LLM inference engine.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage downloaded models.
    Models(cmd_models::ModelsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Command::Models(args) => cmd_models::run(args),
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
