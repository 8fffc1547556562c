//! The one sequence engine: a set of slots that take a prompt (admitted with what the prefix
//! cache holds, the rest run in prefill chunks), then one token per slot per batched step, and
//! give back a vocabulary-long row of logits for each. Two engines implement it: [`Batch`] (the
//! whole model in this process) and, in `strata-parallel`, rank 0 of a model split across
//! ranks. Every client drives sequences through it: the API scheduler (many slots, continuous
//! batching) and `strata run` / `strata chat` through [`generate`] (one slot).

use std::time::Instant;

use crate::prefix::{BLOCK, KvStats, Partition, PrefixStats};
use crate::speculate;
use crate::{Batch, Error, GenerateRequest, GenerationStats, Sampler, SlotId, StopReason};

/// Prompt tokens per prefill pass: whole prefix-cache blocks, so a prompt's blocks are kept and
/// a later prompt that shares them computes exactly what a cold one does.
pub const PREFILL_CHUNK: usize = BLOCK;

/// Why an engine could not take a sequence or run a step.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model refused or failed (a token outside the vocabulary, a full context).
    #[error(transparent)]
    Model(#[from] Error),
    /// A rank or link of a sharded instance failed.
    #[error(transparent)]
    Ranks(Box<dyn std::error::Error + Send + Sync>),
    /// A request the slots cannot take (a free slot stepped, no slot left, too long).
    #[error("{0}")]
    Slots(String),
}

/// Which logits a submitted step needs (see [`Sequences::submit`]).
#[derive(Clone, Copy, Debug)]
pub enum StepKind<'a> {
    /// Whole rows, as [`Sequences::step`].
    Full,
    /// The `k` greatest logits of each row, as [`Sequences::step_top`].
    Top(usize),
    /// Rows limited to grammar masks, as [`Sequences::step_masked`].
    Masked(&'a [Option<&'a [u32]>]),
}

