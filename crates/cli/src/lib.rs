//! The `strata` command line: the front end of every crate in the workspace.
//!
//! Flags are parsed here and turned into typed library calls; the command-line crates are the
//! only ones that use `anyhow`, and every error reaches the user as one line on stderr with a
//! non-zero exit. The binary is [`main`]; the modules the benchmark harnesses (`strata-bench`)
//! drive as well are public.

pub mod args;
pub mod cmd_cluster;
mod cmd_models;
mod cmd_plan;
pub mod cmd_run;
mod cmd_serve;
pub mod cmd_shard;
mod cmd_synth;
mod logging;
mod supervise;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// strata: a distributed LLM inference engine.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
    /// A file holding a Hugging Face token, for gated and private `hf:` models (read ahead of
    /// HF_TOKEN; a token is never taken on the command line, where `ps` would show it).
    #[arg(long, global = true, value_name = "FILE")]
    hf_token_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a reply to one prompt, streamed to stdout.
    #[command(allow_negative_numbers = true)]
    Run(cmd_run::RunArgs),
    /// Chat interactively with a model.
    #[command(allow_negative_numbers = true)]
    Chat(cmd_run::ChatArgs),
    /// Serve the OpenAI-compatible HTTP API with the model loaded on this node.
    #[command(allow_negative_numbers = true)]
    Serve(cmd_serve::ServeArgs),
    /// Manage downloaded models.
    Models(cmd_models::ModelsArgs),
    /// Show where and how a model would run on a cluster, and how fast.
    Plan(cmd_plan::PlanArgs),
    /// Write a random-weight GGUF of any supported family and chosen dimensions.
    Synth(cmd_synth::SynthArgs),
    /// Run this machine's node of the cluster (discovery, membership, API).
    Node(cmd_cluster::NodeArgs),
    /// Write a new cluster key.
    Keygen(cmd_cluster::KeygenArgs),
    /// List the cluster's nodes and what they measured of themselves.
    Devices(cmd_cluster::DevicesArgs),
    /// Show the cluster: nodes, leader, links, events.
    Status(cmd_cluster::StatusArgs),
    /// Place a model on the cluster and load it (or, with --dry-run, show the plan).
    Load(cmd_cluster::LoadArgs),
    /// Stop a model instance and free its memory on every node.
    Unload(cmd_cluster::UnloadArgs),
    /// Stop giving a node new work.
    Drain(cmd_cluster::NodeCommandArgs),
    /// Stop a node.
    Stop(cmd_cluster::NodeCommandArgs),
    /// Serve as one rank of a sharded model, joining rank 0 (`strata run --listen`).
    Worker(cmd_shard::WorkerArgs),
}

/// Runs the `strata` command line and says how it ended.
pub fn main() -> ExitCode {
    let cli = match parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if let Some(path) = cli.hf_token_file.clone() {
        if let Err(e) = strata_hub::token_from_env(Some(&path)) {
            eprintln!("error: --hf-token-file: {e}");
            return ExitCode::from(2);
        }
        strata_hub::use_token_file(path);
    }
    if let Some(format) = match &cli.cmd {
        Command::Serve(a) => Some(a.http.log_format()),
        Command::Node(a) => Some(a.http.log_format()),
        Command::Worker(_) => Some(logging::LogFormat::Text),
        _ => None,
    } {
        logging::init(format);
    } else {
        logging::init_plain();
    }
    // macOS has no PR_SET_PDEATHSIG: a child strata started watches its parent itself (after
    // the logging set-up, so its warnings are seen).
    #[cfg(target_os = "macos")]
    // SAFETY: nothing so far (parsing, the hub token, logging) has started a thread.
    unsafe {
        strata_node::process::watch_parent();
    }
    let supervised = match &cli.cmd {
        Command::Serve(a) if !a.no_supervise => Some("strata serve"),
        Command::Node(a) if !a.no_supervise => Some("strata node"),
        _ => None,
    };
    if let Some(what) = supervised
        && !supervise::is_child()
    {
        return supervise::run(what);
    }
    let result = match cli.cmd {
        Command::Run(args) => cmd_run::run(args),
        Command::Chat(args) => cmd_run::chat(args),
        Command::Serve(args) => cmd_serve::serve(args),
        Command::Models(args) => cmd_models::run(args),
        Command::Worker(args) => cmd_shard::worker(args),
        Command::Synth(args) => cmd_synth::synth(args),
        Command::Plan(args) => cmd_plan::plan(args),
        Command::Node(args) => cmd_cluster::node(args),
        Command::Keygen(args) => cmd_cluster::keygen(args),
        Command::Devices(args) => cmd_cluster::devices(args),
        Command::Status(args) => cmd_cluster::status(args),
        Command::Load(args) => cmd_cluster::load(args),
        Command::Unload(args) => cmd_cluster::unload(args),
        Command::Drain(args) => cmd_cluster::drain(args),
        Command::Stop(args) => cmd_cluster::stop(args),
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

/// Parses the command line into `T`. A bad value is one line naming the flag and what it
/// takes (exit code 2); clap's usage block and "For more information" tip add nothing to that.
/// Other parse errors (a missing argument, a misspelt flag, `--help`) keep clap's whole
/// message, whose tips help, and exit here.
pub fn parse_args<T: clap::Parser>() -> Result<T, ExitCode> {
    match T::try_parse() {
        Ok(t) => Ok(t),
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation | clap::error::ErrorKind::InvalidValue
            ) =>
        {
            let text = e.render().to_string();
            eprintln!("{}", text.lines().next().unwrap_or("error: a bad value"));
            Err(ExitCode::from(2))
        }
        Err(e) => e.exit(),
    }
}
