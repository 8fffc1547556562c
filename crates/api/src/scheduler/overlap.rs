//! Decode steps for an engine that pipelines them ([`Sequences::depth`] > 1, a model split
//! into pipeline stages). Stepping every sequence together drains the pipeline at each step:
//! the last stage works alone on the batch's tail while the first waits for sampled tokens.
//! Here the decoding sequences are dealt into `depth` groups that step in turn, each submitted
//! again as soon as its rows are sampled, so while the last stage works on one group the first
//! already works on the next group's following step. Each row's arithmetic is a one-token
//! step's whatever it is batched with, so the tokens are the same as with one batched step.

use std::collections::VecDeque;

use strata_engine::{Sequences, SlotId};
use strata_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use super::{Job, Seq, fail_all, masks, need};
use crate::metrics::Metrics;

/// Steps the decoding sequences of `active` in overlapped groups until the round has other
/// work, then collects what is in flight and returns. Other work: a request waiting for a free
/// slot, a prompt still to prefill, forced tokens to run, a sequence that ended (the groups
/// are dealt again next round), a client gone. Sequences that end leave their slots.
pub(super) fn decode(
    batch: &mut dyn Sequences,
    active: &mut Vec<Seq>,
    rx: &mpsc::Receiver<Job>,
    tok: &Tokenizer,
    m: &Metrics,
    mask_row: &mut Vec<f32>,
) {
    let n_ctx = batch.n_ctx();
    let decoding: Vec<usize> = (0..active.len())
        .filter(|&i| active[i].decoding())
        .collect();
    if decoding.is_empty() {
        return;
    }
    let depth = batch.depth().clamp(1, decoding.len());
    let groups: Vec<Vec<usize>> = decoding
        .chunks(decoding.len().div_ceil(depth))
        .map(<[usize]>::to_vec)
        .collect();
    let mut steps: Vec<(SlotId, u32)> = Vec::new();
    let mut flight: VecDeque<usize> = VecDeque::new();
    let mut ended: Vec<usize> = Vec::new();
    let mut draining = false;
    let mut failed = None;
    for (g, group) in groups.iter().enumerate() {
        if let Err(e) = submit(batch, active, group, &mut steps, mask_row) {
            failed = Some(e);
            break;
        }
        flight.push_back(g);
    }
    while failed.is_none()
        && let Some(g) = flight.pop_front()
    {
        let logits = match batch.collect() {
            Ok(l) => l,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        let group = &groups[g];
        let vocab = logits.len() / group.len();
        for (r, &i) in group.iter().enumerate() {
            let s = &mut active[i];
            if !s.advance(&mut logits[r * vocab..(r + 1) * vocab], tok, n_ctx, m) {
                ended.push(i);
                draining = true;
            } else if !s.decoding() {
                draining = true;
            }
        }
        draining = draining || other_work(&*batch, active, rx);
        if !draining {
            if let Err(e) = submit(batch, active, group, &mut steps, mask_row) {
                failed = Some(e);
                break;
            }
            flight.push_back(g);
        }
    }
    if let Some(e) = failed {
        // A rank or link failed mid-protocol: whatever was in flight is lost with it.
        fail_all(batch, active, &e);
        return;
    }
    ended.sort_unstable();
    for &i in ended.iter().rev() {
        let s = active.remove(i);
        batch.release(s.slot);
    }
}

/// Submits one step of the sequences `group` (indices into `active`), asking for what their
/// samplers need.
fn submit(
    batch: &mut dyn Sequences,
    active: &mut [Seq],
    group: &[usize],
    steps: &mut Vec<(SlotId, u32)>,
    mask_row: &mut Vec<f32>,
) -> Result<(), strata_engine::EngineError> {
    steps.clear();
    steps.extend(group.iter().map(|&i| (active[i].slot, active[i].last)));
    let need = need(&*batch, active, group, mask_row);
    batch.submit(steps, need.kind(&masks(active, group, &need)))
}

/// Whether the round has work besides decoding: a request that a free slot could take, a
/// prompt still being prefilled, or a client gone (its slot is freed between rounds).
fn other_work(batch: &dyn Sequences, active: &[Seq], rx: &mpsc::Receiver<Job>) -> bool {
    (batch.free_slots() > 0 && !rx.is_empty())
        || active
            .iter()
            .any(|s| s.prefilled < s.job.prompt.len() || s.job.events.is_closed())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::{Arc, Mutex};

    use strata_engine::{EngineError, StepKind};

    use super::super::tests::{greedy_job, tokenizer};
    use super::super::{Event, Finish, Scheduler};
    use super::*;

    /// What the staged engine saw.
    #[derive(Debug, Default)]
    struct Seen {
        /// Whole-batch steps, and steps submitted.
        steps: usize,
        submits: usize,
        /// Submits made after a collect while another step was still in flight: the next
        /// step of one group starting while a stage works on the other's.
        overlapped: usize,
        most_in_flight: usize,
    }

    /// An engine with pipeline stages, `depth` of them, over 4 slots and the test tokenizer's
    /// 8 tokens. A row's best token depends only on the sequence (its prompt's first token)
    /// and the position, so outputs do not depend on how steps are grouped.
    struct Staged {
        depth: usize,
        first: [u32; 4],
        lens: [usize; 4],
        busy: [bool; 4],
        queue: VecDeque<Vec<f32>>,
        out: Vec<f32>,
        collected: bool,
        seen: Arc<Mutex<Seen>>,
    }

    impl Staged {
        fn new(depth: usize, seen: Arc<Mutex<Seen>>) -> Staged {
            Staged {
                depth,
                first: [0; 4],
                lens: [0; 4],
                busy: [false; 4],
                queue: VecDeque::new(),
                out: Vec::new(),
                collected: false,
                seen,
            }
        }

        /// The rows of a step of `steps`, each slot moved on a position.
        fn rows(&mut self, steps: &[(SlotId, u32)]) -> Vec<f32> {
            let mut rows = vec![0.0; steps.len() * 8];
            for (r, &(slot, _)) in steps.iter().enumerate() {
                let s = slot.index();
                self.lens[s] += 1;
                let best = 3 + (self.first[s] as usize + self.lens[s]) % 5;
                rows[r * 8 + best] = 1.0;
            }
            rows
        }
    }

    impl Sequences for Staged {
        fn n_ctx(&self) -> usize {
            64
        }
        fn free_slots(&self) -> usize {
            self.busy.iter().filter(|b| !**b).count()
        }
        fn admit(&mut self, prompt: &[u32]) -> Result<(SlotId, usize), EngineError> {
            assert!(self.queue.is_empty(), "admitted with steps in flight");
            let s = self.busy.iter().position(|b| !*b).unwrap();
            self.busy[s] = true;
            self.first[s] = prompt[0];
            self.lens[s] = 0;
            Ok((SlotId::from_index(s), 0))
        }
        fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], EngineError> {
            assert!(self.queue.is_empty(), "stepped with steps in flight");
            self.seen.lock().unwrap().steps += 1;
            self.out = self.rows(steps);
            Ok(&mut self.out)
        }
        fn depth(&self) -> usize {
            self.depth
        }
        fn submit(
            &mut self,
            steps: &[(SlotId, u32)],
            kind: StepKind<'_>,
        ) -> Result<(), EngineError> {
            assert!(
                matches!(kind, StepKind::Top(1)),
                "greedy rows need their best only"
            );
            assert!(self.queue.len() < self.depth);
            let mut seen = self.seen.lock().unwrap();
            seen.submits += 1;
            if self.collected && !self.queue.is_empty() {
                seen.overlapped += 1;
            }
            seen.most_in_flight = seen.most_in_flight.max(self.queue.len() + 1);
            drop(seen);
            let rows = self.rows(steps);
            self.queue.push_back(rows);
            self.collected = false;
            Ok(())
        }
        fn collect(&mut self) -> Result<&mut [f32], EngineError> {
            self.out = self.queue.pop_front().unwrap();
            self.collected = true;
            Ok(&mut self.out)
        }
        fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], EngineError> {
            assert!(self.queue.is_empty(), "extended with steps in flight");
            self.lens[slot.index()] += tokens.len() - 1;
            let steps = [(slot, tokens[tokens.len() - 1])];
            self.out = self.rows(&steps);
            Ok(&mut self.out)
        }
        fn release(&mut self, slot: SlotId) {
            self.busy[slot.index()] = false;
        }
    }

    /// Four greedy streams through a scheduler over `engine`: each one's tokens.
    fn serve(engine: Staged) -> Vec<Vec<u32>> {
        let sched = Scheduler::start(
            Box::new(engine),
            Arc::new(tokenizer()),
            8,
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let streams: Vec<_> = (0..4u32)
            .map(|i| {
                let (job, rx) = greedy_job(vec![3 + i, 4], 12 + i as usize);
                sched.submit(job).unwrap();
                rx
            })
            .collect();
        streams
            .into_iter()
            .map(|mut rx| {
                let mut tokens = Vec::new();
                loop {
                    match rx.blocking_recv().unwrap() {
                        Event::Token { id, .. } => tokens.push(id),
                        Event::Done { finish, .. } => {
                            assert_eq!(finish, Finish::Length);
                            return tokens;
                        }
                        Event::Admitted { .. } => {}
                        Event::Failed(e) => panic!("{e}"),
                    }
                }
            })
            .collect()
    }

    /// On a two-stage engine the scheduler keeps two groups' steps in flight across steps
    /// (each group submitted again while the other's is in flight), never a whole-batch step
    /// while two or more sequences decode, and every stream gets the tokens it gets from
    /// one-step-at-a-time batching.
    #[test]
    fn a_pipelined_engine_gets_overlapping_steps_and_the_same_tokens() {
        let flat = Arc::new(Mutex::new(Seen::default()));
        let want = serve(Staged::new(1, Arc::clone(&flat)));
        assert_eq!(flat.lock().unwrap().submits, 0);
        for (i, t) in want.iter().enumerate() {
            assert_eq!(t.len(), 12 + i);
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let got = serve(Staged::new(2, Arc::clone(&seen)));
        assert_eq!(got, want);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.most_in_flight, 2, "{seen:?}");
        // Once all four decode, every step but a group's last (and the drains when one
        // ends or another arrives) overlaps: well over half of them.
        assert!(seen.overlapped * 2 > seen.submits, "{seen:?}");
    }
}
