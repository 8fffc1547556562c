//! Sharded runs: `strata run --ranks N` starts N - 1 worker processes of this binary on this
//! host and acts as rank 0; `strata worker` is a rank started by hand (on any host), which
//! joins rank 0 at its coordinator address.
//!
//! Rank 0 owns its workers' lives: they die with it (PR_SET_PDEATHSIG on Linux, a kqueue
//! watch of rank 0's exit on macOS: see `strata_node::process`), and whatever ends a run
//! (success, an error, a dead peer) ends with every worker reaped, so no process is orphaned.

use std::net::{SocketAddr, TcpListener};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use strata_gguf::GgufFile;
use strata_net::{LinkShape, MeshConfig, Transport};
use strata_parallel::{
    Assignment, CombineStyle, Rank, ShardedBatch, Strategy, make_plan, numerics_name,
    worker_command,
};
use strata_tokenizer::{ChatTemplate, Tokenizer};

/// The environment variable that carries the session token to workers.
pub(crate) use strata_parallel::TOKEN_ENV;

/// How a run is split across ranks.
#[derive(Debug, Clone, Args)]
pub struct ShardOpts {
    /// Number of ranks (processes); 1 runs in this process.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// How ranks divide the model.
    #[arg(long, value_enum, default_value_t = StrategyArg::Tensor)]
    pub strategy: StrategyArg,
    /// Ranks per pipeline stage with `--strategy hybrid`.
    #[arg(long, default_value_t = 2)]
    pub tp_size: usize,
    /// How tensor-parallel ranks combine results: `gather` is bit-identical to one process,
    /// `reduce` exchanges half as often.
    #[arg(long, value_enum, default_value_t = CombineArg::Gather)]
    pub tp_combine: CombineArg,
    /// The data plane between ranks.
    #[arg(long, value_enum, default_value_t = TransportArg::Shm)]
    pub transport: TransportArg,
    /// Emulated one-way link latency added to every message (e.g. 300us, 1ms).
    #[arg(long, value_parser = parse_latency)]
    pub link_latency: Option<Duration>,
    /// Emulated link bandwidth cap (e.g. 10gbit, 800MB/s).
    #[arg(long, value_parser = parse_bandwidth)]
    pub link_bandwidth: Option<f64>,
    /// How long a rank may go without hearing from a peer (no data, no heartbeat; heartbeats
    /// flow several times a second) before the run stops with an error.
    #[arg(long, default_value = "1500ms", value_parser = parse_latency)]
    pub link_timeout: Duration,
    /// Compute threads per rank (default: the cores divided among the ranks).
    #[arg(long)]
    pub threads_per_rank: Option<usize>,
    /// Relative weight of each rank (memory or speed), comma-separated; default equal.
    #[arg(long, value_delimiter = ',')]
    pub rank_weights: Option<Vec<f64>>,
    /// Rank 0 listens here and waits for workers started by hand with `strata worker`
    /// (token in $STRATA_TOKEN); without it, workers are started on this host.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Sends the data plane unprotected: set only by `strata-bench scaling
    /// --insecure-plaintext-comparison` to measure what sealing costs, never by a run.
    #[arg(skip)]
    pub insecure_plaintext: bool,
}

fn parse_latency(s: &str) -> std::result::Result<Duration, String> {
    strata_net::parse_latency(s).map_err(|e| e.to_string())
}

fn parse_bandwidth(s: &str) -> std::result::Result<f64, String> {
    strata_net::parse_bandwidth(s).map_err(|e| e.to_string())
}

/// `--strategy`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum StrategyArg {
    /// Every rank on every layer (fast links).
    Tensor,
    /// Each rank a range of layers (slow links).
    Pipeline,
    /// Pipeline stages of `--tp-size` tensor-parallel ranks.
    Hybrid,
    /// A mixture of experts split by expert (attention and dense parts tensor-parallel).
    Expert,
}

/// `--tp-combine`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum CombineArg {
    /// Row-parallel projections and all-gathers (bit-identical to one process).
    Gather,
    /// Partial sums and all-reduces (fewer exchanges).
    Reduce,
}

/// `--transport`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum TransportArg {
    /// Shared memory (ranks on one host).
    Shm,
    /// TCP.
    Tcp,
    /// Shared memory when every rank shares this host's, else TCP.
    Auto,
}

