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
use strata_api::auth::{Keys, Role, Verdict};
use strata_cluster as placement;

use crate::control::{Control, ControlConfig, LinkReport, NodeState, Snapshot, now_ms};
use crate::instances::{self, Hosted, InstanceSpec, LoadRequest, Running};
use crate::key::ClusterKey;
use crate::profile::{self, Profile};
use crate::{Error, Result, identity, transfer};

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
    /// The address peers use for this node's data plane (default: its first non-loopback
    /// IPv4 address).
    pub advertise: Option<std::net::IpAddr>,
    /// Directories whose files cluster requests may name by path (`--allow-model-dir`).
    pub model_dirs: Vec<PathBuf>,
    /// Browser checks, deadlines and the connection cap of the HTTP API.
    pub http: strata_api::listen::HttpOptions,
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
    /// `--allow-model-dir`, canonical.
    model_dirs: Arc<[PathBuf]>,
    stop: tokio::sync::Notify,
    key: ClusterKey,
    /// The address peers reach this node's data plane at.
    data_host: std::net::IpAddr,
    threads: usize,
    /// The instance table, while this node leads.
    table: Mutex<Vec<InstanceSpec>>,
    /// How many changes `table` has seen in the cluster's history (see [`Followed`]).
    table_version: std::sync::atomic::AtomicU64,
    /// The table this node follows and its version: the leader's, as last seen.
    last_table: Mutex<Followed>,
    was_leader: AtomicBool,
    /// Ranks this node runs, by (instance, epoch).
    hosted: Mutex<BTreeMap<(String, u64), Host>>,
    /// The API of the instance whose rank 0 runs here.
    served: Mutex<Option<(String, Router)>>,
}

/// A rank this node runs, and what it says about it.
struct Host {
    info: Hosted,
    running: Option<Running>,
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
            },
            running: None,
        }
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
        eprintln!(
            "strata: no API key has role=admin: cluster operations (load, unload, drain, stop) \
             will be refused over HTTP"
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
        model_dirs,
        stop: tokio::sync::Notify::new(),
        key,
        data_host,
        threads,
        table: Mutex::new(Vec::new()),
        table_version: std::sync::atomic::AtomicU64::new(0),
        last_table: Mutex::new(Followed::default()),
        was_leader: AtomicBool::new(false),
        hosted: Mutex::new(BTreeMap::new()),
        served: Mutex::new(None),
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
        strata_api::listen::serve(listener, router(Arc::clone(&shared)), &opts.http, stop).await;
    publisher.abort();
    prober.abort();
    watcher.abort();
    rpc_task.abort();
    instances_task.abort();
    let _ = tokio::join!(publisher, prober, watcher, rpc_task, instances_task);
    // Ranks stop with the node: workers are killed, rank 0's engine ends with its state.
    locked(&shared.served).take();
    let hosted = std::mem::take(&mut *locked(&shared.hosted));
    drop(hosted);
    served.map_err(Error::control)?;
    // Connections still closing may hold the shared state a moment longer; the session is
    // closed through it (its liveliness token goes with it, so peers see this node leave).
    shared.control.close().await?;
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
            extra: serde_json::json!({
                "hosted": locked(&shared.hosted).values().map(|h| h.info.clone()).collect::<Vec<_>>(),
                "followed": followed(shared),
            }),
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
        .route("/v1/cluster/load", post(load))
        .route("/v1/cluster/unload", post(unload))
        .fallback(to_instance)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            guard,
        ))
        .with_state(shared)
}

/// Routes that change the cluster: only admin keys may use them.
fn is_admin_route(path: &str) -> bool {
    matches!(
        path,
        "/v1/cluster/drain" | "/v1/cluster/stop" | "/v1/cluster/load" | "/v1/cluster/unload"
    )
}

