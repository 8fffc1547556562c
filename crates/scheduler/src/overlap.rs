//! Turns for an engine that pipelines them ([`Sequences::depth`] > 1, a model split into
//! pipeline stages). Running every sequence in one step drains the pipeline each time: the last
//! stage works alone on the batch's tail while the first waits for sampled tokens, and a
//! prompt's chunk runs through the stages in turn while the others wait. Here the decoding
//! sequences are dealt into `depth` groups, and prompt chunks and forced tokens run as passes
//! of one sequence: each is a turn, and up to `depth` turns are in flight, each group submitted
//! again as soon as its rows are sampled. While the last stage works on one turn the first
//! already works on the next, so a prompt arriving among live streams is computed beside their
//! steps instead of between them. Each row's arithmetic is a one-token step's whatever it is
//! batched with, and prompts run in the chunks [`next_chunk`] gives, so the tokens are those of
//! one-step-at-a-time batching.

use std::collections::VecDeque;

use strata_engine::{EngineError, PREFILL_CHUNK, Sequences, SlotId};
use strata_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use super::{Job, LIVE_CHUNK, Seq, admit, fail_all, masks, need, next_chunk};
use crate::metrics::Metrics;
use strata_engine::speculate::SharedAnswers;

/// Whether the live sequences give a pipeline two or more turns to overlap: sequences
/// decoding, and sequences with a pass to run.
pub(super) fn worth(active: &[Seq]) -> bool {
    active
        .iter()
        .filter(|s| s.decoding() || needs_pass(s))
        .count()
        > 1
}

/// Whether a sequence has tokens to run in a pass of its own: prompt tokens not yet in the
/// engine, or tokens its grammar forced.
fn needs_pass(s: &Seq) -> bool {
    s.prefilled < s.job.prompt.len() || !s.forced.is_empty()
}

/// A turn waiting to be submitted.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Turn {
    /// A decode step of a group.
    Group(usize),
    /// A pass through the oldest sequence that needs one (chosen when submitted).
    Pass,
}

/// A turn in flight.
#[derive(Clone, Copy, Debug)]
enum Flying {
    /// A decode step of the group, whose members are as they were when it was submitted.
    Group(usize),
    /// A pass through `active[seq]`, whose row is sampled when `sample` (the prompt's last
    /// chunk, or forced tokens).
    Pass { seq: usize, sample: bool },
}

/// Where a group is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    /// Empty, out of the rotation.
    Idle,
    /// Waiting in the queue of turns.
    Ready,
    /// In flight: its members may not change until it is collected.
    Flying,
}

/// The turns of one [`run`], and what each live sequence takes part in (by index into
/// `active`, which only grows while it runs: sequences that end are marked gone and removed at
/// the end).
struct Turns {
    depth: usize,
    groups: Vec<Vec<usize>>,
    place: Vec<Place>,
    ready: VecDeque<Turn>,
    flight: VecDeque<Flying>,
    /// Pass turns waiting or in flight.
    passes: usize,
    grouped: Vec<bool>,
    in_pass: Vec<bool>,
    gone: Vec<bool>,
    /// The members of the group being collected.
    members: Vec<usize>,
    /// The step and the pass being submitted (kept between turns: nothing is allocated per
    /// turn).
    steps: Vec<(SlotId, u32)>,
    tokens: Vec<u32>,
}

impl Turns {
    /// Every decoding sequence of `active` dealt into `depth` groups.
    fn new(depth: usize, active: &[Seq]) -> Turns {
        let mut t = Turns {
            depth,
            groups: vec![Vec::new(); depth],
            place: vec![Place::Idle; depth],
            ready: VecDeque::new(),
            flight: VecDeque::new(),
            passes: 0,
            grouped: Vec::new(),
            in_pass: Vec::new(),
            gone: Vec::new(),
            members: Vec::new(),
            steps: Vec::new(),
            tokens: Vec::new(),
        };
        t.grow(active.len());
        let decoding: Vec<usize> = (0..active.len())
            .filter(|&i| active[i].decoding())
            .collect();
        let per = decoding.len().div_ceil(depth).max(1);
        for (g, chunk) in decoding.chunks(per).enumerate() {
            for &i in chunk {
                t.grouped[i] = true;
            }
            t.groups[g].extend_from_slice(chunk);
            t.place[g] = Place::Ready;
            t.ready.push_back(Turn::Group(g));
        }
        t
    }

