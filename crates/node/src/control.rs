//! The control plane, on zenoh: discovery (LAN multicast scouting, plus `--peer` addresses for
//! networks without multicast), membership (one liveliness token per node: a killed node's
//! token vanishes when its socket closes, a frozen or cut-off one when its lease runs out),
//! leader election (the live member with the smallest id, so every member agrees once it sees the
//! same members, and the next one takes over the moment a leader's token goes), node state
//! (profile and measured links, republished every second) and link probes.
//!
//! Every link is mutual TLS under the cluster's certificate authority (see [`crate::key`]); plain
//! TCP is not offered. Topics live under `strata/<key fingerprint>/`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use zenoh::Wait as _;
use zenoh::sample::SampleKind;

use crate::key::ClusterKey;
use crate::profile::Profile;
use crate::{Error, Result};

mod claims;

use claims::{Claimant, take_state};

/// The control plane's default TLS port.
pub const DEFAULT_CONTROL_PORT: u16 = 7447;
/// zenoh's multicast scouting group (UDP).
pub const SCOUTING_GROUP: &str = "224.0.0.224:7446";
/// How long a silent link is trusted (ms); with 4 keep-alives per lease a frozen peer is dropped
/// in about 0.75 s and a killed one at once.
const LEASE_MS: u64 = 1000;
/// Events kept for `strata status`.
const EVENTS_KEPT: usize = 64;
/// Bytes sent to a peer to measure a link's bandwidth.
const PROBE_BYTES: usize = 1 << 20;

/// How to join the control plane.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// The cluster key.
    pub key: ClusterKey,
    /// This node's id.
    pub node_id: String,
    /// Address the control plane listens on.
    pub listen: std::net::SocketAddr,
    /// Peers to dial besides those found by multicast (`host:port`).
    pub peers: Vec<String>,
    /// Whether to scout the LAN by multicast.
    pub multicast: bool,
    /// Names and addresses this node's certificate is valid for.
    pub cert_names: Vec<String>,
}

/// A link as measured by one end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkReport {
    /// The other end.
    pub peer: String,
    /// One-way latency, seconds: over the data plane, half a low percentile of small messages'
    /// round trips (see [`crate::linkprobe`]); over the control plane where the peer answers no
    /// data-plane probe, half the best round trip of a query.
    pub latency_s: f64,
    /// Throughput of a large transfer, bytes per second.
    pub bandwidth_bps: f64,
    /// Unix time of the measurement, ms.
    pub measured_at_ms: u64,
    /// The data-plane transport the probe took (`tcp` or `shm`, as the answering node's
    /// instances would), or none when it was measured over the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// What a node publishes about itself every second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    /// Who it is and what it measured of itself.
    pub profile: Profile,
    /// Its measurements of its links.
    pub links: Vec<LinkReport>,
    /// Whether it refuses new work (`strata drain`).
    pub draining: bool,
    /// Anything the daemon above adds (instances it hosts).
    #[serde(default)]
    pub extra: serde_json::Value,
}

/// A membership change, for `strata status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Unix time, ms.
    pub at_ms: u64,
    /// What happened.
    pub what: String,
    /// Whether it is something to fix (logged as a warning, not as news).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warning: bool,
}

/// One live member as this node sees it.
#[derive(Clone, Debug, Default)]
struct Member {
    state: Option<NodeState>,
    joined_at_ms: u64,
    /// Who published the state taken, and when it arrived.
    claimant: Option<(Claimant, Instant)>,
}

/// The cluster as this node sees it.
#[derive(Debug, Default)]
struct View {
    members: BTreeMap<String, Member>,
    events: VecDeque<Event>,
    leader: Option<String>,
    /// Sessions already warned about as a second claimant of an id, by (id, session).
    warned: std::collections::BTreeSet<(String, String)>,
    /// Set when another live process holds this node's own id and started first: who it is.
    displaced_by: Option<String>,
}

impl View {
    fn event(&mut self, what: String) {
        self.record(what, false);
    }

    /// Records an event; `warning` marks something to fix.
    fn record(&mut self, what: String, warning: bool) {
        if self.events.len() == EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            at_ms: now_ms(),
            what,
            warning,
        });
    }

    /// Re-elects after a membership change; records a change of leader.
    fn elect(&mut self) {
        let leader = self.members.keys().next().cloned();
        if leader != self.leader {
            if let Some(l) = &leader {
                self.event(format!("{l} is the leader"));
            }
            self.leader = leader;
        }
    }
}

/// A snapshot of the cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// The node answering.
    pub me: String,
    /// The cluster key's fingerprint.
    pub cluster: String,
    /// The leader.
    pub leader: Option<String>,
    /// Live members (id order) and their last state, if one has arrived yet.
    pub members: Vec<MemberSnapshot>,
    /// Recent membership events, oldest first.
    pub events: Vec<Event>,
}

