//! `strata plan`: where and how a model would run, how fast, and for how many users, on a
//! cluster that is running, described in a file, or not bought yet.
//!
//! The model is a catalog id, a GGUF file (only its header is read, so a file cut after its
//! header will do), a model card (`llama-3.3-70b:f16`) or a card file (JSON). The cluster is
//! this machine (measured now), a cluster file (`--cluster`, the format at the end of
//! `--help`), or presets (`--nodes 4x m3-ultra-512 --link tb5-rdma`). The answer: whether it
//! fits and the room left for KV cache, the placement and its shares, predicted prefill and
//! decode speed for one and for N streams, time to first token, power and energy, and the
//! alternatives the planner rejected.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use strata_cluster::hardware::{self, presets};
use strata_cluster::{
    Combine, Link, ModelFacts, Node, Placement, Request, StrategyChoice, Workload, cards, estimate,
    fit, place, published,
};
use strata_gguf::GgufFile;
use strata_parallel::{CombineStyle, Strategy, make_plan};

/// The cluster file's format and the presets, for `--help`.
const CLUSTER_FORMAT: &str = "\
The cluster file (--cluster) is JSON: the nodes with their free memory and measured memory
bandwidth, and the links between them (bytes, bytes per second, seconds); `flops`,
`message_overhead` (seconds) and `power_watts` per node are optional:

  {\"nodes\": [{\"id\": \"a\", \"memory_available\": 16000000000, \"mem_bandwidth\": 3e10},
             {\"id\": \"b\", \"memory_available\": 16000000000, \"mem_bandwidth\": 3e10}],
   \"links\": [{\"a\": \"a\", \"b\": \"b\", \"latency\": 5e-6, \"bandwidth\": 1e10}]}

A running cluster's own figures are in `strata devices --json` and `strata status --json`.

Hardware you do not have: --nodes takes presets, as COUNTx PRESET or a comma list
(`--nodes 4x m3-ultra-512`, `--nodes 2x m4-pro-mini-64,dgx-spark`), --link a link preset or
LATENCY[,GBIT] (`--link tb5-rdma`, `--link 50us,10`), and --model a card (`deepseek-v3.1:q4`)
or a card file (JSON). `strata plan --list` shows every preset, card and quantisation with its
source; `strata plan --published` compares the predictions with published cluster results.
Without --cluster or --nodes, the plan is for this machine alone, measured now.";

/// `strata plan`.
#[derive(Debug, Args)]
#[command(after_long_help = CLUSTER_FORMAT)]
pub(crate) struct PlanArgs {
    /// Model: catalog id, GGUF file (its header suffices), card (`ID[:QUANT]`, see `--list`)
    /// or card file (`.json`).
    #[arg(long, short = 'm', default_value = strata_store::DEFAULT_MODEL_ID)]
    model: String,
    /// The cluster, as JSON (its format is at the end of `strata plan --help`).
    #[arg(long, conflicts_with = "link")]
    cluster: Option<PathBuf>,
    /// With --cluster: use exactly these node ids, comma-separated. Otherwise: node presets,
    /// as `COUNTx PRESET` or a comma list (`4x m3-ultra-512`, `m3-ultra-512,m3-ultra-256`;
    /// `this-machine` is this machine measured).
    #[arg(long, num_args = 1.., value_name = "NODES")]
    nodes: Option<Vec<String>>,
    /// Link between preset nodes: a preset (see `--list`) or `LATENCY[,GBIT]` (`50us,10`).
    #[arg(long, default_value = "10gbe")]
    link: String,
    /// Context positions to reserve KV cache for, per stream (default: the model's, at most
    /// 8192, as `serve`, `run` and `load` use).
    #[arg(long)]
    ctx_size: Option<usize>,
    /// Prompt length for prefill and time to first token; N-stream decoding runs this deep.
    #[arg(long, default_value_t = 1024)]
    prompt: usize,
    /// Concurrent streams for the N-stream figures (at most what the KV room holds).
    #[arg(long, default_value_t = 8, value_parser = crate::args::at_least_one)]
    streams: usize,
    /// Force a strategy.
    #[arg(long, value_enum)]
    strategy: Option<crate::cmd_shard::StrategyArg>,
    /// Ranks per stage when forcing `hybrid`.
    #[arg(long, default_value_t = 2)]
    tp_size: usize,
    /// How tensor-parallel groups combine: `gather` (four exchanges a layer, bit-identical to
    /// one process; what strata's cluster loads use) or `reduce` (two all-reduces a layer).
    #[arg(long, value_enum, default_value_t = crate::cmd_shard::CombineArg::Gather)]
    combine: crate::cmd_shard::CombineArg,
    /// Threads `this-machine` is measured with (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// List the node and link presets, model cards and quantisations, with their sources.
    #[arg(long)]
    list: bool,
    /// Compare the planner with published cluster measurements (each with its source).
    #[arg(long)]
    published: bool,
    /// With --published: also fit the class constants to the judged rows and predict each
    /// row with constants fitted without it (leave-one-out).
    #[arg(long, requires = "published")]
    loo: bool,
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

/// The model to plan for: its facts, and its file when it has one (for the shard listing).
struct Model {
    facts: ModelFacts,
    file: Option<GgufFile>,
}

/// The cluster to plan on, and how it was described.
struct Described {
    cluster: ClusterFile,
    /// The nodes the placement must use (`None`: the fewest that fit).
    use_nodes: Option<Vec<String>>,
    /// In words.
    what: String,
    /// Which figures each Apple preset stands for (GPU-class or CPU), one line each.
    classes: Vec<String>,
}

pub(crate) fn plan(a: PlanArgs) -> Result<()> {
    if a.list {
        return list(a.json);
    }
    if a.published {
        return show_published(a.json, a.loo);
    }
    if a.ctx_size == Some(0) {
        bail!("--ctx-size must be at least 1");
    }
    let model = load_model(&a.model)?;
    let facts = &model.facts;
    let described = describe_cluster(&a, facts)?;
    let context = a.ctx_size.unwrap_or(facts.default_context);
    let req = Request {
        context,
        combine: match a.combine {
            crate::cmd_shard::CombineArg::Gather => Combine::Gather,
            crate::cmd_shard::CombineArg::Reduce => Combine::Reduce,
        },
        strategy: a.strategy.map(|s| match s {
            crate::cmd_shard::StrategyArg::Tensor => StrategyChoice::Tensor,
            crate::cmd_shard::StrategyArg::Pipeline => StrategyChoice::Pipeline,
            crate::cmd_shard::StrategyArg::Hybrid => StrategyChoice::Hybrid { tp: a.tp_size },
            crate::cmd_shard::StrategyArg::Expert => StrategyChoice::Expert,
        }),
        nodes: described.use_nodes.clone(),
        fewest: false,
        // The plan must hold one context; how many more fit is what the estimate reports.
        sequences: 1,
        prefix_cache: 0,
    };
    let cluster = &described.cluster;
    let p = place(facts, &cluster.nodes, &cluster.links, &req)?;
    let work = Workload {
        context,
        prompt: a.prompt,
        streams: a.streams,
    };
    let est = estimate(facts, &cluster.nodes, &cluster.links, &p, &work)
        .context("estimating the placement's service")?;
    // The fewest nodes that hold it, when the plan was told to use them all.
    let fewest = if described.use_nodes.is_some() && p.nodes.len() > 1 {
        let free = Request {
            nodes: None,
            strategy: None,
            fewest: true,
            ..req.clone()
        };
        place(facts, &cluster.nodes, &cluster.links, &free)
            .ok()
            .filter(|f| f.nodes.len() < p.nodes.len())
    } else {
        None
    };
    let shards = match &model.file {
        Some(file) => Some(shards(file, &p)?),
        None => None,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "model": facts,
                "context": context,
                "cluster": cluster,
                "placement": p,
                "decode_tok_s": p.predicted_decode_tok_s,
                "estimate": est,
                "workload": work,
                "fewest_nodes": fewest,
                "preset_classes": described.classes,
                "shards": shards.as_ref().map(|(s, _)| s),
            }))?
        );
        return Ok(());
    }
    print_plan(facts, &described, &p, &est, &work, fewest.as_ref());
    if let Some((_, lines)) = shards {
        for (line, node) in lines.iter().zip(&p.nodes) {
            println!("  {node}: {line}");
        }
    }
    Ok(())
}

