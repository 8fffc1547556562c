//! The leader's side: the instance table it keeps (versioned, so a new leader takes up the
//! newest), the load and unload requests members send it, and placing again what lost a node.

use super::*;

/// The leader's instance table, from a snapshot.
pub(super) fn leader_table(s: &Snapshot) -> Option<Vec<InstanceSpec>> {
    leader_followed(s).map(|f| f.table)
}

/// The table the leader publishes (it follows its own), with its version.
pub(super) fn leader_followed(s: &Snapshot) -> Option<Followed> {
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
pub(super) struct Followed {
    pub(super) version: u64,
    pub(super) table: Vec<InstanceSpec>,
}

/// What this node follows now: its own table when it leads. Takes the state lock.
pub(super) fn followed(shared: &Shared) -> Followed {
    let leads = shared.control.is_leader();
    shared.state().followed(leads).clone()
}

impl Live {
    /// The table this node follows: its own when it `leads`, else the leader's as last seen.
    pub(super) fn followed(&self, leads: bool) -> &Followed {
        if leads { &self.table } else { &self.last_table }
    }
}

/// The newest table any member (this one included) publishes.
pub(super) fn newest_followed(s: &Snapshot) -> Option<Followed> {
    s.members
        .iter()
        .filter_map(|m| m.state.as_ref()?.extra.get("followed"))
        .filter_map(|v| serde_json::from_value::<Followed>(v.clone()).ok())
        .max_by_key(|f| f.version)
}

impl Followed {
    /// Leader: changes the table by `f` and counts the change, in one step under the state
    /// lock (a publication never shows a table with the version of another).
    pub(super) fn change<T>(&mut self, f: impl FnOnce(&mut Vec<InstanceSpec>) -> T) -> T {
        self.version += 1;
        f(&mut self.table)
    }
}

/// What each member says it hosts, by node id.
pub(super) fn hosted_by(s: &Snapshot) -> BTreeMap<String, Vec<Hosted>> {
    s.members
        .iter()
        .filter_map(|m| {
            let st = m.state.as_ref()?;
            let h: Vec<Hosted> = serde_json::from_value(st.extra.get("hosted")?.clone()).ok()?;
            Some((m.id.clone(), h))
        })
        .collect()
}

pub(super) fn names(s: &Snapshot) -> BTreeMap<String, String> {
    s.members
        .iter()
        .filter_map(|m| Some((m.id.clone(), m.state.as_ref()?.profile.name.clone())))
        .collect()
}

/// How long a member may be silent after joining before a leader counts it as gone: a node
/// publishes its state every second, so ten cover the first one reaching a leader that has just
/// started with room for a busy machine.
const FIRST_STATE_GRACE_MS: u64 = 10_000;

/// Whether a leader knows enough to judge which nodes an instance has lost: every member's
/// state has arrived, or the member has been silent for longer than a node takes to speak.
/// Without this a leader that has just started (a restarted node with the smallest id) saw the
/// nodes whose state it had not yet heard as lost, and placed their instances again: a needless
/// reload, and a moment in which no node served.
pub(super) fn states_settled(snap: &Snapshot, now_ms: u64) -> bool {
    snap.members
        .iter()
        .all(|m| m.state.is_some() || now_ms.saturating_sub(m.joined_at_ms) > FIRST_STATE_GRACE_MS)
}

/// Why a request to the leader failed. The asker reads only its text: the leader sends it back
/// in its reply, and a member passes it on to its client.
#[derive(Debug, thiserror::Error)]
pub(super) enum LeaderError {
    /// This node does not (or no longer) lead.
    #[error("this node is not the leader")]
    NotLeader,
    /// The cluster has not chosen a leader yet.
    #[error("the cluster has no leader yet")]
    NoLeader,
    /// A request whose body does not parse.
    #[error("bad {op} request: {error}")]
    BadRequest {
        /// `load` or `unload`.
        op: &'static str,
        /// What is wrong with it.
        error: serde_json::Error,
    },
    /// A request the leader does not know.
    #[error("unknown request {0:?}")]
    UnknownRequest(String),
    /// No placement, or the model cannot be read.
    #[error(transparent)]
    Plan(#[from] Error),
    /// The planning task did not finish.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// Unloading an instance the table does not hold.
    #[error("no instance {0:?}")]
    NoInstance(String),
    /// The query could not be sent.
    #[error("{0}")]
    Query(zenoh::Error),
    /// The leader did not answer in time.
    #[error("the leader {0} did not answer")]
    NoAnswer(String),
    /// The leader answered with a failure of the query itself.
    #[error("the leader {0} failed")]
    Failed(String),
    /// The leader's answer is not what a leader sends.
    #[error("{0}")]
    BadReply(serde_json::Error),
    /// The leader refused the request, saying why.
    #[error("{0}")]
    Refused(String),
}

/// What a leader request gives.
pub(super) type LeaderResult<T> = std::result::Result<T, LeaderError>;

/// Answers `load` and `unload` sent to this node as leader.
pub(super) async fn rpc_loop(
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
            // A forwarded request's span names where it came from (its own path is read later).
            let span = tracing::info_span!("forwarded", key = %q.key_expr());
            tokio::spawn(tracing::Instrument::instrument(
                serve_forwarded(Arc::clone(&shared), q),
                span,
            ));
            continue;
        }
        if op == "model" {
            tokio::task::spawn_blocking(move || transfer::serve(&q));
            continue;
        }
        if op == "hubrange" {
            tokio::task::spawn_blocking(move || crate::shard_fetch::serve_ranges(&q));
            continue;
        }
        // Its own task: a leader that has just started waits to hear its members before it
        // changes the table, and forwarded requests must not wait behind that.
        tokio::spawn(answer_leader_request(Arc::clone(&shared), q, op));
    }
}