/// What the key check decides for a request to `path` with this `Authorization` header:
/// `None` lets it through. Client keys may run inference and read the cluster's state; cluster
/// operations need `role=admin` (403 otherwise, so an application's key cannot stop the node).
fn authorize(keys: &Keys, path: &str, auth: Option<&str>) -> Option<Response> {
    match keys.check(auth) {
        Verdict::Allowed(g) if is_admin_route(path) && g.role != Role::Admin => Some(error(
            StatusCode::FORBIDDEN,
            &format!(
                "key {:?} is a client key; {path} needs a key with role=admin in the API key file",
                g.name
            ),
        )),
        Verdict::Allowed(_) => None,
        Verdict::Unknown => Some(error(
            StatusCode::UNAUTHORIZED,
            "a valid API key is required",
        )),
        Verdict::Limited(secs) => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("rate limit reached for this key; retry in {secs:.1} s"),
            );
            if let Ok(v) = format!("{}", secs.ceil() as u64).parse() {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            Some(r)
        }
    }
}

/// Every route but `/health` needs a key whenever the node has keys.
async fn guard(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if req.uri().path() != "/health"
        && let Some(keys) = &shared.keys
    {
        let auth = strata_api::auth::presented(req.headers());
        if let Some(refused) = authorize(keys, req.uri().path(), auth.as_deref()) {
            return refused;
        }
    }
    next.run(req).await
}

/// An error in the API's shape (OpenAI's, or Anthropic's on its routes).
fn error(status: StatusCode, msg: &str) -> Response {
    strata_api::ApiError::with_status(status, msg).into_response()
}

