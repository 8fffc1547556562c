//! Hosting: starting and stopping this node's ranks to follow the leader's table.

use super::*;

/// Every 300 ms: as leader, place again what lost a node; as any node, start and stop ranks to
/// match the leader's table.
pub(super) async fn instances_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    loop {
        tick.tick().await;
        let snap = shared.control.snapshot();
        // Follow the leader's table, unless it is older than the one followed already (a
        // leader that has just started and not yet taken up the cluster's table).
        let leads = shared.control.is_leader();
        let newest = if leads { newest_followed(&snap) } else { None };
        let from_leader = leader_followed(&snap);
        {
            let mut st = shared.state();
            if let Some(f) = from_leader
                && f.version >= st.last_table.version
            {
                st.last_table = f;
            }
            if leads {
                // A node that has just become leader takes up the table it followed, unless
                // its own is newer.
                if !std::mem::replace(&mut st.was_leader, true)
                    && st.last_table.version >= st.table.version
                {
                    st.table = st.last_table.clone();
                }
                // A member may follow a newer table than this leader has (this node restarted
                // and leads by its id): take it up before anything else.
                if let Some(newest) = newest
                    && newest.version > st.table.version
                {
                    st.table = newest;
                }
            } else {
                st.was_leader = false;
            }
        }
        if leads {
            replace_lost(&shared, &snap).await;
        }
        let table = followed(&shared).table;
        host(&shared, &snap, &table);
    }
}

/// This node's peers, as a source of models.
pub(super) fn peers_of(shared: &Shared) -> transfer::Peers {
    transfer::Peers {
        session: shared.control.session().clone(),
        prefix: shared.control.prefix().to_string(),
        ids: shared.control.peers(),
        model_dirs: std::sync::Arc::clone(&shared.model_dirs),
        arrival: None,
    }
}

/// Starts the ranks the table gives this node and stops those it no longer does.
pub(super) fn host(shared: &Arc<Shared>, snap: &Snapshot, table: &[InstanceSpec]) {
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
        if shared.state().hosted.contains_key(&k) {
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
            let host = Host::new(spec, rank, None, "starting".into());
            let arrival = Arc::clone(&host.arrival);
            shared.state().hosted.insert(k.clone(), host);
            // Resolving may mean copying the model from a peer: off the async threads.
            let (shared, model, world, placement) = (
                Arc::clone(shared),
                spec.request.model.clone(),
                p.nodes.len(),
                p.clone(),
            );
            let peers = transfer::Peers {
                arrival: Some(arrival),
                ..peers_of(&shared)
            };
            let span = tracing::info_span!("instance", id = %k.0, epoch = k.1, rank);
            std::thread::spawn(move || {
                let _span = span.enter();
                let shard = crate::shard_fetch::shard_file(&model, &placement, rank, &peers);
                let started = match shard {
                    Ok(Some(path)) => Ok(path),
                    Ok(None) => transfer::resolve(&model, &peers),
                    Err(e) => Err(e),
                }
                .and_then(|path| instances::start_worker(&path, rank, world, coordinator, &token));
                let started = started.map(|c| Arc::new(Mutex::new(c)));
                {
                    let mut st = shared.state();
                    let Some(h) = st.hosted.get_mut(&k) else {
                        drop(st);
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
                            tracing::error!("this rank failed to start: {e}");
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
    let gone = {
        let mut st = shared.state();
        let keys: Vec<(String, u64)> = st
            .hosted
            .keys()
            .filter(|k| !wanted.contains(k))
            .cloned()
            .collect();
        let mut gone: Vec<Running> = Vec::with_capacity(keys.len());
        for k in keys {
            st.served.remove(&format!("{}@{}", k.0, k.1));
            gone.extend(st.hosted.remove(&k).and_then(|h| h.running));
        }
        // A worker that exited is reported failed.
        for host in st.hosted.values_mut() {
            if let Some(s) = host.running.as_ref().and_then(Running::exited) {
                tracing::error!(
                    instance = %host.info.instance,
                    rank = host.info.rank,
                    "the worker exited ({s})"
                );
                host.info.status = format!("failed: the worker exited ({s})");
                gone.extend(host.running.take());
            }
        }
        gone
    };
    // Stopping ranks (killing workers, ending engines) happens outside the lock.
    drop(gone);
}

pub(super) fn start_rank0(
    shared: &Arc<Shared>,
    spec: &InstanceSpec,
    p: &strata_cluster::Placement,
    token: String,
) {
    let k = (spec.id.clone(), spec.epoch);
    let listener = match std::net::TcpListener::bind((shared.data_host, 0)) {
        Ok(l) => l,
        Err(e) => {
            shared.state().hosted.insert(
                k,
                Host::new(spec, 0, None, format!("failed: listening for ranks: {e}")),
            );
            return;
        }
    };
    let coordinator = listener.local_addr().ok().map(|a| a.to_string());
    // The workers learn where to join once this rank's shard of a hub model is here, so the
    // ranges they share with it come from this node rather than the hub a second time.
    let host = Host::new(spec, 0, None, "starting".into());
    let arrival = Arc::clone(&host.arrival);
    shared.state().hosted.insert(k.clone(), host);
    let shared = Arc::clone(shared);
    let spec = spec.clone();
    let p = p.clone();
    let span = tracing::info_span!("instance", id = %spec.id, epoch = spec.epoch, rank = 0);
    std::thread::spawn(move || {
        let _span = span.enter();
        let peers = transfer::Peers {
            arrival: Some(Arc::clone(&arrival)),
            ..peers_of(&shared)
        };
        let workers_arrived = || arrivals::wait_for_workers(&shared, &spec, &p, &arrival);
        let shard = match p.nodes.len() {
            1 => Ok(None),
            _ => crate::shard_fetch::shard_file(&spec.request.model, &p, 0, &peers),
        };
        if let Some(h) = shared.state().hosted.get_mut(&k) {
            h.info.coordinator = coordinator;
        }
        let result = shard.and_then(|model_path| {
            instances::start_rank0(instances::Rank0Start {
                spec: &spec,
                model_path,
                placement: &p,
                listener,
                token,
                threads: shared.threads,
                emulate: shared.emulate,
                transport: shared.transport,
                keys: None,
                shared_prefix_cache: shared.shared_prefix_cache,
                served: shared.served_names.clone(),
                peers,
                workers_arrived: &workers_arrived,
            })
        });
        let mut guard = shared.state();
        let st = &mut *guard;
        let Some(h) = st.hosted.get_mut(&k) else {
            // Unloaded or placed again meanwhile: the state drops here, after the lock.
            drop(guard);
            drop(result);
            return;
        };
        match result {
            Ok(state) => {
                tracing::info!("{} is ready", spec.request.model);
                st.served.insert(
                    format!("{}@{}", k.0, k.1),
                    strata_api::router(Arc::clone(&state)),
                );
                h.info.status = "ready".into();
                h.running = Some(Running::Rank0(state));
            }
            Err(e) => {
                tracing::error!("failed to start: {e}");
                h.info.status = format!("failed: {e}");
            }
        }
    });
}
