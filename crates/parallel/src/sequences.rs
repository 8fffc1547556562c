//! Rank 0 of a sharded model as a [`Sequences`] engine: the API scheduler's continuous batching
//! and `strata run`'s one sequence both drive it, as they drive the one-process [`Batch`]. Every
//! live sequence goes through the ranks in one batched step, split into one micro-batch per
//! pipeline stage so the stages work at once. It also times prefill and decode passes for
//! `strata-bench scaling`.
//!
//! [`Batch`]: strata_engine::Batch

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use strata_engine::prefix::{BLOCK, Partition, PrefixStats, Remote, SlotBlocks};
use strata_engine::{EngineError, SamplingParams, Sequences, SlotId, StepKind};

use crate::rank::Rank;
use crate::{Error, Result};

/// Prompt tokens per pass when timing a prefill: llama-bench's micro-batch.
const MEASURED_PREFILL: usize = 512;

/// Communication figures of a sequence's decoding, seen from rank 0.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CommFigures {
    /// Messages rank 0 sent while decoding.
    pub messages: u64,
    /// Bytes rank 0 sent while decoding.
    pub bytes: u64,
    /// Rank 0's time inside exchanges per decoded token (moving data and waiting for peers), in
    /// microseconds.
    pub wait_us_per_token: f64,
}

/// A step in flight through the ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flight {
    /// A batched decode step of this many rows.
    Rows(usize),
    /// A pass of several tokens through one slot (one row comes back).
    Pass,
}

/// Rank 0 of a sharded model as a sequence engine. The last pipeline stage returns every logit
/// of its vocabulary shard (sampling settings that keep all candidates), so the scheduler sees
/// the same full rows as with one process and samples, constrains and scores them the same way.
#[derive(Debug)]
pub struct ShardedBatch {
    rank: Rank,
    vocab: usize,
    busy: Vec<bool>,
    lens: Vec<usize>,
    logits: Vec<f32>,
    cands: Vec<(u32, f32)>,
    /// The step being submitted as (slot, position, token), and the candidates per row of
    /// the one being collected.
    batch: Vec<(usize, usize, u32)>,
    rows: Vec<Vec<(u32, f32)>>,
    /// The steps in flight (submitted, not collected), oldest first.
    pending: VecDeque<Flight>,
    /// The logits of steps taken from the ranks before they were collected (an embedding came
    /// while they were in flight), oldest first: the next collects give them back.
    ready: VecDeque<Vec<f32>>,
    /// Rank 0's communication counters at the last prefill pass, and steps since.
    mark: strata_net::CommStats,
    steps: u64,
    /// The prefix cache's index and what each slot holds, when on (the blocks themselves are
    /// on the ranks, each its slice).
    prefix: Option<SlotBlocks<Remote>>,
}

impl ShardedBatch {
    /// Wraps rank 0 of an instance whose vocabulary has `vocab` entries.
    pub fn new(rank: Rank, vocab: usize) -> Result<ShardedBatch> {
        if rank.rank() != 0 {
            return Err(Error::Protocol("only rank 0 drives generation".into()));
        }
        let slots = rank.max_seqs();
        let mark = rank.comm().stats();
        Ok(ShardedBatch {
            rank,
            vocab,
            busy: vec![false; slots],
            lens: vec![0; slots],
            logits: Vec::new(),
            cands: Vec::new(),
            batch: Vec::new(),
            rows: Vec::new(),
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            mark,
            steps: 0,
            prefix: None,
        })
    }

    /// Turns on the prefix cache with `budget` bytes for blocks (counted over all ranks, as
    /// one process would hold them; 0 leaves it off): every rank keeps its slice of each
    /// block, and a prompt whose start is cached has those positions restored on every rank
    /// (read in place, shared by concurrent sequences) instead of computed.
    pub fn with_prefix_cache(mut self, budget: usize) -> ShardedBatch {
        let c = self.rank.model().config();
        let block_bytes = c.n_layer * c.n_head_kv * BLOCK * (c.head_dim + c.cache_v_dim()) * 2;
        let slots = self.busy.len();
        self.prefix = (budget > 0).then(|| SlotBlocks::new(budget, block_bytes, slots));
        self
    }