/// One member in a [`Snapshot`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberSnapshot {
    /// Node id.
    pub id: String,
    /// Unix time this node saw it join, ms.
    pub joined_at_ms: u64,
    /// Its last published state.
    pub state: Option<NodeState>,
}

/// A running control plane.
pub struct Control {
    session: zenoh::Session,
    prefix: String,
    me: String,
    fingerprint: String,
    view: Arc<Mutex<View>>,
    changes: tokio::sync::watch::Sender<u64>,
    /// This process, as its published states name it (see [`Claimant`]).
    claimant: Vec<u8>,
    _token: zenoh::liveliness::LivelinessToken,
    _members: zenoh::pubsub::Subscriber<()>,
    _states: zenoh::pubsub::Subscriber<()>,
    _echo: zenoh::query::Queryable<()>,
    /// Listens for other zenoh peers on the LAN, to name strangers (multicast discovery only).
    _strangers: Option<(zenoh::scouting::Scout<()>, AbortOnDrop)>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("me", &self.me)
            .field("cluster", &self.fingerprint)
            .finish()
    }
}

fn lock(view: &Mutex<View>) -> MutexGuard<'_, View> {
    view.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The zenoh configuration for a member of this cluster.
fn zenoh_config(cfg: &ControlConfig) -> Result<zenoh::Config> {
    let tls = cfg.key.tls_identity(&cfg.cert_names)?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let endpoint = |addr: &str| format!("quic/{addr}");
    let json = serde_json::json!({
        "mode": "peer",
        "listen": { "endpoints": [endpoint(&cfg.listen.to_string())] },
        "connect": {
            "endpoints": cfg.peers.iter().map(|p| endpoint(p)).collect::<Vec<_>>(),
            // Keep dialling peers that are not up yet; never give up on start.
            "timeout_ms": 0,
            "exit_on_failure": false,
        },
        "scouting": {
            "multicast": {
                "enabled": cfg.multicast,
                "address": SCOUTING_GROUP,
                "autoconnect": { "peer": ["router", "peer"] },
            },
            "gossip": { "enabled": true },
        },
        "adminspace": { "enabled": false },
        "transport": {
            "link": {
                "protocols": ["quic"],
                "tx": { "lease": LEASE_MS, "keep_alive": 4 },
                "tls": {
                    "root_ca_certificate_base64": b64(&tls.ca_pem),
                    "listen_certificate_base64": b64(&tls.cert_pem),
                    "listen_private_key_base64": b64(&tls.key_pem),
                    "connect_certificate_base64": b64(&tls.cert_pem),
                    "connect_private_key_base64": b64(&tls.key_pem),
                    "enable_mtls": true,
                    // The dialled address must be in the peer's certificate: a certificate a
                    // public CA issued for some web name is no use to an impostor here.
                    "verify_name_on_connect": true,
                },
            },
        },
    });
    zenoh::Config::from_json5(&json.to_string()).map_err(Error::control)
}

/// How long a peer that announces itself on the LAN may stay unconnected before it is named a
/// stranger: a member's handshake takes well under this.
const STRANGER_AFTER: Duration = Duration::from_secs(5);

/// A zenoh peer heard on the LAN by multicast scouting.
#[derive(Debug)]
struct Heard {
    first: Instant,
    last: Instant,
    locators: Vec<String>,
    reported: bool,
}