async fn status(State(shared): State<Arc<Shared>>) -> Json<Status> {
    let snapshot = shared.control.snapshot();
    Json(Status {
        topology: topology(&snapshot),
        instances: leader_table(&snapshot).unwrap_or_default(),
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

/// The leader's instance table, from a snapshot.
fn leader_table(s: &Snapshot) -> Option<Vec<InstanceSpec>> {
    leader_followed(s).map(|f| f.table)
}

/// The table the leader publishes (it follows its own), with its version.
fn leader_followed(s: &Snapshot) -> Option<Followed> {
    let leader = s.leader.as_deref()?;
    let m = s.members.iter().find(|m| m.id == leader)?;
    serde_json::from_value(m.state.as_ref()?.extra.get("followed")?.clone()).ok()
}

/// An instance table with its version: the number of changes leaders have made to it, carried
/// from leader to leader. Every node publishes the table it follows, so a leader that has just
/// started (a restarted node with the smallest id) takes up the newest table any member holds
/// instead of imposing its own empty one, and members never drop their instances for a table
/// older than the one they run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Followed {
    version: u64,
    table: Vec<InstanceSpec>,
}

/// What this node follows now: its own table when it leads.
fn followed(shared: &Shared) -> Followed {
    if shared.control.is_leader() {
        Followed {
            version: shared.table_version.load(Ordering::Relaxed),
            table: locked(&shared.table).clone(),
        }
    } else {
        locked(&shared.last_table).clone()
    }
}

/// The newest table any member (this one included) publishes.
fn newest_followed(s: &Snapshot) -> Option<Followed> {
    s.members
        .iter()
        .filter_map(|m| m.state.as_ref()?.extra.get("followed"))
        .filter_map(|v| serde_json::from_value::<Followed>(v.clone()).ok())
        .max_by_key(|f| f.version)
}

/// Leader: counts one change to the table.
fn table_changed(shared: &Shared) {
    shared.table_version.fetch_add(1, Ordering::Relaxed);
}

/// What each member says it hosts, by node id.
fn hosted_by(s: &Snapshot) -> BTreeMap<String, Vec<Hosted>> {
    s.members
        .iter()
        .filter_map(|m| {
            let st = m.state.as_ref()?;
            let h: Vec<Hosted> = serde_json::from_value(st.extra.get("hosted")?.clone()).ok()?;
            Some((m.id.clone(), h))
        })
        .collect()
}

fn names(s: &Snapshot) -> BTreeMap<String, String> {
    s.members
        .iter()
        .filter_map(|m| Some((m.id.clone(), m.state.as_ref()?.profile.name.clone())))
        .collect()
}

/// Answers `load` and `unload` sent to this node as leader.
async fn rpc_loop(
    shared: Arc<Shared>,
    rpc: zenoh::query::Queryable<zenoh::handlers::FifoChannelHandler<zenoh::query::Query>>,
) {
    while let Ok(q) = rpc.recv_async().await {
        let op = q
            .key_expr()
            .as_str()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        if op == "http" {
            tokio::spawn(serve_forwarded(Arc::clone(&shared), q));
            continue;
        }
        if op == "model" {
            tokio::task::spawn_blocking(move || transfer::serve(&q));
            continue;
        }
        let body = q
            .payload()
            .map(|p| p.to_bytes().to_vec())
            .unwrap_or_default();
        let answer: std::result::Result<serde_json::Value, String> = if !shared.control.is_leader()
        {
            Err("this node is not the leader".into())
        } else {
            match op.as_str() {
                "load" => match serde_json::from_slice::<LoadRequest>(&body) {
                    Ok(req) => leader_load(&shared, req)
                        .await
                        .map(|s| serde_json::to_value(s).unwrap_or_default()),
                    Err(e) => Err(format!("bad load request: {e}")),
                },
                "unload" => match serde_json::from_slice::<String>(&body) {
                    Ok(id) => leader_unload(&shared, &id).map(|()| serde_json::json!({})),
                    Err(e) => Err(format!("bad unload request: {e}")),
                },
                other => Err(format!("unknown request {other:?}")),
            }
        };
        let bytes = serde_json::to_vec(&match answer {
            Ok(v) => serde_json::json!({ "ok": v }),
            Err(e) => serde_json::json!({ "error": e }),
        })
        .unwrap_or_default();
        let _ = q.reply(q.key_expr().clone(), bytes).await;
    }
}

async fn leader_load(
    shared: &Arc<Shared>,
    req: LoadRequest,
) -> std::result::Result<InstanceSpec, String> {
    let snap = shared.control.snapshot();
    let topo = topology(&snap);
    let names = names(&snap);
    let r = req.clone();
    let peers = peers_of(shared);
    let (placement, facts) =
        tokio::task::spawn_blocking(move || instances::plan(&r, &topo, &names, &peers))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    // Every rank, and every later re-placement, uses the context this placement was made for.
    let mut req = req;
    req.context = Some(req.context.unwrap_or(facts.default_context));
    let spec = InstanceSpec {
        id: format!("i-{}", crate::key::encode_hex(&rand::random::<[u8; 3]>())),
        epoch: 1,
        request: req,
        placement: Some(placement),
        problem: None,
    };
    locked(&shared.table).push(spec.clone());
    table_changed(shared);
    let _ = publish(shared).await;
    Ok(spec)
}

fn leader_unload(shared: &Shared, id: &str) -> std::result::Result<(), String> {
    let mut t = locked(&shared.table);
    let before = t.len();
    t.retain(|s| s.id != id);
    if t.len() == before {
        return Err(format!("no instance {id:?}"));
    }
    table_changed(shared);
    Ok(())
}

/// Sends a request to the leader (which may be this node) and returns its answer.
async fn ask_leader(
    shared: &Shared,
    op: &str,
    body: Vec<u8>,
) -> std::result::Result<serde_json::Value, String> {
    let leader = shared
        .control
        .leader()
        .ok_or("the cluster has no leader yet")?;
    let key = format!("{}/rpc/{leader}/{op}", shared.control.prefix());
    let replies = shared
        .control
        .session()
        .get(key)
        .payload(body)
        .timeout(Duration::from_secs(120))
        .await
        .map_err(|e| e.to_string())?;
    let reply = replies
        .recv_async()
        .await
        .map_err(|_| format!("the leader {leader} did not answer"))?;
    let sample = reply
        .result()
        .map_err(|_| format!("the leader {leader} failed"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&sample.payload().to_bytes()).map_err(|e| e.to_string())?;
    match v.get("error").and_then(|e| e.as_str()) {
        Some(e) => Err(e.to_string()),
        None => Ok(v["ok"].clone()),
    }
}

/// Every 300 ms: as leader, place again what lost a node; as any node, start and stop ranks to
/// match the leader's table.
async fn instances_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    loop {
        tick.tick().await;
        let snap = shared.control.snapshot();
        // Follow the leader's table, unless it is older than the one followed already (a
        // leader that has just started and not yet taken up the cluster's table).
        if let Some(f) = leader_followed(&snap) {
            let mut last = locked(&shared.last_table);
            if f.version >= last.version {
                *last = f;
            }
        }
        if shared.control.is_leader() {
            if !shared.was_leader.swap(true, Ordering::Relaxed) {
                let inherited = locked(&shared.last_table).clone();
                let mut t = locked(&shared.table);
                if inherited.version >= shared.table_version.load(Ordering::Relaxed) {
                    *t = inherited.table;
                    shared
                        .table_version
                        .store(inherited.version, Ordering::Relaxed);
                }
            }
            // A member may follow a newer table than this leader has (this node restarted and
            // leads by its id): take it up before anything else.
            if let Some(newest) = newest_followed(&snap)
                && newest.version > shared.table_version.load(Ordering::Relaxed)
            {
                *locked(&shared.table) = newest.table;
                shared
                    .table_version
                    .store(newest.version, Ordering::Relaxed);
            }
            replace_lost(&shared, &snap).await;
        } else {
            shared.was_leader.store(false, Ordering::Relaxed);
        }
        let table = followed(&shared).table;
        host(&shared, &snap, &table);
    }
}

/// This node's peers, as a source of models.
fn peers_of(shared: &Shared) -> transfer::Peers {
    transfer::Peers {
        session: shared.control.session().clone(),
        prefix: shared.control.prefix().to_string(),
        ids: shared.control.peers(),
        model_dirs: std::sync::Arc::clone(&shared.model_dirs),
    }
}

/// Leader: instances on a node that left are placed again on the nodes left (a new epoch).
async fn replace_lost(shared: &Arc<Shared>, snap: &Snapshot) {
    let topo = topology(snap);
    let alive: Vec<&str> = topo.nodes.iter().map(|n| n.id.as_str()).collect();
    let lost: Vec<InstanceSpec> = locked(&shared.table)
        .iter()
        .filter(|s| {
            s.placement
                .as_ref()
                .is_none_or(|p| p.nodes.iter().any(|n| !alive.contains(&n.as_str())))
        })
        .cloned()
        .collect();
    for spec in lost {
        let mut req = spec.request.clone();
        // The nodes and strategy asked for may be gone: let the planner choose again.
        req.nodes = None;
        req.strategy = None;
        let (topo, names, peers) = (topo.clone(), names(snap), peers_of(shared));
        let planned =
            tokio::task::spawn_blocking(move || instances::plan(&req, &topo, &names, &peers)).await;
        let mut t = locked(&shared.table);
        let Some(s) = t
            .iter_mut()
            .find(|s| s.id == spec.id && s.epoch == spec.epoch)
        else {
            continue;
        };
        match planned {
            Ok(Ok((p, _))) => {
                s.epoch += 1;
                s.placement = Some(p);
                s.problem = None;
            }
            Ok(Err(e)) => {
                if s.placement.is_some() {
                    s.epoch += 1;
                }
                s.placement = None;
                s.problem = Some(e.to_string());
            }
            Err(e) => s.problem = Some(e.to_string()),
        }
        drop(t);
        table_changed(shared);
    }
}

/// Starts the ranks the table gives this node and stops those it no longer does.
fn host(shared: &Arc<Shared>, snap: &Snapshot, table: &[InstanceSpec]) {
    let me = shared.control.me().to_string();
    let mut wanted: Vec<(String, u64)> = Vec::new();
    let hosted = hosted_by(snap);
    for spec in table {
        let Some(p) = &spec.placement else { continue };
        let Some(rank) = p.nodes.iter().position(|n| *n == me) else {
            continue;
        };
        let k = (spec.id.clone(), spec.epoch);
        wanted.push(k.clone());
        if locked(&shared.hosted).contains_key(&k) {
            continue;
        }
        let token = instances::token(&shared.key, &spec.id, spec.epoch);
        if rank == 0 {
            start_rank0(shared, spec, p, token);
        } else {
            // Workers join rank 0 once it listens.
            let coordinator = hosted.get(&p.nodes[0]).and_then(|list| {
                list.iter()
                    .find(|h| h.instance == spec.id && h.epoch == spec.epoch)
                    .and_then(|h| h.coordinator.as_deref()?.parse::<SocketAddr>().ok())
            });
            let Some(coordinator) = coordinator else {
                continue;
            };
            locked(&shared.hosted)
                .insert(k.clone(), Host::new(spec, rank, None, "starting".into()));
            // Resolving may mean copying the model from a peer: off the async threads.
            let (shared, model, world) = (
                Arc::clone(shared),
                spec.request.model.clone(),
                p.nodes.len(),
            );
            let peers = peers_of(&shared);
            std::thread::spawn(move || {
                let started = transfer::resolve(&model, &peers).and_then(|path| {
                    instances::start_worker(&path, rank, world, coordinator, &token)
                });
                let started = started.map(|c| Arc::new(Mutex::new(c)));
                {
                    let mut hosted = locked(&shared.hosted);
                    let Some(h) = hosted.get_mut(&k) else {
                        // Gone meanwhile; the child (if any) is killed as it drops.
                        drop(started.map(Running::Worker));
                        return;
                    };
                    match &started {
                        Ok(c) => {
                            h.info.status = "ready".into();
                            h.running = Some(Running::Worker(Arc::clone(c)));
                        }
                        Err(e) => {
                            eprintln!("strata: rank {rank} of {} failed to start: {e}", k.0);
                            h.info.status = format!("failed: {e}");
                        }
                    }
                }
                if let Ok(c) = started {
                    instances::watch(&c);
                }
            });
        }
    }
    let mut h = locked(&shared.hosted);
    let gone: Vec<(String, u64)> = h.keys().filter(|k| !wanted.contains(k)).cloned().collect();
    for k in gone {
        if locked(&shared.served)
            .as_ref()
            .is_some_and(|(id, _)| *id == format!("{}@{}", k.0, k.1))
        {
            locked(&shared.served).take();
        }
        h.remove(&k);
    }
    // A worker that exited is reported failed.
    for host in h.values_mut() {
        if let Some(st) = host.running.as_ref().and_then(Running::exited) {
            eprintln!(
                "strata: rank {} of {} exited ({st})",
                host.info.rank, host.info.instance
            );
            host.info.status = format!("failed: the worker exited ({st})");
            host.running = None;
        }
    }
}

fn start_rank0(
    shared: &Arc<Shared>,
    spec: &InstanceSpec,
    p: &strata_cluster::Placement,
    token: String,
) {
    let k = (spec.id.clone(), spec.epoch);
    let listener = match std::net::TcpListener::bind((shared.data_host, 0)) {
        Ok(l) => l,
        Err(e) => {
            locked(&shared.hosted).insert(
                k,
                Host::new(spec, 0, None, format!("failed: listening for ranks: {e}")),
            );
            return;
        }
    };
    let coordinator = listener.local_addr().ok().map(|a| a.to_string());
    locked(&shared.hosted).insert(
        k.clone(),
        Host::new(spec, 0, coordinator, "starting".into()),
    );
    let shared = Arc::clone(shared);
    let spec = spec.clone();
    let p = p.clone();
    std::thread::spawn(move || {
        let result = instances::start_rank0(instances::Rank0Start {
            spec: &spec,
            placement: &p,
            listener,
            token,
            threads: shared.threads,
            keys: None,
            peers: peers_of(&shared),
        });
        let mut hosted = locked(&shared.hosted);
        let Some(h) = hosted.get_mut(&k) else {
            // Unloaded or placed again meanwhile: the state drops here.
            return;
        };
        match result {
            Ok(state) => {
                eprintln!(
                    "strata: instance {} (epoch {}) of {} is ready",
                    spec.id, spec.epoch, spec.request.model
                );
                *locked(&shared.served) = Some((
                    format!("{}@{}", k.0, k.1),
                    strata_api::server::router(Arc::clone(&state)),
                ));
                h.info.status = "ready".into();
                h.running = Some(Running::Rank0(state));
            }
            Err(e) => {
                eprintln!(
                    "strata: instance {} (epoch {}) failed to start: {e}",
                    spec.id, spec.epoch
                );
                h.info.status = format!("failed: {e}");
            }
        }
    });
}

async fn load(State(shared): State<Arc<Shared>>, Json(req): Json<LoadRequest>) -> Response {
    if req.dry_run {
        let snap = shared.control.snapshot();
        let (topo, names) = (topology(&snap), names(&snap));
        let peers = peers_of(&shared);
        let planned =
            tokio::task::spawn_blocking(move || instances::plan(&req, &topo, &names, &peers)).await;
        return match planned {
            Ok(Ok((p, facts))) => {
                Json(serde_json::json!({ "placement": p, "model": facts })).into_response()
            }
            Ok(Err(e)) => error(StatusCode::BAD_REQUEST, &e.to_string()),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
    }
    let body = serde_json::to_vec(&req).unwrap_or_default();
    match ask_leader(&shared, "load", body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, &e),
    }
}

#[derive(Deserialize)]
struct UnloadBody {
    instance: String,
}

async fn unload(State(shared): State<Arc<Shared>>, Json(b): Json<UnloadBody>) -> Response {
    let body = serde_json::to_vec(&b.instance).unwrap_or_default();
    match ask_leader(&shared, "unload", body).await {
        Ok(_) => Json(serde_json::json!({ "unloaded": b.instance })).into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, &e),
    }
}

/// Everything else goes to the API of the instance whose rank 0 runs here.
async fn to_instance(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    use tower::ServiceExt as _;
    let path = req.uri().path();
    if shared.flags.draining.load(Ordering::Relaxed)
        && (path.starts_with("/v1/") || path.starts_with("/api/"))
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node is draining: it finishes what it has and takes no new requests",
        );
    }
    let router = locked(&shared.served).as_ref().map(|(_, r)| r.clone());
    match router {
        Some(r) => match r.oneshot(req).await {
            Ok(resp) => resp,
            Err(e) => match e {},
        },
        None => {
            let snap = shared.control.snapshot();
            let target = hosted_by(&snap)
                .into_iter()
                .find(|(id, hs)| {
                    *id != shared.control.me()
                        && hs.iter().any(|h| h.rank == 0 && h.status == "ready")
                })
                .map(|(id, _)| id);
            match target {
                Some(t) => forward(&shared, &t, req).await,
                None => error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no model instance is loaded; run `strata load MODEL`",
                ),
            }
        }
    }
}