impl From<TransportArg> for Transport {
    fn from(t: TransportArg) -> Transport {
        match t {
            TransportArg::Shm => Transport::Shm,
            TransportArg::Tcp => Transport::Tcp,
            TransportArg::Auto => Transport::Auto,
        }
    }
}

impl ShardOpts {
    pub(crate) fn strategy(&self) -> Strategy {
        match self.strategy {
            StrategyArg::Tensor => Strategy::Tensor,
            StrategyArg::Pipeline => Strategy::Pipeline,
            StrategyArg::Hybrid => Strategy::Hybrid { tp: self.tp_size },
            StrategyArg::Expert => Strategy::Expert,
        }
    }

    fn transport(&self) -> Transport {
        self.transport.into()
    }

    fn style(&self) -> CombineStyle {
        match self.tp_combine {
            CombineArg::Gather => CombineStyle::Gather,
            CombineArg::Reduce => CombineStyle::Reduce,
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads_per_rank.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores / self.ranks.max(1)).max(1)
        })
    }
}

/// The worker processes of a run, reaped on drop.
pub(crate) struct Workers {
    children: Vec<(usize, Child)>,
}

impl Workers {
    /// Waits up to `grace` for every worker to exit, then kills the rest; returns a line for
    /// each worker that did not exit cleanly.
    pub(crate) fn reap(&mut self, grace: Duration) -> Vec<String> {
        let deadline = Instant::now() + grace;
        let mut report = Vec::new();
        for (rank, child) in &mut self.children {
            let status = loop {
                match child.try_wait() {
                    Ok(Some(s)) => break Some(s),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                }
            };
            match status {
                Some(s) if s.success() => {}
                Some(s) => {
                    use std::os::unix::process::ExitStatusExt;
                    let how = match s.signal() {
                        Some(sig) => format!("was killed by signal {sig}"),
                        None => format!("exited with status {}", s.code().unwrap_or(-1)),
                    };
                    report.push(format!("rank {rank} (pid {}) {how}", child.id()));
                }
                None => report.push(format!(
                    "rank {rank} (pid {}) did not stop; killed",
                    child.id()
                )),
            }
        }
        self.children.clear();
        report
    }
}

impl Workers {
    /// Peak resident memory of each worker (MB), by rank.
    pub(crate) fn peak_rss_mb(&self) -> Vec<Option<f64>> {
        self.children
            .iter()
            .map(|(_, c)| peak_rss_mb(Some(c.id())))
            .collect()
    }
}

/// Peak resident memory (VmHWM) of process `pid` (this process for `None`), in MB.
#[cfg(not(target_os = "macos"))]
pub(crate) fn peak_rss_mb(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Peak memory of process `pid` (this process for `None`), in MB: on macOS its lifetime
/// maximum physical footprint, which macOS keeps in place of a resident-set peak (see
/// [`strata_node::host::peak_memory`]).
#[cfg(target_os = "macos")]
pub(crate) fn peak_rss_mb(pid: Option<u32>) -> Option<f64> {
    strata_node::host::peak_memory(pid).map(|b| b as f64 / (1024.0 * 1024.0))
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.reap(Duration::from_secs(2));
    }
}

/// A running sharded instance: rank 0 (a sequence engine) and its workers.
pub struct Session {
    pub engine: ShardedBatch,
    pub(crate) workers: Workers,
    pub(crate) tokenizer: std::sync::Arc<Tokenizer>,
    pub(crate) template: Option<ChatTemplate>,
}

impl Session {
    /// Shuts every rank down and reaps the workers.
    pub fn close(mut self) -> Result<()> {
        let sent = self.engine.shutdown();
        drop(self.engine);
        let report = self.workers.reap(Duration::from_secs(5));
        sent.context("shutting the ranks down")?;
        if !report.is_empty() {
            bail!("{}", report.join("; "));
        }
        Ok(())
    }

    /// Turns a failure of the run into one error that also says what happened to the workers.
    pub fn fail(mut self, err: anyhow::Error) -> anyhow::Error {
        // Healthy workers are told to stop (best effort: after a broken link this may fail,
        // and the closed links stop them instead).
        let _ = self.engine.shutdown();
        drop(self.engine);
        let mut workers = self.workers;
        let report = workers.reap(Duration::from_secs(2));
        if report.is_empty() {
            err
        } else {
            err.context(report.join("; "))
        }
    }
}

