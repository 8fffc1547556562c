//! Rank 0 waits for its workers' models to arrive before it opens the data plane.
//!
//! A worker's node learns where rank 0 listens only once rank 0 has its own shard (so the
//! ranges they share come from rank 0, not the hub a second time); it then fetches or copies
//! its shard, which for a large model takes minutes, and only then starts the worker process
//! that joins. The data plane's join deadline is meant for processes that are already running,
//! so rank 0 watches the workers' published states instead and joins them once every worker
//! runs. What ends the wait early: a worker that failed (its reason is rank 0's), a node that
//! does not take up its rank, and an arrival that makes no progress for [`STALL`].

use std::time::{Duration, Instant};

use super::*;

/// How long a worker's node may take to take up its rank (the table reaches every node within
/// a second or two; a node that has not started after this is not going to).
const TAKE_UP: Duration = Duration::from_secs(60);

/// How long a worker's arrival may show no progress (no new step, no new byte) before rank 0
/// gives up on it. Hashing a large file or waiting for a hub's retry shows progress well
/// within this.
const STALL: Duration = Duration::from_secs(600);

/// Where each worker rank stands, as its node publishes it.
#[derive(Debug, Clone, PartialEq)]
enum Worker {
    /// Its node has not taken up the rank yet.
    Absent,
    /// Still fetching or copying its model; what the node reports of it.
    Arriving(Option<transfer::Arrival>),
    /// Its worker process runs.
    Running,
    /// It failed, for this reason.
    Failed(String),
}

/// Watches the workers of one instance across polls.
struct Watch {
    started: Instant,
    /// Per worker rank (1..): the last arrival seen and when it last changed.
    seen: Vec<(Option<transfer::Arrival>, Instant)>,
}

/// What a poll found.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Every worker runs: open the data plane.
    Ready,
    /// Keep waiting; the words say for what (shown as rank 0's own arrival).
    Waiting(String),
    /// Give up, for this reason.
    Failed(String),
}

impl Watch {
    fn new(workers: usize, now: Instant) -> Watch {
        Watch {
            started: now,
            seen: vec![(None, now); workers],
        }
    }

    /// Judges the workers' states (`workers[i]` is rank `i + 1`'s, on node `names[i]`) at `now`.
    fn judge(&mut self, workers: &[Worker], names: &[String], now: Instant) -> Verdict {
        let mut waiting = None;
        for (i, w) in workers.iter().enumerate() {
            let (rank, node) = (i + 1, &names[i]);
            match w {
                Worker::Running => {}
                Worker::Failed(why) => {
                    return Verdict::Failed(format!("rank {rank} on node {node}: {why}"));
                }
                Worker::Absent => {
                    if now.duration_since(self.started) > TAKE_UP {
                        return Verdict::Failed(format!(
                            "node {node} did not take up rank {rank} within {} s",
                            TAKE_UP.as_secs()
                        ));
                    }
                    waiting.get_or_insert_with(|| {
                        format!("waiting for node {node} to start rank {rank}")
                    });
                }
                Worker::Arriving(arrival) => {
                    let Some(seen) = self.seen.get_mut(i) else {
                        continue;
                    };
                    if seen.0 != *arrival {
                        *seen = (arrival.clone(), now);
                    } else if now.duration_since(seen.1) > STALL {
                        let step = arrival.as_ref().map_or("starting", |a| a.step.as_str());
                        return Verdict::Failed(format!(
                            "rank {rank} on node {node} made no progress for {} s ({step})",
                            STALL.as_secs()
                        ));
                    }
                    waiting.get_or_insert_with(|| match arrival {
                        Some(a) if a.total > 0 => format!(
                            "waiting for rank {rank} on node {node}: {} ({} of {} MB)",
                            a.step,
                            a.done >> 20,
                            a.total >> 20
                        ),
                        Some(a) => format!("waiting for rank {rank} on node {node}: {}", a.step),
                        None => format!("waiting for rank {rank} on node {node}"),
                    });
                }
            }
        }
        waiting.map_or(Verdict::Ready, Verdict::Waiting)
    }
}

/// The worker ranks' states of instance `spec` placed as `p`, from the cluster's snapshot.
fn workers(snap: &Snapshot, spec: &InstanceSpec, p: &placement::Placement) -> Vec<Worker> {
    let hosted = hosted_by(snap);
    p.nodes
        .iter()
        .skip(1)
        .map(|node| {
            let h = hosted.get(node).and_then(|list| {
                list.iter()
                    .find(|h| h.instance == spec.id && h.epoch == spec.epoch)
            });
            match h {
                None => Worker::Absent,
                Some(h) if h.status == "ready" => Worker::Running,
                Some(h) if h.status.starts_with("failed") => Worker::Failed(
                    h.status
                        .strip_prefix("failed: ")
                        .unwrap_or(&h.status)
                        .to_string(),
                ),
                Some(h) => Worker::Arriving(h.arrival.clone()),
            }
        })
        .collect()
}