/// A model that runs sequences in slots.
pub trait Sequences: Send + 'static {
    /// Context positions per sequence.
    fn n_ctx(&self) -> usize;
    /// Slots free for a new sequence.
    fn free_slots(&self) -> usize;
    /// Takes a free slot for `prompt` and fills it with the longest prefix of it already
    /// computed in `partition` (whole blocks of [`BLOCK`], leaving at least one token; see
    /// [`crate::prefix`]); returns the slot and the positions it holds. The caller runs the rest
    /// with [`Sequences::extend`] in chunks that end on multiples of [`BLOCK`], as a cold prompt
    /// is run, so the logits are the same.
    fn admit(
        &mut self,
        prompt: &[u32],
        partition: Partition,
    ) -> Result<(SlotId, usize), EngineError>;
    /// Appends one token to each listed slot and returns the logits that follow, one row per
    /// step in the same order.
    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], EngineError>;
    /// [`Sequences::step`] for a step whose every sequence reads only the `k` greatest logits
    /// of its row (greedy, `k` = 1, or top-k sampling with a `top_k` of at most `k`; no
    /// penalties, grammar or log-probabilities): an engine may fill only those (ties to the
    /// lower id, the rest minus infinity), from which the sampler picks exactly what it picks
    /// from the whole row. A sharded engine then moves `k` candidates per rank and row, not
    /// its vocabulary slice.
    fn step_top(&mut self, steps: &[(SlotId, u32)], _k: usize) -> Result<&mut [f32], EngineError> {
        self.step(steps)
    }
    /// [`Sequences::step`], [`Sequences::step_top`] or [`Sequences::step_masked`], as `kind`
    /// says: what a client that decides the kind per step calls.
    fn step_as(
        &mut self,
        steps: &[(SlotId, u32)],
        kind: StepKind<'_>,
    ) -> Result<&mut [f32], EngineError> {
        match kind {
            StepKind::Full => self.step(steps),
            StepKind::Top(k) => self.step_top(steps, k),
            StepKind::Masked(masks) => self.step_masked(steps, masks),
        }
    }
    /// The vocabulary's size (a row of logits), when the engine limits rows to masks
    /// ([`Sequences::step_masked`]); `None` when masks gain nothing here.
    fn n_vocab(&self) -> Option<usize> {
        None
    }
    /// [`Sequences::step`] with rows limited to the tokens a grammar allows: `masks[i]`, when
    /// given, is row `i`'s bitset over the vocabulary (bit `t % 32` of word `t / 32` set when
    /// token `t` is allowed). An engine may set the other logits of those rows to minus
    /// infinity, or leave them (the caller masks the row either way); a sharded engine applies
    /// each mask on the ranks that hold the vocabulary slices and moves only allowed logits.
    fn step_masked(
        &mut self,
        steps: &[(SlotId, u32)],
        _masks: &[Option<&[u32]>],
    ) -> Result<&mut [f32], EngineError> {
        self.step(steps)
    }
    /// How many steps can usefully be in flight at once: a pipeline's stage count, where stage
    /// 2 works on one group of sequences while stage 1 starts the next. A client that steps
    /// `depth` groups of its sequences in turn through [`Sequences::submit`] and
    /// [`Sequences::collect`], each group submitted again as soon as its row is sampled, keeps
    /// every stage busy across steps; 1 (the default) means [`Sequences::step`] loses nothing.
    fn depth(&self) -> usize {
        1
    }
    /// Starts a step of the listed slots (as [`Sequences::step`], [`Sequences::step_top`] or
    /// [`Sequences::step_masked`], by `kind`) whose logits [`Sequences::collect`] returns,
    /// steps being collected in the order submitted. Between a submit and the collect that
    /// ends it only more submits ([`Sequences::submit`], [`Sequences::submit_extend`]; at most
    /// [`Sequences::depth`] in flight), collects, and [`Sequences::admit`] and
    /// [`Sequences::release`] of slots with nothing in flight may come: no call that waits for
    /// an answer of its own. Engines of depth 1 need not implement it.
    fn submit(&mut self, _steps: &[(SlotId, u32)], _kind: StepKind<'_>) -> Result<(), EngineError> {
        Err(EngineError::Slots(
            "this engine runs one step at a time".into(),
        ))
    }
    /// Starts a pass of `tokens` appended to one slot (as [`Sequences::extend`]: a prefill
    /// chunk, or tokens a grammar forced) as a step in flight, so a pipeline's stages run it
    /// beside other sequences' decode steps instead of in turn; [`Sequences::collect`] gives
    /// back its one row, the logits that follow the last token, when its turn comes. The same
    /// rules as [`Sequences::submit`] hold.
    fn submit_extend(&mut self, _slot: SlotId, _tokens: &[u32]) -> Result<(), EngineError> {
        Err(EngineError::Slots(
            "this engine runs one pass at a time".into(),
        ))
    }
    /// The logits of the oldest step submitted, one row per listed slot in its order.
    fn collect(&mut self) -> Result<&mut [f32], EngineError> {
        Err(EngineError::Slots("no step was submitted".into()))
    }
    /// Appends several tokens to one slot in one pass and returns the logits that follow the
    /// last (prefill chunks, and tokens a grammar forces).
    fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], EngineError>;
    /// Frees a slot.
    fn release(&mut self, slot: SlotId);
    /// What the prefix cache holds (`None`: the engine has none).
    fn prefix_stats(&self) -> Option<PrefixStats> {
        None
    }
    /// What the running sequences' caches hold (`None`: the engine cannot tell).
    fn kv_stats(&self) -> Option<KvStats> {
        None
    }
    /// Whether the engine may go on after a panic once every slot is freed. True where all
    /// state is per slot; false where a panic can leave other parties mid-protocol (ranks on
    /// other nodes waiting inside a collective), which only a restart can bring back in step.
    fn survives_panic(&self) -> bool {
        true
    }
    /// The embedding of `tokens` (a text computed alone, in no slot), pooled as `pooling`
    /// says and not yet normalised (see [`crate::embed`]).
    fn embed(
        &mut self,
        _tokens: &[u32],
        _pooling: crate::embed::Pooling,
    ) -> Result<Vec<f32>, EngineError> {
        Err(EngineError::Slots(
            "this engine does not compute embeddings".into(),
        ))
    }
    /// Whether [`Sequences::verify`] and [`Sequences::rewind`] work here.
    fn verifies(&self) -> bool {
        false
    }
    /// Appends each item's tokens (a sampled token and the draft after it) to its slot, all in
    /// one pass, and returns a row of logits for every token, items back to back: row `j` of
    /// an item bit for bit what a one-token step of its token `j` gives after the tokens
    /// before it. The caller then keeps the prefix the model accepts and cuts the rest with
    /// [`Sequences::rewind`].
    fn verify(&mut self, _items: &[(SlotId, &[u32])]) -> Result<&mut [f32], EngineError> {
        Err(EngineError::Slots(
            "this engine does not verify drafts".into(),
        ))
    }
    /// Cuts the sequence in `slot` back to its first `len` positions.
    fn rewind(&mut self, _slot: SlotId, _len: usize) -> Result<(), EngineError> {
        Err(EngineError::Slots(
            "this engine does not verify drafts".into(),
        ))
    }
    /// Weight bytes one decode step read on average over the `steps` steps since the last call,
    /// which also restarts the count (`None` where the engine cannot tell): the figure
    /// `strata run --stats-json` reports against the planner.
    fn weight_bytes_per_step(&mut self, _steps: u64) -> Option<f64> {
        None
    }
}