/// Largest request body forwarded to another node.
const MAX_FORWARD_BODY: usize = 8 << 20;

/// The head of a forwarded HTTP request or response.
#[derive(Serialize, Deserialize)]
struct ForwardHead {
    method: String,
    uri: String,
    status: u16,
    headers: Vec<(String, String)>,
}

/// The headers to pass on. A client's key stays on the node that checked it: the node serving
/// a forwarded request trusts the control plane's mutual TLS, not the client's header.
fn head_of(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(k, _)| *k != header::AUTHORIZATION)
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect()
}

/// Rank-0 node: runs a forwarded request through the local instance's API and streams the
/// answer back as replies (the head first, then body chunks as they come).
async fn serve_forwarded(shared: Arc<Shared>, q: zenoh::query::Query) {
    use futures_util::StreamExt as _;
    use tower::ServiceExt as _;
    let key = q.key_expr().clone();
    let payload = q
        .payload()
        .map(|p| p.to_bytes().to_vec())
        .unwrap_or_default();
    let parsed = (|| {
        let n = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
        let head: ForwardHead = serde_json::from_slice(payload.get(4..4 + n)?).ok()?;
        Some((head, payload.get(4 + n..)?.to_vec()))
    })();
    let router = locked(&shared.served).as_ref().map(|(_, r)| r.clone());
    let response = match (parsed, router) {
        (Some((head, body)), Some(router)) => {
            let mut req = Request::new(axum::body::Body::from(body));
            *req.method_mut() = head.method.parse().unwrap_or_default();
            *req.uri_mut() = head.uri.parse().unwrap_or_default();
            for (k, v) in &head.headers {
                if let (Ok(k), Ok(v)) = (
                    header::HeaderName::from_bytes(k.as_bytes()),
                    header::HeaderValue::from_str(v),
                ) {
                    req.headers_mut().append(k, v);
                }
            }
            match router.oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            }
        }
        (None, _) => error(StatusCode::BAD_REQUEST, "malformed forwarded request"),
        (_, None) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the instance is no longer served by this node",
        ),
    };
    let head = ForwardHead {
        method: String::new(),
        uri: String::new(),
        status: response.status().as_u16(),
        headers: head_of(response.headers()),
    };
    if q.reply(key.clone(), serde_json::to_vec(&head).unwrap_or_default())
        .await
        .is_err()
    {
        return;
    }
    let mut body = response.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        if q.reply(key.clone(), chunk.to_vec()).await.is_err() {
            break;
        }
    }
}

