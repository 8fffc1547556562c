//! Continuous batching: one engine thread owns the model and a fixed number of sequence slots.
//! Between decode steps it admits waiting requests into free slots (prefilling each prompt), then
//! advances every live sequence by one token in a single batched forward pass, so the weights are
//! read once per step for the whole batch. Finished and abandoned sequences leave at once.
//!
//! Requests reach the thread through a bounded queue (a full queue is the caller's 429); tokens
//! go back through a channel per request. A request whose receiver is gone (the client hung up,
//! or a stop sequence matched) is dropped before the next step.
//!
//! Nothing here knows HTTP: the API server turns requests into [`Job`]s and the [`Event`]s back
//! into its dialects' answers, and [`Metrics`] are what it serves at `/metrics`.
#![warn(missing_docs)]

use std::sync::Arc;
use std::time::Instant;

use strata_engine::embed::Pooling;
use strata_engine::prefix::{BLOCK, Partition, REUSABLE_STEP};
use strata_engine::speculate::{NgramDrafter, SharedAnswers, Speculation};
use strata_engine::{Sampler, SamplingParams, SlotId, StopReason};

use strata_engine::{EngineError, Sequences, StepKind};
use strata_tokenizer::Tokenizer;
use tokio::sync::mpsc;

mod metrics;
pub use metrics::{Metrics, RequestLabels};

mod overlap;
mod speculative;

/// Why a [`Constraint`] cannot go on: the implementation's own error, told to the request.
pub type ConstraintError = Box<dyn std::error::Error + Send + Sync>;

/// A decoding constraint (a grammar): it masks the tokens the grammar forbids before each
/// sample and follows the sampled token.
pub trait Constraint: Send {
    /// Sets the logits of forbidden tokens to -inf.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError>;
    /// Follows the sampled token; returns `true` when the grammar is complete and generation
    /// must end.
    fn commit(&mut self, token: u32) -> Result<bool, ConstraintError>;
    /// Up to `max` of the tokens the grammar allows no choice over from here (followed
    /// already, as if committed), and whether the grammar is then complete. Empty when there is
    /// a choice.
    fn forced(&mut self, _max: usize) -> Result<(Vec<u32>, bool), ConstraintError> {
        Ok((Vec::new(), false))
    }
}

/// Log-probability of a generated token and of the most likely alternatives.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    /// The chosen token's log-probability.
    pub logprob: f32,
    /// The `top` most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// What the engine thread tells a request.
#[derive(Debug)]
pub enum Event {
    /// A generated token (end-of-generation tokens are not sent).
    Token {
        /// Token id.
        id: u32,
        /// Log-probabilities, when asked for.
        logprob: Option<TokenLogprob>,
    },
    /// Generation ended.
    Done {
        /// Why.
        finish: StopReason,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (including an end-of-generation token).
        completion_tokens: usize,
    },
    /// The request has a slot; `cached` of its prompt tokens were restored from earlier
    /// requests instead of computed (sent before any token).
    Admitted {
        /// Prompt tokens restored.
        cached: usize,
    },
    /// The engine failed on this request.
    Failed(String),
    /// The request's own grammar gave up (a limit of the grammar compiler, or a dead end it
    /// leads into): the request's fault, not the server's.
    Refused(String),
    /// The prompt's embedding (pooled, not normalised), the answer to a job with
    /// [`Job::embed`].
    Embedding(Vec<f32>),
}

/// A request for the engine thread.
pub struct Job {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Alternatives to report per token (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
    /// A grammar the output must follow.
    pub constraint: Option<Box<dyn Constraint>>,
    /// Where tokens go.
    pub events: mpsc::UnboundedSender<Event>,
    /// When the request arrived (for time to first token).
    pub arrived: Instant,
    /// Whose cached prompt blocks it may reuse (see [`strata_engine::prefix`]).
    pub partition: Partition,
    /// Compute the prompt's embedding, pooled so, instead of generating: answered with one
    /// [`Event::Embedding`] without taking a slot.
    pub embed: Option<Pooling>,
    /// Where speculative drafts come from (see [`strata_engine::speculate`]): taken only by
    /// an engine that verifies drafts, for a request without a grammar or log-probabilities.
    /// The tokens are the same either way.
    pub speculation: strata_engine::speculate::Speculation,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("prompt_tokens", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("constrained", &self.constraint.is_some())
            .finish_non_exhaustive()
    }
}

/// The submitting side of the engine thread.
#[derive(Debug, Clone)]
pub struct Scheduler {
    tx: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    queue: usize,
    alive: Arc<std::sync::atomic::AtomicBool>,
}

/// Panics within this window that make the supervisor give up on the engine.
const PANIC_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
/// How many panics in [`PANIC_WINDOW`] the engine may have before it is given up.
const PANICS_ALLOWED: usize = 3;

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue holds this many jobs already.
    Full(usize),
    /// The engine thread has stopped.
    Stopped,
}

