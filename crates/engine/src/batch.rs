//! Many sequences on one model: a fixed set of KV-cache slots, prompts prefilled one at a time,
//! and decode steps that advance every live sequence in one batched forward pass.
//!
//! This is the engine half of continuous batching: a server admits a new sequence into a free
//! slot between decode steps and retires finished ones, while the weights are streamed from
//! memory once per step for the whole batch instead of once per sequence.

use crate::generate::PREFILL_BATCH;
use crate::prefix::{BLOCK, KvStats, Partition, PrefixStats, SlotBlocks};
use crate::{Error, KvCache, Model, NoComm, Result, Scratch, StageInput};
use std::sync::Arc;
use strata_kernels::ThreadPool;

/// Which slot a sequence lives in (valid until [`Batch::release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId(usize);

impl SlotId {
    /// The slot's index (for logs and metrics).
    pub fn index(self) -> usize {
        self.0
    }

    /// The slot with this index (a [`Batch`] checks that it holds a sequence before use).
    pub fn from_index(index: usize) -> SlotId {
        SlotId(index)
    }
}

/// A model with `slots` independent KV caches of `n_ctx` positions each.
#[derive(Debug)]
pub struct Batch {
    model: Model,
    pool: ThreadPool,
    scratch: Scratch,
    caches: Vec<KvCache>,
    busy: Vec<bool>,
    /// The slots of the step being run, in the order of its tokens, and the tokens (kept to
    /// avoid allocating).
    order: Vec<usize>,
    tokens: Vec<u32>,
    /// The tokens of each slot in a verification pass.
    counts: Vec<usize>,
    /// Blocks of computed prompts and what each slot holds, when prefix caching is on.
    prefix: Option<SlotBlocks<Arc<[half::f16]>>>,
}

