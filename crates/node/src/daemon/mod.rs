//! `strata node`: one per machine. It joins the control plane, keeps its published state fresh
//! (memory changes; speed was measured at start), measures its links to every member, and
//! serves the node's HTTP API: the cluster view and the lifecycle commands the CLI sends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use strata_cluster as placement;
use strata_http::auth::{Keys, Role, Slot, Verdict};

use crate::control::{Control, ControlConfig, LinkReport, NodeState, Snapshot, now_ms};
use crate::instances::{self, Hosted, InstanceSpec, LoadRequest, Running};
use crate::key::ClusterKey;
use crate::profile::{self, Profile};
use crate::{Error, Result, identity, transfer};

mod admin;
mod arrivals;
mod forward;
mod hosting;
mod leader;
mod publish;

use admin::*;
use forward::*;
use hosting::*;
use leader::*;
use publish::*;

/// How often a node republishes its state.
const STATE_EVERY: Duration = Duration::from_secs(1);
/// How old a link measurement may get before it is taken again, while both ends are idle.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How old it may get while either end is busy (see [`publish::probe_due`]).
const PROBE_BUSY_EVERY: Duration = Duration::from_secs(600);
/// The CPU busy fraction above which a machine counts as busy for link probes.
const PROBE_BUSY: f64 = 0.25;

/// Everything `strata node` is told.
#[derive(Debug)]
pub struct NodeOptions {
    /// Display name (default: the host name).
    pub name: Option<String>,
    /// Where the node id (and, by default, the cluster key) live.
    pub state_dir: PathBuf,
    /// The cluster key file (default: `cluster.key` in the state directory, made on first start).
    pub key_file: Option<PathBuf>,
    /// The control plane's listen address.
    pub control_addr: SocketAddr,
    /// Peers to dial (`host:port`), for networks without multicast.
    pub peers: Vec<String>,
    /// Whether to find peers by LAN multicast.
    pub multicast: bool,
    /// The HTTP API address.
    pub api_addr: SocketAddr,
    /// API keys (required for a non-loopback API address unless `insecure_no_auth`).
    pub keys: Option<Keys>,
    /// Serve a non-loopback API without keys.
    pub insecure_no_auth: bool,
    /// Most memory this node offers to models, bytes.
    pub memory_limit: Option<u64>,
    /// Compute threads (default: all cores).
    pub threads: Option<usize>,
    /// The address peers use for this node's data plane (default: its first non-loopback
    /// IPv4 address).
    pub advertise: Option<std::net::IpAddr>,
    /// Directories whose files cluster requests may name by path (`--allow-model-dir`).
    pub model_dirs: Vec<PathBuf>,
    /// One prefix-cache partition for every key (`--shared-prefix-cache`; by default each
    /// key's cached prompt blocks are its own, see [`strata_api::tenancy`]).
    pub shared_prefix_cache: bool,
    /// Browser checks, deadlines and the connection cap of the HTTP API.
    pub http: strata_http::listen::HttpOptions,
    /// An emulated link (`--emulate-link-latency`, `--emulate-link-bandwidth`): added to every
    /// data-plane message of the instances this node leads (their workers learn it at the
    /// handshake) and to the links this node measures and publishes, so the planner sees the
    /// link it is asked to plan for. For benchmarks of link regimes on one machine.
    pub emulate: strata_net::LinkShape,
    /// How the ranks of the instances this node leads exchange data (`--transport`): `Auto`
    /// puts ranks that share this host's memory on shared-memory rings and the rest on TCP.
    /// Its link probes answer over the same transport, so measured links price what decoding
    /// pays.
    pub transport: strata_net::Transport,
}

/// What the node's lifecycle commands changed.
#[derive(Debug, Default)]
struct Flags {
    draining: AtomicBool,
}

