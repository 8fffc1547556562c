//! `strata-bench cluster`: serving speed through the OpenAI API, on the path users take.
//!
//! It starts `strata node` processes on this machine (loopback ports, `--threads` each, so one
//! node is one core when `--threads 1`), emulates the link between them in the data plane at
//! each regime asked for (the planner's link presets: RDMA over Thunderbolt 5, TCP over
//! Thunderbolt, gigabit Ethernet...; RDMA-class links over shared memory, which like RDMA
//! spares each message the kernel's TCP stack, TCP-class links over TCP), loads the model with
//! each strategy, and drives `/v1/chat/completions` with 1, 4 and 16 concurrent streaming
//! clients. Every configuration is
//! measured in the same run as one node on the same path (the baseline) and, where llama.cpp's
//! tools are installed, llama.cpp's RPC backend with two single-threaded servers on loopback.
//! Each figure is printed beside the planner's prediction for it, so the planner's error is
//! measured where it matters.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use serde_json::json;
use strata_cluster::{StrategyChoice, Workload};
use strata_node::daemon::Status;
use strata_node::instances::{InstanceSpec, LoadRequest};

use crate::engine::median;
use strata::cmd_cluster::NodeAddr;

mod nodes;
mod predict;
mod traffic;

use nodes::*;
use predict::*;
use traffic::*;

/// `strata-bench cluster`.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    /// Model id from the catalog or a path to a GGUF file.
    #[arg(long, short = 'm', default_value = strata_store::DEFAULT_MODEL_ID)]
    model: String,
    /// Nodes of the cluster (one node is always measured too, as the baseline).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Compute threads of every node.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Link presets to emulate, comma-separated (`strata plan --help` lists them; `none` is
    /// loopback as it is).
    #[arg(long, value_delimiter = ',', default_values_t = ["tb5-rdma".to_string(), "tb-tcp".into(), "1gbe".into()])]
    links: Vec<String>,
    /// The nodes' data plane: `preset` emulates RDMA-class links over shared memory and the
    /// rest over TCP (as the link would carry them); `tcp` or `shm` every link alike.
    #[arg(long, default_value = "preset", value_parser = ["preset", "tcp", "shm"])]
    transport: String,
    /// Strategies to load the model with on every link: tensor, pipeline, expert, hybrid.
    #[arg(long, value_delimiter = ',', default_values_t = ["tensor".to_string(), "pipeline".into()])]
    strategies: Vec<String>,
    /// Concurrent streaming clients of each measurement, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16])]
    streams: Vec<usize>,
    /// Tokens each request generates (at most).
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Requests each client makes in a row at each level.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Prompt tokens of the prefill measurement (one request, one token generated).
    #[arg(long, default_value_t = 256)]
    prefill_tokens: usize,
    /// Context positions per sequence of the loaded instances.
    #[arg(long, default_value_t = 2048)]
    ctx_size: usize,
    /// Sampling temperature of the clients (0 is greedy); top-k 40, as llama.cpp samples.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Write the results as JSON here (`scripts/plot-cluster.py` draws them).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Leave the node logs and state here instead of a temporary directory.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    #[command(flatten)]
    llama: crate::engine::LlamaOpts,
}

