//! What a node keeps telling the cluster: its state every second (memory changes; speed was
//! measured at start), its links' measurements, and who joined and left.

use super::*;

pub(super) fn cap(available: u64, limit: Option<u64>) -> u64 {
    limit.map_or(available, |l| available.min(l))
}

pub(super) async fn publish(shared: &Shared) -> Result<()> {
    // Files are read before the state is locked.
    let memory = cap(profile::memory().1, shared.memory_limit);
    let ticks = cpu_ticks();
    let peers = shared.control.peers();
    let leads = shared.control.is_leader();
    let state = {
        let mut st = shared.state();
        st.profile.memory_available = memory;
        let links = st
            .links
            .values()
            .filter(|l| peers.contains(&l.peer))
            .cloned()
            .collect();
        let busy = ticks.and_then(|now| busy_since(&mut st.cpu_ticks, now));
        st.cpu_busy = busy;
        NodeState {
            profile: st.profile.clone(),
            links,
            draining: shared.flags.draining.load(Ordering::Relaxed),
            extra: serde_json::json!({
                "hosted": st.hosted.values().map(Host::published).collect::<Vec<_>>(),
                "cpu_busy": busy,
                "followed": st.followed(leads),
                "link_probe": shared.link_probe.to_string(),
            }),
        }
    };
    shared.control.publish(&state).await
}

/// The machine's (total, idle) CPU ticks from `/proc/stat` (idle time is idle + iowait);
/// `None` where there is no `/proc/stat`.
#[cfg(not(target_os = "macos"))]
fn cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((total, idle))
}

/// The machine's (total, idle) CPU ticks from the kernel's host statistics (macOS counts no
/// iowait: a core waiting on a disk is idle).
#[cfg(target_os = "macos")]
fn cpu_ticks() -> Option<(u64, u64)> {
    crate::host::cpu_ticks()
}

/// The busy fraction of CPU time (0-1) between the ticks in `last` and `now`, which take their
/// place; `None` on the first call.
fn busy_since(last: &mut Option<(u64, u64)>, now: (u64, u64)) -> Option<f64> {
    let (total, idle) = now;
    let (t0, i0) = last.replace(now)?;
    let dt = total.checked_sub(t0).filter(|d| *d > 0)?;
    let di = idle.saturating_sub(i0).min(dt);
    Some(1.0 - di as f64 / dt as f64)
}

pub(super) async fn publish_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(STATE_EVERY);
    loop {
        tick.tick().await;
        if let Err(e) = publish(&shared).await {
            tracing::warn!("publishing this node's state: {e}");
        }
    }
}

/// Whether a link measured `age` ago is measured again now, given the CPU busy fractions of
/// this machine and the peer's (as it last published them).
///
/// A probe is about a hundred sealed round trips and two megabytes each way, and the answering
/// and probing threads take cores a serving instance computes on: on a 2-core machine serving
/// a tensor-parallel instance, one probe every [`PROBE_EVERY`] took about 3 % of both cores,
/// and every rank it delayed stalled its peers at the next exchange. A busy probe also measures
/// the scheduler more than the link (see [`steadied`]). So once a link has its
/// [`PROBES_KEPT`] data-plane probes (`probes`), it is re-measured often only while both ends
/// are idle, and while either is busy only once its figures are [`PROBE_BUSY_EVERY`] old. A
/// link never measured is measured at once.
pub(super) fn probe_due(
    age: Option<Duration>,
    probes: usize,
    mine: Option<f64>,
    peers: Option<f64>,
) -> bool {
    let Some(age) = age else {
        return true;
    };
    // Until [`steadied`] has its probes, a first one that met busy cores (nodes start by
    // measuring themselves) is not left standing for ten minutes.
    let busy = probes >= PROBES_KEPT && [mine, peers].iter().flatten().any(|b| *b > PROBE_BUSY);
    age > if busy { PROBE_BUSY_EVERY } else { PROBE_EVERY }
}