/// Answers one `load` or `unload` sent to this node as leader.
async fn answer_leader_request(shared: Arc<Shared>, q: zenoh::query::Query, op: String) {
    let body = q
        .payload()
        .map(|p| p.to_bytes().to_vec())
        .unwrap_or_default();
    let answer: LeaderResult<serde_json::Value> = if !shared.control.is_leader() {
        Err(LeaderError::NotLeader)
    } else {
        // A leader that has just started may hold a table older than the cluster's (it takes
        // up the newest a member publishes): a change made before it has heard every member
        // could be lost, so it waits for them (at most the grace a member has).
        while !states_settled(&shared.control.snapshot(), now_ms()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Leadership may have moved while it waited.
        if !shared.control.is_leader() {
            return reply(&q, Err(LeaderError::NotLeader)).await;
        }
        match op.as_str() {
            "load" => match serde_json::from_slice::<LoadRequest>(&body) {
                Ok(req) => leader_load(&shared, req)
                    .await
                    .map(|s| serde_json::to_value(s).unwrap_or_default()),
                Err(error) => Err(LeaderError::BadRequest { op: "load", error }),
            },
            "unload" => match serde_json::from_slice::<String>(&body) {
                Ok(id) => leader_unload(&shared, &id).map(|()| serde_json::json!({})),
                Err(error) => Err(LeaderError::BadRequest {
                    op: "unload",
                    error,
                }),
            },
            other => Err(LeaderError::UnknownRequest(other.to_string())),
        }
    };
    reply(&q, answer).await;
}

/// Sends a leader request's answer back (an error as its text).
async fn reply(q: &zenoh::query::Query, answer: LeaderResult<serde_json::Value>) {
    let bytes = serde_json::to_vec(&match answer {
        Ok(v) => serde_json::json!({ "ok": v }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    })
    .unwrap_or_default();
    let _ = q.reply(q.key_expr().clone(), bytes).await;
}

pub(super) async fn leader_load(
    shared: &Arc<Shared>,
    req: LoadRequest,
) -> LeaderResult<InstanceSpec> {
    let snap = shared.control.snapshot();
    let topo = topology(&snap);
    let names = names(&snap);
    let r = req.clone();
    let peers = peers_of(shared);
    let (placement, facts) =
        tokio::task::spawn_blocking(move || instances::plan(&r, &topo, &names, &peers)).await??;
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
    shared.state().table.change(|t| t.push(spec.clone()));
    let _ = publish(shared).await;
    Ok(spec)
}

pub(super) fn leader_unload(shared: &Shared, id: &str) -> LeaderResult<()> {
    let mut st = shared.state();
    if !st.table.table.iter().any(|s| s.id == id) {
        return Err(LeaderError::NoInstance(id.to_string()));
    }
    st.table.change(|t| t.retain(|s| s.id != id));
    Ok(())
}

/// Sends a request to the leader (which may be this node) and returns its answer.
pub(super) async fn ask_leader(
    shared: &Shared,
    op: &str,
    body: Vec<u8>,
) -> LeaderResult<serde_json::Value> {
    let leader = shared.control.leader().ok_or(LeaderError::NoLeader)?;
    let key = format!("{}/rpc/{leader}/{op}", shared.control.prefix());
    let replies = shared
        .control
        .session()
        .get(key)
        .payload(body)
        .timeout(Duration::from_secs(120))
        .await
        .map_err(LeaderError::Query)?;
    let reply = replies
        .recv_async()
        .await
        .map_err(|_| LeaderError::NoAnswer(leader.clone()))?;
    let sample = reply
        .result()
        .map_err(|_| LeaderError::Failed(leader.clone()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&sample.payload().to_bytes()).map_err(LeaderError::BadReply)?;
    match v.get("error").and_then(|e| e.as_str()) {
        Some(e) => Err(LeaderError::Refused(e.to_string())),
        None => Ok(v["ok"].clone()),
    }
}

/// Leader: instances on a node that left are placed again on the nodes left (a new epoch).
pub(super) async fn replace_lost(shared: &Arc<Shared>, snap: &Snapshot) {
    if !states_settled(snap, now_ms()) {
        return;
    }
    let topo = topology(snap);
    let alive: Vec<&str> = topo.nodes.iter().map(|n| n.id.as_str()).collect();
    let lost: Vec<InstanceSpec> = shared
        .state()
        .table
        .table
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
        let mut st = shared.state();
        if !st
            .table
            .table
            .iter()
            .any(|s| s.id == spec.id && s.epoch == spec.epoch)
        {
            continue;
        }
        st.table.change(|t| {
            let Some(s) = t
                .iter_mut()
                .find(|s| s.id == spec.id && s.epoch == spec.epoch)
            else {
                return;
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
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::MemberSnapshot;

    fn member(id: &str, joined_at_ms: u64, heard: bool) -> MemberSnapshot {
        let state = heard.then(|| NodeState {
            profile: Profile {
                id: id.into(),
                name: id.into(),
                hostname: id.into(),
                version: String::new(),
                memory_total: 1 << 30,
                memory_available: 1 << 30,
                cores: 1,
                backend: String::new(),
                matmul_gflops: 1.0,
                matmul_gflops_by_type: BTreeMap::new(),
                stream_gweights_by_type: BTreeMap::new(),
                machine: String::new(),
                machine_bandwidth: 0.0,
                exchange_overhead_us: 0.0,
                attention_gflops: 1.0,
                attention_fixed_us: 0.0,
                row_cost_ns: 0.0,
                mem_bandwidth: 1e9,
                api_addr: String::new(),
                started_at: 0,
                memory_limit: None,
            },
            links: Vec::new(),
            draining: false,
            extra: serde_json::Value::Null,
        });
        MemberSnapshot {
            id: id.into(),
            joined_at_ms,
            state,
        }
    }

    #[test]
    fn a_new_leader_judges_no_node_lost_before_hearing_it() {
        let snap = |members| Snapshot {
            me: "0".into(),
            cluster: String::new(),
            leader: Some("0".into()),
            members,
            events: Vec::new(),
        };
        let now = 100_000;
        // A member joined a moment ago and has not spoken yet: wait.
        let fresh = snap(vec![member("0", now, true), member("5", now - 500, false)]);
        assert!(!states_settled(&fresh, now));
        // Every member heard: judge.
        let heard = snap(vec![member("0", now, true), member("5", now - 500, true)]);
        assert!(states_settled(&heard, now));
        // Silent far longer than a node takes to speak: judged (as gone, by the topology).
        let mute = snap(vec![
            member("0", now, true),
            member("5", now - FIRST_STATE_GRACE_MS - 1, false),
        ]);
        assert!(states_settled(&mute, now));
    }

    #[test]
    fn a_leader_error_reads_as_the_asker_is_told() {
        let bad = serde_json::from_slice::<String>(b"{").expect_err("not a string");
        let why = bad.to_string();
        let said = |e: LeaderError| e.to_string();
        assert_eq!(said(LeaderError::NotLeader), "this node is not the leader");
        assert_eq!(
            said(LeaderError::NoInstance("i-1".into())),
            r#"no instance "i-1""#
        );
        assert_eq!(
            said(LeaderError::UnknownRequest("drop".into())),
            r#"unknown request "drop""#
        );
        assert_eq!(
            said(LeaderError::BadRequest {
                op: "unload",
                error: bad
            }),
            format!("bad unload request: {why}")
        );
        assert_eq!(said(LeaderError::Refused("full".into())), "full");
    }
}
