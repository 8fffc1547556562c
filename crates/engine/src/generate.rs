//! What a generation asks and reports ([`GenerateRequest`], [`GenerationStats`]), and
//! [`Generator`]: one sequence on the whole model, for measuring prefill and decode speed and
//! for reading logits along a path (the benchmarks and the parity tests). Generating text goes
//! through [`crate::generate()`] on a [`crate::Sequences`] engine.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use strata_gguf::GgufFile;
use strata_kernels::ThreadPool;
use strata_tokenizer::{ChatTemplate, Tokenizer};

use crate::{Error, KvCache, Model, NoComm, Result, SamplingParams, Scratch, StageInput};

/// Prompt tokens processed per forward step during prefill (llama.cpp's default batch).
pub(crate) const PREFILL_BATCH: usize = 512;

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// Prompt token ids (BOS included if the model wants one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Keep generating past end-of-generation tokens (for benchmarks and tests).
    pub ignore_eos: bool,
    /// Where speculative drafts come from (off: one token per step). The output is the same
    /// either way (see [`crate::speculate`]).
    pub speculation: crate::speculate::Speculation,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    Eog,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context window is full.
    ContextFull,
    /// The caller's callback asked to stop.
    Cancelled,
    /// The output constraint (a tool call's or a JSON answer's grammar) is complete: it
    /// allows no further token.
    Complete,
}

impl StopReason {
    /// The stop rule of every generation loop (the one-shot generator and the batching
    /// scheduler), applied after each token: an end-of-generation token or a complete
    /// constraint ends the sequence, then the token budget, then the context window.
    /// `tokens_in_context` counts the prompt and every token generated; `None`: it goes on.
    pub fn after_token(
        eog: bool,
        constraint_done: bool,
        generated: usize,
        max_tokens: usize,
        tokens_in_context: usize,
        n_ctx: usize,
    ) -> Option<StopReason> {
        if eog {
            Some(StopReason::Eog)
        } else if constraint_done {
            Some(StopReason::Complete)
        } else if generated >= max_tokens {
            Some(StopReason::MaxTokens)
        } else if tokens_in_context >= n_ctx {
            Some(StopReason::ContextFull)
        } else {
            None
        }
    }

    /// Whether the sequence ran out of room (the budget or the context window; OpenAI's
    /// `length`) rather than ending by itself (`stop`).
    pub fn is_length(self) -> bool {
        matches!(self, StopReason::MaxTokens | StopReason::ContextFull)
    }
}

/// Timing and counts of one generation.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (including a final end-of-generation token).
    pub completion_tokens: usize,
    /// Time from the start to the first generated token, in milliseconds.
    pub ttft_ms: f64,
    /// Prompt tokens per second.
    pub prefill_tok_s: f64,
    /// Generated tokens per second after the first.
    pub decode_tok_s: f64,
    /// Why generation ended.
    pub stop_reason: StopReason,
    /// Bytes of weights each decode step read on average, measured (a mixture of experts
    /// reads only the experts its tokens chose); absent where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_bytes_per_token: Option<f64>,
    /// Speculative decoding: tokens drafted, and how many of them the model accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationStats>,
}

/// What speculative decoding did for one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SpeculationStats {
    /// Tokens drafted.
    pub drafted: u64,
    /// Drafted tokens the model accepted (each a decode step saved).
    pub accepted: u64,
    /// Verification passes (steps that scored a draft).
    pub verified_steps: u64,
}

impl GenerationStats {
    /// Statistics from counts and times in seconds: `ttft_s` to the first token, `prefill_s`
    /// for the prompt, `decode_s` for the tokens after the first.
    pub fn from_timing(
        prompt_tokens: usize,
        completion_tokens: usize,
        ttft_s: f64,
        prefill_s: f64,
        decode_s: f64,
        stop_reason: StopReason,
    ) -> GenerationStats {
        let decoded = completion_tokens.saturating_sub(1);
        GenerationStats {
            prompt_tokens,
            completion_tokens,
            ttft_ms: ttft_s * 1e3,
            prefill_tok_s: prompt_tokens as f64 / prefill_s.max(1e-9),
            decode_tok_s: if decoded > 0 {
                decoded as f64 / decode_s.max(1e-9)
            } else {
                0.0
            },
            stop_reason,
            weight_bytes_per_token: None,
            speculation: None,
        }
    }
}

/// A model ready to generate: weights, tokenizer, chat template, threads and cache.
pub struct Generator {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    pool: ThreadPool,
    cache: KvCache,
    scratch: Scratch,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("config", self.model.config())
            .field("threads", &self.pool.n_threads())
            .field("n_ctx", &self.cache.capacity())
            .finish()
    }
}

impl Generator {
    /// Loads the model at `path` with `threads` compute threads and a context of `n_ctx`
    /// positions (default: [`crate::ModelConfig::default_context`]).
    pub fn load(path: &Path, threads: usize, n_ctx: Option<usize>) -> Result<Generator> {
        let file = GgufFile::open(path)?;
        let crate::Ready {
            engine: model,
            tokenizer,
            template,
        } = crate::Ready::load(&file, None, None)?;
        let n_ctx = n_ctx.unwrap_or(model.config().default_context()).max(1);
        let cache = model.new_cache(n_ctx)?;
        Ok(Generator {
            model,
            tokenizer,
            template,
            pool: ThreadPool::new(threads),
            cache,
            scratch: Scratch::default(),
        })
    }