/// The CPU busy fraction `peer` last published.
fn published_busy(snapshot: &Snapshot, peer: &str) -> Option<f64> {
    let m = snapshot.members.iter().find(|m| m.id == peer)?;
    m.state.as_ref()?.extra.get("cpu_busy")?.as_f64()
}

/// Whether this node measures its link to `peer`: one end of each pair does (the one whose id
/// sorts first), and the planner takes the pair's figures from whichever end published them.
/// Both ends probing at once put four busy-waiting threads (two probers, two answerers) on the
/// cores of nodes that share a machine, and a probe over shared memory then timed the
/// scheduler: 138 us for a 5 us link, on two cores.
fn measures(me: &str, peer: &str) -> bool {
    me < peer
}

/// Measures each member's link when it is new or its measurement is due ([`probe_due`]).
pub(super) async fn probe_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut history = BTreeMap::new();
    loop {
        tick.tick().await;
        let snapshot = shared.control.snapshot();
        let due: Vec<String> = {
            let st = shared.state();
            let now = now_ms();
            shared
                .control
                .peers()
                .into_iter()
                .filter(|p| measures(shared.control.me(), p))
                .filter(|p| {
                    let age = st
                        .links
                        .get(p)
                        .map(|l| Duration::from_millis(now.saturating_sub(l.measured_at_ms)));
                    let probes = history.get(p).map_or(0, Vec::len);
                    probe_due(age, probes, st.cpu_busy, published_busy(&snapshot, p))
                })
                .collect()
        };
        for peer in due {
            let report = match measure_link(&shared, &peer).await {
                Some((r, true)) => Some(steadied(&mut history, r)),
                Some((r, false)) => Some(r),
                None => None,
            };
            let mut st = shared.state();
            match report {
                Some(r) => {
                    st.links.insert(peer, r);
                }
                // A member that just left; the next round forgets it.
                None => {
                    st.links.remove(&peer);
                }
            }
        }
    }
}

/// Data-plane probes of a link kept to steady its figures.
const PROBES_KEPT: usize = 4;

/// The link's figures over its last [`PROBES_KEPT`] data-plane probes: the lowest latency and
/// the highest bandwidth. A link's speed is a property of the link; a probe that meets both
/// cores busy (a model loading, a prompt being prefilled) measures the scheduler instead,
/// by 20 times on two cores, and would tell the planner a fast link is slow.
fn steadied(history: &mut BTreeMap<String, Vec<LinkReport>>, r: LinkReport) -> LinkReport {
    let kept = history.entry(r.peer.clone()).or_default();
    if kept.len() == PROBES_KEPT {
        kept.remove(0);
    }
    kept.push(r.clone());
    LinkReport {
        latency_s: kept
            .iter()
            .map(|k| k.latency_s)
            .fold(f64::INFINITY, f64::min),
        bandwidth_bps: kept.iter().map(|k| k.bandwidth_bps).fold(0.0, f64::max),
        ..r
    }
}

/// Measures the link to `peer`: over the data plane where it answers probes there (`true`),
/// else over the control plane (with the emulated link added, which only the data plane
/// applies).
async fn measure_link(shared: &Arc<Shared>, peer: &str) -> Option<(LinkReport, bool)> {
    let snapshot = shared.control.snapshot();
    // A peer whose state has not arrived yet is measured next round, when it says where it
    // answers probes (a control-plane guess now would stand for a whole round).
    let state = snapshot
        .members
        .iter()
        .find(|m| m.id == peer)
        .and_then(|m| m.state.as_ref());
    let Some(state) = state else {
        return shared.state().links.get(peer).cloned().map(|l| (l, false));
    };
    let probe_addr: Option<std::net::SocketAddr> = state
        .extra
        .get("link_probe")
        .and_then(|a| a.as_str()?.parse().ok());
    if let Some(addr) = probe_addr {
        let key = shared.key.clone();
        let measured =
            tokio::task::spawn_blocking(move || crate::linkprobe::measure(addr, &key)).await;
        if let Ok(Ok((f, via))) = measured {
            let report = LinkReport {
                peer: peer.to_string(),
                latency_s: f.latency,
                bandwidth_bps: f.bandwidth,
                measured_at_ms: now_ms(),
                via: Some(via.into()),
            };
            return Some((report, true));
        }
        // Busy answering another node, most likely: keep the last figures (still due, so
        // tried again in half a second) rather than a control-plane guess.
        let last = shared.state().links.get(peer).cloned();
        if let Some(l) = last {
            return Some((l, false));
        }
    }
    let mut report = shared.control.probe(peer).await.ok()?;
    let e = shared.emulate;
    report.latency_s += e.latency.as_secs_f64();
    if let Some(bw) = e.bandwidth {
        report.bandwidth_bps = report.bandwidth_bps.min(bw);
    }
    Some((report, false))
}