/// One level of concurrent clients.
#[derive(Debug, Clone, Serialize)]
struct Level {
    clients: usize,
    requests: usize,
    /// Prompt tokens of all requests (each prompt is prefilled while others decode).
    prompt_tokens: usize,
    tokens: usize,
    aggregate_tok_s: f64,
    per_stream_tok_s: f64,
    ttft_p50_s: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
    /// Decode rate while every client's stream is live (from the last first token to the first
    /// last token, every stream's tokens in that window): batched decoding with no prompt in
    /// the way. `None` when the streams never all overlapped.
    steady_tok_s: Option<f64>,
    predicted_steady_tok_s: Option<f64>,
    predicted_aggregate_tok_s: Option<f64>,
    predicted_per_stream_tok_s: Option<f64>,
    /// Aggregate over one node's at the same level.
    vs_one_node: Option<f64>,
    /// Cores the node processes and their rank workers kept busy on average over the level
    /// (CPU time over wall time; `None` where `/proc` does not tell; a worker that exits
    /// within the level is not counted), and the clients (this process's threads),
    /// which share the machine's cores with them.
    nodes_cores: Option<f64>,
    clients_cores: f64,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
struct Row {
    link: String,
    /// The nodes' data plane under the emulated link (`shm` or `tcp`).
    transport: String,
    latency_us: f64,
    bandwidth_gbit: Option<f64>,
    nodes: usize,
    strategy: String,
    /// What the planner picks by itself on this link (`single` when it would rather use one
    /// node than split over it).
    planner_choice: String,
    /// Whether that is this row's strategy.
    planner_pick: bool,
    /// The tok/s the planner predicted for one stream when it placed the instance.
    predicted_decode_tok_s: f64,
    /// The link as the nodes measured it (what the planner priced), one-way us and Gbit/s.
    measured_latency_us: Option<f64>,
    measured_gbit: Option<f64>,
    prefill_tok_s: f64,
    predicted_prefill_tok_s: Option<f64>,
    levels: Vec<Level>,
}

/// Measures one loaded instance: prefill, then every level of clients.
fn measure(
    url: &str,
    model: &str,
    a: &ClusterArgs,
    p: &Predictor,
    name: &str,
    pids: &[u32],
) -> Result<(f64, Option<f64>, Vec<Level>)> {
    // Warm-up: the first request pays for page faults and thread start-up.
    stream_one(url, model, &format!("[{name}-warm] Hello"), 4, 0.0, 0)?;
    let (n, prefill_rate) = prefill(url, model, a.prefill_tokens, &format!("{name}-prefill"))?;
    let predicted_prefill = p.estimate(n, 1).and_then(|e| e.prefill_tok_s);
    let mut levels = Vec::new();
    for &c in &a.streams {
        eprintln!("  {name}: {c} client(s)");
        let mut l = level(url, model, a, c, &format!("{name}-{c}"), pids)?;
        // What the planner predicts for this work: each request's prompt prefilled, then
        // its tokens decoded `c` at a time, on average half of them deeper than the prompt.
        let n = l.requests.max(1) as f64;
        let (prompt, generated) = (l.prompt_tokens as f64 / n, l.tokens as f64 / n);
        let decode = p.estimate(prompt as usize + generated as usize / 2, c);
        let whole = p.estimate(prompt as usize, 1).and_then(|e| e.prefill_tok_s);
        // Among live streams the scheduler prefills a prompt `LIVE_CHUNK` tokens a round.
        let live = p
            .estimate(strata_api::LIVE_CHUNK, 1)
            .and_then(|e| e.prefill_tok_s);
        if let (Some(e), Some(whole), Some(live)) = (decode, whole, live) {
            let work = LevelWork {
                clients: c,
                requests: l.requests.max(1),
                prompt,
                generated,
            };
            let (aggregate, per_stream) =
                work.predict(e.decode_aggregate_tok_s, prompt / whole, prompt / live);
            l.predicted_aggregate_tok_s = Some(aggregate);
            l.predicted_steady_tok_s = Some(e.decode_aggregate_tok_s);
            l.predicted_per_stream_tok_s = Some(per_stream);
        }
        levels.push(l);
    }
    Ok((prefill_rate, predicted_prefill, levels))
}

/// What one loaded instance gave.
struct Measured {
    spec: InstanceSpec,
    prefill: f64,
    predicted_prefill: Option<f64>,
    levels: Vec<Level>,
    /// The slowest link among its nodes as measured (one-way us, Gbit/s).
    link: Option<(f64, f64)>,
}

/// Loads `strategy` (or the planner's pick when `None`) on running nodes and measures it.
fn run_config(
    nodes: &Nodes,
    a: &ClusterArgs,
    model: &str,
    facts: &strata_cluster::ModelFacts,
    strategy: Option<StrategyChoice>,
    name: &str,
) -> Result<Measured> {
    let node = NodeAddr::at(&nodes.urls[0]);
    let req = LoadRequest {
        strategy,
        ..load_request(a, model)
    };
    eprintln!("{name}: loading");
    let spec = load(&node, &req)?;
    let status: Status = node.call("GET", "/v1/cluster/status", None)?;
    let placement = spec
        .placement
        .clone()
        .context("the instance has no placement")?;
    let p = Predictor {
        facts: facts.clone(),
        status,
        placement,
        context: a.ctx_size,
    };
    let served = served_model(&nodes.urls[0])?;
    let link = p.link();
    let pids: Vec<u32> = nodes.children.iter().map(Child::id).collect();
    let (prefill, predicted_prefill, levels) =
        measure(&nodes.urls[0], &served, a, &p, name, &pids)?;
    let body = json!({ "instance": spec.id });
    node.call::<serde_json::Value>("POST", "/v1/cluster/unload", Some(&body))?;
    // Wait until the ranks have let go of their memory before the next load.
    let deadline = Instant::now() + Duration::from_secs(60);
    while models(&nodes.urls[0]).map_or(1, |m| m.len()) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(1));
    Ok(Measured {
        spec,
        prefill,
        predicted_prefill,
        levels,
        link,
    })
}