    /// Records a prefill pass of `tokens` at `at` in `slot` with the prefix cache: the blocks
    /// it completes are kept on every rank, and blocks evicted to make room dropped on every
    /// rank.
    fn keep_blocks(&mut self, slot: usize, at: usize, tokens: &[u32]) -> crate::Result<()> {
        let Some(prefix) = self.prefix.as_mut() else {
            return Ok(());
        };
        let bytes = prefix.block_bytes();
        let new = prefix.passed(slot, at, tokens, |_| Some(Remote(bytes)));
        let gone = prefix.cache_mut().take_gone();
        self.rank.forget_blocks(&gone)?;
        for (start, id) in new {
            self.rank.save_block(slot, start, id)?;
        }
        Ok(())
    }

    /// Rank 0.
    pub fn rank(&self) -> &Rank {
        &self.rank
    }

    /// What rank 0 sent and waited for in the steps since the last prefill pass (for a single
    /// sequence: its decoding).
    pub fn last_comm(&self) -> CommFigures {
        let c = self.rank.comm().stats();
        CommFigures {
            messages: c.messages - self.mark.messages,
            bytes: c.bytes - self.mark.bytes,
            wait_us_per_token: if self.steps > 0 {
                (c.wait - self.mark.wait).as_secs_f64() * 1e6 / self.steps as f64
            } else {
                0.0
            },
        }
    }