/// Says on stderr who joined and left, as the control plane sees it.
pub(super) async fn log_membership(shared: Arc<Shared>) {
    let mut rx = shared.control.changes();
    let mut seen = 0usize;
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        let events = shared.control.snapshot().events;
        let total = events.len();
        for e in events.iter().skip(seen.min(total)) {
            if e.warning {
                tracing::warn!("{}", e.what);
            } else {
                tracing::info!("{}", e.what);
            }
        }
        seen = total;
        // Another process held this node's id first: this one stops (`run` says why).
        if shared.control.displaced_by().is_some() {
            shared.stop.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_measured_often_only_while_both_ends_are_idle() {
        let s = Duration::from_secs;
        let k = PROBES_KEPT;
        // Never measured: now, however busy.
        assert!(probe_due(None, 0, Some(1.0), Some(1.0)));
        // Idle on both ends (or not yet known): every PROBE_EVERY.
        assert!(probe_due(Some(s(6)), k, Some(0.1), Some(0.2)));
        assert!(probe_due(Some(s(6)), k, None, None));
        assert!(!probe_due(Some(s(4)), k, Some(0.1), None));
        // Either end busy: only once the figures are PROBE_BUSY_EVERY old.
        assert!(!probe_due(Some(s(6)), k, Some(0.9), Some(0.1)));
        assert!(!probe_due(Some(s(6)), k, Some(0.1), Some(0.6)));
        assert!(!probe_due(Some(s(599)), k, None, Some(0.6)));
        assert!(probe_due(Some(s(601)), k, Some(0.9), Some(0.9)));
        // Busy, but the figures do not rest on enough probes yet: every PROBE_EVERY.
        assert!(probe_due(Some(s(6)), k - 1, Some(0.9), Some(0.9)));
        assert!(!probe_due(Some(s(4)), k - 1, Some(0.9), Some(0.9)));
    }

    #[test]
    fn a_probe_that_met_busy_cores_does_not_slow_the_link() {
        let mut history = BTreeMap::new();
        let r = |lat_us: f64, gbit: f64| LinkReport {
            peer: "p".into(),
            latency_s: lat_us * 1e-6,
            bandwidth_bps: gbit * 1e9 / 8.0,
            measured_at_ms: 0,
            via: Some("tcp".into()),
        };
        let first = steadied(&mut history, r(5.0, 2.0));
        assert!((first.latency_s - 5e-6).abs() < 1e-12);
        let busy = steadied(&mut history, r(127.0, 0.5));
        assert!((busy.latency_s - 5e-6).abs() < 1e-12);
        assert!((busy.bandwidth_bps - 2e9 / 8.0).abs() < 1.0);
        // Once the quick probe is PROBES_KEPT probes old, a link that really slowed shows.
        for _ in 0..PROBES_KEPT {
            steadied(&mut history, r(300.0, 1.0));
        }
        let slow = steadied(&mut history, r(300.0, 1.0));
        assert!((slow.latency_s - 300e-6).abs() < 1e-12);
    }
}
