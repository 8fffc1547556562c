//! The cluster commands: `strata keygen` and `strata node` on each machine, and `strata devices`,
//! `status`, `drain` and `stop`, which talk to a node's HTTP API (default: the node on this host).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::de::DeserializeOwned;
use strata_http::auth::Keys;
use strata_node::daemon::{NodeOptions, Status};
use strata_node::{ClusterKey, Profile, identity};

/// `strata keygen`.
#[derive(Debug, Args)]
pub(crate) struct KeygenArgs {
    /// Where to write the key (default: `cluster.key` in the node state directory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replace an existing key (every node must then get the new one).
    #[arg(long)]
    force: bool,
}

pub(crate) fn keygen(a: KeygenArgs) -> Result<()> {
    let path = a
        .out
        .unwrap_or_else(|| identity::default_state_dir().join("cluster.key"));
    if path.exists() {
        if !a.force {
            bail!(
                "{} already exists; pass --force to replace it (every node must then get the new key)",
                path.display()
            );
        }
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    let key = ClusterKey::generate();
    key.save(&path)?;
    println!("{}", path.display());
    eprintln!(
        "strata: cluster key {} written; copy it to every node (--cluster-key-file)",
        key.fingerprint()
    );
    Ok(())
}

/// `strata node`.
#[derive(Debug, Args)]
pub(crate) struct NodeArgs {
    /// A display name (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// The HTTP API (OpenAI-compatible API, cluster view and commands).
    #[arg(long, default_value = "127.0.0.1:8000")]
    api_addr: SocketAddr,
    /// The control plane (mutual TLS) listens here.
    #[arg(long, default_value = "0.0.0.0:7447")]
    control_addr: SocketAddr,
    /// A node to dial (HOST:PORT of its control plane), for networks without multicast;
    /// repeatable.
    #[arg(long = "peer")]
    peers: Vec<String>,
    /// Do not look for nodes by LAN multicast (only --peer).
    #[arg(long)]
    no_multicast: bool,
    /// The cluster key (default: `cluster.key` in the state directory, made on first start).
    #[arg(long)]
    cluster_key_file: Option<PathBuf>,
    /// Where the node keeps its id (default: $XDG_STATE_HOME/strata or ~/.local/state/strata).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Most memory to offer to models, in bytes (default: what is available).
    #[arg(long)]
    memory_limit: Option<u64>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// API keys file (`KEY [name=NAME] [rpm=N] [max_concurrent=N] [role=admin|client]` per
    /// line; only admin keys may load, unload, drain or stop).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Requests in flight at once per key (a stream counts until it ends), for keys without
    /// their own `max_concurrent=`; more get 429 (default: no limit).
    #[arg(long, value_parser = crate::args::at_least_one, value_name = "N")]
    max_concurrent_per_key: Option<usize>,
    /// Serve a non-loopback API without keys.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Run in this process, not as a child that is restarted when it dies of a signal (an
    /// abort, a stack overflow, the OOM killer).
    #[arg(long)]
    pub(crate) no_supervise: bool,
    /// The address peers use to reach this node's data plane (default: its first non-loopback
    /// IPv4 address).
    #[arg(long)]
    advertise_addr: Option<std::net::IpAddr>,
    /// A directory whose GGUF files `strata load` may name by path (repeatable); without one,
    /// cluster requests name models by id only, and no path on this node is opened for them.
    #[arg(long = "allow-model-dir", value_name = "DIR")]
    allow_model_dirs: Vec<PathBuf>,
    /// Let every API key's requests reuse each other's cached prompt blocks (for a cluster
    /// whose clients trust each other); by default each key's are its own, since a reused
    /// prompt answers sooner and would tell one client what another sent.
    #[arg(long)]
    shared_prefix_cache: bool,
    /// For benchmarks on one machine: one-way latency added to every data-plane message of
    /// the instances this node leads, and to the links it publishes (e.g. 5us, 300us).
    #[arg(long, value_parser = strata_net::parse_latency, value_name = "LATENCY")]
    emulate_link_latency: Option<std::time::Duration>,
    /// For benchmarks on one machine: a bandwidth cap on the same messages (e.g. 10gbit).
    #[arg(long, value_parser = strata_net::parse_bandwidth, value_name = "RATE")]
    emulate_link_bandwidth: Option<f64>,
    /// How the ranks of the instances this node leads exchange data: `auto` uses shared
    /// memory between ranks on one host (sharing /dev/shm as one user) and TCP between hosts;
    /// `tcp` always uses TCP; `shm` refuses ranks on other hosts.
    #[arg(long, value_enum, default_value_t = crate::cmd_shard::TransportArg::Auto)]
    transport: crate::cmd_shard::TransportArg,
    #[command(flatten)]
    pub(crate) http: crate::cmd_serve::HttpArgs,
}

pub(crate) fn node(a: NodeArgs) -> Result<()> {
    if a.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let keys = match &a.api_key_file {
        Some(f) => Some(Keys::from_file(f, None)?.with_max_concurrent(a.max_concurrent_per_key)),
        None => None,
    };
    let opts = NodeOptions {
        name: a.name,
        state_dir: a.state_dir.unwrap_or_else(identity::default_state_dir),
        key_file: a.cluster_key_file,
        control_addr: a.control_addr,
        peers: a.peers,
        multicast: !a.no_multicast,
        api_addr: a.api_addr,
        keys,
        insecure_no_auth: a.insecure_no_auth,
        memory_limit: a.memory_limit,
        threads: a.threads,
        advertise: a.advertise_addr,
        model_dirs: a.allow_model_dirs,
        shared_prefix_cache: a.shared_prefix_cache,
        http: a.http.options()?,
        emulate: strata_net::LinkShape {
            latency: a.emulate_link_latency.unwrap_or_default(),
            bandwidth: a.emulate_link_bandwidth,
        },
        transport: a.transport.into(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(strata_node::daemon::run(
        opts,
        crate::cmd_serve::shutdown_signal(),
    ))?;
    Ok(())
}

/// How to reach a node's API.
#[derive(Debug, Clone, Args)]
pub struct NodeAddr {
    /// The node's API (default: $STRATA_NODE, else http://127.0.0.1:8000).
    #[arg(long)]
    node: Option<String>,
    /// An API key for it (default: $STRATA_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
}

impl NodeAddr {
    /// The node at `url`, without a key.
    pub fn at(url: &str) -> NodeAddr {
        NodeAddr {
            node: Some(url.to_string()),
            api_key: None,
        }
    }

    fn base(&self) -> String {
        let raw = self
            .node
            .clone()
            .or_else(|| std::env::var("STRATA_NODE").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| "http://127.0.0.1:8000".into());
        let raw = raw.trim_end_matches('/');
        if raw.contains("://") {
            raw.to_string()
        } else {
            format!("http://{raw}")
        }
    }

    fn key(&self) -> Option<String> {
        self.api_key.clone().or_else(|| {
            std::env::var("STRATA_API_KEY")
                .ok()
                .filter(|s| !s.is_empty())
        })
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(15)))
            .build()
            .into()
    }

    /// GET or POST `path` and parse the JSON answer; a non-2xx answer becomes its message.
    pub fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T> {
        let url = format!("{}{path}", self.base());
        let agent = Self::agent();
        let auth = self.key().map(|k| format!("Bearer {k}"));
        let resp = if method == "GET" {
            let mut r = agent.get(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        } else {
            let mut r = agent.post(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            match body {
                Some(b) => r.send_json(b),
                None => r.send_empty(),
            }
        };
        let mut resp = resp.with_context(|| {
            format!(
                "reaching the node at {} (is `strata node` running there?)",
                self.base()
            )
        })?;
        let status = resp.status();
        let text = resp
            .body_mut()
            .read_to_string()
            .with_context(|| format!("reading the answer from {url}"))?;
        if !status.is_success() {
            let msg = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            bail!("{url}: {status}: {msg}");
        }
        serde_json::from_str(&text).with_context(|| format!("parsing the answer from {url}"))
    }
}

/// `strata devices`.
#[derive(Debug, Args)]
pub(crate) struct DevicesArgs {
    #[command(flatten)]
    node: NodeAddr,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn devices(a: DevicesArgs) -> Result<()> {
    let devices: Vec<Profile> = a.node.call("GET", "/v1/cluster/devices", None)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&devices)?);
        return Ok(());
    }
    println!(
        "{:<18} {:<14} {:<14} {:>5} {:>10} {:>10} {:>9} {:>9}  backend",
        "id", "name", "host", "cores", "mem GiB", "free GiB", "GB/s", "GFLOP/s"
    );
    for d in devices {
        println!(
            "{:<18} {:<14} {:<14} {:>5} {:>10.1} {:>10.1} {:>9.1} {:>9.1}  {}",
            d.id,
            d.name,
            d.hostname,
            d.cores,
            d.memory_total as f64 / f64::from(1u32 << 30),
            d.memory_available as f64 / f64::from(1u32 << 30),
            d.mem_bandwidth / 1e9,
            d.matmul_gflops,
            d.backend
        );
        if let Some(line) = probe_line(&d) {
            println!("{:<18} {line}", "");
        }
    }
    Ok(())
}

/// The rates a node's probes measured beyond its headline figures (what the planner prices
/// each weight type and attention at): `None` for a node that sent none.
fn probe_line(d: &Profile) -> Option<String> {
    let mut parts: Vec<String> = d
        .matmul_gflops_by_type
        .iter()
        .map(|(ty, g)| format!("{ty} {g:.0}"))
        .collect();
    if !parts.is_empty() {
        parts[0] = format!("matmul GFLOP/s by type: {}", parts[0]);
    }
    if d.attention_gflops > 0.0 {
        parts.push(format!(
            "attention {:.0} GFLOP/s + {:.2} us per head and row",
            d.attention_gflops, d.attention_fixed_us
        ));
    }
    if d.row_cost_ns > 0.0 {
        parts.push(format!(
            "{:.1} ns per row, layer and element of width besides",
            d.row_cost_ns
        ));
    }
    if !d.stream_gweights_by_type.is_empty() {
        let rates: Vec<String> = d
            .stream_gweights_by_type
            .iter()
            .map(|(ty, g)| format!("{ty} {g:.1}"))
            .collect();
        parts.push(format!(
            "one row from memory, G weights/s by type: {}",
            rates.join(" ")
        ));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `strata status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    node: NodeAddr,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Print again every second (stops after --watch-for, or Ctrl-C).
    #[arg(long)]
    watch: bool,
    /// With --watch: stop after this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    watch_for: u64,
}

pub(crate) fn status(a: StatusArgs) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let s: Status = a.node.call("GET", "/v1/cluster/status", None)?;
        if a.json {
            println!("{}", serde_json::to_string(&s)?);
        } else {
            print_status(&s);
        }
        if !a.watch || (a.watch_for > 0 && start.elapsed().as_secs() >= a.watch_for) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The data-plane transport a link's probe took (`tcp` or `shm`), from whichever end
/// reported it; `None` when it was measured over the control plane.
fn link_via<'s>(s: &'s Status, a: &str, b: &str) -> Option<&'s str> {
    s.snapshot
        .members
        .iter()
        .filter(|m| m.id == a || m.id == b)
        .filter_map(|m| m.state.as_ref())
        .flat_map(|st| st.links.iter())
        .find(|l| l.peer == a || l.peer == b)
        .and_then(|l| l.via.as_deref())
}

fn print_status(s: &Status) {
    let snap = &s.snapshot;
    println!(
        "cluster {}: {} node(s), leader {}, answering: {}",
        snap.cluster,
        snap.members.len(),
        snap.leader.as_deref().unwrap_or("-"),
        snap.me
    );
    for m in &snap.members {
        match &m.state {
            Some(st) => println!(
                "  {} {:<14} {:<22} {}{}",
                if snap.leader.as_deref() == Some(m.id.as_str()) {
                    "*"
                } else {
                    " "
                },
                st.profile.name,
                m.id,
                format_args!(
                    "{:.1} GiB free, {:.1} GB/s",
                    st.profile.memory_available as f64 / f64::from(1u32 << 30),
                    st.profile.mem_bandwidth / 1e9
                ),
                if st.draining { ", draining" } else { "" }
            ),
            None => println!("    {:<14} {:<22} joining", "?", m.id),
        }
    }
    if !s.topology.links.is_empty() {
        println!("links:");
        for l in &s.topology.links {
            println!(
                "  {} <-> {}: {:.0} us, {:.2} GB/s{}",
                l.a,
                l.b,
                l.latency * 1e6,
                l.bandwidth / 1e9,
                link_via(s, &l.a, &l.b).map_or(String::new(), |v| format!(", over {v}"))
            );
        }
    }
    if !s.instances.is_empty() {
        println!("instances:");
    }
    for i in &s.instances {
        match &i.placement {
            Some(p) => println!(
                "  {} {} (epoch {}): {} ({}) -> {:.0} tok/s predicted",
                i.id,
                i.request.model,
                i.epoch,
                p.strategy.describe(p.nodes.len()),
                p.nodes.join(", "),
                p.predicted_decode_tok_s
            ),
            None => println!(
                "  {} {}: not placed: {}",
                i.id,
                i.request.model,
                i.problem.as_deref().unwrap_or("-")
            ),
        }
    }
    if let Some(e) = snap.events.last() {
        println!("last event: {}", e.what);
    }
}

/// `strata drain` / `strata stop`.
#[derive(Debug, Args)]
pub(crate) struct NodeCommandArgs {
    #[command(flatten)]
    node: NodeAddr,
    /// Print the node's JSON answer.
    #[arg(long)]
    json: bool,
}

/// Prints the node's answer as JSON, or `line` on stderr.
fn report(json: bool, answer: &serde_json::Value, line: &str) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(answer)?);
    } else {
        eprintln!("strata: {line}");
    }
    Ok(())
}

pub(crate) fn drain(a: NodeCommandArgs) -> Result<()> {
    let answer: serde_json::Value = a.node.call("POST", "/v1/cluster/drain", None)?;
    let line = format!("{} is draining: it takes no new work", a.node.base());
    report(a.json, &answer, &line)
}

pub(crate) fn stop(a: NodeCommandArgs) -> Result<()> {
    let answer: serde_json::Value = a.node.call("POST", "/v1/cluster/stop", None)?;
    report(a.json, &answer, &format!("{} is stopping", a.node.base()))
}

/// `strata load`.
#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    /// Model id from the catalog (or a path present on every node).
    model: String,
    #[command(flatten)]
    node: NodeAddr,
    /// How to split it (default: the fastest predicted).
    #[arg(long, value_enum, default_value_t = StrategyPick::Auto)]
    strategy: StrategyPick,
    /// Nodes per pipeline stage with `--strategy hybrid`.
    #[arg(long, default_value_t = 2)]
    tp_size: usize,
    /// Use exactly these nodes (ids or names), comma-separated.
    #[arg(long, value_delimiter = ',')]
    nodes: Option<Vec<String>>,
    /// Context positions per sequence.
    #[arg(long)]
    ctx_size: Option<usize>,
    /// Sequences decoded together in one batched step (each holds a KV cache of
    /// `--ctx-size` positions; default 4).
    #[arg(long, value_parser = crate::args::at_least_one)]
    parallel: Option<usize>,
    /// Memory for the prefix cache over all the instance's nodes (as `strata serve
    /// --cache-mem`: bytes or `512MiB`, `2GiB`; 0 turns it off; default 1GiB). The planner
    /// reserves it beside the weights and every sequence's KV cache.
    #[arg(long, value_name = "SIZE", value_parser = crate::cmd_serve::parse_size)]
    cache_mem: Option<usize>,
    /// Print the plan and its predicted speed; load nothing.
    #[arg(long)]
    dry_run: bool,
    /// Return once the leader accepts, without waiting for the ranks to load.
    #[arg(long)]
    no_wait: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `--strategy` of `strata load`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum StrategyPick {
    /// The fastest the planner predicts.
    Auto,
    /// Every node on every layer.
    Tensor,
    /// Each node a range of layers.
    Pipeline,
    /// Pipeline stages of `--tp-size` tensor-parallel nodes.
    Hybrid,
    /// A mixture of experts split by expert (attention and dense parts tensor-parallel).
    Expert,
}

pub(crate) fn load(a: LoadArgs) -> Result<()> {
    use strata_cluster::StrategyChoice;
    let req = strata_node::instances::LoadRequest {
        model: a.model.clone(),
        strategy: match a.strategy {
            StrategyPick::Auto => None,
            StrategyPick::Tensor => Some(StrategyChoice::Tensor),
            StrategyPick::Pipeline => Some(StrategyChoice::Pipeline),
            StrategyPick::Hybrid => Some(StrategyChoice::Hybrid { tp: a.tp_size }),
            StrategyPick::Expert => Some(StrategyChoice::Expert),
        },
        nodes: a.nodes.clone(),
        context: a.ctx_size,
        dry_run: a.dry_run,
        parallel: a.parallel,
        cache_mem: a.cache_mem.map(|b| b as u64),
    };
    let body = serde_json::to_value(&req)?;
    let answer: serde_json::Value = a.node.call("POST", "/v1/cluster/load", Some(&body))?;
    if a.dry_run {
        if a.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        } else {
            let p: strata_cluster::Placement = serde_json::from_value(answer["placement"].clone())?;
            println!("{}", p.explanation);
            println!(
                "plan: {} ({}) -> {:.0} tok/s predicted (nothing loaded: --dry-run)",
                p.strategy.describe(p.nodes.len()),
                p.nodes.join(", "),
                p.predicted_decode_tok_s
            );
        }
        return Ok(());
    }
    let spec: strata_node::instances::InstanceSpec = serde_json::from_value(answer)?;
    if !a.no_wait {
        wait_ready(&a.node, &spec.id, Duration::from_secs(180))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&spec)?);
    } else if let Some(p) = &spec.placement {
        println!(
            "{}: {} on {} ({}; {:.0} tok/s predicted){}",
            spec.id,
            spec.request.model,
            p.strategy.describe(p.nodes.len()),
            p.nodes.join(", "),
            p.predicted_decode_tok_s,
            if a.no_wait { ", loading" } else { ", ready" }
        );
    }
    Ok(())
}