pub(crate) fn cluster(a: ClusterArgs) -> Result<()> {
    if a.nodes < 2 || a.threads == 0 || a.tokens < 2 || a.rounds == 0 || a.streams.contains(&0) {
        bail!(
            "--nodes must be at least 2; --threads, --rounds and every --streams at least 1; --tokens at least 2"
        );
    }
    let links = a
        .links
        .iter()
        .map(|l| link_setting(l, &a.transport))
        .collect::<Result<Vec<_>>>()?;
    let strategies = a
        .strategies
        .iter()
        .map(|s| strategy_choice(s, a.nodes))
        .collect::<Result<Vec<_>>>()?;
    let path = strata::cmd_run::resolve_model(&a.model)?;
    let file = strata_gguf::GgufFile::open(&path)?;
    let facts = strata_cluster::ModelFacts::from_gguf(&file)?;
    drop(file);
    // A catalog id is loaded by id; a file by its path, from a directory the nodes allow.
    let (model, model_dir) = if Path::new(&a.model).is_file() {
        let canon = std::fs::canonicalize(&path)?;
        let dir = canon.parent().map(Path::to_path_buf);
        (canon.display().to_string(), dir)
    } else {
        (a.model.clone(), None)
    };
    let dir = match &a.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("strata-bench-cluster-{}", std::process::id())),
    };
    let cpu = cpu_name();
    eprintln!(
        "strata-bench cluster: {} on {cpu}; work directory {}",
        a.model,
        dir.display()
    );

    // One node on the same path: the baseline.
    let base_dir = dir.join("one-node");
    std::fs::create_dir_all(&base_dir)?;
    let one = {
        let none = link_setting("none", &a.transport)?;
        let nodes = start_nodes(&base_dir, 1, a.threads, &none, model_dir.as_deref())?;
        let Measured {
            spec,
            prefill,
            predicted_prefill: pred_prefill,
            levels,
            ..
        } = run_config(&nodes, &a, &model, &facts, None, "1 node")?;
        Row {
            link: "-".into(),
            transport: none.transport.into(),
            latency_us: 0.0,
            bandwidth_gbit: None,
            nodes: 1,
            strategy: "single".into(),
            planner_choice: "single".into(),
            planner_pick: true,
            predicted_decode_tok_s: spec.placement.map_or(0.0, |p| p.predicted_decode_tok_s),
            measured_latency_us: None,
            measured_gbit: None,
            prefill_tok_s: prefill,
            predicted_prefill_tok_s: pred_prefill,
            levels,
        }
    };
    let mut rows = vec![one.clone()];
    for link in &links {
        let ldir = dir.join(&link.id);
        std::fs::create_dir_all(&ldir)?;
        let nodes = start_nodes(&ldir, a.nodes, a.threads, link, model_dir.as_deref())?;
        let pick = match planner_pick(&NodeAddr::at(&nodes.urls[0]), &load_request(&a, &model)) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!(
                    "note: the planner's own pick on {} is unknown: {e:#}",
                    link.id
                );
                None
            }
        };
        for &s in &strategies {
            let name = format!("{} nodes {} {}", a.nodes, s.name(), link.id);
            let Measured {
                spec,
                prefill,
                predicted_prefill: pred_prefill,
                mut levels,
                link: measured,
            } = run_config(&nodes, &a, &model, &facts, Some(s), &name)?;
            for l in &mut levels {
                l.vs_one_node = one
                    .levels
                    .iter()
                    .find(|b| b.clients == l.clients)
                    .map(|b| l.aggregate_tok_s / b.aggregate_tok_s);
            }
            rows.push(Row {
                link: link.id.clone(),
                transport: link.transport.into(),
                latency_us: link.latency.as_secs_f64() * 1e6,
                bandwidth_gbit: link.bandwidth.map(|b| b * 8.0 / 1e9),
                nodes: a.nodes,
                strategy: s.name().into(),
                planner_choice: pick.map_or("unknown".into(), |p| p.name().to_string()),
                planner_pick: pick == Some(s),
                predicted_decode_tok_s: spec.placement.map_or(0.0, |p| p.predicted_decode_tok_s),
                measured_latency_us: measured.map(|m| m.0),
                measured_gbit: measured.map(|m| m.1),
                prefill_tok_s: prefill,
                predicted_prefill_tok_s: pred_prefill,
                levels,
            });
        }
    }
    let llama = llama_rpc(&a, &path);
    print_table(&a, &cpu, &rows, llama.as_ref());
    if let Some(out) = &a.json {
        let doc = json!({
            "model": a.model,
            "cpu": cpu,
            "threads_per_node": a.threads,
            "tokens": a.tokens,
            "rounds": a.rounds,
            "temperature": a.temperature,
            "rows": rows,
            "llama_cpp": llama,
        });
        std::fs::write(out, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if a.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// llama.cpp alone (one thread) and its RPC backend over two single-threaded servers on
/// loopback: one stream's decode and prefill, where llama.cpp's tools are installed.
fn llama_rpc(a: &ClusterArgs, model: &Path) -> Option<serde_json::Value> {
    let exe = a.llama.find()?;
    let rpc = exe.with_file_name("ggml-rpc-server");
    let alone = crate::engine::run_llama_bench(&exe, model, 1, a.prefill_tokens, a.tokens, 3, &[]);
    let split = if rpc.is_file() {
        crate::scaling::start_rpc_servers(&rpc, a.nodes).and_then(|(_servers, list)| {
            let extra = ["-rpc".to_string(), list, "-ngl".into(), "99".into()];
            crate::engine::run_llama_bench(&exe, model, 1, a.prefill_tokens, a.tokens, 3, &extra)
        })
    } else {
        Err(anyhow::anyhow!("{} not found", rpc.display()))
    };
    let pair = |r: &Result<(f64, f64)>| match r {
        Ok((pp, tg)) => json!({"prefill_tok_s": pp, "decode_tok_s": tg}),
        Err(e) => json!({"error": format!("{e:#}")}),
    };
    Some(json!({ "one_thread": pair(&alone), "rpc": pair(&split), "rpc_servers": a.nodes }))
}

fn print_table(a: &ClusterArgs, cpu: &str, rows: &[Row], llama: Option<&serde_json::Value>) {
    println!(
        "strata-bench cluster: {} on {cpu}; {} thread(s) per node; {} tokens per request, {} requests per client; planner's prediction in brackets, its error in %\n",
        a.model, a.threads, a.tokens, a.rounds
    );
    println!(
        "| nodes | strategy | link | prefill tok/s | clients | aggregate tok/s | all streams live tok/s | per stream tok/s | TTFT p50 s | ITL p50/p99 ms | cores: nodes + clients | vs 1 node |"
    );
    println!("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let strategy = if r.planner_pick && r.nodes > 1 {
            format!("{} (planner's pick)", r.strategy)
        } else {
            r.strategy.clone()
        };
        let link = if r.nodes == 1 {
            "-".to_string()
        } else {
            match (r.measured_latency_us, r.measured_gbit) {
                (Some(l), Some(g)) => format!(
                    "{} ({:.0} us over {}; measured {l:.1} us, {g:.1} Gbit/s)",
                    r.link, r.latency_us, r.transport
                ),
                _ => format!("{} ({:.0} us over {})", r.link, r.latency_us, r.transport),
            }
        };
        for (i, l) in r.levels.iter().enumerate() {
            let prefill = if i == 0 {
                format!(
                    "{:.1} [{}] {}",
                    r.prefill_tok_s,
                    r.predicted_prefill_tok_s
                        .map_or("-".into(), |p| format!("{p:.1}")),
                    percent_error(r.prefill_tok_s, r.predicted_prefill_tok_s)
                )
            } else {
                String::new()
            };
            println!(
                "| {} | {} | {} | {} | {} | {:.1} [{}] {} | {} | {:.1} [{}] {} | {:.2} | {:.0}/{:.0} | {} + {:.2} | {} |",
                r.nodes,
                strategy,
                link,
                prefill,
                l.clients,
                l.aggregate_tok_s,
                l.predicted_aggregate_tok_s
                    .map_or("-".into(), |p| format!("{p:.1}")),
                percent_error(l.aggregate_tok_s, l.predicted_aggregate_tok_s),
                l.steady_tok_s.map_or("-".into(), |m| format!(
                    "{m:.1} [{}] {}",
                    l.predicted_steady_tok_s
                        .map_or("-".into(), |p| format!("{p:.1}")),
                    percent_error(m, l.predicted_steady_tok_s)
                )),
                l.per_stream_tok_s,
                l.predicted_per_stream_tok_s
                    .map_or("-".into(), |p| format!("{p:.1}")),
                percent_error(l.per_stream_tok_s, l.predicted_per_stream_tok_s),
                l.ttft_p50_s,
                l.itl_p50_ms,
                l.itl_p99_ms,
                l.nodes_cores.map_or("-".into(), |c| format!("{c:.2}")),
                l.clients_cores,
                l.vs_one_node.map_or("1.00x".into(), |x| format!("{x:.2}x")),
            );
        }
    }
    let mut said = Vec::new();
    for r in rows.iter().filter(|r| r.nodes > 1) {
        if !said.contains(&&r.link) {
            said.push(&r.link);
            let what = match r.planner_choice.as_str() {
                "single" => "one node (splitting over this link is predicted slower)".to_string(),
                other => other.to_string(),
            };
            println!("\nOn {}, the planner by itself picks {what}.", r.link);
        }
    }
    if let Some(l) = llama {
        println!(
            "\nllama.cpp (llama-bench, one stream, loopback, no emulated link): one thread {}; RPC backend over {} single-threaded servers {}",
            l["one_thread"], a.nodes, l["rpc"]
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Four clients, two requests each of a 48-token prompt and 64 tokens, decoding at 200
    /// tok/s together.
    fn four_clients() -> LevelWork {
        LevelWork {
            clients: 4,
            requests: 8,
            prompt: 48.0,
            generated: 64.0,
        }
    }

    #[test]
    fn prompts_among_live_streams_cost_their_live_chunks() {
        let w = four_clients();
        // Live chunks as fast as whole blocks: each round is four prompts then 64 steps of
        // 20 ms (the first four prompts whole, the next four live, 0.2 s each).
        let (agg, per) = w.predict(200.0, 0.2, 0.2);
        assert!((agg - 8.0 * 64.0 / (8.0 * 0.2 + 2.0 * 64.0 * 0.02)).abs() < 1e-9);
        assert!((per - 64.0 / (64.0 * 0.02 + 3.0 * 0.2)).abs() < 1e-9);
        // Twice as slow in live chunks: only the four prompts that arrive among live streams
        // cost more, and every stream waits for three of them.
        let (agg2, per2) = w.predict(200.0, 0.2, 0.4);
        assert!((agg2 - 8.0 * 64.0 / (4.0 * 0.2 + 4.0 * 0.4 + 2.56)).abs() < 1e-9);
        assert!((per2 - 64.0 / (1.28 + 3.0 * 0.4)).abs() < 1e-9);
        assert!(agg2 < agg && per2 < per);
        // One client: its requests come one after another, every prompt whole.
        let one = LevelWork {
            clients: 1,
            requests: 2,
            ..four_clients()
        };
        let (agg1, per1) = one.predict(100.0, 0.2, 5.0);
        assert!((agg1 - 128.0 / (0.4 + 1.28)).abs() < 1e-9);
        assert!((per1 - 100.0).abs() < 1e-9);
    }

    fn stream(arrivals: &[f64]) -> Stream {
        Stream {
            prompt_tokens: 10,
            tokens: arrivals.len(),
            ttft: arrivals[0],
            arrivals: arrivals.to_vec(),
        }
    }

    #[test]
    fn rdma_class_links_are_emulated_over_shared_memory_and_tcp_ones_over_tcp() {
        let via = |id: &str, t: &str| link_setting(id, t).unwrap().transport;
        assert_eq!(via("tb5-rdma", "preset"), "shm");
        assert_eq!(via("100gbe", "preset"), "shm");
        assert_eq!(via("tb-tcp", "preset"), "tcp");
        assert_eq!(via("1gbe", "preset"), "tcp");
        assert_eq!(via("none", "preset"), "tcp");
        assert_eq!(via("tb5-rdma", "tcp"), "tcp");
        assert_eq!(via("tb-tcp", "shm"), "shm");
        assert!(link_setting("loopback-shm", "preset").is_err());
    }

    #[test]
    fn the_steady_rate_counts_only_while_every_stream_is_live() {
        // Two clients, one round: live together from 1.0 s (the later first token) to 3.0 s
        // (the earlier last one); tokens inside: 1.5, 2, 2.5, 3 and 1.2, 2.2.
        let s = [
            stream(&[0.5, 1.0, 1.5, 2.0, 2.5, 3.0]),
            stream(&[1.0, 1.2, 2.2, 3.5, 4.0]),
        ];
        let rate = steady_rate(&s, 1).unwrap();
        assert!((rate - 6.0 / 2.0).abs() < 1e-9, "{rate}");
        // With two rounds per client only the first of each counts.
        let s = [
            stream(&[0.5, 1.0, 1.5, 2.0, 2.5, 3.0]),
            stream(&[5.0, 6.0]),
            stream(&[1.0, 1.2, 2.2, 3.5, 4.0]),
            stream(&[5.0, 6.0]),
        ];
        assert!((steady_rate(&s, 2).unwrap() - 3.0).abs() < 1e-9);
        // Streams that never overlap have no steady rate.
        let s = [stream(&[0.0, 1.0]), stream(&[2.0, 3.0])];
        assert!(steady_rate(&s, 1).is_none());
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