/// Everything the node's tasks and handlers change, in one place behind one lock
/// ([`Shared::state`]).
///
/// The rules: a guard is held for a few reads and writes of the fields, never across an
/// `.await` (the guard is not `Send`, so a spawned task that tried would not compile), never
/// while calling a function that takes the lock itself (those say so), and never while a rank
/// starts or stops (a `Host` leaving the map is dropped after the guard, since dropping its
/// rank kills a worker or ends an engine). The only other lock is a host's `arrival`, which
/// the thread copying its model writes; it is taken under the state lock or alone, never the
/// other way round.
struct Live {
    /// This node's published profile (its memory is refreshed on every publication).
    profile: Profile,
    /// The links this node measured, by peer.
    links: BTreeMap<String, LinkReport>,
    /// The instance table, while this node leads, and how many changes it has seen in the
    /// cluster's history (see [`Followed`]): changed together.
    table: Followed,
    /// The table this node follows: the leader's, as last seen.
    last_table: Followed,
    /// Whether this node led at the last look (a new leader takes up the followed table).
    was_leader: bool,
    /// Ranks this node runs, by (instance, epoch).
    hosted: BTreeMap<(String, u64), Host>,
    /// The APIs of the instances whose rank 0 runs here, by `id@epoch`.
    served: BTreeMap<String, Router>,
    /// The machine's (total, idle) CPU ticks at the last publication (`/proc/stat`, or the host
    /// statistics on macOS), for the CPU busy fraction.
    cpu_ticks: Option<(u64, u64)>,
    /// The busy fraction between the last two publications.
    cpu_busy: Option<f64>,
}

/// Shared by the HTTP handlers and the background tasks: what never changes, and the
/// [`Live`] state that does.
struct Shared {
    control: Control,
    state: Mutex<Live>,
    flags: Flags,
    keys: Option<Keys>,
    memory_limit: Option<u64>,
    /// `--allow-model-dir`, canonical.
    model_dirs: Arc<[PathBuf]>,
    stop: tokio::sync::Notify,
    key: ClusterKey,
    /// The address peers reach this node's data plane at.
    data_host: std::net::IpAddr,
    threads: usize,
    /// The emulated link ([`NodeOptions::emulate`]).
    emulate: strata_net::LinkShape,
    /// The data plane's transport ([`NodeOptions::transport`]).
    transport: strata_net::Transport,
    /// Where this node answers data-plane link probes (published, so peers can time the link).
    link_probe: std::net::SocketAddr,
    /// The models the cluster serves, as last routed (the instances' "not found" lists them).
    served_names: strata_api::ServedNames,
    /// [`NodeOptions::shared_prefix_cache`].
    shared_prefix_cache: bool,
}

impl Shared {
    /// The node's mutable state, locked (see [`Live`] for the rules).
    fn state(&self) -> std::sync::MutexGuard<'_, Live> {
        locked(&self.state)
    }
}

/// A rank this node runs, and what it says about it.
struct Host {
    info: Hosted,
    running: Option<Running>,
    /// How far its model's arrival has got, while it is on its way.
    arrival: transfer::ArrivalSlot,
}

impl Host {
    /// A rank of `spec` that is not running (yet).
    fn new(spec: &InstanceSpec, rank: usize, coordinator: Option<String>, status: String) -> Host {
        Host {
            info: Hosted {
                instance: spec.id.clone(),
                epoch: spec.epoch,
                rank,
                coordinator,
                status,
                arrival: None,
            },
            running: None,
            arrival: Arc::default(),
        }
    }