/// Waits until rank 0 of the newest epoch of `instance` reports ready (or failed).
pub fn wait_ready(node: &NodeAddr, instance: &str, limit: Duration) -> Result<()> {
    let t = std::time::Instant::now();
    loop {
        let s: Status = node.call("GET", "/v1/cluster/status", None)?;
        if let Some(spec) = s.instances.iter().find(|i| i.id == instance) {
            let rank0 = spec.placement.as_ref().and_then(|p| p.nodes.first());
            let report = s
                .snapshot
                .members
                .iter()
                .filter(|m| Some(&m.id) == rank0)
                .filter_map(|m| m.state.as_ref()?.extra.get("hosted").cloned())
                .filter_map(|h| {
                    serde_json::from_value::<Vec<strata_node::instances::Hosted>>(h).ok()
                })
                .flatten()
                .find(|h| h.instance == instance && h.epoch == spec.epoch);
            if let Some(h) = report {
                if h.status == "ready" {
                    return Ok(());
                }
                if let Some(why) = h.status.strip_prefix("failed: ") {
                    bail!("instance {instance} failed to start: {why}");
                }
            }
        }
        if t.elapsed() > limit {
            bail!("instance {instance} was not ready after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `strata unload`.
#[derive(Debug, Args)]
pub(crate) struct UnloadArgs {
    /// The instance id (from `strata load` or `strata status`).
    instance: String,
    #[command(flatten)]
    node: NodeAddr,
    /// Print the node's JSON answer.
    #[arg(long)]
    json: bool,
}

pub(crate) fn unload(a: UnloadArgs) -> Result<()> {
    let body = serde_json::json!({ "instance": a.instance });
    let answer: serde_json::Value = a.node.call("POST", "/v1/cluster/unload", Some(&body))?;
    report(a.json, &answer, &format!("unloaded {}", a.instance))
}