impl Scheduler {
    /// Starts the engine thread over `batch`; at most `queue` requests wait for a slot.
    pub fn start(
        batch: Box<dyn Sequences>,
        tokenizer: Arc<Tokenizer>,
        queue: usize,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Scheduler> {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let m = Arc::clone(&metrics);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = Arc::clone(&alive);
        std::thread::Builder::new()
            .name("strata-engine".into())
            .spawn(move || {
                supervise(batch, &tokenizer, rx, &m);
                flag.store(false, std::sync::atomic::Ordering::Release);
            })?;
        Ok(Scheduler {
            tx,
            metrics,
            queue: queue.max(1),
            alive,
        })
    }

    /// Whether the engine thread still runs (false once it gave up after repeated panics).
    pub fn is_alive(&self) -> bool {
        self.alive.load(std::sync::atomic::Ordering::Acquire) && !self.tx.is_closed()
    }

    /// Queues a job without waiting.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        match self.tx.try_send(job) {
            Ok(()) => {
                self.metrics.queue_depth.inc();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(SubmitError::Full(self.queue)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SubmitError::Stopped),
        }
    }
}

/// A sequence in a slot.
struct Seq {
    job: Job,
    slot: SlotId,
    sampler: Sampler,
    history: Vec<u32>,
    generated: usize,
    last: u32,
    last_at: Instant,
    /// Tokens the grammar forced after `last`, given out already and waiting to be run through
    /// the model in one pass.
    forced: Vec<u32>,
    /// Prompt tokens in the engine so far; the rest are run in later rounds.
    prefilled: usize,
    /// The tokens the grammar allows next, when computed before a decode step for an engine
    /// that limits rows to them (bit `t % 32` of word `t / 32`), and whether it holds for the
    /// row being sampled.
    allowed: Vec<u32>,
    premasked: bool,
    /// The sequence's drafts, when it speculates.
    drafter: Option<NgramDrafter>,
}

impl Drop for Seq {
    /// However a sequence ends (finished, cancelled, failed), what it generated joins the
    /// answers suffix drafts copy from, if it drafts from them.
    fn drop(&mut self) {
        if let Some(d) = &self.drafter {
            let start = self.job.prompt.len().min(self.history.len());
            d.record(&self.history[start..]);
        }
    }
}

impl Seq {
    /// How many of its next row's greatest logits this sequence's sampler reads: 1 when
    /// greedy, `top_k` under top-k sampling; `None` when anything reads the whole row
    /// (penalties, a grammar, log-probabilities, sampling without top-k).
    fn reads_top(&self) -> Option<usize> {
        if self.job.logprobs.is_some() || self.job.constraint.is_some() {
            None
        } else {
            self.job.sampling.reads_top()
        }
    }

    /// What follows a pass of tokens through the sequence's slot: with `sample`, the next token
    /// is sampled from its logits; a failed pass fails the request. Whether the sequence goes
    /// on (the caller frees the slot of one that does not).
    fn after_pass(
        &mut self,
        pass: Result<&mut [f32], EngineError>,
        sample: bool,
        tok: &Tokenizer,
        n_ctx: usize,
        m: &Metrics,
    ) -> bool {
        match pass {
            Ok(logits) => !sample || self.advance(logits, tok, n_ctx, m),
            Err(e) => {
                let _ = self.job.events.send(Event::Failed(e.to_string()));
                false
            }
        }
    }

