//! Model instances across the cluster.
//!
//! The leader owns the table of instances: `strata load` reaches it (from whichever node the
//! CLI talked to), it places the model with the planner on the measured topology, and publishes
//! the table in its state. When a member leaves, the leader places every instance that used it
//! again on the members left (a new epoch). Every node follows the leader's table: it starts
//! the ranks it was given and stops those it no longer has.
//!
//! Rank 0 runs inside the node and serves the OpenAI API for the instance; other ranks are
//! `strata worker` processes the node starts and watches (they die with it). The data plane's
//! session token is derived from the cluster key, the instance and its epoch, so only key
//! holders can compute it.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::process::Child;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use strata_cluster as placement;
use strata_cluster::{ModelFacts, Placement, StrategyChoice};
use strata_gguf::GgufFile;

use crate::key::ClusterKey;
use crate::transfer::{Peers, resolve};
use crate::{Error, Result};

/// What `strata load` asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadRequest {
    /// Catalog id or path of the model (resolved on every node that hosts a rank).
    pub model: String,
    /// Force a strategy (default: the fastest predicted).
    #[serde(default)]
    pub strategy: Option<StrategyChoice>,
    /// Use exactly these nodes (ids or names).
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    /// Context positions per sequence (default 4096).
    #[serde(default)]
    pub context: Option<usize>,
    /// Only plan.
    #[serde(default)]
    pub dry_run: bool,
    /// Sequences decoded together in one batched step (default [`DEFAULT_PARALLEL`]).
    #[serde(default)]
    pub parallel: Option<usize>,
    /// Bytes of prefix cache the instance may keep over all its ranks (default
    /// [`strata_api::DEFAULT_CACHE_MEM`]; 0 turns it off).
    #[serde(default)]
    pub cache_mem: Option<u64>,
}

impl LoadRequest {
    /// The prefix cache's budget, bytes.
    pub fn cache_mem(&self) -> usize {
        self.cache_mem.map_or(strata_api::DEFAULT_CACHE_MEM, |b| {
            usize::try_from(b).unwrap_or(usize::MAX)
        })
    }

    /// Sequence slots.
    pub fn slots(&self) -> usize {
        self.parallel.unwrap_or(DEFAULT_PARALLEL).max(1)
    }
}

/// Sequence slots of an instance whose request names none.
pub const DEFAULT_PARALLEL: usize = 4;

/// An instance in the leader's table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceSpec {
    /// Instance id.
    pub id: String,
    /// Bumped each time the instance is placed again.
    pub epoch: u64,
    /// What was asked (kept to place it again).
    pub request: LoadRequest,
    /// Where and how it runs; `None` while it fits nowhere.
    pub placement: Option<Placement>,
    /// Why it is not placed, if it is not.
    pub problem: Option<String>,
}

/// What a node hosts of an instance, published in its state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hosted {
    /// Instance id.
    pub instance: String,
    /// Its epoch.
    pub epoch: u64,
    /// This node's rank in it.
    pub rank: usize,
    /// Rank 0's data-plane address, once listening.
    pub coordinator: Option<String>,
    /// `starting`, `ready` or `failed: why`.
    pub status: String,
    /// While starting: how far the model's download or copy has got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<crate::transfer::Arrival>,
}

/// Places `req` on the topology; the answer names nodes by id.
pub fn plan(
    req: &LoadRequest,
    topo: &crate::daemon::Topology,
    names: &BTreeMap<String, String>,
    peers: &Peers,
) -> Result<(Placement, ModelFacts)> {
    // A hub model not here yet is planned from its headers: each node then fetches only
    // its shard (see `shard_fetch`).
    let file = match crate::shard_fetch::header_file(&req.model)? {
        Some(header) => header,
        None => GgufFile::open(&resolve(&req.model, peers)?)?,
    };
    let facts = ModelFacts::from_gguf(&file)?;
    // Nodes may be named by id or by name.
    let nodes = req.nodes.as_ref().map(|list| {
        list.iter()
            .map(|n| {
                names
                    .iter()
                    .find(|(_, name)| *name == n)
                    .map_or_else(|| n.clone(), |(id, _)| id.clone())
            })
            .collect()
    });
    let p = placement::place(
        &facts,
        &topo.nodes,
        &topo.links,
        &placement::Request {
            context: req.context.unwrap_or(facts.default_context),
            sequences: req.slots(),
            prefix_cache: req.cache_mem() as u64,
            strategy: req.strategy,
            nodes,
            // Cluster loads combine by all-gathers: bit for bit one process's output.
            combine: placement::Combine::Gather,
            fewest: false,
        },
    )?;
    Ok((p, facts))
}