/// Blocks until every worker of `spec` runs (or one cannot), showing what it waits for as
/// rank 0's arrival. Gives up at once if this node stops hosting the instance meanwhile.
pub(super) fn wait_for_workers(
    shared: &Shared,
    spec: &InstanceSpec,
    p: &placement::Placement,
    arrival: &transfer::ArrivalSlot,
) -> Result<()> {
    let key = (spec.id.clone(), spec.epoch);
    let names = {
        let snap = shared.control.snapshot();
        let names = names(&snap);
        p.nodes
            .iter()
            .skip(1)
            .map(|id| names.get(id).cloned().unwrap_or_else(|| id.clone()))
            .collect::<Vec<_>>()
    };
    let mut watch = Watch::new(names.len(), Instant::now());
    loop {
        if !shared.state().hosted.contains_key(&key) {
            return Err(Error::Instance(
                "the instance was unloaded or placed again while its workers arrived".into(),
            ));
        }
        let snap = shared.control.snapshot();
        match watch.judge(&workers(&snap, spec, p), &names, Instant::now()) {
            Verdict::Ready => {
                transfer::update_arrival(Some(arrival), |_| true);
                return Ok(());
            }
            Verdict::Failed(why) => return Err(Error::Instance(why)),
            Verdict::Waiting(what) => transfer::update_arrival(Some(arrival), |now| {
                (now.step, now.done, now.total) = (what, 0, 0);
                false
            }),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arriving(done: u64) -> Worker {
        Worker::Arriving(Some(transfer::Arrival {
            step: "fetching this node's shard of m.gguf".into(),
            done,
            total: 100 << 20,
        }))
    }

    fn names() -> Vec<String> {
        vec!["b".into(), "c".into()]
    }

    #[test]
    fn ready_only_when_every_worker_runs() {
        let t = Instant::now();
        let mut w = Watch::new(2, t);
        let v = w.judge(&[Worker::Running, arriving(5 << 20)], &names(), t);
        assert_eq!(
            v,
            Verdict::Waiting(
                "waiting for rank 2 on node c: fetching this node's shard of m.gguf (5 of 100 MB)"
                    .into()
            )
        );
        assert_eq!(
            w.judge(&[Worker::Running, Worker::Running], &names(), t),
            Verdict::Ready
        );
    }

    #[test]
    fn a_long_download_that_progresses_is_waited_for() {
        let t = Instant::now();
        let mut w = Watch::new(1, t);
        // An hour of arrival, with progress every five minutes: still waiting.
        for minute in (0..60).step_by(5) {
            let now = t + Duration::from_secs(minute * 60);
            let v = w.judge(&[arriving(minute << 20)], &names(), now);
            assert!(matches!(v, Verdict::Waiting(_)), "{v:?} at minute {minute}");
        }
    }

    #[test]
    fn a_stalled_arrival_fails_naming_the_rank_and_its_step() {
        let t = Instant::now();
        let mut w = Watch::new(1, t);
        assert!(matches!(
            w.judge(&[arriving(7)], &names(), t),
            Verdict::Waiting(_)
        ));
        let still = t + STALL - Duration::from_secs(1);
        assert!(matches!(
            w.judge(&[arriving(7)], &names(), still),
            Verdict::Waiting(_)
        ));
        let v = w.judge(&[arriving(7)], &names(), t + STALL + Duration::from_secs(1));
        assert_eq!(
            v,
            Verdict::Failed(
                "rank 1 on node b made no progress for 600 s (fetching this node's shard of m.gguf)"
                    .into()
            )
        );
    }

    #[test]
    fn a_failed_worker_or_a_node_that_never_starts_ends_the_wait() {
        let t = Instant::now();
        let mut w = Watch::new(2, t);
        let v = w.judge(
            &[Worker::Running, Worker::Failed("no space left".into())],
            &names(),
            t,
        );
        assert_eq!(v, Verdict::Failed("rank 2 on node c: no space left".into()));
        let mut w = Watch::new(2, t);
        assert_eq!(
            w.judge(&[Worker::Absent, Worker::Running], &names(), t),
            Verdict::Waiting("waiting for node b to start rank 1".into())
        );
        let v = w.judge(
            &[Worker::Absent, Worker::Running],
            &names(),
            t + TAKE_UP + Duration::from_secs(1),
        );
        assert_eq!(
            v,
            Verdict::Failed("node b did not take up rank 1 within 60 s".into())
        );
    }
}