    /// Computes the tokens the grammar allows next (for an engine that limits the row to them);
    /// `scratch` is a row of `vocab` logits to mask. Left unmarked when the grammar fails here
    /// (sampling then masks the row itself, and reports the failure).
    fn compute_allowed(&mut self, vocab: usize, scratch: &mut Vec<f32>) {
        self.premasked = false;
        let Some(c) = self.job.constraint.as_mut() else {
            return;
        };
        // A mask depends on the token ids only, never on the logits: masking a row of zeros
        // gives the allowed set.
        scratch.clear();
        scratch.resize(vocab, 0.0);
        if c.mask(scratch).is_err() {
            return;
        }
        self.allowed.clear();
        self.allowed.resize(vocab.div_ceil(32), 0);
        for (t, l) in scratch.iter().enumerate() {
            if *l != f32::NEG_INFINITY {
                strata_engine::mask_allow(&mut self.allowed, t);
            }
        }
        self.premasked = true;
    }

    /// Whether the sequence takes part in the next decode step: its prompt is in and no
    /// forced tokens wait for their own pass.
    fn decoding(&self) -> bool {
        self.forced.is_empty() && self.prefilled == self.job.prompt.len()
    }

    /// Samples the next token from `logits`, reports it, and says whether the sequence goes on.
    fn advance(&mut self, logits: &mut [f32], tok: &Tokenizer, n_ctx: usize, m: &Metrics) -> bool {
        if let Some(c) = self.job.constraint.as_mut() {
            let masked = if std::mem::take(&mut self.premasked) {
                apply_allowed(&self.allowed, logits);
                Ok(())
            } else {
                c.mask(logits)
            };
            if let Err(e) = masked {
                let _ = self
                    .job
                    .events
                    .send(Event::Refused(format!("grammar: {e}")));
                return false;
            }
            if logits.iter().all(|l| *l == f32::NEG_INFINITY) {
                let _ = self
                    .job
                    .events
                    .send(Event::Refused("grammar: no token is allowed here".into()));
                return false;
            }
        }
        let lp = self.job.logprobs.map(|top| logprobs(logits, top));
        let id = self.sampler.sample(logits, &self.history);
        let mut grammar_done = false;
        if let Some(c) = self.job.constraint.as_mut() {
            match c.commit(id) {
                Ok(done) => grammar_done = done,
                Err(e) => {
                    let _ = self
                        .job
                        .events
                        .send(Event::Refused(format!("grammar: {e}")));
                    return false;
                }
            }
        }
        if !self.emit(id, lp.map(|(chosen, top)| (chosen(id), top)), tok, m) {
            return false;
        }
        let eog = tok.is_eog(id);
        if self.finish(eog, grammar_done, n_ctx) {
            return false;
        }
        self.take_forced(tok, n_ctx, m)
    }

    /// Counts and reports a generated token (end-of-generation tokens are counted, not sent);
    /// `false` when the client is gone.
    fn emit(
        &mut self,
        id: u32,
        logprob: Option<(f32, Vec<(u32, f32)>)>,
        tok: &Tokenizer,
        m: &Metrics,
    ) -> bool {
        let now = Instant::now();
        if self.generated == 0 {
            m.ttft
                .observe(now.duration_since(self.job.arrived).as_secs_f64());
        } else {
            m.inter_token
                .observe(now.duration_since(self.last_at).as_secs_f64());
        }
        self.last_at = now;
        self.generated += 1;
        m.completion_tokens.inc();
        self.history.push(id);
        self.last = id;
        if self.job.events.is_closed() {
            return false;
        }
        if tok.is_eog(id) {
            return true;
        }
        let logprob = logprob.map(|(logprob, top)| TokenLogprob { logprob, top });
        self.job.events.send(Event::Token { id, logprob }).is_ok()
    }

    /// Ends the sequence by [`StopReason::after_token`]; `true` when it ended.
    fn finish(&mut self, eog: bool, grammar_done: bool, n_ctx: usize) -> bool {
        let finish = StopReason::after_token(
            eog,
            grammar_done,
            self.generated,
            self.job.max_tokens,
            self.job.prompt.len() + self.generated,
            n_ctx,
        );
        let Some(finish) = finish else {
            return false;
        };
        let _ = self.job.events.send(Event::Done {
            finish,
            prompt_tokens: self.job.prompt.len(),
            completion_tokens: self.generated,
        });
        true
    }