/// Listens to the LAN's zenoh announcements and adds an event for each peer that keeps
/// announcing itself but never joins this node's session: its mutual-TLS handshake fails, so it
/// holds no key of this cluster. (The control plane refuses it inside the handshake, where
/// nothing above sees it; this is how `strata status` and the dashboard learn of it.)
async fn watch_strangers(
    session: &zenoh::Session,
    view: &Arc<Mutex<View>>,
    changes: &tokio::sync::watch::Sender<u64>,
) -> Result<(zenoh::scouting::Scout<()>, AbortOnDrop)> {
    use zenoh::config::WhatAmI;
    let heard: Arc<Mutex<BTreeMap<String, Heard>>> = Arc::default();
    let mut cfg = zenoh::Config::default();
    let set =
        |cfg: &mut zenoh::Config, k: &str, v: &str| cfg.insert_json5(k, v).map_err(Error::control);
    set(&mut cfg, "scouting/multicast/enabled", "true")?;
    set(
        &mut cfg,
        "scouting/multicast/address",
        &format!("\"{SCOUTING_GROUP}\""),
    )?;
    let scout = {
        let heard = Arc::clone(&heard);
        zenoh::scout(WhatAmI::Peer | WhatAmI::Router, cfg)
            .callback(move |hello| {
                let now = Instant::now();
                let mut h = heard
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let e = h.entry(hello.zid().to_string()).or_insert(Heard {
                    first: now,
                    last: now,
                    locators: Vec::new(),
                    reported: false,
                });
                e.last = now;
                e.locators = hello.locators().iter().map(|l| l.to_string()).collect();
            })
            .await
            .map_err(Error::control)?
    };
    let (session, view, changes) = (session.clone(), Arc::clone(view), changes.clone());
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let me = session.zid().to_string();
            let peers: Vec<String> = session
                .info()
                .peers_zid()
                .await
                .map(|z| z.to_string())
                .collect();
            let mut found = Vec::new();
            {
                let mut h = heard
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let now = Instant::now();
                // Forget peers gone quiet; a member's entry is kept so it is never reported.
                h.retain(|_, e| now.duration_since(e.last) < Duration::from_secs(30));
                for (zid, e) in h.iter_mut() {
                    if *zid == me || peers.contains(zid) {
                        e.first = now;
                        continue;
                    }
                    if !e.reported && now.duration_since(e.first) >= STRANGER_AFTER {
                        e.reported = true;
                        found.push(e.locators.join(", "));
                    }
                }
            }
            if !found.is_empty() {
                let mut v = lock(&view);
                for at in found {
                    v.event(format!(
                        "refused a stranger at {at}: it announces itself but holds no key of this cluster"
                    ));
                }
                drop(v);
                changes.send_modify(|n| *n += 1);
            }
        }
    });
    Ok((scout, AbortOnDrop(task)))
}

