//! One rank of a sharded model: its shard, its KV caches, its links, and the serving loop that
//! runs steps in lockstep with the other ranks.
//!
//! A step enters at rank 0, which hands its header to the rest of stage 0. Each stage runs its
//! layers (its tensor-parallel group exchanging partial results inside the forward pass) and
//! passes the header and hidden states straight to the next stage. The last stage's ranks each
//! reduce their slice of the vocabulary to a few sampling candidates and send those, not full
//! logits, to rank 0, which samples. Rank 0 may submit the next step (of another sequence)
//! before collecting the last one, so pipeline stages work on different sequences at once.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use strata_engine::prefix::BLOCK;
use strata_engine::{
    Axis, Collective, CommError, KvCache, Model, Scratch, StageInput, shard_candidates,
};
use strata_gguf::GgufFile;
use strata_kernels::ThreadPool;
use strata_kernels::attn::Flavour;
use strata_net::Communicator;

use crate::plan::{GroupParts, Plan};
use crate::proto::{
    Header, Kind, decode_candidate_rows, decode_candidates, encode_candidate_rows,
    encode_candidates, ids_from_words, ids_to_words,
};
use crate::{Error, Result};

/// What rank 0 tells every worker after the mesh is up.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Assignment {
    /// The plan (every rank's shard).
    pub plan: Plan,
    /// Where rank 0 found the model (a worker on another host may use its own copy).
    pub model_path: PathBuf,
    /// The model file's size, checked by every rank against its own copy.
    pub model_bytes: u64,
    /// Compute threads per rank.
    pub threads: usize,
    /// Context positions per sequence.
    pub n_ctx: usize,
    /// Sequences that may be in flight at once (KV cache slots).
    pub max_seqs: usize,
    /// Which llama.cpp build's arithmetic to reproduce (`avx512`, `avx2` or `neon`).
    pub numerics: String,
}

impl Assignment {
    fn flavour(&self) -> Result<Flavour> {
        Flavour::from_name(&self.numerics)
            .ok_or_else(|| Error::Protocol(format!("unknown numerics {:?}", self.numerics)))
    }
}

/// The name of a flavour in an [`Assignment`].
pub fn numerics_name(f: Flavour) -> &'static str {
    f.name()
}

/// The engine's view of a tensor-parallel group: collectives over the group's links.
struct GroupComm<'a> {
    comm: &'a mut Communicator,
    group: &'a [usize],
    parts: &'a GroupParts,
}

impl Collective for GroupComm<'_> {
    fn all_reduce_sum(&mut self, x: &mut [f32]) -> std::result::Result<(), CommError> {
        Ok(self.comm.all_reduce_sum(self.group, x)?)
    }

    fn all_gather(
        &mut self,
        axis: Axis,
        rows: usize,
        src: &[f32],
        dst: &mut [f32],
    ) -> std::result::Result<(), CommError> {
        let parts: &[Range<usize>] = match axis {
            Axis::QHeads => &self.parts.q,
            Axis::KvHeads => &self.parts.kv,
            Axis::Ffn => &self.parts.ffn,
            Axis::Embd => &self.parts.embd,
            Axis::ExpertFfn => &self.parts.ffn_exp,
        };
        Ok(self
            .comm
            .all_gather_cols(self.group, src, dst, rows, parts)?)
    }

    fn all_gather_varying(
        &mut self,
        counts: &[usize],
        src: &[f32],
        dst: &mut [f32],
    ) -> std::result::Result<(), CommError> {
        // One "row" whose columns are the members' contributions back to back.
        let mut at = 0;
        let parts: Vec<Range<usize>> = counts
            .iter()
            .map(|&c| {
                at += c;
                at - c..at
            })
            .collect();
        Ok(self.comm.all_gather_cols(self.group, src, dst, 1, &parts)?)
    }
}

/// A rank's loaded weights and caches, before it is connected.
#[derive(Debug)]
pub struct Shard {
    model: Model,
    caches: Vec<KvCache>,
    threads: usize,
}

