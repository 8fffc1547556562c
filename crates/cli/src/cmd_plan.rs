//! `strata plan`: where and how a model would run on a cluster, with the predicted decode speed
//! and each rank's shard, from a description of the nodes and links (until nodes measure and
//! publish these themselves, the description is written by hand or by a script).
//!
//! The cluster file is JSON: `{"nodes": [{"id", "memory_available", "mem_bandwidth"}], "links":
//! [{"a", "b", "latency", "bandwidth"}]}` (bytes, bytes per second, seconds). Without one, the
//! plan is for this machine alone, with its memory bandwidth measured now.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use strata_cluster::{Link, ModelFacts, Node, Request, StrategyChoice, place};
use strata_gguf::GgufFile;
use strata_parallel::{CombineStyle, Strategy, make_plan};

/// The cluster file's format, for `--help`.
const CLUSTER_FORMAT: &str = "\
The cluster file (--cluster) is JSON: the nodes with their free memory and measured memory
bandwidth, and the links between them (bytes, bytes per second, seconds):

  {\"nodes\": [{\"id\": \"a\", \"memory_available\": 16000000000, \"mem_bandwidth\": 3e10},
             {\"id\": \"b\", \"memory_available\": 16000000000, \"mem_bandwidth\": 3e10}],
   \"links\": [{\"a\": \"a\", \"b\": \"b\", \"latency\": 5e-6, \"bandwidth\": 1e10}]}

A running cluster's own figures are in `strata devices --json` and `strata status --json`.
Without --cluster, the plan is for this machine alone, its memory bandwidth measured now.";

/// `strata plan`.
#[derive(Debug, Args)]
#[command(after_long_help = CLUSTER_FORMAT)]
pub(crate) struct PlanArgs {
    /// Model id from the catalog or a path to a GGUF file.
    #[arg(long, short = 'm', default_value = strata_store::DEFAULT_MODEL_ID)]
    model: String,
    /// The cluster, as JSON (its format is at the end of `strata plan --help`); default: this
    /// machine.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Context positions to reserve KV cache for (default: the model's, at most 8192, as
    /// `serve`, `run` and `load` use).
    #[arg(long)]
    ctx_size: Option<usize>,
    /// Force a strategy.
    #[arg(long, value_enum)]
    strategy: Option<crate::cmd_shard::StrategyArg>,
    /// Ranks per stage when forcing `hybrid`.
    #[arg(long, default_value_t = 2)]
    tp_size: usize,
    /// Use exactly these nodes, comma-separated.
    #[arg(long, value_delimiter = ',')]
    nodes: Option<Vec<String>>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct ClusterFile {
    nodes: Vec<Node>,
    #[serde(default)]
    links: Vec<Link>,
}

pub(crate) fn plan(a: PlanArgs) -> Result<()> {
    if a.ctx_size == Some(0) {
        anyhow::bail!("--ctx-size must be at least 1");
    }
    let path = crate::cmd_run::resolve_model(&a.model)?;
    let file = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut facts = ModelFacts::from_gguf(&file)?;
    // The name the user gave: a catalog id, or the file's name (a GGUF's `general.name` is
    // often a training run's label).
    facts.name = match path.file_name() {
        Some(n) if strata_store::is_path_spec(&a.model) => n.to_string_lossy().into_owned(),
        _ => a.model.clone(),
    };
    let cluster = match &a.cluster {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str::<ClusterFile>(&text).with_context(|| {
                format!(
                    "parsing the cluster file {} (its format is at the end of `strata plan \
                     --help`)",
                    p.display()
                )
            })?
        }
        None => ClusterFile {
            nodes: vec![this_machine()],
            links: Vec::new(),
        },
    };
    let req = Request {
        context: a.ctx_size.unwrap_or(facts.default_context),
        strategy: a.strategy.map(|s| match s {
            crate::cmd_shard::StrategyArg::Tensor => StrategyChoice::Tensor,
            crate::cmd_shard::StrategyArg::Pipeline => StrategyChoice::Pipeline,
            crate::cmd_shard::StrategyArg::Hybrid => StrategyChoice::Hybrid { tp: a.tp_size },
            crate::cmd_shard::StrategyArg::Expert => StrategyChoice::Expert,
        }),
        nodes: a.nodes.clone(),
    };
    let p = place(&facts, &cluster.nodes, &cluster.links, &req)?;
    let cfg = strata_engine::ModelConfig::from_gguf(&file)?;
    let strategy = match p.strategy {
        StrategyChoice::Single | StrategyChoice::Tensor => Strategy::Tensor,
        StrategyChoice::Pipeline => Strategy::Pipeline,
        StrategyChoice::Hybrid { tp } => Strategy::Hybrid { tp },
        StrategyChoice::Expert => Strategy::Expert,
    };
    // One node's shard is the whole model; the plan says so in the same terms.
    let shards = make_plan(
        &file,
        &cfg,
        strategy,
        p.nodes.len(),
        Some(&p.weights),
        CombineStyle::Gather,
    )?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "model": facts,
                "context": req.context,
                "cluster": cluster,
                "placement": p,
                "shards": shards,
            }))?
        );
        return Ok(());
    }
    println!("{}", p.explanation);
    println!(
        "placement: {} ({}) -> {:.0} tok/s predicted for one stream",
        p.strategy.describe(p.nodes.len()),
        p.nodes.join(", "),
        p.predicted_decode_tok_s
    );
    for (line, node) in shards.describe(&cfg).lines().zip(&p.nodes) {
        println!("  {node}: {line}");
    }
    Ok(())
}

/// This machine as a one-node cluster: available memory from /proc/meminfo, bandwidth measured.
fn this_machine() -> Node {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = strata_kernels::ThreadPool::new(threads);
    Node {
        id: hostname(),
        memory_available: available,
        // The best of several passes: one or two vary with whatever else ran just before, and
        // the prediction with them.
        mem_bandwidth: strata_kernels::membw::read_bandwidth(&pool, 256 << 20, 8),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "this-machine".into())
}