    /// Which llama.cpp build's arithmetic to reproduce (see [`Model::set_flavour`]).
    pub fn set_flavour(&mut self, flavour: strata_kernels::attn::Flavour) {
        self.model.set_flavour(flavour);
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// A shared handle to the tokenizer (for decoding while generating).
    pub fn tokenizer_shared(&self) -> Arc<Tokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// The chat template, if the model has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// Uses `template` in place of the model's own (or for a model without one).
    pub fn set_template(&mut self, template: ChatTemplate) {
        self.template = Some(template);
    }

    /// Context size in tokens.
    pub fn n_ctx(&self) -> usize {
        self.cache.capacity()
    }

    /// Runs the prompt and returns the logits of its last token (for tests and tools).
    pub fn prompt_logits(&mut self, prompt: &[u32]) -> Result<Vec<f32>> {
        self.prefill(prompt)?;
        Ok(self.scratch.logits().to_vec())
    }

    /// Appends one token to the sequence started by [`Generator::prompt_logits`] and returns the
    /// logits that follow it (the same computation as a decode step).
    pub fn decode_logits(&mut self, token: u32) -> Result<&[f32]> {
        if self.cache.len() >= self.cache.capacity() {
            return Err(Error::ContextOverflow {
                needed: self.cache.len() + 1,
                limit: self.cache.capacity(),
            });
        }
        self.model.forward(
            &self.pool,
            &mut self.cache,
            &mut self.scratch,
            StageInput::Tokens(&[token]),
            &mut NoComm,
        )?;
        Ok(self.scratch.logits())
    }

    /// Times one prefill of `prompt` from an empty cache (llama-bench's `pp` test).
    pub fn time_prefill(&mut self, prompt: &[u32]) -> Result<std::time::Duration> {
        self.time_prefill_at(&[], prompt)
    }

    /// Times the prefill of `prompt` after an untimed prefill of `context` (llama-bench's `pp`
    /// test at depth `context.len()`, `-d`).
    pub fn time_prefill_at(
        &mut self,
        context: &[u32],
        prompt: &[u32],
    ) -> Result<std::time::Duration> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.start_at(context, prompt.len())?;
        let start = Instant::now();
        self.feed(prompt)?;
        Ok(start.elapsed())
    }

    /// Times `n` single-token steps from an empty cache, each fed the next of `tokens` (cycled):
    /// llama-bench's `tg` test.
    pub fn time_decode(&mut self, tokens: &[u32], n: usize) -> Result<std::time::Duration> {
        self.time_decode_at(&[], tokens, n)
    }

    /// Times `n` single-token steps after an untimed prefill of `context` (llama-bench's `tg`
    /// test at depth `context.len()`, `-d`).
    pub fn time_decode_at(
        &mut self,
        context: &[u32],
        tokens: &[u32],
        n: usize,
    ) -> Result<std::time::Duration> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.start_at(context, n)?;
        let start = Instant::now();
        for i in 0..n {
            self.decode_logits(tokens[i % tokens.len()])?;
        }
        Ok(start.elapsed())
    }

    /// Starts a sequence with `context` (possibly empty), checking that `more` positions fit
    /// after it.
    fn start_at(&mut self, context: &[u32], more: usize) -> Result<()> {
        let needed = context.len() + more;
        if needed > self.cache.capacity() {
            return Err(Error::ContextOverflow {
                needed,
                limit: self.cache.capacity(),
            });
        }
        self.cache.clear();
        self.feed(context)
    }

    /// Measures the memory read bandwidth this generator's threads reach (bytes per second).
    pub fn memory_bandwidth(&self) -> f64 {
        strata_kernels::membw::read_bandwidth(&self.pool, 512 << 20, 3)
    }

    fn prefill(&mut self, prompt: &[u32]) -> Result<()> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if prompt.len() >= self.cache.capacity() {
            return Err(Error::ContextOverflow {
                needed: prompt.len() + 1,
                limit: self.cache.capacity(),
            });
        }
        self.cache.clear();
        self.feed(prompt)
    }

    /// Appends `tokens` to the sequence in prefill batches.
    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        for chunk in tokens.chunks(PREFILL_BATCH) {
            self.model.forward(
                &self.pool,
                &mut self.cache,
                &mut self.scratch,
                StageInput::Tokens(chunk),
                &mut NoComm,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::StopReason;

    #[test]
    fn the_stop_rule_ends_on_eog_then_the_constraint_then_the_budget_then_the_context() {
        let after = StopReason::after_token;
        assert_eq!(after(false, false, 3, 8, 10, 16), None);
        assert_eq!(after(true, true, 8, 8, 16, 16), Some(StopReason::Eog));
        assert_eq!(after(false, true, 8, 8, 16, 16), Some(StopReason::Complete));
        assert_eq!(
            after(false, false, 8, 8, 16, 16),
            Some(StopReason::MaxTokens)
        );
        assert_eq!(
            after(false, false, 3, 8, 16, 16),
            Some(StopReason::ContextFull)
        );
        assert!(StopReason::MaxTokens.is_length() && StopReason::ContextFull.is_length());
        assert!(!StopReason::Eog.is_length() && !StopReason::Complete.is_length());
        assert!(!StopReason::Cancelled.is_length());
    }
}