impl Batch {
    /// Takes a whole model (not a shard) and reserves `slots` caches of `n_ctx` positions. Cache
    /// pages are only touched as positions fill, so idle slots cost address space, not memory.
    pub fn new(model: Model, threads: usize, slots: usize, n_ctx: usize) -> Result<Batch> {
        if slots == 0 {
            return Err(Error::InvalidShard(
                "a batch needs at least one slot".into(),
            ));
        }
        let caches = (0..slots)
            .map(|_| model.new_cache(n_ctx.max(1)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Batch {
            model,
            pool: ThreadPool::new(threads),
            scratch: Scratch::default(),
            caches,
            busy: vec![false; slots],
            order: Vec::with_capacity(slots),
            tokens: Vec::with_capacity(slots),
            counts: Vec::with_capacity(slots),
            prefix: None,
        })
    }

    /// Turns on prefix caching with `budget` bytes for blocks of finished prompts (0 leaves it
    /// off): [`Batch::admit`] then restores the longest cached prefix of a prompt, from the
    /// slot that still holds it without copying, or else from the cache.
    pub fn with_prefix_cache(mut self, budget: usize) -> Batch {
        let block_bytes = self.caches.first().map_or(0, |c| c.block_len(BLOCK) * 2);
        self.prefix = (budget > 0).then(|| SlotBlocks::new(budget, block_bytes, self.slots()));
        self
    }

    /// What the prefix cache holds (`None` when it is off).
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|p| p.cache().stats())
    }

    /// What the running sequences hold: their own positions, and the shared prefix blocks they
    /// read (each counted once).
    pub fn kv_stats(&self) -> KvStats {
        let mut stats = KvStats::default();
        let mut blocks: Vec<(*const half::f16, usize)> = Vec::new();
        for (cache, _) in self.caches.iter().zip(&self.busy).filter(|(_, b)| **b) {
            stats.sequences += 1;
            stats.own_bytes += cache.own_bytes();
            for b in cache.shared_blocks() {
                stats.shared_read_bytes += b.len() * 2;
                blocks.push((b.as_ptr(), b.len() * 2));
            }
        }
        blocks.sort_unstable();
        blocks.dedup();
        stats.shared_bytes = blocks.iter().map(|b| b.1).sum();
        stats
    }

    /// Whether `prompt` can start a sequence: not empty, with room for a token after it.
    fn fits(&self, prompt: &[u32]) -> Result<()> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if prompt.len() >= self.n_ctx() {
            return Err(Error::ContextOverflow {
                needed: prompt.len() + 1,
                limit: self.n_ctx(),
            });
        }
        Ok(())
    }

    /// Starts a sequence without running anything: takes a free slot and fills it with the
    /// longest prefix of `prompt` already computed (whole [`BLOCK`]s, leaving at least one
    /// token to run), preferring a free slot that still holds it. Returns the slot and how
    /// many positions it holds; the caller runs the rest with [`Batch::extend`], in chunks of
    /// [`BLOCK`] aligned to multiples of it for the logits to be those of a cold prefill.
    pub fn admit(&mut self, prompt: &[u32]) -> Result<(SlotId, usize)> {
        self.admit_in(prompt, Partition::SHARED)
    }

    /// [`Batch::admit`] reusing only blocks of `partition` (see [`crate::prefix`]).
    pub fn admit_in(&mut self, prompt: &[u32], partition: Partition) -> Result<(SlotId, usize)> {
        self.fits(prompt)?;
        let no_slot = || Error::InvalidShard("every batch slot is in use".into());
        let Some(prefix) = self.prefix.as_mut() else {
            let slot = self.busy.iter().position(|b| !*b).ok_or_else(no_slot)?;
            self.caches[slot].clear();
            self.busy[slot] = true;
            return Ok((SlotId(slot), 0));
        };
        let a = prefix
            .choose(&self.busy, prompt, partition)
            .ok_or_else(no_slot)?;
        let cache = &mut self.caches[a.slot];
        cache.truncate(a.kept * BLOCK);
        let n = a
            .restore
            .iter()
            .take_while(|&&id| {
                prefix
                    .cache()
                    .data(id)
                    .is_some_and(|d| cache.append_block(d))
            })
            .count();
        let kept = prefix.restored(&a, prompt, n);
        self.busy[a.slot] = true;
        Ok((SlotId(a.slot), kept * BLOCK))
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The embedding of `tokens`, computed alone in a cache of its own (no slot is taken and
    /// no other sequence is touched), pooled and not yet normalised (see [`crate::embed`]).
    pub fn embed(&mut self, tokens: &[u32], pooling: crate::embed::Pooling) -> Result<Vec<f32>> {
        if tokens.len() > self.n_ctx() {
            return Err(Error::ContextOverflow {
                needed: tokens.len(),
                limit: self.n_ctx(),
            });
        }
        let mut cache = self.model.new_cache(tokens.len().max(1))?;
        self.model
            .embed(&self.pool, &mut cache, &mut self.scratch, tokens)?;
        crate::embed::pool_states(
            self.scratch.embeddings(),
            self.model.config().n_embd,
            pooling,
            self.model.flavour(),
        )
    }

    /// Positions each slot holds.
    pub fn n_ctx(&self) -> usize {
        self.caches.first().map_or(0, KvCache::capacity)
    }

    /// Slots in all.
    pub fn slots(&self) -> usize {
        self.caches.len()
    }

    /// Slots not holding a sequence.
    pub fn free_slots(&self) -> usize {
        self.busy.iter().filter(|b| !**b).count()
    }

    /// Positions filled in `slot`.
    pub fn len(&self, slot: SlotId) -> usize {
        self.caches.get(slot.0).map_or(0, KvCache::len)
    }

    /// Starts a sequence: takes a free slot and runs `prompt` through it (in chunks of the
    /// prefill batch). Returns the slot and the logits that follow the prompt.
    pub fn start(&mut self, prompt: &[u32]) -> Result<(SlotId, &mut [f32])> {
        self.fits(prompt)?;
        let slot = self
            .busy
            .iter()
            .position(|b| !*b)
            .ok_or_else(|| Error::InvalidShard("every batch slot is in use".into()))?;
        self.caches[slot].clear();
        if let Some(p) = self.prefix.as_mut() {
            p.clear(slot);
        }
        self.prefill(slot, prompt)?;
        self.busy[slot] = true;
        Ok((SlotId(slot), self.scratch.logits_mut()))
    }

    /// Appends several tokens to the sequence in `slot` in one prefill pass (tokens a grammar
    /// forces need no sampling, so they need no step each). Returns the logits that follow the
    /// last token.
    pub fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32]> {
        if !self.busy.get(slot.0).copied().unwrap_or(false) {
            return Err(Error::InvalidShard(format!(
                "slot {} holds no sequence",
                slot.0
            )));
        }
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let needed = self.caches[slot.0].len() + tokens.len();
        if needed >= self.n_ctx() {
            return Err(Error::ContextOverflow {
                needed: needed + 1,
                limit: self.n_ctx(),
            });
        }
        self.prefill(slot.0, tokens)?;
        Ok(self.scratch.logits_mut())
    }

    /// Runs `tokens` through slot `slot`'s cache, in chunks of the prefill batch, keeping the
    /// blocks they complete in the prefix cache (see [`SlotBlocks::passed`]).
    fn prefill(&mut self, slot: usize, tokens: &[u32]) -> Result<()> {
        for chunk in tokens.chunks(PREFILL_BATCH) {
            let cache = &mut self.caches[slot];
            let at = cache.len();
            self.model.forward(
                &self.pool,
                cache,
                &mut self.scratch,
                StageInput::Tokens(chunk),
                &mut NoComm,
            )?;
            if let Some(p) = self.prefix.as_mut() {
                let cache = &self.caches[slot];
                p.passed(slot, at, chunk, |start| cache.save_block(start, BLOCK));
                // Evicted blocks are dropped with their entries.
                p.cache_mut().take_gone();
            }
        }
        Ok(())
    }

    /// Appends `steps[i].1` to the sequence in slot `steps[i].0`, all in one forward pass, and
    /// returns the logits that follow, one vocabulary-long row per step in the same order.
    pub fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32]> {
        self.order.clear();
        for &(slot, _) in steps {
            if !self.busy.get(slot.0).copied().unwrap_or(false) {
                return Err(Error::InvalidShard(format!(
                    "slot {} holds no sequence",
                    slot.0
                )));
            }
            if self.order.contains(&slot.0) {
                return Err(Error::InvalidShard(format!(
                    "slot {} appears twice in one step",
                    slot.0
                )));
            }
            self.order.push(slot.0);
        }
        self.tokens.clear();
        self.tokens.extend(steps.iter().map(|s| s.1));
        self.model.forward_batch(
            &self.pool,
            &mut self.caches,
            &self.order,
            &mut self.scratch,
            &self.tokens,
        )?;
        Ok(self.scratch.logits_mut())
    }

    /// Appends each item's tokens to the sequence in its slot, all in one pass, and returns a
    /// row of logits for every token, items back to back: row `j` of an item bit for bit what
    /// a [`Batch::step`] of its token `j` would give after the tokens before it (see
    /// [`Model::verify`]). Speculative drafts of several sequences, scored at once; the caller
    /// cuts the tokens the model did not accept with [`Batch::rewind`].
    pub fn verify(&mut self, items: &[(SlotId, &[u32])]) -> Result<&mut [f32]> {
        self.order.clear();
        self.tokens.clear();
        self.counts.clear();
        for &(slot, tokens) in items {
            if !self.busy.get(slot.0).copied().unwrap_or(false) {
                return Err(Error::InvalidShard(format!(
                    "slot {} holds no sequence",
                    slot.0
                )));
            }
            self.order.push(slot.0);
            self.counts.push(tokens.len());
            self.tokens.extend_from_slice(tokens);
        }
        self.model.verify(
            &self.pool,
            &mut self.caches,
            &self.order,
            &self.counts,
            &mut self.scratch,
            &self.tokens,
        )?;
        Ok(self.scratch.logits_mut())
    }

    /// Cuts the sequence in `slot` back to its first `len` positions (drafted tokens the
    /// model did not accept); a longer `len` changes nothing.
    pub fn rewind(&mut self, slot: SlotId, len: usize) {
        if let Some(c) = self.caches.get_mut(slot.0) {
            c.truncate(len);
        }
    }

    /// Weight bytes one step read on average over the `steps` steps since the last call (the
    /// fixed tensors, and a mixture's experts as routed), which also restarts the count.
    pub fn weight_bytes_per_step(&mut self, steps: u64) -> f64 {
        let experts = self.scratch.take_expert_bytes() as f64 / steps.max(1) as f64;
        self.model.fixed_bytes_per_step() as f64 + experts
    }

    /// Frees a slot for the next sequence.
    pub fn release(&mut self, slot: SlotId) {
        if let Some(b) = self.busy.get_mut(slot.0) {
            *b = false;
        }
    }
}