    /// Gives out the tokens the grammar now forces and queues them to run through the model in
    /// one pass, instead of a decode step each. Not taken when log-probabilities are asked for:
    /// forced tokens have no logits of their own. Returns whether the sequence goes on.
    fn take_forced(&mut self, tok: &Tokenizer, n_ctx: usize, m: &Metrics) -> bool {
        if self.job.logprobs.is_some() {
            return true;
        }
        let Some(c) = self.job.constraint.as_mut() else {
            return true;
        };
        let (forced, grammar_done) = match c.forced(MAX_FORCED) {
            Ok(f) => f,
            Err(e) => {
                let _ = self
                    .job
                    .events
                    .send(Event::Refused(format!("grammar: {e}")));
                return false;
            }
        };
        if forced.is_empty() {
            return true;
        }
        let n = forced.len();
        // The model has not seen the sampled token yet: it runs first, then the forced ones.
        let mut run = Vec::with_capacity(n + 1);
        run.push(self.last);
        run.extend_from_slice(&forced);
        for (i, &id) in forced.iter().enumerate() {
            if !self.emit(id, None, tok, m) {
                return false;
            }
            let last = i + 1 == n;
            if self.finish(tok.is_eog(id), last && grammar_done, n_ctx) {
                return false;
            }
        }
        self.forced = run;
        true
    }
}

/// Log-softmax of `logits`: a lookup for the chosen token, and the `top` best tokens.
#[allow(clippy::type_complexity)]
fn logprobs(logits: &[f32], top: usize) -> (Box<dyn Fn(u32) -> f32>, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let lse = max + sum.ln() as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() < top || l > best[best.len() - 1].1 {
                let at = best.partition_point(|b| b.1 >= l);
                best.insert(at, (i as u32, l));
                best.truncate(top);
            }
        }
    }
    let table: Vec<f32> = logits.iter().map(|&l| l - lse).collect();
    let best = best.into_iter().map(|(i, l)| (i, l - lse)).collect();
    (
        Box::new(move |id| table.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY)),
        best,
    )
}

/// Sets the logits of tokens outside `allowed` (bit `t % 32` of word `t / 32`) to minus
/// infinity.
fn apply_allowed(allowed: &[u32], logits: &mut [f32]) {
    for (t, l) in logits.iter_mut().enumerate() {
        if !strata_engine::mask_allows(allowed, t) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Most forced tokens run in one pass: a grammar may force thousands (a fixed string), and a
/// pass that long would stall every other sequence in the batch.
const MAX_FORCED: usize = 32;

/// Runs the tokens each sequence's grammar forced through the model, one pass per sequence,
/// and samples what follows. A sequence whose grammar then forces more waits for the next
/// round, after the other sequences' step. Sequences that end leave their slots.
fn run_forced(
    batch: &mut dyn Sequences,
    active: &mut Vec<Seq>,
    tok: &Tokenizer,
    n_ctx: usize,
    m: &Metrics,
) {
    active.retain_mut(|s| {
        if s.forced.is_empty() {
            return true;
        }
        let tokens = std::mem::take(&mut s.forced);
        let keep = s.after_pass(batch.extend(s.slot, &tokens), true, tok, n_ctx, m);
        if !keep {
            batch.release(s.slot);
        }
        keep
    });
}

/// Runs the engine loop and keeps it running through panics.
///
/// A panic (a bug, never client input, but a server must outlive bugs) fails every request in
/// flight with an error naming it, frees their slots, and the loop goes on with the same engine:
/// its state is per slot, and every slot is free again. Panics that keep coming
/// ([`PANICS_ALLOWED`] within [`PANIC_WINDOW`]) mean the engine itself is broken: the thread then
/// fails everything queued and stops, so `/health` says so and requests get 503. An engine that
/// cannot go on after a panic (a sharded one) stops at the first.
fn supervise(
    mut batch: Box<dyn Sequences>,
    tok: &Tokenizer,
    mut rx: mpsc::Receiver<Job>,
    m: &Metrics,
) {
    let mut recent: Vec<Instant> = Vec::new();
    let mut active: Vec<Seq> = Vec::new();
    // The recent answers suffix drafts copy from, kept across panics.
    let answers = SharedAnswers::default();
    loop {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(batch.as_mut(), tok, &mut rx, m, &mut active, &answers)
        }));
        let Err(panic) = ran else { return };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        m.engine_panics.inc();
        for s in active.drain(..) {
            let _ = s.job.events.send(Event::Failed(format!(
                "internal error in the engine ({what}); this request was stopped"
            )));
            // A second panic in the engine's own clean-up must not escape the supervisor.
            let slot = s.slot;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batch.release(slot)));
        }
        m.active_sequences.set(0);
        let now = Instant::now();
        recent.retain(|t| now.duration_since(*t) < PANIC_WINDOW);
        recent.push(now);
        if recent.len() >= PANICS_ALLOWED || !batch.survives_panic() {
            tracing::error!(
                "the engine panicked ({what}; {} time(s) within {} s); it is stopped and the \
                 server answers 503 until it is restarted",
                recent.len(),
                PANIC_WINDOW.as_secs()
            );
            rx.close();
            while let Ok(job) = rx.try_recv() {
                m.queue_depth.dec();
                let _ = job.events.send(Event::Failed(
                    "the engine stopped after repeated internal errors".into(),
                ));
            }
            return;
        }
        tracing::error!("the engine panicked ({what}); requests in flight failed, serving on");
    }
}