/// Whether a token mask of [`Sequences::step_masked`] (bit `t % 32` of word `t / 32`) allows
/// token `t`.
pub fn mask_allows(mask: &[u32], t: usize) -> bool {
    mask.get(t / 32).is_some_and(|w| w & (1 << (t % 32)) != 0)
}

/// Sets token `t`'s bit in a token mask of [`Sequences::step_masked`].
pub fn mask_allow(mask: &mut [u32], t: usize) {
    if let Some(w) = mask.get_mut(t / 32) {
        *w |= 1 << (t % 32);
    }
}

impl Sequences for Batch {
    fn n_ctx(&self) -> usize {
        Batch::n_ctx(self)
    }

    fn free_slots(&self) -> usize {
        Batch::free_slots(self)
    }

    fn admit(
        &mut self,
        prompt: &[u32],
        partition: Partition,
    ) -> Result<(SlotId, usize), EngineError> {
        Batch::admit_in(self, prompt, partition).map_err(EngineError::from)
    }

    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], EngineError> {
        Batch::step(self, steps).map_err(EngineError::from)
    }

    fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], EngineError> {
        Batch::extend(self, slot, tokens).map_err(EngineError::from)
    }

    fn embed(
        &mut self,
        tokens: &[u32],
        pooling: crate::embed::Pooling,
    ) -> Result<Vec<f32>, EngineError> {
        Batch::embed(self, tokens, pooling).map_err(EngineError::from)
    }

    fn release(&mut self, slot: SlotId) {
        Batch::release(self, slot);
    }

    fn verifies(&self) -> bool {
        true
    }

    fn verify(&mut self, items: &[(SlotId, &[u32])]) -> Result<&mut [f32], EngineError> {
        Batch::verify(self, items).map_err(EngineError::from)
    }

    fn rewind(&mut self, slot: SlotId, len: usize) -> Result<(), EngineError> {
        Batch::rewind(self, slot, len);
        Ok(())
    }

    fn prefix_stats(&self) -> Option<PrefixStats> {
        Batch::prefix_stats(self)
    }

    fn kv_stats(&self) -> Option<KvStats> {
        Some(Batch::kv_stats(self))
    }

    fn weight_bytes_per_step(&mut self, steps: u64) -> Option<f64> {
        Some(Batch::weight_bytes_per_step(self, steps))
    }
}

/// Chunks of `tokens` (starting at position `at` of the sequence) that end on multiples of
/// [`PREFILL_CHUNK`], as [`Sequences::admit`] asks.
pub fn prefill_chunks(at: usize, tokens: &[u32]) -> impl Iterator<Item = &[u32]> {
    let mut rest = tokens;
    let mut pos = at;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = (PREFILL_CHUNK - pos % PREFILL_CHUNK).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        pos += n;
        Some(chunk)
    })
}