    /// Settings under which the ranks return raw logits for the whole vocabulary.
    fn raw() -> SamplingParams {
        // The defaults (no top-k, top-p, min-p or penalties) with sampling on: every logit of
        // the shard comes back, raw.
        SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        }
    }

    /// Takes the candidates of the oldest step and writes them as row `row` of the logits.
    fn collect_row(&mut self, row: usize) -> std::result::Result<(), EngineError> {
        self.rank.collect(&mut self.cands)?;
        fill_row(
            &mut self.logits[row * self.vocab..(row + 1) * self.vocab],
            &self.cands,
        );
        Ok(())
    }

    /// Starts `tokens` through `slot` from position `at` in prefill chunks; the logits that
    /// follow the last come back to [`ShardedBatch::collect_row`].
    fn submit_chunks(
        &mut self,
        slot: usize,
        at: usize,
        tokens: &[u32],
    ) -> std::result::Result<(), EngineError> {
        let raw = Self::raw();
        let chunks = tokens.len().div_ceil(BLOCK);
        for (i, chunk) in tokens.chunks(BLOCK).enumerate() {
            self.rank
                .submit(slot, at + i * BLOCK, chunk, i + 1 == chunks, &raw, &[])?;
            self.keep_blocks(slot, at + i * BLOCK, chunk)?;
        }
        self.logits.resize(self.vocab.max(self.logits.len()), 0.0);
        Ok(())
    }

    /// Fails unless `slot` holds a sequence with room for `tokens` more.
    fn check_room(&self, slot: usize, tokens: &[u32]) -> std::result::Result<(), EngineError> {
        if !self.busy.get(slot).copied().unwrap_or(false) {
            return Err(EngineError::Slots(format!("slot {slot} holds no sequence")));
        }
        if tokens.is_empty() || self.lens[slot] + tokens.len() >= self.n_ctx() {
            return Err(EngineError::Slots(format!(
                "cannot append {} tokens to a sequence of {} in a context of {}",
                tokens.len(),
                self.lens[slot],
                self.n_ctx()
            )));
        }
        Ok(())
    }

    /// Fails when as many steps are in flight as the pipeline has stages.
    fn check_depth(&self) -> std::result::Result<(), EngineError> {
        if self.pending.len() >= self.rank.stages() {
            return Err(EngineError::Slots(format!(
                "{} steps are in flight already, as many as the pipeline has stages",
                self.pending.len()
            )));
        }
        Ok(())
    }

    /// Sampling settings under which the ranks give back what a step of `kind` needs.
    fn params_of(kind: StepKind<'_>) -> SamplingParams {
        match kind {
            // Each rank's `k` greatest raw logits per row, ordered and tied as the sampler's
            // top-k orders them.
            StepKind::Top(k) => SamplingParams {
                temperature: 1.0,
                top_k: k.max(1),
                ..SamplingParams::default()
            },
            StepKind::Full | StepKind::Masked(_) => Self::raw(),
        }
    }

    /// Fails unless every listed slot holds a sequence.
    fn check_busy(&self, steps: &[(SlotId, u32)]) -> std::result::Result<(), EngineError> {
        for &(slot, _) in steps {
            let slot = slot.index();
            if !self.busy.get(slot).copied().unwrap_or(false) {
                return Err(EngineError::Slots(format!("slot {slot} holds no sequence")));
            }
        }
        Ok(())
    }

    /// Fails while steps are in flight (submitted, not collected): the ranks answer in order,
    /// so nothing else may go through them until those are collected.
    fn check_idle(&self) -> std::result::Result<(), EngineError> {
        let n = self.pending.len() + self.ready.len();
        if n == 0 {
            Ok(())
        } else {
            Err(EngineError::Slots(format!(
                "{n} step(s) are in flight: collect them first"
            )))
        }
    }

    /// Takes the oldest step in flight from the ranks into the logits; returns how many values
    /// its rows hold.
    fn collect_flight(&mut self) -> std::result::Result<usize, EngineError> {
        if self.pending.front() == Some(&Flight::Pass) {
            self.pending.pop_front();
            if let Err(e) = self.collect_row(0) {
                self.pending.clear();
                return Err(e);
            }
            return Ok(self.vocab);
        }
        Ok(self.collect_rows(0)? * self.vocab)
    }

    /// Starts one batched step of the listed sequences (checked busy) through the ranks, each
    /// rank to give back the candidates `params` keep of its vocabulary slice.
    fn submit_rows(
        &mut self,
        steps: &[(SlotId, u32)],
        params: &SamplingParams,
        masks: &[Option<&[u32]>],
    ) -> std::result::Result<(), EngineError> {
        self.batch.clear();
        self.batch.extend(
            steps
                .iter()
                .map(|&(slot, token)| (slot.index(), self.lens[slot.index()], token)),
        );
        if let Err(e) = self.rank.submit_batch_masked(&self.batch, params, masks) {
            // The ranks are out of step: what was in flight is lost, and later calls should
            // meet the ranks' own failure, not a queue that never empties.
            self.pending.clear();
            return Err(e.into());
        }
        for &(slot, _) in steps {
            self.lens[slot.index()] += 1;
        }
        self.pending.push_back(Flight::Rows(steps.len()));
        Ok(())
    }

    /// Takes the rows of the oldest step in flight into the logits from row `at` on; returns
    /// how many.
    fn collect_rows(&mut self, at: usize) -> std::result::Result<usize, EngineError> {
        let n = match self.pending.pop_front() {
            Some(Flight::Rows(n)) => n,
            Some(Flight::Pass) => {
                self.pending.clear();
                return Err(EngineError::Slots(
                    "a pass was in flight where a step was expected".into(),
                ));
            }
            None => return Err(EngineError::Slots("no step was submitted".into())),
        };
        self.logits
            .resize(((at + n) * self.vocab).max(self.logits.len()), 0.0);
        if let Err(e) = self.rank.collect_batch(n, &mut self.rows) {
            self.pending.clear();
            return Err(e.into());
        }
        for (i, row) in self.rows[..n].iter().enumerate() {
            fill_row(
                &mut self.logits[(at + i) * self.vocab..(at + i + 1) * self.vocab],
                row,
            );
        }
        Ok(n)
    }

    /// One batched step of every listed sequence, each rank giving back the candidates
    /// `params` keep of its vocabulary slice.
    fn step_with(
        &mut self,
        steps: &[(SlotId, u32)],
        params: &SamplingParams,
        masks: &[Option<&[u32]>],
    ) -> std::result::Result<&mut [f32], EngineError> {
        self.check_idle()?;
        self.check_busy(steps)?;
        // Every sequence in one batched step; a pipeline gets one micro-batch per stage, each
        // submitted before the first is collected, so stage 2 works on the first while stage 1
        // works on the second. Each row's arithmetic is a one-token step's, so a sequence's
        // tokens do not depend on what it is batched with.
        let per = steps
            .len()
            .div_ceil(self.rank.stages().clamp(1, steps.len().max(1)));
        for (i, micro) in steps.chunks(per.max(1)).enumerate() {
            let masks = masks
                .get(i * per..)
                .map_or(&[][..], |m| &m[..m.len().min(per)]);
            self.submit_rows(micro, params, masks)?;
        }
        let mut at = 0;
        while at < steps.len() {
            at += self.collect_rows(at)?;
        }
        self.steps += 1;
        Ok(&mut self.logits[..steps.len() * self.vocab])
    }

    /// Times one prefill of `prompt` (llama-bench's `pp`).
    pub fn time_prefill(&mut self, prompt: &[u32]) -> Result<Duration> {
        if prompt.is_empty() || prompt.len() >= self.rank.n_ctx() {
            return Err(Error::Protocol(format!(
                "cannot time a prefill of {} tokens in a context of {}",
                prompt.len(),
                self.rank.n_ctx()
            )));
        }
        let params = SamplingParams::default();
        let start = Instant::now();
        let chunks = prompt.len().div_ceil(MEASURED_PREFILL);
        for (i, chunk) in prompt.chunks(MEASURED_PREFILL).enumerate() {
            self.rank.submit(
                0,
                i * MEASURED_PREFILL,
                chunk,
                i + 1 == chunks,
                &params,
                &[],
            )?;
        }
        self.rank.collect(&mut self.cands)?;
        Ok(start.elapsed())
    }

    /// Times `n` greedy single-token steps from an empty cache, each fed the next of `tokens`
    /// (llama-bench's `tg`); returns the time and rank 0's exchange time.
    pub fn time_decode(&mut self, tokens: &[u32], n: usize) -> Result<(Duration, Duration)> {
        if tokens.is_empty() {
            return Err(strata_engine::Error::EmptyPrompt.into());
        }
        let params = Default::default();
        let before = self.rank.comm().stats().wait;
        let start = Instant::now();
        for i in 0..n.min(self.rank.n_ctx()) {
            self.rank
                .submit(0, i, &[tokens[i % tokens.len()]], true, &params, &[])?;
            self.rank.collect(&mut self.cands)?;
        }
        Ok((start.elapsed(), self.rank.comm().stats().wait - before))
    }

    /// Decodes `n` tokens for each of `seqs` sequences kept in flight together (pipeline stages
    /// then work on different sequences at once); returns the elapsed time.
    pub fn time_decode_batch(&mut self, tokens: &[u32], seqs: usize, n: usize) -> Result<Duration> {
        let seqs = seqs.clamp(1, self.rank.max_seqs());
        if tokens.is_empty() {
            return Err(strata_engine::Error::EmptyPrompt.into());
        }
        let params = Default::default();
        let n = n.min(self.rank.n_ctx());
        let start = Instant::now();
        for s in 0..seqs {
            self.rank
                .submit(s, 0, &[tokens[s % tokens.len()]], true, &params, &[])?;
        }
        for i in 1..n {
            for s in 0..seqs {
                self.rank.collect(&mut self.cands)?;
                let t = tokens[(i + s) % tokens.len()];
                self.rank.submit(s, i, &[t], true, &params, &[])?;
            }
        }
        for _ in 0..seqs {
            self.rank.collect(&mut self.cands)?;
        }
        Ok(start.elapsed())
    }

    /// Tells every rank to stop (the instance is being unloaded).
    pub fn shutdown(&mut self) -> Result<()> {
        self.rank.shutdown()
    }
}