/// The data-plane session token of an instance epoch.
pub fn token(key: &ClusterKey, instance: &str, epoch: u64) -> String {
    crate::key::encode_hex(&key.mac(
        "instance token",
        &[instance.as_bytes(), &epoch.to_le_bytes()],
    ))
}

/// The strategy the sharded runtime uses for a placement.
pub fn strategy(p: &Placement) -> strata_parallel::Strategy {
    match p.strategy {
        StrategyChoice::Single | StrategyChoice::Tensor => strata_parallel::Strategy::Tensor,
        StrategyChoice::Pipeline => strata_parallel::Strategy::Pipeline,
        StrategyChoice::Hybrid { tp } => strata_parallel::Strategy::Hybrid { tp },
        StrategyChoice::Expert => strata_parallel::Strategy::Expert,
    }
}

/// A rank this node runs.
pub enum Running {
    /// Rank 0: the API state serving the instance (dropping it stops the engine thread, which
    /// closes the links and so ends the workers).
    Rank0(Arc<strata_api::AppState>),
    /// A worker process, watched by the thread that started it.
    Worker(Arc<std::sync::Mutex<Child>>),
}

impl Running {
    /// The exit status of a worker that has ended.
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        match self {
            Running::Rank0(_) => None,
            Running::Worker(c) => lock_child(c).try_wait().ok().flatten(),
        }
    }
}

fn lock_child(c: &std::sync::Mutex<Child>) -> std::sync::MutexGuard<'_, Child> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Worker(c) = self {
            let mut c = lock_child(c);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Keeps the calling thread alive as long as the worker runs: a child started with