/// The model from a card, a card file, a GGUF header or the catalog.
fn load_model(spec: &str) -> Result<Model> {
    let cards = cards::cards();
    let path = Path::new(spec);
    if spec.ends_with(".json") {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading the card {spec}"))?;
        return Ok(Model {
            facts: cards.from_json(&text)?,
            file: None,
        });
    }
    let id = spec.split(':').next().unwrap_or(spec);
    if cards.models.iter().any(|c| c.id.eq_ignore_ascii_case(id)) {
        return Ok(Model {
            facts: cards.resolve(spec)?.0,
            file: None,
        });
    }
    // A GGUF's header holds every shape the plan needs; a file cut after it will do.
    let file_path = if strata_store::is_path_spec(spec) {
        PathBuf::from(spec)
    } else {
        crate::cmd_run::resolve_model(spec).map_err(|e| {
            anyhow::anyhow!(
                "{e:#} (model cards: {})",
                cards
                    .models
                    .iter()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?
    };
    let file = GgufFile::open_header(&file_path)
        .with_context(|| format!("reading the header of {}", file_path.display()))?;
    let mut facts = ModelFacts::from_gguf(&file)?;
    // The name the user gave: a catalog id, or the file's name (a GGUF's `general.name` is
    // often a training run's label).
    facts.name = match file_path.file_name() {
        Some(n) if strata_store::is_path_spec(spec) => n.to_string_lossy().into_owned(),
        _ => spec.to_string(),
    };
    Ok(Model {
        facts,
        file: Some(file),
    })
}

/// The cluster from a file, from presets, or this machine.
fn describe_cluster(a: &PlanArgs, facts: &ModelFacts) -> Result<Described> {
    if let Some(p) = &a.cluster {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let cluster = serde_json::from_str::<ClusterFile>(&text).with_context(|| {
            format!(
                "parsing the cluster file {} (its format is at the end of `strata plan --help`)",
                p.display()
            )
        })?;
        return Ok(Described {
            use_nodes: a.nodes.as_ref().map(|n| {
                n.join(",")
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            }),
            what: format!("the cluster in {}", p.display()),
            cluster,
            classes: Vec::new(),
        });
    }
    // `--nodes 4x m3-ultra-512` arrives as two words.
    let Some(spec) = a.nodes.as_ref().map(|n| n.join(" ")) else {
        let node = this_machine(a.threads, facts.weight_bytes)?;
        return Ok(Described {
            what: format!("this machine ({}, measured now)", node.id),
            classes: Vec::new(),
            cluster: ClusterFile {
                nodes: vec![node],
                links: Vec::new(),
            },
            use_nodes: None,
        });
    };
    let items = hardware::parse_nodes(&spec)?;
    let total: usize = items.iter().map(|(n, _)| n).sum();
    let me = if items
        .iter()
        .any(|(_, n)| n.eq_ignore_ascii_case("this-machine"))
    {
        // Each node's share of the weights is the working set its bandwidth is read over.
        Some(this_machine(
            a.threads,
            facts.weight_bytes / total.max(1) as u64,
        )?)
    } else {
        None
    };
    let p = presets();
    let mut classes: Vec<String> = Vec::new();
    for (_, name) in &items {
        if let Some(line) = p.node(name).ok().and_then(|n| n.engine_class(p))
            && !classes.contains(&line)
        {
            classes.push(line);
        }
    }
    let (latency, bandwidth, link_words) = link(&a.link)?;
    let (nodes, links) = hardware::cluster(&items, latency, bandwidth, me.as_ref())?;
    let count = total;
    Ok(Described {
        use_nodes: Some(nodes.iter().map(|n| n.id.clone()).collect()),
        what: if count > 1 {
            format!("{count} nodes ({spec}) over {link_words}")
        } else {
            format!("one node ({spec})")
        },
        cluster: ClusterFile { nodes, links },
        classes,
    })
}

/// Latency (s), bandwidth (bytes/s) and a description of `--link`.
fn link(spec: &str) -> Result<(f64, f64, String)> {
    let p = presets();
    let preset = p.link(spec);
    if let Ok(l) = preset {
        if let Some(transport) = &l.measured {
            let (lat, bw) = measure_loopback(transport)?;
            return Ok((
                lat,
                bw,
                format!(
                    "{} ({:.1} us, {:.1} Gbit/s measured now)",
                    l.id,
                    lat * 1e6,
                    bw * 8.0 / 1e9
                ),
            ));
        }
        return Ok((
            l.latency_us * 1e-6,
            l.bandwidth_gbit * 1e9 / 8.0,
            format!("{} ({})", l.id, l.name),
        ));
    }
    let (lat, gbit) = match spec.split_once(',') {
        Some((l, b)) => (l, Some(b)),
        None => (spec, None),
    };
    let Ok(latency) = strata_net::parse_latency(lat.trim()) else {
        // Neither a preset nor a latency: say what the presets are.
        return Err(match preset {
            Err(e) => e.into(),
            Ok(_) => anyhow::anyhow!("--link {spec}: not a link"),
        });
    };
    let gbit: f64 = match gbit {
        Some(b) => b
            .trim()
            .trim_end_matches("gbit")
            .parse()
            .ok()
            .filter(|g: &f64| *g > 0.0)
            .with_context(|| format!("--link {spec}: {b:?} is not a bandwidth in Gbit/s"))?,
        None => 10.0,
    };
    Ok((
        latency.as_secs_f64(),
        gbit * 1e9 / 8.0,
        format!("a {lat} link of {gbit} Gbit/s"),
    ))
}

/// One-way latency (half the median of many round trips of a small message) and bandwidth (a
/// stream of 4 MB messages) of strata's data plane between two ranks on this machine.
fn measure_loopback(transport: &str) -> Result<(f64, f64)> {
    let transport = if transport == "shm" {
        strata_net::Transport::Shm
    } else {
        strata_net::Transport::Tcp
    };
    let (mut c, mut peer_comm) = strata_net::loopback_pair(transport)?;
    const ROUNDS: usize = 2000;
    const BIG: usize = 4 << 20;
    const BIGS: usize = 16;
    let peer = std::thread::spawn(move || -> Result<()> {
        let c = &mut peer_comm;
        for _ in 0..ROUNDS {
            let m = c.recv(0)?.to_vec();
            c.send(0, &m)?;
        }
        for _ in 0..BIGS {
            c.recv(0)?;
        }
        c.send(0, b"done")?;
        Ok(())
    });
    let small = [0u8; 64];
    let mut trips = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        c.send(1, &small)?;
        c.recv(1)?;
        trips.push(t.elapsed().as_secs_f64());
    }
    // The median round trip: exchanges during decoding meet the typical wake-up, not the
    // luckiest one.
    trips.sort_by(f64::total_cmp);
    let trip = trips[ROUNDS / 2];
    let big = vec![1u8; BIG];
    let t = Instant::now();
    for _ in 0..BIGS {
        c.send(1, &big)?;
    }
    c.recv(1)?;
    let bw = (BIG * BIGS) as f64 / t.elapsed().as_secs_f64();
    peer.join()
        .map_err(|_| anyhow::anyhow!("the measuring peer panicked"))??;
    Ok((trip / 2.0, bw))
}

/// This machine as a node: available memory from /proc/meminfo, bandwidth and matmul
/// throughput measured now on `threads` threads, through the `measured` class's constants.
/// Bandwidth is read over `working_set` bytes (the node's share of the weights) read in a
/// cycle, as decoding reads them: a share that fits the last-level cache partly streams from
/// it there too, one that does not streams from memory (at least 16 MB, at most 1 GB).
fn this_machine(threads: Option<usize>, working_set: u64) -> Result<Node> {
    let available = strata_node::profile::memory().1;
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = strata_kernels::ThreadPool::new(threads.max(1));
    // The best of several passes: one or two vary with whatever else ran just before, and
    // the prediction with them.
    let bytes = working_set.clamp(16 << 20, 1 << 30) as usize;
    let bandwidth = strata_kernels::membw::read_bandwidth(&pool, bytes, 8);
    let by_type = strata_node::profile::matmul_gflops_by_type(&pool);
    let gflops = strata_node::profile::q8_0_gflops(&by_type);
    let attention = strata_node::profile::attention_speed(pool.n_threads());
    let row_cost = strata_node::profile::row_cost_s(pool.n_threads(), &attention);
    let stream = strata_node::profile::stream_gweights_by_type(&pool);
    let class = presets()
        .class("measured")
        .context("the presets lack the measured class")?;
    Ok(Node {
        id: strata_node::identity::hostname(),
        memory_available: (available as f64 * class.usable_memory) as u64,
        mem_bandwidth: bandwidth * class.bandwidth_efficiency,
        flops: gflops * 1e9 * class.compute_efficiency,
        flops_by_type: by_type
            .into_iter()
            .map(|(t, g)| (t, g * 1e9 * class.compute_efficiency))
            .collect(),
        attn_flops: attention.gflops * 1e9 * class.compute_efficiency,
        attn_fixed: attention.fixed_s / class.compute_efficiency,
        row_cost: row_cost / class.compute_efficiency,
        stream_by_type: stream
            .into_iter()
            .map(|(t, g)| (t, g * 1e9 * class.bandwidth_efficiency))
            .collect(),
        // Measured here as live nodes measure it; the class's figure stands where it cannot be.
        message_overhead: strata_node::profile::exchange_overhead_us()
            .unwrap_or(class.message_overhead_us)
            * 1e-6,
        ..Node::default()
    })
}

/// Every rank's shard of a model with a file, as data and as lines.
fn shards(file: &GgufFile, p: &Placement) -> Result<(strata_parallel::Plan, Vec<String>)> {
    let cfg = strata_engine::ModelConfig::from_gguf(file)?;
    let strategy = match p.strategy {
        StrategyChoice::Single | StrategyChoice::Tensor => Strategy::Tensor,
        StrategyChoice::Pipeline => Strategy::Pipeline,
        StrategyChoice::Hybrid { tp } => Strategy::Hybrid { tp },
        StrategyChoice::Expert => Strategy::Expert,
    };
    let style = match p.combine {
        Combine::Gather => CombineStyle::Gather,
        Combine::Reduce => CombineStyle::Reduce,
    };
    // One node's shard is the whole model; the plan says so in the same terms.
    let plan = make_plan(file, &cfg, strategy, p.nodes.len(), Some(&p.weights), style)?;
    let lines = plan.describe(&cfg).lines().map(str::to_string).collect();
    Ok((plan, lines))
}

fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

fn print_plan(
    m: &ModelFacts,
    d: &Described,
    p: &Placement,
    e: &strata_cluster::Estimate,
    w: &Workload,
    fewest: Option<&Placement>,
) {
    println!("{} on {}", m.name, d.what);
    for line in &d.classes {
        println!("  assumes {line}");
    }
    println!(
        "  fits: {} of weights in {} of memory; {} left for KV cache: {} contexts of {} \
         positions at once ({} each)",
        gb(e.weight_bytes),
        gb(e.memory_bytes),
        gb(e.kv_room_bytes),
        e.contexts_that_fit,
        w.context,
        gb(e.kv_bytes_per_context)
    );
    println!(
        "  placement: {} ({}) -> {:.1} tok/s predicted for one stream",
        p.strategy.describe(p.nodes.len()),
        p.nodes.join(", "),
        p.predicted_decode_tok_s
    );
    println!(
        "  decode: {:.1} tok/s for one stream; {} streams {} positions deep: {:.1} tok/s in all, \
         {:.1} each",
        e.decode_tok_s,
        e.streams,
        w.prompt.min(w.context),
        e.decode_aggregate_tok_s,
        e.decode_per_stream_tok_s
    );
    match (e.prefill_tok_s, e.ttft_s) {
        (Some(pp), Some(ttft)) => println!(
            "  prefill: {pp:.0} tok/s; time to first token of a {}-token prompt: {ttft:.2} s",
            w.prompt
        ),
        _ => println!("  prefill: not predicted (a node's compute is unknown)"),
    }
    if let (Some(watts), Some(j), Some(kwh)) =
        (e.power_watts, e.joules_per_token, e.kwh_per_million_tokens)
    {
        println!(
            "  power: {watts:.0} W; at {} streams {j:.2} J per token, {kwh:.3} kWh per million \
             tokens",
            e.streams
        );
    }
    let others: Vec<String> = p
        .considered
        .iter()
        .filter(|(s, _)| *s != p.strategy)
        .map(|(s, t)| format!("{} {t:.1} tok/s", s.describe(p.nodes.len())))
        .collect();
    if !others.is_empty() {
        println!("  alternatives on these nodes: {}", others.join("; "));
    }
    if let Some(f) = fewest {
        println!(
            "  the fewest nodes that hold it: {} ({}) {:.1} tok/s for one stream",
            f.strategy.describe(f.nodes.len()),
            f.nodes.join(", "),
            f.predicted_decode_tok_s
        );
    }
    println!("{}", p.explanation);
}

/// `strata plan --list`.
fn list(json: bool) -> Result<()> {
    let p = presets();
    let c = cards::cards();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "classes": p.classes.iter().map(|(k, v)| (k.clone(), serde_json::json!({
                    "about": v.about, "bandwidth_efficiency": v.bandwidth_efficiency,
                    "compute_efficiency": v.compute_efficiency,
                    "message_overhead_us": v.message_overhead_us, "usable_memory": v.usable_memory,
                }))).collect::<serde_json::Map<_, _>>(),
                "nodes": p.nodes.iter().map(|n| serde_json::json!({
                    "id": n.id, "name": n.name, "class": n.class, "devices": n.devices,
                    "memory_gb": n.memory_gb, "bandwidth_gbs": n.bandwidth_gbs,
                    "tflops": n.tflops, "power_w": n.power_w, "source": n.source,
                })).collect::<Vec<_>>(),
                "links": p.links.iter().map(|l| serde_json::json!({
                    "id": l.id, "name": l.name, "latency_us": l.latency_us,
                    "bandwidth_gbit": l.bandwidth_gbit, "measured": l.measured, "source": l.source,
                })).collect::<Vec<_>>(),
                "cards": c.models.iter().map(|m| serde_json::json!({
                    "id": m.id, "name": m.name, "native": m.native, "params_b": m.params_b,
                    "active_params_b": m.active_params_b, "source": m.source,
                })).collect::<Vec<_>>(),
                "quants": c.quants.iter().map(|(k, q)| (k.clone(), serde_json::json!({
                    "bits": q.bits, "expert_bits": q.expert_bits, "about": q.about,
                }))).collect::<serde_json::Map<_, _>>(),
            }))?
        );
        return Ok(());
    }
    println!("node presets (--nodes; `this-machine` is this machine measured now):");
    for n in &p.nodes {
        println!(
            "  {:<18} {:>6.0} GB {:>7.0} GB/s {:>6.0} TFLOPS {:>6.0} W  {} [{}]",
            n.id, n.memory_gb, n.bandwidth_gbs, n.tflops, n.power_w, n.name, n.class
        );
        println!("  {:<18} source: {}", "", n.source);
    }
    println!("\nlink presets (--link; or LATENCY[,GBIT] such as 50us,10):");
    for l in &p.links {
        if l.measured.is_some() {
            println!("  {:<14} {}", l.id, l.name);
        } else {
            println!(
                "  {:<14} {:>5.0} us {:>6.2} Gbit/s  {}",
                l.id, l.latency_us, l.bandwidth_gbit, l.name
            );
        }
        println!("  {:<14} source: {}", "", l.source);
    }
    println!("\nclass constants (rated figures to what inference reaches):");
    for (k, v) in &p.classes {
        println!(
            "  {k:<9} bandwidth x{:.2}, compute x{:.2}, {:.0} us per peer per exchange, {:.0} % \
             of memory usable: {}",
            v.bandwidth_efficiency,
            v.compute_efficiency,
            v.message_overhead_us,
            v.usable_memory * 100.0,
            v.about
        );
    }
    println!("\nmodel cards (--model ID[:QUANT]):");
    for m in &c.models {
        println!(
            "  {:<18} {:>7.1}B params, {:>5.1}B per token, ships as {:<5} {}",
            m.id, m.params_b, m.active_params_b, m.native, m.name
        );
    }
    println!("\nquantisations:");
    for (k, q) in &c.quants {
        println!("  {k:<6} {}", q.about);
    }
    Ok(())
}