/// A loaded rank.
pub struct Rank {
    me: usize,
    plan: Plan,
    comm: Communicator,
    model: Model,
    pool: ThreadPool,
    caches: Vec<KvCache>,
    scratch: Scratch,
    step: Header,
    hidden: Vec<f32>,
    bytes: Vec<u8>,
    local: Vec<(u32, f32)>,
    /// This rank's candidates for each row of the last batch (last stage only).
    rows: Vec<Vec<(u32, f32)>>,
    targets: Vec<usize>,
    /// The slot of each row of the batch being run.
    pick: Vec<usize>,
    /// Rank 0: batches submitted and not yet collected, and the most there have been.
    in_flight: usize,
    max_in_flight: usize,
    /// This rank's slice of the prefix cache's blocks, by entry (rank 0 keeps the index and
    /// decides what is kept, restored and dropped).
    blocks: HashMap<u64, Arc<[strata_engine::f16]>>,
    /// Rank 0, when it is also the last stage's first rank: the last embedding it pooled.
    embedding: Vec<f32>,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rank")
            .field("rank", &self.me)
            .field("spec", self.model.spec())
            .finish()
    }
}

impl Rank {
    /// Loads rank `me`'s shard of `file` as `a` assigns it.
    pub fn prepare(file: &GgufFile, a: &Assignment, me: usize) -> Result<Shard> {
        let rp = a
            .plan
            .ranks
            .get(me)
            .ok_or_else(|| Error::Protocol(format!("the plan has no rank {me}")))?;
        let len = file.file_len();
        if len != a.model_bytes {
            return Err(Error::Protocol(format!(
                "this rank's model file has {len} bytes, rank 0's has {}: not the same model",
                a.model_bytes
            )));
        }
        let mut model = Model::load(file, rp.spec.clone())?;
        model.set_flavour(a.flavour()?);
        let caches = (0..a.max_seqs.max(1))
            .map(|_| model.new_cache(a.n_ctx))
            .collect::<strata_engine::Result<Vec<_>>>()?;
        Ok(Shard {
            model,
            caches,
            threads: a.threads.max(1),
        })
    }

