//! What the scheduler drives: a set of sequence slots that take a prompt, then one token per
//! step, and give back a vocabulary-long row of logits for each. Two engines implement it: the
//! engine's [`Batch`] (the whole model in this process, every live sequence in one forward pass)
//! and [`Sharded`] (rank 0 of a model split across nodes, sequences stepped one after another
//! through the ranks).

use strata_engine::prefix::{BLOCK, PrefixStats};
use strata_engine::{Batch, SamplingParams, SlotId};
use strata_parallel::Rank;

/// A model the scheduler can run sequences on.
pub trait Engine: Send + 'static {
    /// Context positions per sequence.
    fn n_ctx(&self) -> usize;
    /// Slots free for a new sequence.
    fn free_slots(&self) -> usize;
    /// Takes a free slot for `prompt` and fills it with the longest prefix of it already
    /// computed (whole blocks of [`BLOCK`], leaving at least one token); returns the slot and
    /// the positions it holds. The caller runs the rest with [`Engine::extend`] in chunks that
    /// end on multiples of [`BLOCK`], as a cold prompt is run, so the logits are the same.
    fn admit(&mut self, prompt: &[u32]) -> Result<(SlotId, usize), String>;
    /// Appends one token to each listed slot and returns the logits that follow, one row per
    /// step in the same order.
    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], String>;
    /// Appends several tokens to one slot in one pass and returns the logits that follow the
    /// last (the fast path for tokens a grammar forces).
    fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], String>;
    /// Frees a slot.
    fn release(&mut self, slot: SlotId);
    /// What the prefix cache holds (`None`: the engine has none).
    fn prefix_stats(&self) -> Option<PrefixStats> {
        None
    }
    /// Whether the engine may go on after a panic once every slot is freed. True where all
    /// state is per slot; false where a panic can leave other parties mid-protocol (ranks on
    /// other nodes waiting inside a collective), which only a restart can bring back in step.
    fn survives_panic(&self) -> bool {
        true
    }
}

impl Engine for Batch {
    fn n_ctx(&self) -> usize {
        Batch::n_ctx(self)
    }

    fn free_slots(&self) -> usize {
        Batch::free_slots(self)
    }

    fn admit(&mut self, prompt: &[u32]) -> Result<(SlotId, usize), String> {
        Batch::admit(self, prompt).map_err(|e| e.to_string())
    }

    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], String> {
        Batch::step(self, steps).map_err(|e| e.to_string())
    }

    fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], String> {
        Batch::extend(self, slot, tokens).map_err(|e| e.to_string())
    }

    fn release(&mut self, slot: SlotId) {
        Batch::release(self, slot);
    }

    fn prefix_stats(&self) -> Option<PrefixStats> {
        Batch::prefix_stats(self)
    }
}

/// Rank 0 of a sharded model as a scheduler engine. The last pipeline stage returns every logit
/// of its vocabulary shard (sampling settings that keep all candidates), so the scheduler sees
/// the same full rows as with one process and samples, constrains and scores them the same way.
#[derive(Debug)]
pub struct Sharded {
    rank: Rank,
    vocab: usize,
    busy: Vec<bool>,
    lens: Vec<usize>,
    logits: Vec<f32>,
    cands: Vec<(u32, f32)>,
}

impl Sharded {
    /// Wraps rank 0 of an instance whose vocabulary has `vocab` entries.
    pub fn new(rank: Rank, vocab: usize) -> Sharded {
        let slots = rank.max_seqs();
        Sharded {
            rank,
            vocab,
            busy: vec![false; slots],
            lens: vec![0; slots],
            logits: Vec::new(),
            cands: Vec::new(),
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
    fn collect_row(&mut self, row: usize) -> Result<(), String> {
        self.rank
            .collect(&mut self.cands)
            .map_err(|e| e.to_string())?;
        let dst = &mut self.logits[row * self.vocab..(row + 1) * self.vocab];
        dst.fill(f32::NEG_INFINITY);
        for &(id, l) in &self.cands {
            if let Some(x) = dst.get_mut(id as usize) {
                *x = l;
            }
        }
        Ok(())
    }

    /// Runs `tokens` through `slot` from position `at` in prefill chunks, and takes the logits
    /// that follow the last as row 0.
    fn submit_chunks(&mut self, slot: usize, at: usize, tokens: &[u32]) -> Result<(), String> {
        let raw = Self::raw();
        let chunks = tokens.len().div_ceil(BLOCK);
        for (i, chunk) in tokens.chunks(BLOCK).enumerate() {
            self.rank
                .submit(slot, at + i * BLOCK, chunk, i + 1 == chunks, &raw, &[])
                .map_err(|e| e.to_string())?;
        }
        self.logits.resize(self.vocab.max(self.logits.len()), 0.0);
        self.collect_row(0)
    }

    /// Tells every rank to stop (the instance is being unloaded).
    pub fn shutdown(&mut self) -> Result<(), String> {
        self.rank.shutdown().map_err(|e| e.to_string())
    }
}

impl Engine for Sharded {
    fn n_ctx(&self) -> usize {
        self.rank.n_ctx()
    }

    fn survives_panic(&self) -> bool {
        false
    }

    fn free_slots(&self) -> usize {
        self.busy.iter().filter(|b| !**b).count()
    }

    fn admit(&mut self, prompt: &[u32]) -> Result<(SlotId, usize), String> {
        if prompt.is_empty() {
            return Err(strata_engine::Error::EmptyPrompt.to_string());
        }
        if prompt.len() >= self.n_ctx() {
            return Err(strata_engine::Error::ContextOverflow {
                needed: prompt.len() + 1,
                limit: self.n_ctx(),
            }
            .to_string());
        }
        let slot = self
            .busy
            .iter()
            .position(|b| !*b)
            .ok_or("every sequence slot is in use")?;
        self.busy[slot] = true;
        self.lens[slot] = 0;
        Ok((SlotId::from_index(slot), 0))
    }

    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], String> {
        let raw = Self::raw();
        for &(slot, _) in steps {
            let slot = slot.index();
            if !self.busy.get(slot).copied().unwrap_or(false) {
                return Err(format!("slot {slot} holds no sequence"));
            }
        }
        // One step at a time: rank 0 keeps only the latest step's own candidates, so each is
        // collected before the next is submitted.
        self.logits.resize(steps.len() * self.vocab, 0.0);
        for (row, &(slot, token)) in steps.iter().enumerate() {
            let slot = slot.index();
            self.rank
                .submit(slot, self.lens[slot], &[token], true, &raw, &[])
                .map_err(|e| e.to_string())?;
            self.lens[slot] += 1;
            self.collect_row(row)?;
        }
        Ok(&mut self.logits[..steps.len() * self.vocab])
    }

    fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], String> {
        let at = slot.index();
        if !self.busy.get(at).copied().unwrap_or(false) {
            return Err(format!("slot {at} holds no sequence"));
        }
        if tokens.is_empty() || self.lens[at] + tokens.len() >= self.n_ctx() {
            return Err(format!(
                "cannot append {} tokens to a sequence of {} in a context of {}",
                tokens.len(),
                self.lens[at],
                self.n_ctx()
            ));
        }
        self.submit_chunks(at, self.lens[at], tokens)?;
        self.lens[at] += tokens.len();
        Ok(&mut self.logits[..self.vocab])
    }

    fn release(&mut self, slot: SlotId) {
        if let Some(b) = self.busy.get_mut(slot.index()) {
            *b = false;
        }
    }
}