    /// Makes room for sequences admitted since.
    fn grow(&mut self, n: usize) {
        self.grouped.resize(n, false);
        self.in_pass.resize(n, false);
        self.gone.resize(n, false);
    }

    /// Whether any group is in the rotation.
    fn decoding(&self) -> bool {
        self.place.iter().any(|&p| p != Place::Idle)
    }

    /// Queues pass turns for the sequences that need one: one at a time beside decode steps
    /// (their streams wait for each), up to `depth` while nothing decodes.
    fn add_passes(&mut self, active: &[Seq]) {
        let target = if self.decoding() { 1 } else { self.depth };
        let waiting = self.ready.iter().filter(|&&t| t == Turn::Pass).count();
        let needy = (0..active.len())
            .filter(|&i| !self.gone[i] && !self.in_pass[i] && needs_pass(&active[i]))
            .count();
        let mut queued = waiting;
        while self.passes < target && queued < needy {
            self.ready.push_back(Turn::Pass);
            self.passes += 1;
            queued += 1;
        }
    }

    /// Puts sequences that have started decoding (a prompt complete, forced tokens run) into
    /// the smallest group, once it is not in flight, bringing an idle group back into the
    /// rotation.
    fn place_joiners(&mut self, active: &[Seq]) {
        for (i, s) in active.iter().enumerate() {
            if self.gone[i] || self.grouped[i] || self.in_pass[i] || !s.decoding() {
                continue;
            }
            // The smallest group, so the pipeline's turns stay even; one in flight takes it
            // once collected.
            let Some(g) = (0..self.depth)
                .min_by_key(|&g| (self.groups[g].len(), self.place[g] == Place::Flying))
            else {
                return;
            };
            if self.place[g] == Place::Flying {
                return;
            }
            self.groups[g].push(i);
            self.grouped[i] = true;
            if self.place[g] == Place::Idle {
                self.place[g] = Place::Ready;
                self.ready.push_back(Turn::Group(g));
            }
        }
    }

    /// The sequence the next pass runs through: the oldest that needs one. Sequences whose
    /// client is gone are ended on the way.
    fn pick_pass(&mut self, batch: &mut dyn Sequences, active: &[Seq]) -> Option<usize> {
        for i in 0..active.len() {
            if self.gone[i] || self.in_pass[i] || !needs_pass(&active[i]) {
                continue;
            }
            if active[i].job.events.is_closed() {
                self.end(batch, active, i);
                continue;
            }
            return Some(i);
        }
        None
    }

    /// Ends `active[i]`: its slot is free at once (no step of it is in flight).
    fn end(&mut self, batch: &mut dyn Sequences, active: &[Seq], i: usize) {
        batch.release(active[i].slot);
        self.gone[i] = true;
        self.grouped[i] = false;
    }
}