    /// A rank from its loaded shard and its links.
    pub fn new(comm: Communicator, shard: Shard, plan: &Plan) -> Result<Rank> {
        let me = comm.rank();
        if plan.world() != comm.world() {
            return Err(Error::Protocol(format!(
                "a plan for {} ranks in a mesh of {}",
                plan.world(),
                comm.world()
            )));
        }
        Ok(Rank {
            targets: Rank::next_stage_targets(plan, me),
            me,
            plan: plan.clone(),
            comm,
            model: shard.model,
            pool: ThreadPool::new(shard.threads),
            caches: shard.caches,
            scratch: Scratch::default(),
            step: Header::default(),
            hidden: Vec::new(),
            bytes: Vec::new(),
            local: Vec::new(),
            rows: Vec::new(),
            pick: Vec::new(),
            in_flight: 0,
            max_in_flight: 0,
            blocks: HashMap::new(),
            embedding: Vec::new(),
        })
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// The shard.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The links (for traffic statistics).
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// Mutable links.
    pub fn comm_mut(&mut self) -> &mut Communicator {
        &mut self.comm
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn stage(&self) -> usize {
        self.plan.ranks[self.me].stage
    }

    fn is_last_stage(&self) -> bool {
        self.stage() + 1 == self.plan.stages.len()
    }

    /// Where this rank's steps come from.
    fn source(&self) -> usize {
        let s = self.stage();
        if s == 0 {
            return 0;
        }
        let pos = self.position();
        let prev = &self.plan.stages[s - 1];
        prev[pos % prev.len()]
    }

    fn position(&self) -> usize {
        let g = &self.plan.stages[self.stage()];
        g.iter().position(|&r| r == self.me).unwrap_or(0)
    }

    /// Ranks of the next stage this rank feeds.
    fn next_stage_targets(plan: &Plan, me: usize) -> Vec<usize> {
        let s = plan.ranks[me].stage;
        let size = plan.stages[s].len();
        let pos = plan.stages[s].iter().position(|&r| r == me).unwrap_or(0);
        plan.stages.get(s + 1).map_or_else(Vec::new, |next| {
            next.iter()
                .enumerate()
                .filter(|(k, _)| k % size == pos)
                .map(|(_, &r)| r)
                .collect()
        })
    }

    /// Sends the step's header and its `rows` hidden states to the next stage.
    fn pass_on(&mut self, rows: usize) -> Result<()> {
        self.step.encode(&mut self.bytes);
        let n = rows * self.model.config().n_embd;
        let hidden: &[u8] = bytemuck::cast_slice(&self.scratch.hidden()[..n]);
        let len = (self.bytes.len() as u32).to_le_bytes();
        for &t in &self.targets {
            self.comm.post_send(t, &[&len, &self.bytes, hidden])?;
        }
        self.comm.wait()?;
        Ok(())
    }

    /// Runs the batch in `self.step`: one token for each listed sequence, as one forward pass
    /// whose exchanges carry every row; passes the hidden states on, or (last stage) each row's
    /// candidates back to rank 0 in one message.
    fn run_batch(&mut self) -> Result<()> {
        let h = &self.step;
        let n = h.seqs.len();
        self.pick.clear();
        for (&seq, &pos) in h.seqs.iter().zip(&h.poss) {
            let (seq, pos) = (seq as usize, pos as usize);
            let cache = self
                .caches
                .get_mut(seq)
                .ok_or_else(|| Error::Protocol(format!("sequence slot {seq} does not exist")))?;
            cache.truncate(pos);
            if cache.len() != pos {
                return Err(Error::Protocol(format!(
                    "a batch step at position {pos} but slot {seq} holds {}",
                    cache.len()
                )));
            }
            self.pick.push(seq);
        }
        let stage = self.plan.ranks[self.me].stage;
        let input = if stage == 0 {
            StageInput::Tokens(&h.tokens)
        } else {
            StageInput::Hidden(&self.hidden)
        };
        let mut gc = GroupComm {
            comm: &mut self.comm,
            group: &self.plan.stages[stage],
            parts: &self.plan.parts[stage],
        };
        // A slot named twice is refused there.
        self.model.forward_batch_slots(
            &self.pool,
            &mut self.caches,
            &self.pick,
            &mut self.scratch,
            input,
            &mut gc,
        )?;
        if !self.is_last_stage() {
            self.pass_on(n)?;
        } else if self.step.want {
            let offset = self.model.spec().vocab.start as u32;
            let logits = self.scratch.logits();
            let width = logits.len() / n.max(1);
            // Rows only grow: a warm batch of any size allocates nothing.
            if self.rows.len() < n {
                self.rows.resize_with(n, Vec::new);
            }
            for (row, out) in logits.chunks_exact(width).zip(self.rows.iter_mut()) {
                shard_candidates(&self.step.params, row, offset, &[], out);
            }
            self.apply_masks(n)?;
            if self.me != 0 {
                encode_candidate_rows(&self.rows[..n], &mut self.bytes);
                self.comm.send(0, &self.bytes)?;
            }
        }
        Ok(())
    }

    /// Keeps, in each masked row of the last batch's candidates, only the tokens its mask allows.
    fn apply_masks(&mut self, n: usize) -> Result<()> {
        let h = &self.step;
        if h.masked.is_empty() {
            return Ok(());
        }
        let words = self.model.config().n_vocab.div_ceil(32);
        let rows = h.masked.iter().filter(|&&m| m != 0).count();
        if h.masks.len() != rows * words {
            return Err(Error::Protocol(format!(
                "{} mask words for {rows} rows of {words}",
                h.masks.len()
            )));
        }
        let mut at = 0;
        for (flag, out) in h.masked.iter().zip(&mut self.rows[..n]) {
            if *flag == 0 {
                continue;
            }
            let mask = &h.masks[at..at + words];
            at += words;
            out.retain(|&(id, _)| strata_engine::mask_allows(mask, id as usize));
        }
        Ok(())
    }

    /// Runs the step in `self.step` (with `self.hidden` as input on later stages) and passes
    /// its result on.
    fn run_step(&mut self) -> Result<()> {
        match self.step.kind {
            Kind::Batch => return self.run_batch(),
            Kind::Embed => return self.run_embed(),
            _ => {}
        }
        let h = &self.step;
        let seq = h.seq as usize;
        let cache = self
            .caches
            .get_mut(seq)
            .ok_or_else(|| Error::Protocol(format!("sequence slot {seq} does not exist")))?;
        cache.truncate(h.pos0 as usize);
        if cache.len() != h.pos0 as usize {
            return Err(Error::Protocol(format!(
                "step at position {} but the cache holds {}",
                h.pos0,
                cache.len()
            )));
        }
        let input = if self.plan.ranks[self.me].stage == 0 {
            StageInput::Tokens(&h.tokens)
        } else {
            StageInput::Hidden(&self.hidden)
        };
        let stage = self.plan.ranks[self.me].stage;
        let mut gc = GroupComm {
            comm: &mut self.comm,
            group: &self.plan.stages[stage],
            parts: &self.plan.parts[stage],
        };
        self.model
            .forward(&self.pool, cache, &mut self.scratch, input, &mut gc)?;
        if !self.is_last_stage() {
            self.pass_on(self.step.tokens.len())?;
        } else if self.step.want {
            let offset = self.model.spec().vocab.start as u32;
            shard_candidates(
                &self.step.params,
                self.scratch.logits(),
                offset,
                &self.step.history,
                &mut self.local,
            );
            if self.me != 0 {
                encode_candidates(&self.local, &mut self.bytes);
                self.comm.send(0, &self.bytes)?;
            }
        }
        Ok(())
    }

    /// Runs the embedding pass in `self.step` through this rank's layers, in a cache of its
    /// own (no slot is touched), and passes the hidden states on; the last stage's first rank
    /// pools the normed states and sends the vector to rank 0 (the other ranks of a tensor
    /// group hold the same rows and send nothing).
    fn run_embed(&mut self) -> Result<()> {
        let h = &self.step;
        let n = h.tokens.len();
        let pooling = strata_engine::embed::Pooling::from_gguf_code(h.seq)
            .ok_or_else(|| Error::Protocol(format!("unknown pooling {}", h.seq)))?;
        let mut cache = self.model.new_cache(n.max(1))?;
        let stage = self.stage();
        let input = if stage == 0 {
            StageInput::Tokens(&h.tokens)
        } else {
            StageInput::Hidden(&self.hidden)
        };
        let mut gc = GroupComm {
            comm: &mut self.comm,
            group: &self.plan.stages[stage],
            parts: &self.plan.parts[stage],
        };
        self.model
            .embed_stage(&self.pool, &mut cache, &mut self.scratch, input, &mut gc)?;
        if !self.is_last_stage() {
            return self.pass_on(n);
        }
        if self.position() != 0 {
            return Ok(());
        }
        let v = strata_engine::embed::pool_states(
            self.scratch.embeddings(),
            self.model.config().n_embd,
            pooling,
            self.model.flavour(),
        )?;
        if self.me == 0 {
            self.embedding = v;
        } else {
            self.comm.send(0, bytemuck::cast_slice(&v))?;
        }
        Ok(())
    }

    /// Rank 0: the embedding of `tokens` (a text computed alone, in no slot, on every rank),
    /// pooled as `pooling` says and not yet normalised, bit for bit what one process computes
    /// ([`strata_engine::Batch::embed`]). Nothing may be in flight: the last stage answers in
    /// order, and this waits for its answer.
    pub fn embed(
        &mut self,
        tokens: &[u32],
        pooling: strata_engine::embed::Pooling,
    ) -> Result<Vec<f32>> {
        // Checked here, before any rank sees it: a worker that failed on its input would leave
        // the instance out of step.
        let cfg = self.model.config();
        if tokens.is_empty() {
            return Err(strata_engine::Error::EmptyPrompt.into());
        }
        if tokens.len() > self.n_ctx() {
            return Err(strata_engine::Error::ContextOverflow {
                needed: tokens.len(),
                limit: self.n_ctx(),
            }
            .into());
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= cfg.n_vocab) {
            return Err(strata_engine::Error::BadToken {
                id,
                vocab: cfg.n_vocab,
            }
            .into());
        }
        let width = cfg.n_embd;
        let h = &mut self.step;
        h.kind = Kind::Embed;
        h.seq = pooling.gguf_code();
        h.pos0 = 0;
        h.want = true;
        h.tokens.clear();
        h.tokens.extend_from_slice(tokens);
        h.history.clear();
        self.broadcast_header()?;
        self.run_embed()?;
        let last = &self.plan.stages[self.plan.stages.len() - 1];
        let from = last[0];
        if from == 0 {
            return Ok(std::mem::take(&mut self.embedding));
        }
        let payload = self.comm.recv(from)?;
        if payload.len() != width * 4 {
            return Err(Error::Protocol(format!(
                "an embedding of {} bytes from rank {from}, not {}",
                payload.len(),
                width * 4
            )));
        }
        Ok(payload
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Receives the next step from this rank's source; returns false on shutdown (after passing
    /// the shutdown on).
    fn receive(&mut self) -> Result<bool> {
        let src = self.source();
        let first_stage = self.stage() == 0;
        let payload = self.comm.recv(src)?;
        let (hdr, rest) = if first_stage {
            (payload, &[][..])
        } else {
            if payload.len() < 4 {
                return Err(Error::Protocol("short stage message".into()));
            }
            let n = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
            if payload.len() < 4 + n {
                return Err(Error::Protocol("short stage message".into()));
            }
            (&payload[4..4 + n], &payload[4 + n..])
        };
        self.step.decode(hdr)?;
        if !rest.len().is_multiple_of(4) {
            return Err(Error::Protocol("hidden states of odd length".into()));
        }
        self.hidden.clear();
        self.hidden.extend(
            rest.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(self.step.kind != Kind::Shutdown)
    }

    /// Applies the prefix-cache message in `self.step` to this rank's slice; returns how many
    /// blocks a restore brought in (it stops at the first it cannot).
    fn apply_control(&mut self) -> Result<usize> {
        let h = &self.step;
        let seq = h.seq as usize;
        let ids = ids_from_words(&h.tokens)?;
        let no_slot = || Error::Protocol(format!("sequence slot {seq} does not exist"));
        match h.kind {
            Kind::Restore => {
                let cache = self.caches.get_mut(seq).ok_or_else(no_slot)?;
                cache.truncate(h.pos0 as usize);
                Ok(ids
                    .iter()
                    .take_while(|id| self.blocks.get(id).is_some_and(|b| cache.append_block(b)))
                    .count())
            }
            Kind::Save => {
                let start = h.pos0 as usize;
                let data = self
                    .caches
                    .get(seq)
                    .ok_or_else(no_slot)?
                    .save_block(start, BLOCK);
                let (Some(data), [id]) = (data, &ids[..]) else {
                    return Err(Error::Protocol(format!(
                        "cannot keep positions {start}.. of slot {seq} as a block"
                    )));
                };
                self.blocks.insert(*id, data);
                Ok(1)
            }
            Kind::Forget => {
                for id in &ids {
                    self.blocks.remove(id);
                }
                Ok(ids.len())
            }
            _ => Ok(0),
        }
    }

    /// Rank 0: sends the prefix-cache message in `self.step` to every rank and applies it here.
    fn control(&mut self) -> Result<usize> {
        self.broadcast_header()?;
        self.forward_header()?;
        self.apply_control()
    }

    /// Rank 0: cuts slot `seq` to `keep` positions on every rank and brings in the cached
    /// blocks `ids` after them, in order; returns how many were (it stops at the first that
    /// cannot be, and every rank brings in the same).
    pub fn restore_blocks(&mut self, seq: usize, keep: usize, ids: &[u64]) -> Result<usize> {
        // Here first: the other ranks are told only what this rank could bring in.
        let h = &mut self.step;
        h.kind = Kind::Restore;
        h.seq = seq as u32;
        h.pos0 = keep as u32;
        ids_to_words(ids, &mut h.tokens);
        let n = self.apply_control()?;
        ids_to_words(&ids[..n], &mut self.step.tokens);
        self.broadcast_header()?;
        self.forward_header()?;
        Ok(n)
    }

    /// Rank 0: every rank keeps positions `start..start + BLOCK` of slot `seq` as cached
    /// block `id`.
    pub fn save_block(&mut self, seq: usize, start: usize, id: u64) -> Result<()> {
        let h = &mut self.step;
        h.kind = Kind::Save;
        h.seq = seq as u32;
        h.pos0 = start as u32;
        ids_to_words(&[id], &mut h.tokens);
        self.control().map(|_| ())
    }

    /// Rank 0: every rank drops cached blocks `ids`.
    pub fn forget_blocks(&mut self, ids: &[u64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let h = &mut self.step;
        h.kind = Kind::Forget;
        ids_to_words(ids, &mut h.tokens);
        self.control().map(|_| ())
    }

    /// Bytes of cached blocks this rank holds.
    pub fn block_bytes(&self) -> usize {
        self.blocks.values().map(|b| b.len() * 2).sum()
    }

    /// Sends the header in `self.step` alone to the next stage (a shutdown, or a prefix-cache
    /// message).
    fn forward_header(&mut self) -> Result<()> {
        self.step.encode(&mut self.bytes);
        let len = (self.bytes.len() as u32).to_le_bytes();
        for &t in &self.targets {
            self.comm.post_send(t, &[&len, &self.bytes])?;
        }
        self.comm.wait()?;
        Ok(())
    }

    /// The worker loop: runs steps until rank 0 shuts the instance down.
    pub fn serve(&mut self) -> Result<()> {
        loop {
            if !self.receive()? {
                return self.forward_header();
            }
            if self.step.kind.is_control() {
                self.forward_header()?;
                let wanted = self.step.tokens.len() / 2;
                let done = self.apply_control()?;
                if self.step.kind == Kind::Restore && done != wanted {
                    return Err(Error::Protocol(format!(
                        "rank {} restored {done} of {wanted} cached blocks into slot {}",
                        self.me, self.step.seq
                    )));
                }
                continue;
            }
            self.run_step()?;
        }
    }

    /// Rank 0: starts a step of `tokens` for sequence `seq` at position `pos0`. With `want`,
    /// [`Rank::collect`] must later be called to take its candidates.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        seq: usize,
        pos0: usize,
        tokens: &[u32],
        want: bool,
        params: &strata_engine::SamplingParams,
        history: &[u32],
    ) -> Result<()> {
        let h = &mut self.step;
        h.kind = Kind::Step;
        h.seq = seq as u32;
        h.pos0 = pos0 as u32;
        h.want = want;
        h.tokens.clear();
        h.tokens.extend_from_slice(tokens);
        h.params.clone_from(params);
        h.history.clear();
        let penalised = params.repeat_penalty != 1.0
            || params.presence_penalty != 0.0
            || params.frequency_penalty != 0.0;
        if penalised {
            h.history
                .extend_from_slice(&history[history.len().saturating_sub(params.penalty_last_n)..]);
        }
        self.broadcast_header()?;
        self.run_step()
    }

    /// Rank 0: starts one decode step for several sequences at once: `steps` lists each
    /// sequence's slot, the position its token goes to, and the token. Every row's candidates
    /// (under `params`, without penalties) come back through [`Rank::collect_batch`]; several
    /// batches may be in flight when the stages differ (a pipeline works on one while the
    /// next starts).
    pub fn submit_batch(
        &mut self,
        steps: &[(usize, usize, u32)],
        params: &strata_engine::SamplingParams,
    ) -> Result<()> {
        self.submit_batch_masked(steps, params, &[])
    }

    /// [`Rank::submit_batch`] with rows limited to the tokens a grammar allows: `masks[i]`
    /// (when given; `masks` may be empty) is row `i`'s bitset over the whole vocabulary (bit
    /// `t % 32` of word `t / 32` for token `t`). The last stage's ranks apply each to their
    /// vocabulary slice and send back only the allowed candidates, so a grammar costs bytes in
    /// proportion to what it allows instead of a full row.
    pub fn submit_batch_masked(
        &mut self,
        steps: &[(usize, usize, u32)],
        params: &strata_engine::SamplingParams,
        masks: &[Option<&[u32]>],
    ) -> Result<()> {
        if steps.is_empty() {
            return Err(Error::Protocol("an empty batch".into()));
        }
        let h = &mut self.step;
        h.kind = Kind::Batch;
        h.want = true;
        h.seq = 0;
        h.pos0 = 0;
        h.params.clone_from(params);
        h.history.clear();
        h.tokens.clear();
        h.seqs.clear();
        h.poss.clear();
        for &(seq, pos, token) in steps {
            h.seqs.push(seq as u32);
            h.poss.push(pos as u32);
            h.tokens.push(token);
        }
        h.masked.clear();
        h.masks.clear();
        if masks.iter().any(Option::is_some) {
            for i in 0..steps.len() {
                let m = masks.get(i).copied().flatten();
                h.masked.push(u32::from(m.is_some()));
                h.masks.extend_from_slice(m.unwrap_or(&[]));
            }
        }
        self.broadcast_header()?;
        let res = self.run_step();
        // The next single step's header carries no batch.
        self.step.seqs.clear();
        self.step.poss.clear();
        self.step.masked.clear();
        self.step.masks.clear();
        self.in_flight += 1;
        self.max_in_flight = self.max_in_flight.max(self.in_flight);
        res
    }

    /// Rank 0: the most batches that have been in flight at once (submitted, not collected).
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Rank 0: takes the candidates of the oldest batch submitted, one row per sequence in
    /// the order submitted: `out[..rows]` (`out` may be longer, and is never shortened).
    pub fn collect_batch(&mut self, rows: usize, out: &mut Vec<Vec<(u32, f32)>>) -> Result<()> {
        self.in_flight = self.in_flight.saturating_sub(1);
        // Rows only grow (a warm batch of any size allocates nothing); `out[..rows]` is this
        // batch's.
        if out.len() < rows {
            out.resize_with(rows, Vec::new);
        }
        let out = &mut out[..rows];
        for row in out.iter_mut() {
            row.clear();
        }
        let last = self.plan.stages.len() - 1;
        for i in 0..self.plan.stages[last].len() {
            let r = self.plan.stages[last][i];
            if r == 0 {
                if self.rows.len() < rows {
                    return Err(Error::Protocol("no batch of this size was run".into()));
                }
                for (o, mine) in out.iter_mut().zip(&self.rows[..rows]) {
                    o.extend_from_slice(mine);
                }
            } else {
                let payload = self.comm.recv(r)?;
                decode_candidate_rows(payload, out)?;
            }
        }
        Ok(())
    }

    /// Pipeline stages: how many batches may usefully be in flight at once.
    pub fn stages(&self) -> usize {
        self.plan.stages.len()
    }

    fn broadcast_header(&mut self) -> Result<()> {
        self.step.encode(&mut self.bytes);
        for &r in &self.plan.stages[0] {
            if r != 0 {
                self.comm.post_send(r, &[&self.bytes])?;
            }
        }
        self.comm.wait()?;
        Ok(())
    }

    /// Rank 0: takes the candidates of the oldest step submitted with `want`.
    pub fn collect(&mut self, out: &mut Vec<(u32, f32)>) -> Result<()> {
        out.clear();
        let last = self.plan.stages.len() - 1;
        for i in 0..self.plan.stages[last].len() {
            let r = self.plan.stages[last][i];
            if r == 0 {
                out.extend_from_slice(&self.local);
            } else {
                let payload = self.comm.recv(r)?;
                decode_candidates(payload, out)?;
            }
        }
        Ok(())
    }

    /// Rank 0: tells every rank to leave its serving loop.
    pub fn shutdown(&mut self) -> Result<()> {
        self.step.kind = Kind::Shutdown;
        self.step.tokens.clear();
        self.step.history.clear();
        self.broadcast_header()?;
        self.forward_header()
    }

    /// Number of KV cache slots.
    pub fn max_seqs(&self) -> usize {
        self.caches.len()
    }

    /// Context positions per sequence.
    pub fn n_ctx(&self) -> usize {
        self.caches.first().map_or(0, KvCache::capacity)
    }
}

/// Two ranks of one instance of `file` (at `model_path`) split by `plan`, in this process and
/// linked over shared memory, one thread each, with this CPU's numerics: rank 1 serves on a
/// thread of its own until rank 0 shuts the instance down, and rank 0 is returned to drive
/// it. For tests and measurements of the sharded path without starting processes.
pub fn local_pair(
    file: &GgufFile,
    model_path: &std::path::Path,
    plan: Plan,
    n_ctx: usize,
    max_seqs: usize,
) -> Result<(Rank, std::thread::JoinHandle<Result<()>>)> {
    let a = &Assignment {
        plan,
        model_path: model_path.to_path_buf(),
        model_bytes: file.file_len(),
        threads: 1,
        n_ctx,
        max_seqs,
        numerics: numerics_name(Flavour::native()).into(),
    };
    if a.plan.world() != 2 {
        return Err(Error::Protocol(format!(
            "a local pair needs a plan for 2 ranks, not {}",
            a.plan.world()
        )));
    }
    let (first, second) = strata_net::loopback_pair(strata_net::Transport::Shm)?;
    let worker = {
        let (a, file) = (a.clone(), file.clone());
        std::thread::spawn(move || -> Result<()> {
            let shard = Rank::prepare(&file, &a, 1)?;
            Rank::new(second, shard, &a.plan)?.serve()
        })
    };
    let rank = Rank::new(first, Rank::prepare(file, a, 0)?, &a.plan)?;
    Ok((rank, worker))
}