/// A row of logits from candidates: theirs where given, minus infinity elsewhere.
fn fill_row(dst: &mut [f32], cands: &[(u32, f32)]) {
    dst.fill(f32::NEG_INFINITY);
    for &(id, l) in cands {
        if let Some(x) = dst.get_mut(id as usize) {
            *x = l;
        }
    }
}

impl Sequences for ShardedBatch {
    fn n_ctx(&self) -> usize {
        self.rank.n_ctx()
    }

    fn survives_panic(&self) -> bool {
        false
    }

    fn free_slots(&self) -> usize {
        self.busy.iter().filter(|b| !**b).count()
    }

    // Steps may be in flight: a free slot is not among them, and every rank takes a restore
    // of its cached blocks in order after them.
    fn admit(
        &mut self,
        prompt: &[u32],
        partition: Partition,
    ) -> std::result::Result<(SlotId, usize), EngineError> {
        if prompt.is_empty() {
            return Err(strata_engine::Error::EmptyPrompt.into());
        }
        if prompt.len() >= self.n_ctx() {
            return Err(strata_engine::Error::ContextOverflow {
                needed: prompt.len() + 1,
                limit: self.n_ctx(),
            }
            .into());
        }
        let no_slot = || EngineError::Slots("every sequence slot is in use".into());
        let Some(prefix) = self.prefix.as_mut() else {
            let slot = self.busy.iter().position(|b| !*b).ok_or_else(no_slot)?;
            self.busy[slot] = true;
            self.lens[slot] = 0;
            return Ok((SlotId::from_index(slot), 0));
        };
        let a = prefix
            .choose(&self.busy, prompt, partition)
            .ok_or_else(no_slot)?;
        let n = if a.restore.is_empty() {
            0
        } else {
            self.rank
                .restore_blocks(a.slot, a.kept * BLOCK, &a.restore)?
        };
        let kept = prefix.restored(&a, prompt, n) * BLOCK;
        self.busy[a.slot] = true;
        self.lens[a.slot] = kept;
        Ok((SlotId::from_index(a.slot), kept))
    }