/// `strata plan --published`, and with `--loo` the fit and its leave-one-out check.
fn show_published(json: bool, loo: bool) -> Result<()> {
    if loo {
        return show_loo(json);
    }
    let checked = published::check().map_err(anyhow::Error::msg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&checked)?);
        return Ok(());
    }
    print!("{}", published::table(&checked));
    println!();
    for c in &checked {
        println!("- {} on {}: {}", c.row.model, c.row.nodes, c.row.source);
        if !c.row.judged {
            println!("  not judged: {}", c.row.why);
        }
    }
    Ok(())
}

/// `strata plan --published --loo`.
fn show_loo(json: bool) -> Result<()> {
    let rows = published::rows();
    let p = presets();
    let (_, fitted) = fit::fit(&rows, p).map_err(anyhow::Error::msg)?;
    let loo = fit::leave_one_out(&rows, p).map_err(anyhow::Error::msg)?;
    let (n, median, worst) = fit::summary(&loo);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "fitted": fitted.iter().map(|f| serde_json::json!({
                    "class": f.class, "rows": f.rows,
                    "bandwidth_efficiency": f.bandwidth_efficiency,
                    "message_overhead_us": f.message_overhead_us,
                    "rms_log_error": f.rms_log_error,
                })).collect::<Vec<_>>(),
                "rows": loo.iter().map(|l| serde_json::json!({
                    "model": l.row.model, "nodes": l.row.nodes, "engine": l.row.engine,
                    "judged": l.row.judged, "published_tok_s": l.row.tok_s,
                    "in_sample_tok_s": l.in_sample_tok_s, "loo_tok_s": l.loo_tok_s,
                    "source": l.row.source,
                })).collect::<Vec<_>>(),
                "judged_with_loo": n, "median_abs_loo_error": median, "max_abs_loo_error": worst,
            }))?
        );
        return Ok(());
    }
    println!("class constants fitted to the judged rows (squared log error):\n");
    print!("{}", fit::constants_table(&fitted, p));
    println!(
        "\neach row with the shipped (fitted) constants and with its class refitted without it:\n"
    );
    print!("{}", fit::loo_table(&loo));
    println!(
        "\n{n} judged rows: median |leave-one-out error| {:.0} %, largest {:.0} %",
        median * 100.0,
        worst * 100.0
    );
    for l in loo.iter().filter(|l| !l.row.judged) {
        println!(
            "- {} on {}: not judged: {}",
            l.row.model, l.row.nodes, l.row.why
        );
    }
    Ok(())
}
