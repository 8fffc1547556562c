//! The planner's prediction of each measured level, to print beside the measurement.

use super::*;

/// One level's work as the clients made it: `requests` in all from `clients` at once, each
/// with a `prompt` of that many tokens (on average) and `generated` tokens back.
pub(super) struct LevelWork {
    pub(super) clients: usize,
    pub(super) requests: usize,
    pub(super) prompt: f64,
    pub(super) generated: f64,
}

impl LevelWork {
    /// Aggregate and per-stream tok/s of the level, from the instance's decode rate with every
    /// client live (`steady` tok/s) and the seconds one prompt takes prefilled in whole blocks
    /// (`whole`) and in live chunks (`live`), as the scheduler runs them: the prompts that
    /// arrive together before any stream decodes fill whole blocks (as many as one block's
    /// round holds); every later one arrives among live streams and runs a `LIVE_CHUNK` a
    /// round. A stream's decoding waits for the other clients' prompts (its own came before
    /// its first token). A pipeline runs those chunks as passes beside the groups' steps, but
    /// crediting that overlap (a pass costing the streams `live / stages`) puts the 4-client
    /// predictions 15-30 points further off in measurement, so its prompts are priced like
    /// everyone's.
    pub(super) fn predict(&self, steady: f64, whole: f64, live: f64) -> (f64, f64) {
        let c = self.clients.max(1);
        let first = if c == 1 {
            // One client's requests come one after another: each prompt runs alone.
            self.requests
        } else {
            let per_round = (strata_cluster::PREFILL_CHUNK as f64 / self.prompt.max(1.0)) as usize;
            per_round.clamp(1, c).min(self.requests)
        };
        let step = c as f64 / steady;
        let prompts = first as f64 * whole + (self.requests - first) as f64 * live;
        let rounds = self.requests as f64 / c as f64;
        let aggregate =
            self.requests as f64 * self.generated / (prompts + rounds * self.generated * step);
        let span = self.generated * step + (c - 1) as f64 * live;
        (aggregate, self.generated / span)
    }
}

/// The planner's predictions for one instance on the cluster as it stands.
pub(super) struct Predictor {
    pub(super) facts: strata_cluster::ModelFacts,
    pub(super) status: Status,
    pub(super) placement: strata_cluster::Placement,
    pub(super) context: usize,
}

impl Predictor {
    pub(super) fn estimate(
        &self,
        prompt: usize,
        streams: usize,
    ) -> Option<strata_cluster::Estimate> {
        strata_cluster::estimate(
            &self.facts,
            &self.status.topology.nodes,
            &self.status.topology.links,
            &self.placement,
            &Workload {
                context: self.context,
                prompt,
                streams,
            },
        )
    }

    /// The slowest measured link among the instance's nodes.
    pub(super) fn link(&self) -> Option<(f64, f64)> {
        self.status
            .topology
            .links
            .iter()
            .filter(|l| self.placement.nodes.contains(&l.a) && self.placement.nodes.contains(&l.b))
            .map(|l| (l.latency * 1e6, l.bandwidth * 8.0 / 1e9))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }
}

pub(super) fn percent_error(measured: f64, predicted: Option<f64>) -> String {
    match predicted {
        Some(p) if measured > 0.0 => format!("{:+.0} %", (p - measured) / measured * 100.0),
        _ => "-".into(),
    }
}