fn run(
    batch: &mut dyn Sequences,
    tok: &Tokenizer,
    rx: &mut mpsc::Receiver<Job>,
    m: &Metrics,
    active: &mut Vec<Seq>,
    answers: &SharedAnswers,
) {
    let n_ctx = batch.n_ctx();
    let mut steps: Vec<(SlotId, u32)> = Vec::new();
    // A row to compute grammar masks on (see `Seq::compute_allowed`).
    let mut mask_row: Vec<f32> = Vec::new();
    let mut drafts = speculative::Drafts::default();
    // A pipeline runs decode steps, prompt chunks and forced tokens of different sequences in
    // overlapped turns whenever there are two or more to run.
    let piped = batch.depth() > 1;
    loop {
        if piped && overlap::worth(active) {
            overlap::run(batch, active, rx, tok, m, &mut mask_row, answers);
            m.active_sequences.set(active.len() as i64);
            continue;
        }
        // Prompt tokens this round may run: long prompts go in chunks between the decode steps
        // of the sequences already generating, so their streams keep flowing.
        let mut spent = 0;
        continue_prefills(batch, active, &mut spent, tok, n_ctx, m);
        // Admit waiting requests into free slots; sleep only when nothing is running.
        while batch.free_slots() > 0 {
            let job = if active.is_empty() {
                match rx.blocking_recv() {
                    Some(j) => j,
                    None => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            admit(batch, job, active, m, answers);
            if piped && overlap::worth(active) {
                break;
            }
            // The new sequence's first chunk, if this round has room for it.
            continue_prefills(batch, active, &mut spent, tok, n_ctx, m);
        }
        if piped && overlap::worth(active) {
            continue;
        }
        // Blocks are kept only by prefill passes: nothing to show after a round without one.
        if spent > 0
            && let Some(stats) = batch.prefix_stats()
        {
            m.show_prefix_cache(&stats);
        }
        run_forced(batch, active, tok, n_ctx, m);
        active.retain(|s| {
            let gone = s.job.events.is_closed();
            if gone {
                batch.release(s.slot);
            }
            !gone
        });
        m.active_sequences.set(active.len() as i64);
        if let Some(stats) = batch.kv_stats() {
            m.show_kv(&stats);
        }
        if piped && overlap::worth(active) {
            continue;
        }
        steps.clear();
        // Sequences with forced tokens waiting take their own pass instead (next round), and
        // sequences still prefilling have nothing to decode yet.
        let idx: Vec<usize> = (0..active.len())
            .filter(|&i| active[i].decoding())
            .collect();
        steps.extend(idx.iter().map(|&i| (active[i].slot, active[i].last)));
        if steps.is_empty() {
            continue;
        }
        if speculative::round(batch, active, &idx, &mut drafts, tok, n_ctx, m) {
            m.active_sequences.set(active.len() as i64);
            continue;
        }
        let need = need(&*batch, active, &idx, &mut mask_row);
        let masks = masks(active, &idx, &need);
        let pass = batch.step_as(&steps, need.kind(&masks));
        match pass {
            Ok(logits) => {
                let vocab = logits.len() / steps.len();
                let mut i = 0;
                let mut ended = Vec::new();
                active.retain_mut(|s| {
                    if !s.decoding() {
                        return true;
                    }
                    let row = &mut logits[i * vocab..(i + 1) * vocab];
                    i += 1;
                    let keep = s.advance(row, tok, n_ctx, m);
                    if !keep {
                        ended.push(s.slot);
                    }
                    keep
                });
                for slot in ended {
                    batch.release(slot);
                }
            }
            Err(e) => fail_all(batch, active, &e),
        }
        m.active_sequences.set(active.len() as i64);
    }
}

/// Gives `job` a slot (with what the prefix cache holds of its prompt) and makes it a live
/// sequence, or fails it.
fn admit(
    batch: &mut dyn Sequences,
    job: Job,
    active: &mut Vec<Seq>,
    m: &Metrics,
    answers: &SharedAnswers,
) {
    m.queue_depth.dec();
    if job.events.is_closed() {
        return;
    }
    m.prompt_tokens.inc_by(job.prompt.len() as u64);
    if let Some(pooling) = job.embed {
        // Computed here, between two steps of the running sequences, in one pass.
        let answer = match batch.embed(&job.prompt, pooling) {
            Ok(v) => Event::Embedding(v),
            Err(e) => Event::Failed(e.to_string()),
        };
        let _ = job.events.send(answer);
        return;
    }
    // Drafts are verified by engines of one stage; a grammar's masks and log-probabilities
    // are decided per row by paths of their own.
    let speculates = job.speculation.drafts()
        && batch.verifies()
        && batch.depth() == 1
        && job.constraint.is_none()
        && job.logprobs.is_none();
    match batch.admit(&job.prompt, job.partition) {
        Ok((slot, cached)) => {
            m.cached_tokens.inc_by(cached as u64);
            let _ = job.events.send(Event::Admitted { cached });
            active.push(Seq {
                drafter: speculates.then(|| match job.speculation {
                    Speculation::Suffix => NgramDrafter::with_answers(answers.clone()),
                    _ => NgramDrafter::new(),
                }),
                sampler: Sampler::new(job.sampling.clone()),
                history: job.prompt.clone(),
                prefilled: cached,
                job,
                slot,
                generated: 0,
                last: 0,
                last_at: Instant::now(),
                forced: Vec::new(),
                allowed: Vec::new(),
                premasked: false,
            });
        }
        Err(e) => {
            let _ = job.events.send(Event::Failed(e.to_string()));
        }
    }
}

/// Fails every live request with the engine's error and frees its slot.
fn fail_all(batch: &mut dyn Sequences, active: &mut Vec<Seq>, e: &EngineError) {
    let e = e.to_string();
    for s in active.drain(..) {
        let _ = s.job.events.send(Event::Failed(e.clone()));
        batch.release(s.slot);
    }
}

/// What a decode step of the sequences `idx` (indices into `active`) needs from the engine.
enum Need {
    /// The `k` greatest logits of each row: every sampler reads only those (a sharded
    /// instance then moves k candidates per rank and row instead of its vocabulary slice).
    Top(usize),
    /// Rows limited to the grammars' masks, now computed into each sequence (a sharded
    /// instance's ranks then send only the allowed logits).
    Masked,
    /// Whole rows.
    Full,
}

/// What a step of the decoding sequences `idx` needs (see [`Need`]); `mask_row` is scratch.
fn need(batch: &dyn Sequences, active: &mut [Seq], idx: &[usize], mask_row: &mut Vec<f32>) -> Need {
    let top = idx
        .iter()
        .map(|&i| active[i].reads_top())
        .try_fold(1, |k, need| need.map(|n| k.max(n)));
    let constrained = idx.iter().any(|&i| active[i].job.constraint.is_some());
    match (top, batch.n_vocab()) {
        (Some(k), _) => Need::Top(k),
        (None, Some(vocab)) if constrained => {
            for &i in idx {
                active[i].compute_allowed(vocab, mask_row);
            }
            Need::Masked
        }
        (None, _) => Need::Full,
    }
}

impl Need {
    /// The step kind, with `masks` (see [`masks`]) for [`Need::Masked`].
    fn kind<'a>(&self, masks: &'a [Option<&'a [u32]>]) -> StepKind<'a> {
        match *self {
            Need::Top(k) => StepKind::Top(k),
            Need::Masked => StepKind::Masked(masks),
            Need::Full => StepKind::Full,
        }
    }
}

/// The grammar masks of the sequences `idx` in their order when `need` is [`Need::Masked`];
/// none (and nothing allocated) otherwise.
fn masks<'a>(active: &'a [Seq], idx: &[usize], need: &Need) -> Vec<Option<&'a [u32]>> {
    if !matches!(need, Need::Masked) {
        return Vec::new();
    }
    idx.iter()
        .map(|&i| active[i].premasked.then_some(&active[i].allowed[..]))
        .collect()
}

/// Prompt tokens run per round across all sequences being admitted (see [`run`]) while no
/// other sequence is generating: the engine's prefill chunk, the prefix cache's block (chunks
/// end on multiples of it, or of [`LIVE_CHUNK`], which divides it, so a pass completes each
/// block and a restored prefix gives the logits of a cold prefill).
use strata_engine::PREFILL_CHUNK;

/// Prompt tokens per round (on a pipeline, per pass turn) while other sequences are generating:
/// their next tokens wait for each round's chunk, so it is short (a 2,000-token prompt among eight
/// streams would otherwise stall them for a 256-token pass at a time). A prompt's logits are the
/// same in chunks of 16 as of 256 (`prefill_logits_do_not_depend_on_the_chunk_size` in the engine's
/// tests), given the scheduler's rule for the last one. Measured (`scripts/bench-itl.py`, SmolLM2,
/// 8 streams, 2 threads): the median gap while a 1,830-token prompt is admitted is 2.0-2.1x the
/// usual one with 16 (3.1x with 32, 18-19x with 256); the prompt itself takes about twice as long
/// to admit as in whole blocks. It is the engine's finest reusable grid, so the prefix cache keeps
/// the blocks such chunks fill.
pub const LIVE_CHUNK: usize = REUSABLE_STEP;

/// Fewest rows of a chunk that runs the same kernels as longer ones: fewer take the matrix
/// kernels' small-batch path, and one row the one-token attention order.
const MIN_ROWS: usize = 8;

/// How many tokens the next chunk of a `len`-token prompt with `done` prefilled takes, in
/// chunks ending on multiples of `step` (a divisor of [`BLOCK`]). A last chunk shorter than
/// [`MIN_ROWS`] is left only where whole blocks would leave the same one; otherwise it joins
/// the chunk before, so the rows are computed as in block-sized chunks, bit for bit, whatever
/// the server was doing.
pub(crate) fn next_chunk(len: usize, done: usize, step: usize) -> usize {
    let left = len - done;
    let n = left.min(step - done % step);
    let rest = left - n;
    let tail = match len % BLOCK {
        0 => BLOCK,
        r => r,
    };
    if rest > 0 && rest < MIN_ROWS && tail >= MIN_ROWS {
        left
    } else {
        n
    }
}

/// Runs the next chunks of prompts already admitted, oldest first: while other sequences are
/// generating, chunks of [`LIVE_CHUNK`] (their tokens wait for each), else whole blocks
/// (fastest to the first token); at most a chunk's worth (and a short last one, see
/// [`next_chunk`]) per round, counted in `spent` (a chunk that does not fit waits for the next
/// round). A sequence whose prompt is complete samples its first token.
fn continue_prefills(
    batch: &mut dyn Sequences,
    active: &mut Vec<Seq>,
    spent: &mut usize,
    tok: &Tokenizer,
    n_ctx: usize,
    m: &Metrics,
) {
    let mut i = 0;
    while i < active.len() {
        // Decided chunk by chunk: a stream that has just got its first token makes it live.
        let step = if active.iter().any(Seq::decoding) {
            LIVE_CHUNK
        } else {
            PREFILL_CHUNK
        };
        let s = &mut active[i];
        let left = s.job.prompt.len() - s.prefilled;
        let n = next_chunk(s.job.prompt.len(), s.prefilled, step);
        if left == 0 || *spent + n > step + MIN_ROWS {
            i += 1;
            continue;
        }
        *spent += n;
        let pass = batch.extend(s.slot, &s.job.prompt[s.prefilled..s.prefilled + n]);
        s.prefilled += n;
        let complete = s.prefilled == s.job.prompt.len();
        if s.after_pass(pass, complete, tok, n_ctx, m) {
            i += 1;
        } else {
            batch.release(s.slot);
            active.remove(i);
        }
    }
}

#[cfg(test)]
mod tests;