    /// What the cluster is told of it: its info with the arrival as it stands now.
    fn published(&self) -> Hosted {
        let mut info = self.info.clone();
        if info.status == "starting" {
            info.arrival = locked(&self.arrival).clone();
        }
        info
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The cluster as the planner sees it: live members with a state, and their links (each link
/// once, as the worse of its two ends' measurements).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Topology {
    /// Nodes that accept work (draining nodes are left out).
    pub nodes: Vec<placement::Node>,
    /// Measured links between them.
    pub links: Vec<placement::Link>,
}

/// `GET /v1/cluster/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    /// Membership, states and events.
    #[serde(flatten)]
    pub snapshot: Snapshot,
    /// The planner's inputs derived from it.
    pub topology: Topology,
    /// The leader's instance table.
    pub instances: Vec<InstanceSpec>,
}

/// Derives the planner's view from a snapshot.
pub fn topology(s: &Snapshot) -> Topology {
    let states: Vec<&NodeState> = s.members.iter().filter_map(|m| m.state.as_ref()).collect();
    let nodes: Vec<placement::Node> = states
        .iter()
        .filter(|st| !st.draining)
        .map(|st| placement::Node {
            id: st.profile.id.clone(),
            memory_available: st.profile.memory_available,
            mem_bandwidth: st.profile.mem_bandwidth,
            flops: st.profile.matmul_gflops * 1e9,
            flops_by_type: st
                .profile
                .matmul_gflops_by_type
                .iter()
                .map(|(t, g)| (t.clone(), g * 1e9))
                .collect(),
            attn_flops: st.profile.attention_gflops * 1e9,
            attn_fixed: st.profile.attention_fixed_us * 1e-6,
            row_cost: st.profile.row_cost_ns * 1e-9,
            stream_by_type: st
                .profile
                .stream_gweights_by_type
                .iter()
                .map(|(t, g)| (t.clone(), g * 1e9))
                .collect(),
            machine: st.profile.machine.clone(),
            machine_bandwidth: st.profile.machine_bandwidth,
            message_overhead: st.profile.exchange_overhead_us * 1e-6,
            ..placement::Node::default()
        })
        .collect();
    let mut pairs: BTreeMap<(String, String), placement::Link> = BTreeMap::new();
    for st in &states {
        for l in &st.links {
            let (a, b) = if st.profile.id < l.peer {
                (st.profile.id.clone(), l.peer.clone())
            } else {
                (l.peer.clone(), st.profile.id.clone())
            };
            if !nodes.iter().any(|n| n.id == a) || !nodes.iter().any(|n| n.id == b) {
                continue;
            }
            let e = pairs
                .entry((a.clone(), b.clone()))
                .or_insert(placement::Link {
                    a,
                    b,
                    latency: 0.0,
                    bandwidth: f64::INFINITY,
                });
            e.latency = e.latency.max(l.latency_s);
            e.bandwidth = e.bandwidth.min(l.bandwidth_bps);
        }
    }
    Topology {
        nodes,
        links: pairs.into_values().collect(),
    }
}

/// Runs a node until `shutdown` resolves or `strata stop` arrives.
pub async fn run(
    opts: NodeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    strata_api::check_bind(opts.api_addr, opts.keys.is_some(), opts.insecure_no_auth)
        .map_err(Error::control)?;
    if opts.keys.as_ref().is_some_and(|k| !k.has_admin()) {
        tracing::warn!(
            "no API key has role=admin: cluster operations (load, unload, drain, stop) will be \
             refused over HTTP"
        );
    }
    let model_dirs = opts
        .model_dirs
        .iter()
        .map(|d| match std::fs::canonicalize(d) {
            Ok(c) if c.is_dir() => Ok(c),
            Ok(_) => Err(Error::Control(format!(
                "--allow-model-dir {}: not a directory",
                d.display()
            ))),
            Err(e) => Err(Error::Control(format!(
                "--allow-model-dir {}: {e}",
                d.display()
            ))),
        })
        .collect::<Result<Vec<_>>>()?
        .into();
    let key_file = opts
        .key_file
        .clone()
        .unwrap_or_else(|| opts.state_dir.join("cluster.key"));
    let (key, created) = ClusterKey::load_or_create(&key_file)?;
    if created {
        tracing::info!(
            "made a new cluster key at {} (copy it to every machine that should join)",
            key_file.display()
        );
    }
    let id = identity::node_id(&opts.state_dir)?;
    let hostname = identity::hostname();
    let threads = opts
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let speed = tokio::task::spawn_blocking(move || profile::measure_speed(threads))
        .await
        .map_err(Error::control)?;
    let (memory_total, memory_available) = profile::memory();
    let mut profile = Profile {
        id: id.clone(),
        name: opts.name.clone().unwrap_or_else(|| hostname.clone()),
        hostname: hostname.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        memory_total,
        memory_available: cap(memory_available, opts.memory_limit),
        cores: threads,
        backend: profile::backend(),
        matmul_gflops: speed.matmul_gflops,
        matmul_gflops_by_type: speed.matmul_gflops_by_type,
        attention_gflops: speed.attention_gflops,
        attention_fixed_us: speed.attention_fixed_us,
        row_cost_ns: speed.row_cost_ns,
        mem_bandwidth: speed.mem_bandwidth,
        stream_gweights_by_type: speed.stream_gweights_by_type,
        machine: profile::machine_id(),
        machine_bandwidth: speed.machine_bandwidth,
        exchange_overhead_us: speed.exchange_overhead_us,
        api_addr: opts.api_addr.to_string(),
        started_at: now_ms() / 1000,
        memory_limit: opts.memory_limit,
    };
    let data_host = opts.advertise.unwrap_or_else(|| {
        identity::local_addresses()
            .into_iter()
            .find(|a| a.is_ipv4() && !a.is_loopback())
            .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]))
    });
    let mut cert_names: Vec<String> = identity::local_addresses()
        .iter()
        .map(ToString::to_string)
        .collect();
    cert_names.push(hostname.clone());
    cert_names.push("localhost".into());
    let control = Control::start(ControlConfig {
        key: key.clone(),
        node_id: id.clone(),
        listen: opts.control_addr,
        peers: opts.peers.clone(),
        multicast: opts.multicast,
        cert_names,
    })
    .await?;
    let listener = tokio::net::TcpListener::bind(opts.api_addr)
        .await
        .map_err(|e| Error::Control(format!("binding the API to {}: {e}", opts.api_addr)))?;
    let api_addr = listener.local_addr().map_err(Error::control)?;
    // The address bound (`:0` becomes a port), as peers and warnings name this node.
    profile.api_addr = api_addr.to_string();
    tracing::info!(
        "node {id} ({}) in cluster {}: control plane {} ({}), API http://{api_addr} ",
        profile.name,
        control.fingerprint(),
        opts.control_addr,
        if opts.multicast {
            "multicast discovery on"
        } else {
            "multicast discovery off"
        }
    );
    let probe_server =
        crate::linkprobe::ProbeServer::start(data_host, &key, opts.emulate, opts.transport)?;
    let shared = Arc::new(Shared {
        control,
        state: Mutex::new(Live {
            profile,
            links: BTreeMap::new(),
            table: Followed::default(),
            last_table: Followed::default(),
            was_leader: false,
            hosted: BTreeMap::new(),
            served: BTreeMap::new(),
            cpu_ticks: None,
            cpu_busy: None,
        }),
        flags: Flags::default(),
        keys: opts.keys,
        memory_limit: opts.memory_limit,
        model_dirs,
        stop: tokio::sync::Notify::new(),
        key,
        data_host,
        threads,
        emulate: opts.emulate,
        transport: opts.transport,
        link_probe: probe_server.addr(),
        served_names: strata_api::ServedNames::default(),
        shared_prefix_cache: opts.shared_prefix_cache,
    });
    publish(&shared).await?;
    let publisher = tokio::spawn(publish_loop(Arc::clone(&shared)));
    let prober = tokio::spawn(probe_loop(Arc::clone(&shared)));
    let watcher = tokio::spawn(log_membership(Arc::clone(&shared)));
    let rpc = shared
        .control
        .session()
        .declare_queryable(format!(
            "{}/rpc/{}/*",
            shared.control.prefix(),
            shared.control.me()
        ))
        .await
        .map_err(Error::control)?;
    let rpc_task = tokio::spawn(rpc_loop(Arc::clone(&shared), rpc));
    let instances_task = tokio::spawn(instances_loop(Arc::clone(&shared)));

    let stop = {
        let shared = Arc::clone(&shared);
        async move {
            tokio::select! {
                () = shutdown => {},
                () = shared.stop.notified() => {},
            }
        }
    };
    let served =
        strata_http::listen::serve(listener, router(Arc::clone(&shared)), &opts.http, stop).await;
    publisher.abort();
    prober.abort();
    watcher.abort();
    rpc_task.abort();
    instances_task.abort();
    let _ = tokio::join!(publisher, prober, watcher, rpc_task, instances_task);
    // Ranks stop with the node: workers are killed, rank 0's engine ends with its state.
    let hosted = {
        let mut st = shared.state();
        st.served.clear();
        std::mem::take(&mut st.hosted)
    };
    drop(hosted);
    served.map_err(Error::control)?;
    // Connections still closing may hold the shared state a moment longer; the session is
    // closed through it (its liveliness token goes with it, so peers see this node leave).
    shared.control.close().await?;
    if let Some(other) = shared.control.displaced_by() {
        return Err(Error::IdTaken {
            id,
            other,
            state_dir: opts.state_dir,
        });
    }
    tracing::info!("node {id} stopped");
    Ok(())
}
