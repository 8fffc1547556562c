//! Rank 0's generation loop over a sharded model: the same requests, streaming and statistics as
//! the single-process [`strata_engine::Generator`], and (for greedy decoding) the same tokens.

use std::time::{Duration, Instant};

use strata_engine::{GenerateRequest, GenerationStats, Sampler, StopReason};
use strata_tokenizer::{ChatTemplate, Tokenizer};

use crate::rank::Rank;
use crate::{Error, Result};

/// Prompt tokens per prefill step (as in the single-process engine).
const PREFILL_BATCH: usize = 512;

/// Communication figures of the last generation, seen from rank 0.
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

/// Rank 0 of a sharded model, with the tokenizer and chat template.
pub struct ShardedGenerator {
    rank: Rank,
    tokenizer: std::sync::Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    cands: Vec<(u32, f32)>,
    last_comm: CommFigures,
}

impl std::fmt::Debug for ShardedGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedGenerator")
            .field("rank", &self.rank)
            .finish()
    }
}

impl ShardedGenerator {
    /// Wraps rank 0.
    pub fn new(
        rank: Rank,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
    ) -> Result<ShardedGenerator> {
        if rank.rank() != 0 {
            return Err(Error::Protocol("only rank 0 drives generation".into()));
        }
        Ok(ShardedGenerator {
            rank,
            tokenizer: std::sync::Arc::new(tokenizer),
            template,
            cands: Vec::new(),
            last_comm: CommFigures::default(),
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// A shared handle to the tokenizer.
    pub fn tokenizer_shared(&self) -> std::sync::Arc<Tokenizer> {
        std::sync::Arc::clone(&self.tokenizer)
    }

    /// The chat template.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// Uses `template` in place of the model's own (or for a model without one).
    pub fn set_template(&mut self, template: ChatTemplate) {
        self.template = Some(template);
    }

    /// Rank 0.
    pub fn rank(&self) -> &Rank {
        &self.rank
    }

    /// Communication figures of the last [`ShardedGenerator::generate`].
    pub fn last_comm(&self) -> CommFigures {
        self.last_comm
    }

    /// Tells every rank to stop serving.
    pub fn shutdown(&mut self) -> Result<()> {
        self.rank.shutdown()
    }

    fn prefill(&mut self, seq: usize, prompt: &[u32], req: &GenerateRequest) -> Result<()> {
        if prompt.is_empty() {
            return Err(strata_engine::Error::EmptyPrompt.into());
        }
        if prompt.len() >= self.rank.n_ctx() {
            return Err(strata_engine::Error::ContextOverflow {
                needed: prompt.len() + 1,
                limit: self.rank.n_ctx(),
            }
            .into());
        }
        let chunks = prompt.len().div_ceil(PREFILL_BATCH);
        for (i, chunk) in prompt.chunks(PREFILL_BATCH).enumerate() {
            let last = i + 1 == chunks;
            self.rank
                .submit(seq, i * PREFILL_BATCH, chunk, last, &req.sampling, prompt)?;
        }
        Ok(())
    }

    /// Generates a continuation of `req.prompt`, calling `on_token` with each new token.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<GenerationStats> {
        req.sampling.validate().map_err(|m| {
            strata_engine::Error::InvalidModel(format!("invalid sampling parameters: {m}"))
        })?;
        let start = Instant::now();
        self.prefill(0, &req.prompt, req)?;
        self.rank.collect(&mut self.cands)?;
        let prefill_s = start.elapsed().as_secs_f64();

        let mut sampler = Sampler::new(req.sampling.clone());
        let mut history = req.prompt.clone();
        let mut generated = 0usize;
        let mut ttft = None;
        let mut decode_start = Instant::now();
        let n_ctx = self.rank.n_ctx();
        let mut comm_start = self.rank.comm().stats();
        let stop = loop {
            if generated >= req.max_tokens {
                break StopReason::MaxTokens;
            }
            let tok = sampler.sample_candidates(&mut self.cands, &history);
            generated += 1;
            history.push(tok);
            if ttft.is_none() {
                ttft = Some(start.elapsed().as_secs_f64());
                decode_start = Instant::now();
                comm_start = self.rank.comm().stats();
            }
            if !on_token(tok) {
                break StopReason::Cancelled;
            }
            if !req.ignore_eos && self.tokenizer.is_eog(tok) {
                break StopReason::Eog;
            }
            if generated >= req.max_tokens {
                break StopReason::MaxTokens;
            }
            let pos = history.len() - 1;
            if pos >= n_ctx {
                break StopReason::ContextFull;
            }
            self.rank
                .submit(0, pos, &[tok], true, &req.sampling, &history)?;
            self.rank.collect(&mut self.cands)?;
        };
        let decode_s = decode_start.elapsed().as_secs_f64();
        let decoded = generated.saturating_sub(1);
        let c = self.rank.comm().stats();
        self.last_comm = CommFigures {
            messages: c.messages - comm_start.messages,
            bytes: c.bytes - comm_start.bytes,
            wait_us_per_token: if decoded > 0 {
                (c.wait - comm_start.wait).as_secs_f64() * 1e6 / decoded as f64
            } else {
                0.0
            },
        };
        Ok(GenerationStats::from_timing(
            req.prompt.len(),
            generated,
            ttft.unwrap_or(prefill_s),
            prefill_s,
            decode_s,
            stop,
        ))
    }

    /// Times one prefill of `prompt` (llama-bench's `pp`).
    pub fn time_prefill(&mut self, prompt: &[u32]) -> Result<Duration> {
        let req = GenerateRequest {
            prompt: prompt.to_vec(),
            max_tokens: 1,
            sampling: Default::default(),
            ignore_eos: false,
        };
        let start = Instant::now();
        self.prefill(0, prompt, &req)?;
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
}