    fn step(&mut self, steps: &[(SlotId, u32)]) -> std::result::Result<&mut [f32], EngineError> {
        self.step_with(steps, &Self::raw(), &[])
    }

    fn n_vocab(&self) -> Option<usize> {
        Some(self.vocab)
    }

    fn step_masked(
        &mut self,
        steps: &[(SlotId, u32)],
        masks: &[Option<&[u32]>],
    ) -> std::result::Result<&mut [f32], EngineError> {
        self.step_with(steps, &Self::raw(), masks)
    }

    fn step_top(
        &mut self,
        steps: &[(SlotId, u32)],
        k: usize,
    ) -> std::result::Result<&mut [f32], EngineError> {
        self.step_with(steps, &Self::params_of(StepKind::Top(k)), &[])
    }

    fn depth(&self) -> usize {
        self.rank.stages()
    }

    fn submit(
        &mut self,
        steps: &[(SlotId, u32)],
        kind: StepKind<'_>,
    ) -> std::result::Result<(), EngineError> {
        self.check_depth()?;
        self.check_busy(steps)?;
        let masks = match kind {
            StepKind::Masked(m) => m,
            _ => &[],
        };
        self.submit_rows(steps, &Self::params_of(kind), masks)?;
        self.steps += 1;
        Ok(())
    }

    fn submit_extend(
        &mut self,
        slot: SlotId,
        tokens: &[u32],
    ) -> std::result::Result<(), EngineError> {
        self.check_depth()?;
        let at = slot.index();
        self.check_room(at, tokens)?;
        if let Err(e) = self.submit_chunks(at, self.lens[at], tokens) {
            self.pending.clear();
            return Err(e);
        }
        self.lens[at] += tokens.len();
        self.pending.push_back(Flight::Pass);
        Ok(())
    }

    fn collect(&mut self) -> std::result::Result<&mut [f32], EngineError> {
        if let Some(rows) = self.ready.pop_front() {
            let n = rows.len();
            self.logits.resize(n.max(self.logits.len()), 0.0);
            self.logits[..n].copy_from_slice(&rows);
            return Ok(&mut self.logits[..n]);
        }
        let n = self.collect_flight()?;
        Ok(&mut self.logits[..n])
    }

    // The scheduler computes an embedding between its turns, possibly with turns in flight:
    // the ranks answer in order, so those are taken first and kept for the collects that
    // ask for them, and the embedding runs through the ranks alone.
    fn embed(
        &mut self,
        tokens: &[u32],
        pooling: strata_engine::embed::Pooling,
    ) -> std::result::Result<Vec<f32>, EngineError> {
        while !self.pending.is_empty() {
            let n = self.collect_flight()?;
            self.ready.push_back(self.logits[..n].to_vec());
        }
        Ok(self.rank.embed(tokens, pooling)?)
    }

    fn extend(
        &mut self,
        slot: SlotId,
        tokens: &[u32],
    ) -> std::result::Result<&mut [f32], EngineError> {
        self.check_idle()?;
        let at = slot.index();
        self.check_room(at, tokens)?;
        self.submit_chunks(at, self.lens[at], tokens)?;
        self.collect_row(0)?;
        self.lens[at] += tokens.len();
        self.mark = self.rank.comm().stats();
        self.steps = 0;
        Ok(&mut self.logits[..self.vocab])
    }

    fn release(&mut self, slot: SlotId) {
        if let Some(b) = self.busy.get_mut(slot.index()) {
            *b = false;
        }
    }

    fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|p| p.cache().stats())
    }
}

#[cfg(test)]
#[path = "sequences_tests.rs"]
mod tests;