/// Runs the live sequences' turns overlapped until none is left: decode steps of groups,
/// prompt chunks and forced tokens, admitting waiting requests as slots free up. Sequences
/// that end leave their slots (and `active`).
pub(super) fn run(
    batch: &mut dyn Sequences,
    active: &mut Vec<Seq>,
    rx: &mut mpsc::Receiver<Job>,
    tok: &Tokenizer,
    m: &Metrics,
    mask_row: &mut Vec<f32>,
    answers: &SharedAnswers,
) {
    let n_ctx = batch.n_ctx();
    let depth = batch.depth().max(1);
    let mut t = Turns::new(depth, active);
    let failed = loop {
        while batch.free_slots() > 0
            && let Ok(job) = rx.try_recv()
        {
            admit(batch, job, active, m, answers);
            t.grow(active.len());
        }
        t.add_passes(active);
        if let Err(e) = fill(batch, active, &mut t, tok, m, mask_row) {
            break Some(e);
        }
        let Some(f) = t.flight.pop_front() else {
            break None;
        };
        let logits = match batch.collect() {
            Ok(l) => l,
            Err(e) => break Some(e),
        };
        match f {
            Flying::Group(g) => {
                t.members.clear();
                t.members.append(&mut t.groups[g]);
                let vocab = logits.len() / t.members.len().max(1);
                for r in 0..t.members.len() {
                    let i = t.members[r];
                    let s = &mut active[i];
                    if !s.advance(&mut logits[r * vocab..(r + 1) * vocab], tok, n_ctx, m) {
                        // Its slot is freed below, once the row is no longer borrowed.
                        t.gone[i] = true;
                    } else if s.decoding() {
                        t.groups[g].push(i);
                    } else {
                        // Forced tokens to run first: a pass, then it joins a group again.
                        t.grouped[i] = false;
                    }
                }
                for r in 0..t.members.len() {
                    let i = t.members[r];
                    if t.gone[i] {
                        t.end(batch, active, i);
                    }
                }
                if t.groups[g].is_empty() {
                    t.place[g] = Place::Idle;
                } else {
                    t.place[g] = Place::Ready;
                    t.ready.push_back(Turn::Group(g));
                }
            }
            Flying::Pass { seq, sample } => {
                t.passes -= 1;
                t.in_pass[seq] = false;
                if !active[seq].after_pass(Ok(logits), sample, tok, n_ctx, m) {
                    t.end(batch, active, seq);
                }
                if let Some(stats) = batch.prefix_stats() {
                    m.show_prefix_cache(&stats);
                }
            }
        }
        t.place_joiners(active);
        m.active_sequences
            .set(t.gone.iter().filter(|g| !**g).count() as i64);
    };
    // Sequences that ended have freed their slots already.
    let mut i = 0;
    active.retain(|_| {
        i += 1;
        !t.gone[i - 1]
    });
    if let Some(e) = failed {
        // A rank or link failed mid-protocol: whatever was in flight is lost with it.
        fail_all(batch, active, &e);
    }
}