/// Starts a sharded instance of the model at `path` as rank 0.
pub fn launch(
    path: &std::path::Path,
    opts: &ShardOpts,
    n_ctx: Option<usize>,
    max_seqs: usize,
    numerics: strata_kernels::attn::Flavour,
    chat_template: Option<&str>,
) -> Result<Session> {
    let n = opts.ranks;
    if n < 2 {
        bail!("a sharded run needs at least 2 ranks");
    }
    let file = GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    let cfg = strata_engine::ModelConfig::from_gguf(&file)?;
    let plan = make_plan(
        &file,
        &cfg,
        opts.strategy(),
        n,
        opts.rank_weights.as_deref(),
        opts.style(),
    )?;
    let external = opts.listen.is_some();
    let bind = opts
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let listener = TcpListener::bind(bind).with_context(|| format!("listening on {bind}"))?;
    let coordinator = listener.local_addr()?;
    let token = if external {
        std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.is_empty())
            .with_context(|| format!("--listen needs the session token in ${TOKEN_ENV}"))?
    } else {
        strata_net::new_token()
    };
    let mut workers = Workers {
        children: Vec::new(),
    };
    if !external {
        let exe = std::env::current_exe().context("finding the strata binary")?;
        for r in 1..n {
            let mut cmd = worker_command(&exe, coordinator, (r, n), None, &token);
            strata_node::process::die_with_parent(&mut cmd);
            let child = cmd.spawn().context("starting a worker process")?;
            workers.children.push((r, child));
        }
    }
    let mesh = MeshConfig {
        rank: 0,
        world: n,
        coordinator,
        listen: None,
        token,
        transport: opts.transport(),
        shape: LinkShape {
            latency: opts.link_latency.unwrap_or_default(),
            bandwidth: opts.link_bandwidth,
        },
        join_timeout: Duration::from_secs(if external { 600 } else { 60 }),
        stall_timeout: opts.link_timeout,
        insecure_plaintext: opts.insecure_plaintext,
    };
    let comm = strata_net::coordinate(&mesh, listener).context("connecting the ranks")?;
    let assignment = Assignment {
        plan,
        model_path: path.to_path_buf(),
        model_bytes: file.file_len(),
        threads: opts.threads(),
        n_ctx: n_ctx.unwrap_or(cfg.default_context()).max(1),
        max_seqs,
        numerics: numerics_name(numerics).to_string(),
    };
    let ready = strata_engine::Ready::open(&file, chat_template, |file| -> Result<_> {
        let rank =
            Rank::start_coordinator(comm, file, &assignment).context("loading the shards")?;
        Ok(ShardedBatch::new(rank, cfg.n_vocab)?)
    })?;
    Ok(Session {
        engine: ready.engine,
        workers,
        tokenizer: ready.tokenizer,
        template: ready.template,
    })
}

/// `strata worker`.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// Rank 0's address.
    #[arg(long)]
    coordinator: SocketAddr,
    /// This worker's rank (1 .. world - 1).
    #[arg(long)]
    rank: usize,
    /// Number of ranks.
    #[arg(long)]
    world: usize,
    /// Where to listen for the other workers (default: the address used to reach rank 0).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The model file or catalog id on this host (default: the path rank 0 uses).
    #[arg(long, short = 'm')]
    model: Option<String>,
}

pub(crate) fn worker(a: WorkerArgs) -> Result<()> {
    let token = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
        .with_context(|| format!("a worker needs the session token in ${TOKEN_ENV}"))?;
    let mesh = MeshConfig {
        rank: a.rank,
        world: a.world,
        coordinator: a.coordinator,
        listen: a.listen,
        token,
        transport: Transport::Tcp,
        shape: LinkShape::default(),
        join_timeout: Duration::from_secs(600),
        stall_timeout: Duration::from_secs(300),
        // Learned from rank 0 (sealed), like the transport.
        insecure_plaintext: false,
    };
    let comm = strata_net::join(&mesh).context("joining rank 0")?;
    let mut rank = Rank::join_coordinator(comm, |assignment| match &a.model {
        Some(m) => crate::cmd_run::resolve_model(m).map_err(|e| format!("{e:#}")),
        None => Ok(assignment.model_path.clone()),
    })
    .with_context(|| format!("rank {}", a.rank))?;
    rank.serve()
        .with_context(|| format!("rank {} stopped", a.rank))?;
    Ok(())
}
