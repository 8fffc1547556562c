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
use strata_api::auth::{Keys, Verdict};
use strata_cluster as placement;

use crate::control::{Control, ControlConfig, LinkReport, NodeState, Snapshot, now_ms};
use crate::key::ClusterKey;
use crate::profile::{self, Profile};
use crate::{Error, Result, identity};

/// How often a node republishes its state.
const STATE_EVERY: Duration = Duration::from_secs(1);
/// How old a link measurement may get before it is taken again.
const PROBE_EVERY: Duration = Duration::from_secs(5);

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
}

/// What the node's lifecycle commands changed.
#[derive(Debug, Default)]
struct Flags {
    draining: AtomicBool,
}

/// Shared by the HTTP handlers and the background tasks.
struct Shared {
    control: Control,
    profile: Mutex<Profile>,
    links: Mutex<BTreeMap<String, LinkReport>>,
    flags: Flags,
    keys: Option<Keys>,
    memory_limit: Option<u64>,
    stop: tokio::sync::Notify,
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
    let key_file = opts
        .key_file
        .clone()
        .unwrap_or_else(|| opts.state_dir.join("cluster.key"));
    let (key, created) = ClusterKey::load_or_create(&key_file)?;
    if created {
        eprintln!(
            "strata: made a new cluster key at {} (copy it to every machine that should join)",
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
    let profile = Profile {
        id: id.clone(),
        name: opts.name.clone().unwrap_or_else(|| hostname.clone()),
        hostname: hostname.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        memory_total,
        memory_available: cap(memory_available, opts.memory_limit),
        cores: threads,
        backend: profile::backend(),
        matmul_gflops: speed.matmul_gflops,
        mem_bandwidth: speed.mem_bandwidth,
        api_addr: opts.api_addr.to_string(),
        started_at: now_ms() / 1000,
    };
    let mut cert_names: Vec<String> = identity::local_addresses()
        .iter()
        .map(ToString::to_string)
        .collect();
    cert_names.push(hostname.clone());
    cert_names.push("localhost".into());
    let control = Control::start(ControlConfig {
        key,
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
    eprintln!(
        "strata: node {id} ({}) in cluster {}: control plane {} ({}), API http://{api_addr}",
        profile.name,
        control.fingerprint(),
        opts.control_addr,
        if opts.multicast {
            "multicast discovery on"
        } else {
            "multicast discovery off"
        }
    );
    let shared = Arc::new(Shared {
        control,
        profile: Mutex::new(profile),
        links: Mutex::new(BTreeMap::new()),
        flags: Flags::default(),
        keys: opts.keys,
        memory_limit: opts.memory_limit,
        stop: tokio::sync::Notify::new(),
    });
    publish(&shared).await?;
    let publisher = tokio::spawn(publish_loop(Arc::clone(&shared)));
    let prober = tokio::spawn(probe_loop(Arc::clone(&shared)));
    let watcher = tokio::spawn(log_membership(Arc::clone(&shared)));

    let stop = {
        let shared = Arc::clone(&shared);
        async move {
            tokio::select! {
                () = shutdown => {},
                () = shared.stop.notified() => {},
            }
        }
    };
    let served = axum::serve(listener, router(Arc::clone(&shared)))
        .with_graceful_shutdown(stop)
        .await;
    publisher.abort();
    prober.abort();
    watcher.abort();
    let _ = tokio::join!(publisher, prober, watcher);
    served.map_err(Error::control)?;
    match Arc::try_unwrap(shared) {
        Ok(s) => s.control.close().await?,
        Err(_) => return Err(Error::Control("node state still shared at exit".into())),
    }
    eprintln!("strata: node {id} stopped");
    Ok(())
}

fn cap(available: u64, limit: Option<u64>) -> u64 {
    limit.map_or(available, |l| available.min(l))
}

async fn publish(shared: &Shared) -> Result<()> {
    let state = {
        let mut p = shared
            .profile
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        p.memory_available = cap(profile::memory().1, shared.memory_limit);
        let peers = shared.control.peers();
        let links = shared
            .links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .filter(|l| peers.contains(&l.peer))
            .cloned()
            .collect();
        NodeState {
            profile: p.clone(),
            links,
            draining: shared.flags.draining.load(Ordering::Relaxed),
            extra: serde_json::Value::Null,
        }
    };
    shared.control.publish(&state).await
}

async fn publish_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(STATE_EVERY);
    loop {
        tick.tick().await;
        if let Err(e) = publish(&shared).await {
            eprintln!("strata: publishing this node's state: {e}");
        }
    }
}

/// Measures each member's link when it is new or its measurement is older than
/// [`PROBE_EVERY`].
async fn probe_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let due: Vec<String> = {
            let links = shared
                .links
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = now_ms();
            shared
                .control
                .peers()
                .into_iter()
                .filter(|p| {
                    links.get(p).is_none_or(|l| {
                        now.saturating_sub(l.measured_at_ms) > PROBE_EVERY.as_millis() as u64
                    })
                })
                .collect()
        };
        for peer in due {
            match shared.control.probe(&peer).await {
                Ok(report) => {
                    shared
                        .links
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(peer, report);
                }
                // A member that just left; the next round forgets it.
                Err(_) => {
                    shared
                        .links
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .remove(&peer);
                }
            }
        }
    }
}

/// Says on stderr who joined and left, as the control plane sees it.
async fn log_membership(shared: Arc<Shared>) {
    let mut rx = shared.control.changes();
    let mut seen = 0usize;
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        let events = shared.control.snapshot().events;
        let total = events.len();
        for e in events.iter().skip(seen.min(total)) {
            eprintln!("strata: {}", e.what);
        }
        seen = total;
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/cluster/status", get(status))
        .route("/v1/cluster/devices", get(devices))
        .route("/v1/cluster/drain", post(drain))
        .route("/v1/cluster/stop", post(stop))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            guard,
        ))
        .with_state(shared)
}

/// Admin routes need a key whenever the node has keys.
async fn guard(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if req.uri().path() != "/health"
        && let Some(keys) = &shared.keys
    {
        let auth = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !matches!(keys.check(auth), Verdict::Allowed(_)) {
            return error(StatusCode::UNAUTHORIZED, "a valid API key is required");
        }
    }
    next.run(req).await
}

fn error(status: StatusCode, msg: &str) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": { "message": msg } })),
    )
        .into_response()
}

async fn status(State(shared): State<Arc<Shared>>) -> Json<Status> {
    let snapshot = shared.control.snapshot();
    Json(Status {
        topology: topology(&snapshot),
        snapshot,
    })
}

async fn devices(State(shared): State<Arc<Shared>>) -> Json<Vec<Profile>> {
    Json(
        shared
            .control
            .snapshot()
            .members
            .into_iter()
            .filter_map(|m| m.state.map(|s| s.profile))
            .collect(),
    )
}

async fn drain(State(shared): State<Arc<Shared>>, _h: HeaderMap) -> Response {
    shared.flags.draining.store(true, Ordering::Relaxed);
    let _ = publish(&shared).await;
    Json(serde_json::json!({ "draining": true })).into_response()
}

async fn stop(State(shared): State<Arc<Shared>>) -> Response {
    shared.stop.notify_one();
    Json(serde_json::json!({ "stopping": true })).into_response()
}