/// PR_SET_PDEATHSIG is killed when the *thread* that started it ends, not the process.
pub fn watch(child: &Arc<std::sync::Mutex<Child>>) {
    loop {
        if !matches!(lock_child(child).try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How rank 0 of an instance starts on this node.
pub struct Rank0Start<'a> {
    /// The instance.
    pub spec: &'a InstanceSpec,
    /// The model's path when it is already here (a shard fetched before the workers were
    /// told where to join); `None` to resolve the model.
    pub model_path: Option<std::path::PathBuf>,
    /// Its placement.
    pub placement: &'a Placement,
    /// The listener workers join (already bound, so its address could be published).
    pub listener: TcpListener,
    /// The data-plane token.
    pub token: String,
    /// Compute threads.
    pub threads: usize,
    /// The emulated link of the instance's data plane (ideal unless benchmarking).
    pub emulate: strata_net::LinkShape,
    /// The data plane's transport (`Auto` settles on shared memory when every rank shares
    /// this host's).
    pub transport: strata_net::Transport,
    /// API keys for the instance's routes.
    pub keys: Option<strata_http::auth::Keys>,
    /// One prefix-cache partition for every key ([`strata_api::tenancy`]).
    pub shared_prefix_cache: bool,
    /// Every model the cluster serves (the instance's "not found" lists them).
    pub served: strata_api::ServedNames,
    /// Where to get the model if this node lacks it.
    pub peers: Peers,
    /// Returns once every worker's process runs (their models arrive after rank 0 publishes
    /// where it listens, which may take far longer than joining a running process should), or
    /// says why one will not. Called after this rank has its model, before the data plane
    /// opens.
    pub workers_arrived: &'a (dyn Fn() -> Result<()> + Sync),
}

/// Starts rank 0 (blocking: waits for every worker to join and load).
pub fn start_rank0(s: Rank0Start<'_>) -> Result<Arc<strata_api::AppState>> {
    let path = match s.model_path.clone() {
        Some(path) => path,
        None => resolve(&s.spec.request.model, &s.peers)?,
    };
    // The leader fills in the model's default when it places a request without one.
    let context = s
        .spec
        .request
        .context
        .unwrap_or(strata_engine::DEFAULT_CONTEXT_CAP);
    let opts = strata_api::EngineOptions {
        model_id: s.spec.request.model.clone(),
        queue: 64,
        shared: strata_api::Shared::new(s.keys, 1)
            .with_served(s.served)
            .with_shared_prefix_cache(s.shared_prefix_cache),
        max_body: 4 << 20,
        info: strata_api::ModelInfo::default(),
        aliases: Vec::new(),
        defaults: strata_api::types::SamplingDefaults::default(),
    };
    let slots = s.spec.request.slots();
    let cache_mem = s.spec.request.cache_mem();
    let world = s.placement.nodes.len();
    if world == 1 {
        return strata_api::start(strata_api::ServeOptions {
            model_path: path,
            model_id: opts.model_id,
            threads: s.threads,
            parallel: slots,
            queue: opts.queue,
            n_ctx: Some(context),
            shared: opts.shared,
            max_body: opts.max_body,
            aliases: opts.aliases,
            defaults: opts.defaults,
            cache_mem,
            chat_template: None,
            flavour: None,
            pooling: None,
        })
        .map_err(Error::from);
    }
    (s.workers_arrived)()?;
    let file = GgufFile::open(&path)?;
    let cfg = strata_engine::ModelConfig::from_gguf(&file)?;
    let plan = strata_parallel::make_plan(
        &file,
        &cfg,
        strategy(s.placement),
        world,
        Some(&s.placement.weights),
        strata_parallel::CombineStyle::Gather,
    )?;
    let coordinator = s
        .listener
        .local_addr()
        .map_err(Error::system("reading the ranks' listener address"))?;
    let mesh = strata_net::MeshConfig {
        rank: 0,
        world,
        coordinator,
        listen: None,
        token: s.token,
        transport: s.transport,
        shape: s.emulate,
        join_timeout: Duration::from_secs(60),
        stall_timeout: Duration::from_millis(1500),
        insecure_plaintext: false,
    };
    let comm = strata_net::coordinate(&mesh, s.listener)?;
    let assignment = strata_parallel::Assignment {
        plan,
        model_path: path,
        model_bytes: file.file_len(),
        threads: s.threads,
        n_ctx: context,
        max_seqs: slots,
        numerics: strata_parallel::numerics_name(strata_kernels::attn::Flavour::native()).into(),
    };
    let strata_engine::Ready {
        engine,
        tokenizer,
        template,
    } = strata_engine::Ready::open(&file, None, |file| -> Result<_> {
        let rank = strata_parallel::Rank::start_coordinator(comm, file, &assignment)?;
        Ok(strata_parallel::ShardedBatch::new(rank, cfg.n_vocab)?.with_prefix_cache(cache_mem))
    })?;
    let opts = strata_api::EngineOptions {
        info: strata_api::ModelInfo::from_gguf(&file),
        ..opts
    };
    Ok(strata_api::start_engine(
        Box::new(engine),
        tokenizer,
        template,
        opts,
    )?)
}

/// Starts rank `rank` as a `strata worker` process joining `coordinator`; it dies with this
/// node.
pub fn start_worker(
    model: &std::path::Path,
    rank: usize,
    world: usize,
    coordinator: SocketAddr,
    token: &str,
) -> Result<Child> {
    let exe = std::env::current_exe().map_err(Error::system("finding this program"))?;
    let mut cmd =
        strata_parallel::worker_command(&exe, coordinator, (rank, world), Some(model), token);
    crate::process::die_with_parent(&mut cmd);
    cmd.spawn().map_err(Error::system("starting a worker"))
}