/// Generates one continuation of `req.prompt` in a slot of `engine`, calling `on_token` with
/// each token as soon as it is sampled (`false` stops early); `is_eog` says which tokens end
/// generation. The loop `strata run` and `strata chat` share, on one process or on ranks.
pub fn generate(
    engine: &mut dyn Sequences,
    is_eog: &dyn Fn(u32) -> bool,
    req: &GenerateRequest,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<GenerationStats, EngineError> {
    req.sampling
        .validate()
        .map_err(|m| Error::InvalidModel(format!("invalid sampling parameters: {m}")))?;
    let start = Instant::now();
    let (slot, cached) = engine.admit(&req.prompt, Partition::SHARED)?;
    let result = run_slot(engine, slot, cached, is_eog, req, on_token, start);
    engine.release(slot);
    result
}

fn run_slot(
    engine: &mut dyn Sequences,
    slot: SlotId,
    cached: usize,
    is_eog: &dyn Fn(u32) -> bool,
    req: &GenerateRequest,
    on_token: &mut dyn FnMut(u32) -> bool,
    start: Instant,
) -> Result<GenerationStats, EngineError> {
    let mut sampler = Sampler::new(req.sampling.clone());
    let top = req.sampling.reads_top();
    let mut history = req.prompt.clone();
    let n_ctx = engine.n_ctx();
    let mut logits: &mut [f32] = &mut [];
    for chunk in prefill_chunks(cached, &req.prompt[cached..]) {
        logits = engine.extend(slot, chunk)?;
    }
    if req.max_tokens == 0 {
        let s = start.elapsed().as_secs_f64();
        return Ok(GenerationStats::from_timing(
            req.prompt.len(),
            0,
            s,
            s,
            0.0,
            StopReason::MaxTokens,
        ));
    }
    let mut tok = sampler.sample(logits, &history);
    let prefill_s = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut generated = 1usize;
    let mut steps = 0u64;
    engine.weight_bytes_per_step(1);
    let mut speculator =
        (req.speculation.drafts() && engine.verifies()).then(speculate::Speculator::default);
    let stop = loop {
        history.push(tok);
        if !on_token(tok) {
            break StopReason::Cancelled;
        }
        let eog = !req.ignore_eos && is_eog(tok);
        if let Some(stop) =
            StopReason::after_token(eog, false, generated, req.max_tokens, history.len(), n_ctx)
        {
            break stop;
        }
        if let Some(sp) = speculator.as_mut() {
            // Each drafted token counts against the budget, and the pass needs room for all.
            let room = (req.max_tokens - generated).min(n_ctx.saturating_sub(history.len() + 1));
            let mut emit = |t: u32, h: &[u32]| {
                generated += 1;
                if !on_token(t) {
                    return Some(StopReason::Cancelled);
                }
                let eog = !req.ignore_eos && is_eog(t);
                StopReason::after_token(eog, false, generated, req.max_tokens, h.len(), n_ctx)
            };
            if let Some(v) = sp.step(engine, slot, &mut sampler, &mut history, room, &mut emit)? {
                steps += 1;
                if let Some(stop) = v.stop {
                    break stop;
                }
                tok = v.next;
                generated += 1;
                continue;
            }
        }
        let logits = match top {
            Some(k) => engine.step_top(&[(slot, tok)], k)?,
            None => engine.step(&[(slot, tok)])?,
        };
        steps += 1;
        tok = sampler.sample(logits, &history);
        generated += 1;
    };
    let mut stats = GenerationStats::from_timing(
        req.prompt.len(),
        generated,
        prefill_s,
        prefill_s,
        decode_start.elapsed().as_secs_f64(),
        stop,
    );
    if steps > 0 {
        stats.weight_bytes_per_token = engine.weight_bytes_per_step(steps);
    }
    stats.speculation = speculator.as_ref().map(speculate::Speculator::stats);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_chunks_end_on_block_multiples() {
        let tokens: Vec<u32> = (0..600).collect();
        let lens: Vec<usize> = prefill_chunks(0, &tokens).map(<[u32]>::len).collect();
        assert_eq!(lens, [256, 256, 88]);
        // After 256 cached positions, and from the middle of a block.
        let lens: Vec<usize> = prefill_chunks(256, &tokens[256..])
            .map(<[u32]>::len)
            .collect();
        assert_eq!(lens, [256, 88]);
        let lens: Vec<usize> = prefill_chunks(100, &tokens[..300])
            .map(<[u32]>::len)
            .collect();
        assert_eq!(lens, [156, 144]);
        assert_eq!(prefill_chunks(0, &[]).count(), 0);
        let all: Vec<u32> = prefill_chunks(3, &tokens).flatten().copied().collect();
        assert_eq!(all, tokens);
    }
}