/// Submits turns from the queue until `depth` are in flight or none waits.
fn fill(
    batch: &mut dyn Sequences,
    active: &mut [Seq],
    t: &mut Turns,
    tok: &Tokenizer,
    m: &Metrics,
    mask_row: &mut Vec<f32>,
) -> Result<(), EngineError> {
    let n_ctx = batch.n_ctx();
    while t.flight.len() < t.depth
        && let Some(turn) = t.ready.pop_front()
    {
        match turn {
            Turn::Group(g) => {
                if t.groups[g].is_empty() {
                    t.place[g] = Place::Idle;
                    continue;
                }
                t.steps.clear();
                t.steps.extend(
                    t.groups[g]
                        .iter()
                        .map(|&i| (active[i].slot, active[i].last)),
                );
                let need = need(&*batch, active, &t.groups[g], mask_row);
                batch.submit(&t.steps, need.kind(&masks(active, &t.groups[g], &need)))?;
                t.place[g] = Place::Flying;
                t.flight.push_back(Flying::Group(g));
            }
            Turn::Pass => {
                let Some(i) = t.pick_pass(batch, active) else {
                    t.passes -= 1;
                    continue;
                };
                let s = &mut active[i];
                t.tokens.clear();
                let sample = if s.forced.is_empty() {
                    let step = if t.decoding() {
                        LIVE_CHUNK
                    } else {
                        PREFILL_CHUNK
                    };
                    let n = next_chunk(s.job.prompt.len(), s.prefilled, step);
                    t.tokens
                        .extend_from_slice(&s.job.prompt[s.prefilled..s.prefilled + n]);
                    s.prefilled += n;
                    s.prefilled == s.job.prompt.len()
                } else {
                    t.tokens.append(&mut s.forced);
                    true
                };
                match batch.submit_extend(s.slot, &t.tokens) {
                    Ok(()) => {
                        t.in_pass[i] = true;
                        t.flight.push_back(Flying::Pass { seq: i, sample });
                    }
                    // Refused before anything was sent (no room in the context): this
                    // sequence fails, the others go on.
                    Err(e @ EngineError::Slots(_)) => {
                        t.passes -= 1;
                        let _ = s.after_pass(Err(e), sample, tok, n_ctx, m);
                        t.end(batch, active, i);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::{Arc, Mutex};

    use strata_engine::{EngineError, StepKind};

    use super::super::tests::{greedy_job, tokenizer};
    use super::super::{Event, Scheduler};
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
        /// Passes (prompt chunks) submitted, and those submitted while another step was in
        /// flight.
        passes: usize,
        passes_beside: usize,
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
            512
        }
        fn free_slots(&self) -> usize {
            self.busy.iter().filter(|b| !**b).count()
        }
        fn admit(
            &mut self,
            prompt: &[u32],
            _: strata_engine::prefix::Partition,
        ) -> Result<(SlotId, usize), EngineError> {
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
            for (slot, _) in steps {
                assert!(
                    self.busy[slot.index()],
                    "a step of free slot {}",
                    slot.index()
                );
            }
            let rows = self.rows(steps);
            self.queue.push_back(rows);
            self.collected = false;
            Ok(())
        }
        fn submit_extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<(), EngineError> {
            assert!(self.queue.len() < self.depth);
            let mut seen = self.seen.lock().unwrap();
            seen.passes += 1;
            if !self.queue.is_empty() {
                seen.passes_beside += 1;
            }
            seen.most_in_flight = seen.most_in_flight.max(self.queue.len() + 1);
            drop(seen);
            assert!(
                self.busy[slot.index()],
                "a pass of free slot {}",
                slot.index()
            );
            self.lens[slot.index()] += tokens.len() - 1;
            let rows = self.rows(&[(slot, tokens[tokens.len() - 1])]);
            self.queue.push_back(rows);
            self.collected = false;
            Ok(())
        }
        fn collect(&mut self) -> Result<&mut [f32], EngineError> {
            // Slow enough that requests sent together arrive while the first still decodes.
            std::thread::sleep(std::time::Duration::from_micros(200));
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
        let jobs: Vec<(Vec<u32>, usize)> = (0..4u32)
            .map(|i| (vec![3 + i, 4], 12 + i as usize))
            .collect();
        serve_jobs(engine, &jobs)
    }

    /// Greedy streams of `(prompt, max_tokens)` through a scheduler over `engine`, sent
    /// together: each one's tokens (each runs to its length).
    fn serve_jobs(engine: Staged, jobs: &[(Vec<u32>, usize)]) -> Vec<Vec<u32>> {
        let sched = Scheduler::start(
            Box::new(engine),
            Arc::new(tokenizer()),
            8,
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let streams: Vec<_> = jobs
            .iter()
            .map(|(prompt, max)| {
                let (job, rx) = greedy_job(prompt.clone(), *max);
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
                            assert!(finish.is_length(), "{finish:?}");
                            return tokens;
                        }
                        Event::Admitted { .. } => {}
                        Event::Failed(e) | Event::Refused(e) => panic!("{e}"),
                        Event::Embedding(_) => panic!("an embedding for a generation"),
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

    /// Prompts that arrive while a stream decodes run as passes in flight beside its steps
    /// (and each other's), in the chunks one-step-at-a-time serving runs them, so every stream
    /// gets the same tokens.
    #[test]
    fn prompts_run_beside_the_decode_steps_and_give_the_same_tokens() {
        let prompt = |first: u32, n: usize| -> Vec<u32> {
            (0..n as u32)
                .map(|i| if i == 0 { first } else { 3 + i % 5 })
                .collect()
        };
        let jobs = [
            (prompt(3, 2), 300),
            (prompt(4, 40), 20),
            (prompt(5, 70), 15),
            (prompt(6, 5), 30),
            // More than the four slots: these wait for ones that free up.
            (prompt(7, 20), 3),
            (prompt(3, 33), 1),
            (prompt(4, 3), 9),
            (prompt(5, 17), 2),
        ];
        let flat = Arc::new(Mutex::new(Seen::default()));
        let want = serve_jobs(Staged::new(1, Arc::clone(&flat)), &jobs);
        for (t, (_, n)) in want.iter().zip(&jobs) {
            assert_eq!(t.len(), *n);
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let got = serve_jobs(Staged::new(2, Arc::clone(&seen)), &jobs);
        assert_eq!(got, want);
        let seen = seen.lock().unwrap();
        // The 40- and 70-token prompts run in chunks of 16 beside the first stream's steps.
        assert!(seen.passes >= 3 + 5, "{seen:?}");
        assert!(seen.passes_beside >= 3 + 5 - 1, "{seen:?}");
        assert_eq!(seen.most_in_flight, 2, "{seen:?}");
    }
}
