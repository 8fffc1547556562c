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
        if self.pending.is_empty() {
            Ok(())
        } else {
            Err(EngineError::Slots(format!(
                "{} step(s) are in flight: collect them first",
                self.pending.len()
            )))
        }
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
        if self.pending.front() == Some(&Flight::Pass) {
            self.pending.pop_front();
            if let Err(e) = self.collect_row(0) {
                self.pending.clear();
                return Err(e);
            }
            return Ok(&mut self.logits[..self.vocab]);
        }
        let n = self.collect_rows(0)?;
        Ok(&mut self.logits[..n * self.vocab])
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use crate::{CombineStyle, Strategy, local_pair, make_plan};
    use strata_engine::Batch;
    use strata_engine::{Model, ModelConfig};
    use strata_gguf::GgufFile;
    use strata_kernels::attn::Flavour;

    use super::*;

    /// The default model: its path, file and configuration.
    fn smollm2() -> (std::path::PathBuf, GgufFile, ModelConfig) {
        let path = strata_store::Store::from_env()
            .expect("store")
            .ensure("smollm2-135m-instruct")
            .expect("model");
        let file = GgufFile::open(&path).unwrap();
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        (path, file, cfg)
    }

    /// SmolLM2 split into two pipeline stages (rank 1 on a thread of its own, shared memory)
    /// and whole in one process, each with `slots` slots of 96 positions.
    fn pipeline_and_one_process(
        slots: usize,
    ) -> (
        ShardedBatch,
        std::thread::JoinHandle<crate::Result<()>>,
        Batch,
    ) {
        let (path, file, cfg) = smollm2();
        let plan = make_plan(
            &file,
            &cfg,
            Strategy::Pipeline,
            2,
            None,
            CombineStyle::Gather,
        )
        .unwrap();
        let (rank, worker) = local_pair(&file, &path, plan, 96, slots).unwrap();
        let sharded = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
        let mut model = Model::load_full(&file).unwrap();
        model.set_flavour(Flavour::native());
        (sharded, worker, Batch::new(model, 1, slots, 96).unwrap())
    }

    /// The `k` greatest logits with their ids, ties to the lower id.
    fn top(row: &[f32], k: usize) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .map(|(i, &x)| (i as u32, x))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.iter().take(k).map(|&(i, x)| (i, x.to_bits())).collect()
    }

    fn argmax(row: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best as u32
    }

    /// Sequences of different lengths join and leave a sharded instance's batched steps (all
    /// live sequences in one step, a pipeline's in one micro-batch per stage), and every row
    /// of logits is bit for bit what one process's batch gives the same sequence.
    #[test]
    fn sharded_batched_steps_match_one_process_per_sequence() {
        let (path, file, cfg) = smollm2();
        let flavour = Flavour::native();
        for strategy in [Strategy::Tensor, Strategy::Pipeline] {
            let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
            let (rank, worker) = local_pair(&file, &path, plan, 96, 4).unwrap();
            let mut sharded = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
            let mut model = Model::load_full(&file).unwrap();
            model.set_flavour(flavour);
            let mut local = Batch::new(model, 1, 4, 96).unwrap();

            // Each sequence: its slot in either engine and its next token.
            let mut live: Vec<(SlotId, SlotId, u32)> = Vec::new();
            let join = |sharded: &mut ShardedBatch, local: &mut Batch, prompt: &[u32]| {
                let (s, _) = Sequences::admit(sharded, prompt, Partition::SHARED).unwrap();
                let (l, cached) = Sequences::admit(local, prompt, Partition::SHARED).unwrap();
                let a = Sequences::extend(sharded, s, prompt).unwrap().to_vec();
                let b = Sequences::extend(local, l, &prompt[cached..])
                    .unwrap()
                    .to_vec();
                assert_eq!(a, b, "{strategy:?}: prefill of {} tokens", prompt.len());
                (s, l, argmax(&b))
            };
            live.push(join(&mut sharded, &mut local, &[1, 504, 3000, 25, 77]));
            live.push(join(
                &mut sharded,
                &mut local,
                &(200..212).collect::<Vec<_>>(),
            ));
            for step in 0..10 {
                if step == 3 {
                    live.push(join(&mut sharded, &mut local, &[9, 8, 7]));
                }
                if step == 6 {
                    let (s, l, _) = live.remove(0);
                    Sequences::release(&mut sharded, s);
                    Sequences::release(&mut local, l);
                }
                let s_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.0, x.2)).collect();
                let l_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.1, x.2)).collect();
                let a = Sequences::step(&mut sharded, &s_steps).unwrap().to_vec();
                let b = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
                let v = cfg.n_vocab;
                for (i, seq) in live.iter_mut().enumerate() {
                    let (ra, rb) = (&a[i * v..(i + 1) * v], &b[i * v..(i + 1) * v]);
                    let same = ra.iter().zip(rb).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{strategy:?}: step {step}, row {i} differs");
                    seq.2 = argmax(rb);
                }
            }
            // Greedy steps move each rank's best logit per row, nothing more, and pick the
            // token the full row's argmax picks; top-k steps move k per rank and row, the
            // row's k best among them.
            for step in 0..4 {
                let k = if step < 2 { 1 } else { 5 };
                let s_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.0, x.2)).collect();
                let l_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.1, x.2)).collect();
                let a = Sequences::step_top(&mut sharded, &s_steps, k)
                    .unwrap()
                    .to_vec();
                let b = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
                let v = cfg.n_vocab;
                for (i, seq) in live.iter_mut().enumerate() {
                    let (ra, rb) = (&a[i * v..(i + 1) * v], &b[i * v..(i + 1) * v]);
                    let kept = ra.iter().filter(|x| x.is_finite()).count();
                    assert!(
                        (k..=2 * k).contains(&kept),
                        "{strategy:?}: {kept} logits moved"
                    );
                    assert_eq!(top(ra, k), top(rb, k), "{strategy:?}: step {step}, k {k}");
                    seq.2 = argmax(rb);
                }
            }
            // A pipeline's stages had two micro-batches in flight; a single stage, one.
            let want = if strategy == Strategy::Pipeline { 2 } else { 1 };
            assert_eq!(sharded.rank.max_in_flight(), want, "{strategy:?}");
            sharded.shutdown().unwrap();
            worker.join().unwrap().unwrap();
        }
    }

    /// A pipeline's steps overlap across steps: two groups of sequences step in turn through
    /// `submit` and `collect`, each submitted again while the other is in flight, and every
    /// row is bit for bit one process's. No step or pass that waits for its answer may start
    /// while a step is in flight, and no more steps than stages may be in flight.
    #[test]
    fn pipelined_groups_overlap_across_steps_and_match_one_process() {
        let (mut sharded, worker, mut local) = pipeline_and_one_process(4);
        assert_eq!(Sequences::depth(&sharded), 2);
        let v = sharded.vocab;
        // Per sequence: its slot in either engine and its next token.
        let mut seqs: Vec<(SlotId, SlotId, u32)> = Vec::new();
        for prompt in [
            &[1u32, 504, 3000][..],
            &[7, 8],
            &[200, 201, 202, 203],
            &[42],
        ] {
            let (s, _) = Sequences::admit(&mut sharded, prompt, Partition::SHARED).unwrap();
            let (l, _) = Sequences::admit(&mut local, prompt, Partition::SHARED).unwrap();
            let a = Sequences::extend(&mut sharded, s, prompt).unwrap().to_vec();
            let b = Sequences::extend(&mut local, l, prompt).unwrap().to_vec();
            assert!(a == b);
            seqs.push((s, l, argmax(&b)));
        }
        let groups = [[0, 1], [2, 3]];
        let steps = |seqs: &[(SlotId, SlotId, u32)], g: usize| -> Vec<(SlotId, u32)> {
            groups[g].iter().map(|&i| (seqs[i].0, seqs[i].2)).collect()
        };
        Sequences::submit(&mut sharded, &steps(&seqs, 0), StepKind::Full).unwrap();
        Sequences::submit(&mut sharded, &steps(&seqs, 1), StepKind::Top(1)).unwrap();
        let err = Sequences::submit(&mut sharded, &steps(&seqs, 0), StepKind::Full);
        assert!(err.is_err(), "a third step in flight on two stages");
        assert!(Sequences::extend(&mut sharded, seqs[0].0, &[5]).is_err());
        assert!(Sequences::step(&mut sharded, &steps(&seqs, 0)).is_err());
        for turn in 0..12 {
            let g = turn % 2;
            let got = Sequences::collect(&mut sharded).unwrap().to_vec();
            let l_steps: Vec<(SlotId, u32)> =
                groups[g].iter().map(|&i| (seqs[i].1, seqs[i].2)).collect();
            let want = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
            for (r, &i) in groups[g].iter().enumerate() {
                let (a, b) = (&got[r * v..(r + 1) * v], &want[r * v..(r + 1) * v]);
                if g == 0 {
                    assert!(a == b, "turn {turn}, row {r}");
                } else {
                    assert_eq!(top(a, 1), top(b, 1), "turn {turn}, row {r}");
                }
                seqs[i].2 = argmax(b);
            }
            if turn < 10 {
                let kind = if g == 0 {
                    StepKind::Full
                } else {
                    StepKind::Top(1)
                };
                Sequences::submit(&mut sharded, &steps(&seqs, g), kind).unwrap();
            }
        }
        assert!(
            Sequences::collect(&mut sharded).is_err(),
            "nothing in flight"
        );
        // Steps were submitted while the other group's was in flight.
        assert_eq!(sharded.rank.max_in_flight(), 2);
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
    }

    /// A prompt admitted while another sequence's step is in flight runs its chunks as passes
    /// in flight beside that sequence's steps (`submit_extend`), and every row, the passes'
    /// and the steps', is bit for bit one process's.
    #[test]
    fn prompt_passes_run_beside_steps_in_flight_and_match_one_process() {
        let (mut sharded, worker, mut local) = pipeline_and_one_process(2);
        let first = [1u32, 504, 3000];
        let (sa, _) = Sequences::admit(&mut sharded, &first, Partition::SHARED).unwrap();
        let (la, _) = Sequences::admit(&mut local, &first, Partition::SHARED).unwrap();
        let a = Sequences::extend(&mut sharded, sa, &first)
            .unwrap()
            .to_vec();
        let b = Sequences::extend(&mut local, la, &first).unwrap().to_vec();
        assert!(a == b);
        let mut next = argmax(&b);
        Sequences::submit(&mut sharded, &[(sa, next)], StepKind::Full).unwrap();
        // Admitted and prefilled while the first sequence's step is in flight.
        let prompt: Vec<u32> = (0..40).map(|i| 300 + i * 11).collect();
        let (sb, _) = Sequences::admit(&mut sharded, &prompt, Partition::SHARED).unwrap();
        let (lb, _) = Sequences::admit(&mut local, &prompt, Partition::SHARED).unwrap();
        for chunk in [&prompt[..16], &prompt[16..]] {
            Sequences::submit_extend(&mut sharded, sb, chunk).unwrap();
            assert!(
                Sequences::submit_extend(&mut sharded, sb, chunk).is_err(),
                "a third step in flight on two stages"
            );
            let got = Sequences::collect(&mut sharded).unwrap().to_vec();
            let want = Sequences::step(&mut local, &[(la, next)]).unwrap().to_vec();
            assert!(got == want, "the step beside a pass");
            next = argmax(&want);
            Sequences::submit(&mut sharded, &[(sa, next)], StepKind::Full).unwrap();
            let got = Sequences::collect(&mut sharded).unwrap().to_vec();
            let want = Sequences::extend(&mut local, lb, chunk).unwrap().to_vec();
            assert!(got == want, "the pass beside a step");
        }
        let got = Sequences::collect(&mut sharded).unwrap().to_vec();
        let want = Sequences::step(&mut local, &[(la, next)]).unwrap().to_vec();
        assert!(got == want);
        assert_eq!(
            sharded.rank.max_in_flight(),
            1,
            "batched steps never overlapped"
        );
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
    }

    /// With the prefix cache on, a sharded instance keeps every block a prompt completes on
    /// every rank (each its slice), restores them for a later prompt in another slot (read in
    /// place), reuses what a free slot still holds, and every logit is bit for bit a cold
    /// one-process prefill's and step's.
    #[test]
    fn a_sharded_instance_restores_cached_prefixes_on_every_rank() {
        let (path, file, cfg) = smollm2();
        let shared: Vec<u32> = (0..2 * BLOCK as u32).map(|i| 100 + i * 7 % 900).collect();
        let prompt = |tail: u32| -> Vec<u32> {
            let tail: Vec<u32> = (0..20 + tail).map(|i| 3000 + tail * 50 + i).collect();
            [shared.clone(), tail].concat()
        };
        let (a, b, c) = (prompt(0), prompt(1), prompt(2));
        // Runs `p` from `from` in block-aligned chunks; the logits after it.
        fn run<E: Sequences>(e: &mut E, slot: SlotId, p: &[u32], from: usize) -> Vec<f32> {
            let mut last = Vec::new();
            for chunk in p[from..].chunks(BLOCK) {
                last = e.extend(slot, chunk).unwrap().to_vec();
            }
            last
        }
        for strategy in [Strategy::Tensor, Strategy::Pipeline] {
            let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
            let (rank, worker) = local_pair(&file, &path, plan, 1024, 3).unwrap();
            let mut sharded = ShardedBatch::new(rank, cfg.n_vocab)
                .unwrap()
                .with_prefix_cache(256 << 20);
            let mut model = Model::load_full(&file).unwrap();
            model.set_flavour(Flavour::native());
            let mut cold = Batch::new(model, 1, 3, 1024).unwrap();
            let expect = |cold: &mut Batch, p: &[u32]| {
                let (slot, held) = Sequences::admit(cold, p, Partition::SHARED).unwrap();
                assert_eq!(held, 0);
                (slot, run(cold, slot, p, 0))
            };
            let (ca, want_a) = expect(&mut cold, &a);
            let (cb, want_b) = expect(&mut cold, &b);
            Sequences::release(&mut cold, ca);
            let (cc, want_c) = expect(&mut cold, &c);

            let (sa, held) = Sequences::admit(&mut sharded, &a, Partition::SHARED).unwrap();
            assert_eq!(held, 0);
            assert!(run(&mut sharded, sa, &a, 0) == want_a, "{strategy:?}: a");
            let stats = sharded.prefix_stats().unwrap();
            assert_eq!(stats.blocks, 2, "{strategy:?}: {stats:?}");
            assert!(sharded.rank.block_bytes() > 0);
            // While `a` runs, `b` takes another slot and its prefix comes from the cache.
            let (sb, held) = Sequences::admit(&mut sharded, &b, Partition::SHARED).unwrap();
            assert_ne!(sb, sa);
            assert_eq!(held, 2 * BLOCK, "{strategy:?}: b restored");
            assert!(run(&mut sharded, sb, &b, held) == want_b, "{strategy:?}: b");
            // `a` leaves; `c` takes the slot that still holds the prefix.
            Sequences::release(&mut sharded, sa);
            let (sc, held) = Sequences::admit(&mut sharded, &c, Partition::SHARED).unwrap();
            assert_eq!((sc, held), (sa, 2 * BLOCK), "{strategy:?}: c");
            assert!(run(&mut sharded, sc, &c, held) == want_c, "{strategy:?}: c");
            // Decoding both together matches one process step for step.
            let (mut tb, mut tc) = (argmax(&want_b), argmax(&want_c));
            for step in 0..4 {
                let x = Sequences::step(&mut sharded, &[(sb, tb), (sc, tc)])
                    .unwrap()
                    .to_vec();
                let y = Sequences::step(&mut cold, &[(cb, tb), (cc, tc)])
                    .unwrap()
                    .to_vec();
                assert!(x == y, "{strategy:?}: step {step}");
                let v = cfg.n_vocab;
                (tb, tc) = (argmax(&y[..v]), argmax(&y[v..]));
            }
            sharded.shutdown().unwrap();
            worker.join().unwrap().unwrap();
        }
    }

    /// A grammar's mask goes to the ranks that hold the vocabulary: a masked row comes back
    /// with only the allowed candidates (each rank filters its slice), equal bit for bit to one
    /// process's row with the mask applied; an unmasked row in the same step stays whole.
    #[test]
    fn grammar_masks_are_applied_on_the_ranks() {
        let (path, file, cfg) = smollm2();
        let v = cfg.n_vocab;
        // Allowed: a few tokens spread over both ranks' vocabulary slices.
        let allowed = [17u32, 3000, 25_000, 40_000, v as u32 - 1];
        let mut mask = vec![0u32; v.div_ceil(32)];
        for t in allowed {
            strata_engine::mask_allow(&mut mask, t as usize);
        }
        for strategy in [Strategy::Tensor, Strategy::Pipeline] {
            let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
            let (rank, worker) = local_pair(&file, &path, plan, 96, 2).unwrap();
            let mut sharded = ShardedBatch::new(rank, v).unwrap();
            let mut model = Model::load_full(&file).unwrap();
            model.set_flavour(Flavour::native());
            let mut local = Batch::new(model, 1, 2, 96).unwrap();
            let mut slots = Vec::new();
            for prompt in [&[1u32, 504, 3000][..], &[9, 8, 7, 6]] {
                let (s, _) = Sequences::admit(&mut sharded, prompt, Partition::SHARED).unwrap();
                let (l, _) = Sequences::admit(&mut local, prompt, Partition::SHARED).unwrap();
                Sequences::extend(&mut sharded, s, prompt).unwrap();
                Sequences::extend(&mut local, l, prompt).unwrap();
                slots.push((s, l));
            }
            let masks = [Some(&mask[..]), None];
            let s_steps = [(slots[0].0, 42), (slots[1].0, 43)];
            let l_steps = [(slots[0].1, 42), (slots[1].1, 43)];
            let a = Sequences::step_masked(&mut sharded, &s_steps, &masks)
                .unwrap()
                .to_vec();
            // Row 0's candidates were only the allowed tokens; row 1's, every token.
            let mut counts: Vec<usize> = sharded.rows.iter().take(2).map(Vec::len).collect();
            if strategy == Strategy::Pipeline {
                // Two micro-batches of one row: only the last collected (row 1) is kept; row 0's
                // mask is checked by the logits below.
                counts = vec![allowed.len(), counts[0]];
            }
            assert_eq!(counts, [allowed.len(), v], "{strategy:?}");
            let mut b = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
            for (t, l) in b[..v].iter_mut().enumerate() {
                if !allowed.contains(&(t as u32)) {
                    *l = f32::NEG_INFINITY;
                }
            }
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{strategy:?}: masked step differs from one process's");
            sharded.shutdown().unwrap();
            worker.join().unwrap().unwrap();
        }
    }
}
