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

/// Node processes of one configuration; killed when dropped.
struct Nodes {
    children: Vec<Child>,
    urls: Vec<String>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The CPU's name as the kernel reports it (figures are meaningless without it).
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// What a link preset asks the nodes to emulate.
struct LinkSetting {
    id: String,
    /// The nodes' `--transport`.
    transport: &'static str,
    latency: Duration,
    bandwidth: Option<f64>,
}

fn link_setting(id: &str, transport: &str) -> Result<LinkSetting> {
    let forced = match transport {
        "tcp" => Some("tcp"),
        "shm" => Some("shm"),
        _ => None,
    };
    if id == "none" {
        return Ok(LinkSetting {
            id: id.into(),
            transport: forced.unwrap_or("tcp"),
            latency: Duration::ZERO,
            bandwidth: None,
        });
    }
    let p = strata_cluster::hardware::presets().link(id)?;
    if p.measured.is_some() {
        bail!("link {id} is measured, not emulated: use `none` for loopback as it is");
    }
    Ok(LinkSetting {
        id: id.into(),
        transport: forced.unwrap_or(if p.rdma { "shm" } else { "tcp" }),
        latency: Duration::from_secs_f64(p.latency_us * 1e-6),
        bandwidth: (p.bandwidth_gbit > 0.0).then_some(p.bandwidth_gbit * 1e9 / 8.0),
    })
}

/// Starts `n` nodes that know each other, and waits until each has measured its links.
fn start_nodes(
    dir: &Path,
    n: usize,
    threads: usize,
    link: &LinkSetting,
    model_dir: Option<&Path>,
) -> Result<Nodes> {
    let exe = crate::strata_exe()?;
    let key = dir.join("cluster.key");
    let mut nodes = Nodes {
        children: Vec::new(),
        urls: Vec::new(),
    };
    let mut first_control = None;
    for i in 0..n {
        let (api, control) = (free_port()?, free_port()?);
        let log = std::fs::File::create(dir.join(format!("node{i}.log")))?;
        let mut cmd = Command::new(&exe);
        // Unsupervised: a node that dies is a failed run here, not one to bring back.
        cmd.arg("node")
            .args([
                "--name",
                &format!("bench{i}"),
                "--no-multicast",
                "--no-supervise",
            ])
            .args(["--threads", &threads.to_string()])
            .args(["--transport", link.transport])
            .args(["--api-addr", &format!("127.0.0.1:{api}")])
            .args(["--control-addr", &format!("127.0.0.1:{control}")])
            .args(["--advertise-addr", "127.0.0.1"])
            .arg("--state-dir")
            .arg(dir.join(format!("state{i}")))
            .arg("--cluster-key-file")
            .arg(&key);
        if let Some(c) = first_control {
            cmd.args(["--peer", &format!("127.0.0.1:{c}")]);
        }
        if !link.latency.is_zero() {
            cmd.args([
                "--emulate-link-latency",
                &format!("{}ns", link.latency.as_nanos()),
            ]);
        }
        if let Some(bw) = link.bandwidth {
            cmd.args(["--emulate-link-bandwidth", &format!("{bw}B/s")]);
        }
        if let Some(d) = model_dir {
            cmd.arg("--allow-model-dir").arg(d);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        strata_node::process::die_with_parent(&mut cmd);
        nodes.children.push(cmd.spawn().context("starting a node")?);
        let url = format!("http://127.0.0.1:{api}");
        wait_http(&url, Duration::from_secs(120))
            .with_context(|| format!("node {i} (log: {})", dir.display()))?;
        nodes.urls.push(url);
        first_control.get_or_insert(control);
    }
    // Every node must see the others and have measured its links (with the emulated latency)
    // before the planner can be asked anything.
    let node = NodeAddr::at(&nodes.urls[0]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s: Status = node.call("GET", "/v1/cluster/status", None)?;
        let measured = s.topology.nodes.len() == n
            && s.topology.links.len() == n * (n - 1) / 2
            && s.topology
                .links
                .iter()
                .all(|l| l.latency >= link.latency.as_secs_f64());
        if measured {
            return Ok(nodes);
        }
        if Instant::now() > deadline {
            bail!(
                "the {n} nodes did not all see each other's measured links within 120 s (logs: {})",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn wait_http(url: &str, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    while agent.get(&format!("{url}/health")).call().is_err() {
        if Instant::now() > deadline {
            bail!("{url} did not answer within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn strategy_choice(s: &str, nodes: usize) -> Result<StrategyChoice> {
    Ok(match s {
        "tensor" => StrategyChoice::Tensor,
        "pipeline" => StrategyChoice::Pipeline,
        "expert" => StrategyChoice::Expert,
        "hybrid" => StrategyChoice::Hybrid {
            tp: (nodes / 2).max(1),
        },
        other => bail!("unknown strategy {other:?} (tensor, pipeline, expert, hybrid)"),
    })
}

/// One streamed request: tokens, time to the first token and the arrival of every chunk.
struct Stream {
    prompt_tokens: usize,
    tokens: usize,
    ttft: f64,
    arrivals: Vec<f64>,
}

/// Streams one chat completion and times its chunks.
fn stream_one(
    url: &str,
    model: &str,
    prompt: &str,
    max_tokens: usize,
    temp: f32,
    seed: u64,
) -> Result<Stream> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(1800)))
        .build()
        .into();
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temp,
        "top_k": 40,
        "seed": seed,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let t0 = Instant::now();
    let mut resp = agent
        .post(&format!("{url}/v1/chat/completions"))
        .send_json(&body)
        .with_context(|| format!("reaching {url}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        bail!("{url}: {status}: {text}");
    }
    let reader = BufReader::new(resp.body_mut().as_reader());
    let mut arrivals = Vec::new();
    let mut tokens = None;
    let mut prompt_tokens = 0;
    for line in reader.lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data).context("a stream chunk")?;
        if let Some(e) = v.get("error") {
            bail!("the stream failed: {e}");
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n as usize);
            prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
        }
        let content = v["choices"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
        });
        if content {
            arrivals.push(t0.elapsed().as_secs_f64());
        }
    }
    let end = t0.elapsed().as_secs_f64();
    Ok(Stream {
        prompt_tokens,
        tokens: tokens.context("the stream carried no usage")?,
        ttft: arrivals.first().copied().unwrap_or(end),
        arrivals,
    })
}

const TOPICS: [&str; 4] = [
    "Write a long story about a lighthouse keeper.",
    "Explain how a steam engine works, step by step.",
    "Describe a journey across the mountains in winter.",
    "Write a detailed recipe for bread, with every step.",
];

/// `clients` concurrent clients, each making `rounds` requests in a row. Every prompt starts
/// with its own tag, so no request's prompt is served from another's prefix cache.
fn level(
    url: &str,
    model: &str,
    a: &ClusterArgs,
    clients: usize,
    tag: &str,
    pids: &[u32],
) -> Result<Level> {
    let (nodes_cpu0, clients_cpu0) = (cpu_of(pids), own_cpu());
    let t0 = Instant::now();
    let results: Vec<Result<Vec<Stream>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                s.spawn(move || {
                    (0..a.rounds)
                        .map(|r| {
                            let i = c * a.rounds + r;
                            let prompt = format!("[{tag}-{i}] {}", TOPICS[i % TOPICS.len()]);
                            stream_one(url, model, &prompt, a.tokens, a.temperature, i as u64)
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let nodes_cores = cpu_of(pids).zip(nodes_cpu0).map(|(b, a)| (b - a) / wall);
    let clients_cores = (own_cpu() - clients_cpu0) / wall;
    let streams: Vec<Stream> = results
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let tokens: usize = streams.iter().map(|s| s.tokens).sum();
    let per: Vec<f64> = streams
        .iter()
        .filter(|s| s.arrivals.len() > 1)
        .map(|s| {
            let span = s.arrivals[s.arrivals.len() - 1] - s.arrivals[0];
            (s.tokens.saturating_sub(1)) as f64 / span.max(1e-9)
        })
        .collect();
    let mut gaps: Vec<f64> = streams
        .iter()
        .flat_map(|s| s.arrivals.windows(2).map(|w| (w[1] - w[0]) * 1e3))
        .collect();
    gaps.sort_by(f64::total_cmp);
    let ttfts: Vec<f64> = streams.iter().map(|s| s.ttft).collect();
    let steady = steady_rate(&streams, a.rounds);
    Ok(Level {
        clients,
        requests: streams.len(),
        prompt_tokens: streams.iter().map(|s| s.prompt_tokens).sum(),
        tokens,
        aggregate_tok_s: tokens as f64 / wall,
        per_stream_tok_s: if per.is_empty() { 0.0 } else { median(&per) },
        ttft_p50_s: median(&ttfts),
        itl_p50_ms: quantile(&gaps, 0.5),
        itl_p99_ms: quantile(&gaps, 0.99),
        steady_tok_s: steady,
        predicted_steady_tok_s: None,
        predicted_aggregate_tok_s: None,
        predicted_per_stream_tok_s: None,
        vs_one_node: None,
        nodes_cores,
        clients_cores,
    })
}

/// CPU seconds (user and system) this process's threads have used.
fn own_cpu() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// CPU seconds (user and system) the processes `pids` and their descendants (the nodes'
/// rank workers) have used, from `/proc` (`None` where it cannot be read).
fn cpu_of(pids: &[u32]) -> Option<f64> {
    // SAFETY: sysconf reads a configuration value.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    if tick <= 0.0 {
        return None;
    }
    // Every process as (pid, parent, CPU ticks).
    let mut procs: Vec<(u32, u32, f64)> = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces, so it is skipped by its
        // closing parenthesis): the parent is the 2nd, utime and stime the 12th and 13th.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok());
        if let (Some(parent), Some(u), Some(s)) = (num(1), num(11), num(12)) {
            procs.push((pid, parent as u32, u + s));
        }
    }
    let mut mine: Vec<u32> = pids.to_vec();
    if !pids.iter().all(|p| procs.iter().any(|q| q.0 == *p)) {
        return None;
    }
    // Descendants, a generation at a time.
    loop {
        let before = mine.len();
        for &(pid, parent, _) in &procs {
            if mine.contains(&parent) && !mine.contains(&pid) {
                mine.push(pid);
            }
        }
        if mine.len() == before {
            break;
        }
    }
    let ticks: f64 = procs
        .iter()
        .filter(|p| mine.contains(&p.0))
        .map(|p| p.2)
        .sum();
    Some(ticks / tick)
}

/// Tokens per second across the streams of the first round while all of them are decoding.
fn steady_rate(streams: &[Stream], rounds: usize) -> Option<f64> {
    // Streams are stored client by client, `rounds` each; the first of each started together.
    let first: Vec<&Stream> = streams.iter().step_by(rounds.max(1)).collect();
    let start = first
        .iter()
        .map(|s| s.arrivals.first().copied())
        .try_fold(0.0f64, |m, t| t.map(|t| m.max(t)))?;
    let end = first
        .iter()
        .map(|s| s.arrivals.last().copied())
        .try_fold(f64::INFINITY, |m, t| t.map(|t| m.min(t)))?;
    if end - start < 1e-3 {
        return None;
    }
    let tokens = first
        .iter()
        .map(|s| {
            s.arrivals
                .iter()
                .filter(|&&t| t > start && t <= end)
                .count()
        })
        .sum::<usize>();
    Some(tokens as f64 / (end - start))
}

/// The `q` quantile of sorted values (nearest rank); 0 when empty.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Prompt tokens per second of one long prompt (one token generated).
fn prefill(url: &str, model: &str, words: usize, tag: &str) -> Result<(usize, f64)> {
    let text: String = (0..words)
        .map(|i| {
            [
                "river", "stone", "lamp", "north", "green", "bridge", "salt", "window",
            ][i % 8]
        })
        .collect::<Vec<_>>()
        .join(" ");
    let prompt = format!("[{tag}] Summarise: {text}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(1800)))
        .build()
        .into();
    let t0 = Instant::now();
    let mut resp = agent
        .post(&format!("{url}/v1/chat/completions"))
        .send_json(json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1,
            "temperature": 0,
        }))
        .with_context(|| format!("reaching {url}"))?;
    let secs = t0.elapsed().as_secs_f64();
    let status = resp.status();
    let v: serde_json::Value =
        serde_json::from_str(&resp.body_mut().read_to_string()?).context("the prefill answer")?;
    if !status.is_success() {
        bail!("{url}: {status}: {v}");
    }
    let n = v["usage"]["prompt_tokens"]
        .as_u64()
        .context("no prompt_tokens")? as usize;
    Ok((n, n as f64 / secs))
}

/// Loads the model, waits until it serves, and returns its spec.
fn load(node: &NodeAddr, req: &LoadRequest) -> Result<InstanceSpec> {
    let spec: InstanceSpec = serde_json::from_value(ask_load(node, req)?)?;
    strata::cmd_cluster::wait_ready(node, &spec.id, Duration::from_secs(900))?;
    Ok(spec)
}

/// The strategy the planner picks by itself (a dry run).
fn planner_pick(node: &NodeAddr, req: &LoadRequest) -> Result<StrategyChoice> {
    let dry = LoadRequest {
        strategy: None,
        dry_run: true,
        ..req.clone()
    };
    let v = ask_load(node, &dry)?;
    let p: strata_cluster::Placement = serde_json::from_value(v["placement"].clone())?;
    Ok(p.strategy)
}

fn ask_load(node: &NodeAddr, req: &LoadRequest) -> Result<serde_json::Value> {
    let body = serde_json::to_value(req)?;
    let mut last = None;
    // A node that joined a moment ago may not have published everything yet.
    for _ in 0..5 {
        match node.call::<serde_json::Value>("POST", "/v1/cluster/load", Some(&body)) {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("load failed")))
}

/// One level's work as the clients made it: `requests` in all from `clients` at once, each
/// with a `prompt` of that many tokens (on average) and `generated` tokens back.
struct LevelWork {
    clients: usize,
    requests: usize,
    prompt: f64,
    generated: f64,
}

impl LevelWork {
    /// Aggregate and per-stream tok/s of the level, from the instance's decode rate with every
    /// client live (`steady` tok/s) and the seconds one prompt takes prefilled in whole blocks
    /// (`whole`) and in live chunks (`live`), as the scheduler runs them: the prompts that
    /// arrive together before any stream decodes fill whole blocks (as many as one block's
    /// round holds); every later one arrives among live streams and runs a `LIVE_CHUNK` a
    /// round. A stream's decoding waits for the other clients' prompts (its own came before
    /// its first token). A pipeline runs those chunks as passes beside the groups' steps, but
    /// crediting that overlap (a pass costing the streams `live / stages`) puts the 4-client
    /// predictions 15-30 points further off in measurement, so its prompts are priced like
    /// everyone's.
    fn predict(&self, steady: f64, whole: f64, live: f64) -> (f64, f64) {
        let c = self.clients.max(1);
        let first = if c == 1 {
            // One client's requests come one after another: each prompt runs alone.
            self.requests
        } else {
            let per_round = (strata_cluster::PREFILL_CHUNK as f64 / self.prompt.max(1.0)) as usize;
            per_round.clamp(1, c).min(self.requests)
        };
        let step = c as f64 / steady;
        let prompts = first as f64 * whole + (self.requests - first) as f64 * live;
        let rounds = self.requests as f64 / c as f64;
        let aggregate =
            self.requests as f64 * self.generated / (prompts + rounds * self.generated * step);
        let span = self.generated * step + (c - 1) as f64 * live;
        (aggregate, self.generated / span)
    }
}

/// The planner's predictions for one instance on the cluster as it stands.
struct Predictor {
    facts: strata_cluster::ModelFacts,
    status: Status,
    placement: strata_cluster::Placement,
    context: usize,
}

impl Predictor {
    fn estimate(&self, prompt: usize, streams: usize) -> Option<strata_cluster::Estimate> {
        strata_cluster::estimate(
            &self.facts,
            &self.status.topology.nodes,
            &self.status.topology.links,
            &self.placement,
            &Workload {
                context: self.context,
                prompt,
                streams,
            },
        )
    }

    /// The slowest measured link among the instance's nodes.
    fn link(&self) -> Option<(f64, f64)> {
        self.status
            .topology
            .links
            .iter()
            .filter(|l| self.placement.nodes.contains(&l.a) && self.placement.nodes.contains(&l.b))
            .map(|l| (l.latency * 1e6, l.bandwidth * 8.0 / 1e9))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }
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

fn percent_error(measured: f64, predicted: Option<f64>) -> String {
    match predicted {
        Some(p) if measured > 0.0 => format!("{:+.0} %", (p - measured) / measured * 100.0),
        _ => "-".into(),
    }
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

/// What every load of the run asks for: one slot per client of the largest level.
fn load_request(a: &ClusterArgs, model: &str) -> LoadRequest {
    LoadRequest {
        model: model.to_string(),
        strategy: None,
        nodes: None,
        context: Some(a.ctx_size),
        dry_run: false,
        parallel: Some(a.streams.iter().copied().max().unwrap_or(1)),
        cache_mem: None,
    }
}

fn models(url: &str) -> Result<Vec<String>> {
    let v: serde_json::Value = NodeAddr::at(url).call("GET", "/v1/models", None)?;
    Ok(v["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// The id the loaded instance answers to.
fn served_model(url: &str) -> Result<String> {
    models(url)?
        .into_iter()
        .next()
        .context("the node serves no model after loading")
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