/// Any node: sends a request for an instance served elsewhere to its rank-0 node over the
/// (encrypted, authenticated) control plane and streams the answer back.
async fn forward(shared: &Shared, target: &str, req: Request) -> Response {
    use futures_util::StreamExt as _;
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_FORWARD_BODY).await else {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    };
    let head = ForwardHead {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        status: 0,
        headers: head_of(&parts.headers),
    };
    let head = serde_json::to_vec(&head).unwrap_or_default();
    let mut payload = (head.len() as u32).to_le_bytes().to_vec();
    payload.extend_from_slice(&head);
    payload.extend_from_slice(&body);
    let key = format!("{}/rpc/{target}/http", shared.control.prefix());
    let replies = match shared
        .control
        .session()
        .get(key)
        .payload(payload)
        // Every reply is a piece of one answer: none may be merged away, and order matters.
        .consolidation(zenoh::query::ConsolidationMode::None)
        .timeout(Duration::from_secs(3600))
        .await
    {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_GATEWAY, &format!("forwarding: {e}")),
    };
    let first = match replies.recv_async().await {
        Ok(r) => r,
        Err(_) => {
            return error(
                StatusCode::BAD_GATEWAY,
                &format!("node {target} did not answer the forwarded request"),
            );
        }
    };
    let Some(head) = first
        .result()
        .ok()
        .and_then(|s| serde_json::from_slice::<ForwardHead>(&s.payload().to_bytes()).ok())
    else {
        return error(StatusCode::BAD_GATEWAY, "malformed forwarded answer");
    };
    let chunks = futures_util::stream::unfold(replies, |replies| async move {
        let r = replies.recv_async().await.ok()?;
        let bytes = r.result().ok()?.payload().to_bytes().to_vec();
        Some((Ok::<_, std::io::Error>(bytes), replies))
    })
    .boxed();
    let mut resp = Response::new(axum::body::Body::from_stream(chunks));
    *resp.status_mut() = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (k, v) in head.headers {
        if let (Ok(k), Ok(v)) = (
            header::HeaderName::from_bytes(k.as_bytes()),
            header::HeaderValue::from_str(&v),
        ) {
            resp.headers_mut().append(k, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn keys() -> Keys {
        Keys::parse(
            "sk-admin-123456 name=ops role=admin\nsk-app-1234567 name=app\nsk-slow-1234567 rpm=1\n",
            None,
        )
        .unwrap()
    }

    #[test]
    fn client_keys_may_infer_and_read_but_not_operate_the_cluster() {
        let k = keys();
        let client = Some("Bearer sk-app-1234567");
        for path in ["/v1/chat/completions", "/v1/cluster/status", "/v1/models"] {
            assert!(authorize(&k, path, client).is_none(), "{path}");
        }
        for path in [
            "/v1/cluster/stop",
            "/v1/cluster/drain",
            "/v1/cluster/load",
            "/v1/cluster/unload",
        ] {
            let r = authorize(&k, path, client).expect(path);
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
            assert!(authorize(&k, path, Some("Bearer sk-admin-123456")).is_none());
            assert_eq!(
                authorize(&k, path, None).unwrap().status(),
                StatusCode::UNAUTHORIZED
            );
        }
    }

    #[test]
    fn a_key_over_its_rate_gets_429_with_retry_after() {
        let k = keys();
        let slow = Some("Bearer sk-slow-1234567");
        assert!(authorize(&k, "/v1/models", slow).is_none());
        let r = authorize(&k, "/v1/models", slow).unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(r.headers().get(header::RETRY_AFTER).is_some());
    }
}