/// A background task that ends with its owner.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Control {
    /// Joins the cluster and starts following its membership and state.
    pub async fn start(cfg: ControlConfig) -> Result<Control> {
        let fingerprint = cfg.key.fingerprint();
        let prefix = format!("strata/{fingerprint}");
        let me = cfg.node_id.clone();
        let session = zenoh::open(zenoh_config(&cfg)?)
            .await
            .map_err(Error::control)?;
        let view = Arc::new(Mutex::new(View::default()));
        let (changes, _) = tokio::sync::watch::channel(0u64);
        {
            let mut v = lock(&view);
            v.members.insert(
                me.clone(),
                Member {
                    state: None,
                    joined_at_ms: now_ms(),
                    claimant: None,
                },
            );
            v.event(format!("{me} started"));
            v.elect();
        }

        let token = session
            .liveliness()
            .declare_token(format!("{prefix}/member/{me}"))
            .await
            .map_err(Error::control)?;

        let members = {
            let view = Arc::clone(&view);
            let changes = changes.clone();
            let me = me.clone();
            session
                .liveliness()
                .declare_subscriber(format!("{prefix}/member/*"))
                .history(true)
                .callback(move |s| {
                    let Some(id) = s.key_expr().as_str().rsplit('/').next() else {
                        return;
                    };
                    if id == me || !crate::identity::valid_id(id) {
                        return;
                    }
                    let mut v = lock(&view);
                    match s.kind() {
                        SampleKind::Put => {
                            if !v.members.contains_key(id) {
                                v.members.insert(
                                    id.to_string(),
                                    Member {
                                        state: None,
                                        joined_at_ms: now_ms(),
                                        claimant: None,
                                    },
                                );
                                v.event(format!("{id} joined"));
                            }
                        }
                        SampleKind::Delete => {
                            if v.members.remove(id).is_some() {
                                v.event(format!("{id} left"));
                            }
                        }
                    }
                    v.elect();
                    drop(v);
                    changes.send_modify(|n| *n += 1);
                })
                .await
                .map_err(Error::control)?
        };

        let mine = Claimant {
            session: session.zid().to_string(),
            started_ms: now_ms(),
        };
        let claimant = serde_json::to_vec(&mine).map_err(Error::control)?;
        let states = {
            let view = Arc::clone(&view);
            let changes = changes.clone();
            let me = me.clone();
            session
                .declare_subscriber(format!("{prefix}/state/*"))
                .callback(move |s| {
                    let Some(id) = s.key_expr().as_str().rsplit('/').next() else {
                        return;
                    };
                    let bytes = s.payload().to_bytes();
                    let Ok(state) = serde_json::from_slice::<NodeState>(&bytes) else {
                        return;
                    };
                    if state.profile.id != id {
                        return;
                    }
                    let from = s
                        .attachment()
                        .and_then(|a| serde_json::from_slice::<Claimant>(&a.to_bytes()).ok());
                    let mut v = lock(&view);
                    if take_state(&mut v, &mine, id == me, state, from) {
                        drop(v);
                        changes.send_modify(|n| *n += 1);
                    }
                })
                .await
                .map_err(Error::control)?
        };

        // Link probes: an empty reply to whatever is sent, so the asker can time the round trip
        // (and, with a large query, the transfer).
        let echo = session
            .declare_queryable(format!("{prefix}/echo/{me}"))
            .callback(|q| {
                let n = q.payload().map_or(0, |p| p.len());
                let _ = q
                    .reply(q.key_expr().clone(), n.to_le_bytes().to_vec())
                    .wait();
            })
            .await
            .map_err(Error::control)?;

        let strangers = if cfg.multicast {
            Some(watch_strangers(&session, &view, &changes).await?)
        } else {
            None
        };

        Ok(Control {
            session,
            prefix,
            me,
            fingerprint,
            view,
            changes,
            claimant,
            _token: token,
            _members: members,
            _states: states,
            _echo: echo,
            _strangers: strangers,
        })
    }

    /// This node's id.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The cluster key's fingerprint.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A receiver that changes whenever membership or a member's state does.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The zenoh session, for the layers above (instance records, requests between nodes).
    pub fn session(&self) -> &zenoh::Session {
        &self.session
    }

    /// The topic prefix of this cluster.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Publishes this node's state (and records it locally).
    pub async fn publish(&self, state: &NodeState) -> Result<()> {
        {
            let mut v = lock(&self.view);
            if let Some(m) = v.members.get_mut(&self.me) {
                m.state = Some(state.clone());
            }
        }
        let bytes = serde_json::to_vec(state).map_err(Error::control)?;
        self.session
            .put(format!("{}/state/{}", self.prefix, self.me), bytes)
            .attachment(self.claimant.clone())
            .await
            .map_err(Error::control)
    }

    /// Who holds this node's id besides it, and held it first, once this node has seen one: it
    /// must stop (the member first seen with an id keeps it).
    pub fn displaced_by(&self) -> Option<String> {
        lock(&self.view).displaced_by.clone()
    }

    /// The leader, as this node sees it.
    pub fn leader(&self) -> Option<String> {
        lock(&self.view).leader.clone()
    }

    /// Whether this node is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader().as_deref() == Some(self.me.as_str())
    }

    /// Ids of live members other than this node.
    pub fn peers(&self) -> Vec<String> {
        lock(&self.view)
            .members
            .keys()
            .filter(|k| **k != self.me)
            .cloned()
            .collect()
    }

    /// Adds an event to this node's feed (what `strata status` and the dashboard show).
    pub fn note(&self, what: String) {
        lock(&self.view).event(what);
        self.changes.send_modify(|n| *n += 1);
    }

    /// The cluster as this node sees it now.
    pub fn snapshot(&self) -> Snapshot {
        let v = lock(&self.view);
        Snapshot {
            me: self.me.clone(),
            cluster: self.fingerprint.clone(),
            leader: v.leader.clone(),
            members: v
                .members
                .iter()
                .map(|(id, m)| MemberSnapshot {
                    id: id.clone(),
                    joined_at_ms: m.joined_at_ms,
                    state: m.state.clone(),
                })
                .collect(),
            events: v.events.iter().cloned().collect(),
        }
    }

    /// Measures the link to `peer`: the best of a few empty round trips, then a 1 MiB transfer.
    pub async fn probe(&self, peer: &str) -> Result<LinkReport> {
        let key = format!("{}/echo/{peer}", self.prefix);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            self.ask(&key, Vec::new()).await?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        self.ask(&key, vec![0x5a; PROBE_BYTES]).await?;
        let transfer = (t.elapsed().as_secs_f64() - best).max(1e-6);
        Ok(LinkReport {
            peer: peer.to_string(),
            latency_s: best / 2.0,
            bandwidth_bps: PROBE_BYTES as f64 / transfer,
            measured_at_ms: now_ms(),
            via: None,
        })
    }

    async fn ask(&self, key: &str, payload: Vec<u8>) -> Result<()> {
        let replies = self
            .session
            .get(key)
            .payload(payload)
            .timeout(Duration::from_secs(2))
            .await
            .map_err(Error::control)?;
        match replies.recv_async().await {
            Ok(r) if r.result().is_ok() => Ok(()),
            Ok(_) => Err(Error::Control(format!(
                "{key}: the peer answered with an error"
            ))),
            Err(_) => Err(Error::Control(format!("{key}: no answer within 2 s"))),
        }
    }

    /// Leaves the cluster (the liveliness token goes with the session).
    pub async fn close(&self) -> Result<()> {
        self.session.close().await.map_err(Error::control)
    }
}

/// Unix time in ms.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
