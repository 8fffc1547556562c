//! The scheduler against a tiny random model: admission, batching, constraints, panics.
#![allow(clippy::unwrap_used)]
use super::*;

use std::sync::Mutex;
use strata_gguf::{Array, GgufFile, GgufWriter, Value};

/// Eight tokens; `</s>` (2) ends generation.
pub(super) fn tokenizer() -> Tokenizer {
    let tokens = ["<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"];
    let mut w = GgufWriter::new();
    w.kv("tokenizer.ggml.model", Value::String("llama".into()));
    w.kv(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(
            tokens.iter().map(|t| t.to_string()).collect(),
        )),
    );
    w.kv(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![2, 3, 3, 1, 1, 1, 1, 1])),
    );
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    Tokenizer::from_gguf(file.metadata()).unwrap()
}

/// A greedy job of `prompt` generating at most `max_tokens`, and its events.
pub(super) fn greedy_job(
    prompt: Vec<u32>,
    max_tokens: usize,
) -> (Job, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        logprobs: None,
        constraint: None,
        events: tx,
        arrived: Instant::now(),
        partition: Partition::SHARED,
        embed: None,
        speculation: Default::default(),
    };
    (job, rx)
}

/// What the scripted engine was asked to do.
#[derive(Debug, Default, PartialEq)]
struct Calls {
    steps: usize,
    extends: Vec<Vec<u32>>,
}

/// An engine whose logits always favour token 3 ("a"), recording its calls.
struct Scripted {
    calls: Arc<Mutex<Calls>>,
    busy: bool,
    logits: Vec<f32>,
}

impl Scripted {
    fn row(&mut self, rows: usize) -> &mut [f32] {
        self.logits = (0..rows)
            .flat_map(|_| (0..8).map(|i| if i == 3 { 1.0 } else { 0.0 }))
            .collect();
        &mut self.logits
    }
}

impl Sequences for Scripted {
    fn n_ctx(&self) -> usize {
        64
    }
    fn free_slots(&self) -> usize {
        usize::from(!self.busy)
    }
    fn admit(&mut self, _prompt: &[u32], _: Partition) -> Result<(SlotId, usize), EngineError> {
        self.busy = true;
        Ok((SlotId::from_index(0), 0))
    }
    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], EngineError> {
        self.calls.lock().unwrap().steps += 1;
        Ok(self.row(steps.len()))
    }
    fn extend(&mut self, _slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], EngineError> {
        self.calls.lock().unwrap().extends.push(tokens.to_vec());
        Ok(self.row(1))
    }
    fn release(&mut self, _slot: SlotId) {
        self.busy = false;
    }
}

/// A grammar that forces "c d" (5, 6) once, after the first token.
struct ForcesOnce(bool);

impl Constraint for ForcesOnce {
    fn mask(&mut self, _logits: &mut [f32]) -> Result<(), ConstraintError> {
        Ok(())
    }
    fn commit(&mut self, _token: u32) -> Result<bool, ConstraintError> {
        Ok(false)
    }
    fn forced(&mut self, _max: usize) -> Result<(Vec<u32>, bool), ConstraintError> {
        let first = !self.0;
        self.0 = true;
        Ok((if first { vec![5, 6] } else { Vec::new() }, false))
    }
}

/// Runs one job of at most 6 tokens; returns the tokens it got and the engine's calls.
fn generate(logprobs: Option<usize>) -> (Vec<u32>, Calls) {
    let calls = Arc::new(Mutex::new(Calls::default()));
    let engine = Scripted {
        calls: Arc::clone(&calls),
        busy: false,
        logits: Vec::new(),
    };
    let metrics = Arc::new(Metrics::new());
    let sched = Scheduler::start(Box::new(engine), Arc::new(tokenizer()), 4, metrics).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    sched
        .submit(Job {
            prompt: vec![1, 4],
            max_tokens: 6,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            logprobs,
            constraint: Some(Box::new(ForcesOnce(false))),
            events: tx,
            arrived: Instant::now(),
            partition: Partition::SHARED,
            embed: None,
            speculation: Default::default(),
        })
        .unwrap();
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().unwrap() {
            Event::Token { id, .. } => tokens.push(id),
            Event::Done {
                finish,
                completion_tokens,
                ..
            } => {
                assert!(finish.is_length(), "{finish:?}");
                assert_eq!(completion_tokens, 6);
                break;
            }
            Event::Admitted { cached } => assert_eq!(cached, 0),
            Event::Failed(e) | Event::Refused(e) => panic!("{e}"),
            Event::Embedding(_) => panic!("an embedding for a generation"),
        }
    }
    let calls = std::mem::take(&mut *calls.lock().unwrap());
    (tokens, calls)
}

#[test]
fn forced_tokens_run_in_one_pass_instead_of_a_step_each() {
    let (tokens, calls) = generate(None);
    assert_eq!(tokens, vec![3, 5, 6, 3, 3, 3]);
    // The prompt; then the sampled "a" and the forced "c d" go through the model together;
    // then two steps.
    assert_eq!(
        calls,
        Calls {
            steps: 2,
            extends: vec![vec![1, 4], vec![3, 5, 6]],
        }
    );
    // With log-probabilities asked for, every token gets its own step (and its logits).
    let (tokens, calls) = generate(Some(0));
    assert_eq!(tokens, vec![3, 3, 3, 3, 3, 3]);
    assert_eq!(calls.steps, 5);
    assert_eq!(calls.extends, vec![vec![1, 4]]);
}

/// [`Scripted`], but its steps panic while `panics` is above zero (counting down).
struct Panicky {
    inner: Scripted,
    panics: Arc<std::sync::atomic::AtomicUsize>,
}

impl Sequences for Panicky {
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    fn free_slots(&self) -> usize {
        self.inner.free_slots()
    }
    fn admit(&mut self, prompt: &[u32], p: Partition) -> Result<(SlotId, usize), EngineError> {
        self.inner.admit(prompt, p)
    }
    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], EngineError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.panics.load(SeqCst) > 0 {
            self.panics.fetch_sub(1, SeqCst);
            panic!("index out of bounds in a test engine");
        }
        self.inner.step(steps)
    }
    fn extend(&mut self, slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], EngineError> {
        self.inner.extend(slot, tokens)
    }
    fn release(&mut self, slot: SlotId) {
        self.inner.release(slot);
    }
}

/// Submits a 4-token job and waits for its end: `Ok(tokens)` or `Err(failure)`.
fn one_job(sched: &Scheduler) -> Result<usize, String> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    sched
        .submit(Job {
            prompt: vec![1, 4],
            max_tokens: 4,
            sampling: SamplingParams::default(),
            logprobs: None,
            constraint: None,
            events: tx,
            arrived: Instant::now(),
            partition: Partition::SHARED,
            embed: None,
            speculation: Default::default(),
        })
        .map_err(|e| format!("{e:?}"))?;
    loop {
        match rx.blocking_recv() {
            Some(Event::Token { .. } | Event::Admitted { .. }) => {}
            Some(Event::Done {
                completion_tokens, ..
            }) => return Ok(completion_tokens),
            Some(Event::Failed(e) | Event::Refused(e)) => return Err(e),
            Some(Event::Embedding(_)) => return Err("an embedding for a generation".into()),
            None => return Err("closed".into()),
        }
    }
}

#[test]
fn an_engine_panic_fails_the_requests_in_flight_and_serving_goes_on_until_it_repeats() {
    let panics = Arc::new(std::sync::atomic::AtomicUsize::new(1));
    let engine = Panicky {
        inner: Scripted {
            calls: Arc::default(),
            busy: false,
            logits: Vec::new(),
        },
        panics: Arc::clone(&panics),
    };
    let metrics = Arc::new(Metrics::new());
    let sched = Scheduler::start(
        Box::new(engine),
        Arc::new(tokenizer()),
        4,
        Arc::clone(&metrics),
    )
    .unwrap();
    let failed = one_job(&sched).unwrap_err();
    assert!(failed.contains("internal error in the engine"), "{failed}");
    assert!(failed.contains("index out of bounds"), "{failed}");
    assert_eq!(metrics.engine_panics.get(), 1);
    // The slot was freed and the engine goes on.
    assert_eq!(one_job(&sched), Ok(4));
    assert!(sched.is_alive());
    // Panics that keep coming stop it: health turns, and new requests are refused.
    panics.store(usize::MAX / 2, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..PANICS_ALLOWED - 1 {
        assert!(one_job(&sched).is_err());
    }
    let last = one_job(&sched);
    assert!(last.is_err());
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    while sched.is_alive() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!sched.is_alive());
    assert!(one_job(&sched).is_err());
    assert_eq!(metrics.engine_panics.get(), PANICS_ALLOWED as u64);
}

/// Two slots; logs every call ("start N", "extend N", "step K") and favours token 3.
struct Recorder {
    log: Arc<Mutex<Vec<String>>>,
    free: usize,
    logits: Vec<f32>,
    /// Positions admitted prompts of this length or more find cached.
    cached: usize,
}

impl Recorder {
    fn row(&mut self, rows: usize, what: String) -> &mut [f32] {
        self.log.lock().unwrap().push(what);
        std::thread::sleep(std::time::Duration::from_micros(200));
        self.logits = (0..rows)
            .flat_map(|_| (0..8).map(|i| if i == 3 { 1.0 } else { 0.0 }))
            .collect();
        &mut self.logits
    }
}

impl Sequences for Recorder {
    fn n_ctx(&self) -> usize {
        1 << 20
    }
    fn free_slots(&self) -> usize {
        self.free
    }
    fn admit(&mut self, prompt: &[u32], _: Partition) -> Result<(SlotId, usize), EngineError> {
        self.free -= 1;
        let slot = SlotId::from_index(self.free);
        self.log
            .lock()
            .unwrap()
            .push(format!("admit {}", prompt.len()));
        Ok((
            slot,
            if prompt.len() > self.cached {
                self.cached
            } else {
                0
            },
        ))
    }
    fn step(&mut self, steps: &[(SlotId, u32)]) -> Result<&mut [f32], EngineError> {
        Ok(self.row(steps.len(), format!("step {}", steps.len())))
    }
    fn extend(&mut self, _slot: SlotId, tokens: &[u32]) -> Result<&mut [f32], EngineError> {
        Ok(self.row(1, format!("extend {}", tokens.len())))
    }
    fn release(&mut self, _slot: SlotId) {
        self.free += 1;
    }
}

/// While a stream generates, prompts of the given lengths arrive together; the engine
/// reports `cached` positions for prompts longer than that. Returns the prefill passes
/// (`extend N`) in order, after checking that the stream got a step between every two.
fn prefill_passes(prompts: &[usize], cached: usize) -> Vec<String> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let engine = Recorder {
        log: Arc::clone(&log),
        free: 1 + prompts.len(),
        logits: Vec::new(),
        cached,
    };
    let sched = Scheduler::start(
        Box::new(engine),
        Arc::new(tokenizer()),
        4,
        Arc::new(Metrics::new()),
    )
    .unwrap();
    // A stream is generating ...
    let (a, mut a_rx) = greedy_job(vec![1, 4], 1 << 19);
    sched.submit(a).unwrap();
    assert!(matches!(a_rx.blocking_recv(), Some(Event::Admitted { .. })));
    assert!(matches!(a_rx.blocking_recv(), Some(Event::Token { .. })));
    // ... when long prompts arrive.
    let rxs: Vec<_> = prompts
        .iter()
        .map(|&n| {
            let (j, rx) = greedy_job((0..n as u32).map(|i| 3 + i % 5).collect(), 2);
            sched.submit(j).unwrap();
            (n, rx)
        })
        .collect();
    for (n, mut rx) in rxs {
        match rx.blocking_recv() {
            Some(Event::Admitted { cached: c }) => {
                assert_eq!(c, if n > cached { cached } else { 0 })
            }
            other => panic!("{other:?}"),
        }
        loop {
            match rx.blocking_recv() {
                Some(Event::Done { prompt_tokens, .. }) => {
                    assert_eq!(prompt_tokens, n);
                    break;
                }
                Some(Event::Token { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    drop(a_rx);
    let log = log.lock().unwrap().clone();
    let first = log
        .iter()
        .position(|l| l.starts_with("admit") && l != "admit 2")
        .expect("a long prompt admitted");
    let chunks: Vec<usize> = (first..log.len())
        .filter(|&i| log[i].starts_with("extend") && log[i] != "extend 2")
        .collect();
    // The generating stream got a step between every two chunks.
    for w in chunks.windows(2) {
        assert!(
            log[w[0]..w[1]].iter().any(|l| l.starts_with("step")),
            "no decode step between chunks: {:?}",
            &log[w[0]..=w[1]]
        );
    }
    chunks.iter().map(|&i| log[i].clone()).collect()
}

/// `n` passes of `size` tokens, as the log names them.
fn passes(n: usize, size: usize) -> Vec<String> {
    vec![format!("extend {size}"); n]
}

#[test]
fn a_long_prompt_is_prefilled_in_short_chunks_between_the_other_streams_steps() {
    // 1000 tokens while another stream generates: 62 chunks of 16, then the last 8.
    assert_eq!(LIVE_CHUNK, 16);
    let passes_seen = prefill_passes(&[1000], usize::MAX);
    let mut want = passes(62, 16);
    want.push("extend 8".into());
    assert_eq!(passes_seen, want);
}

#[test]
fn prompts_run_in_chunks_ending_on_chunk_boundaries_however_they_arrive() {
    // Two prompts share the rounds; neither is ever cut off a boundary to fill a round.
    let seen = prefill_passes(&[300, 600], usize::MAX);
    let mut sizes: Vec<&str> = seen.iter().map(|p| &p[7..]).collect();
    sizes.sort();
    // 300 = 18 x 16 + 12, 600 = 37 x 16 + 8.
    let mut want = vec!["12"];
    want.extend(std::iter::repeat_n("16", 18 + 37));
    want.push("8");
    assert_eq!(sizes, want);
    // A prompt with 512 positions cached runs only the rest, from the boundary.
    let seen = prefill_passes(&[1000], 512);
    let mut want = passes(30, 16);
    want.push("extend 8".into());
    assert_eq!(seen, want);
}

#[test]
fn a_last_chunk_too_short_for_the_batch_kernels_joins_the_one_before() {
    // Whole blocks when nothing else runs.
    assert_eq!(next_chunk(1000, 0, BLOCK), 256);
    assert_eq!(next_chunk(1000, 768, BLOCK), 232);
    // 292 tokens: in blocks, 256 then 36. In chunks of 32, 32 x 8 then 36 (not 32 and 4).
    assert_eq!(next_chunk(292, 224, 32), 32);
    assert_eq!(next_chunk(292, 256, 32), 36);
    // 260 tokens: blocks leave a last chunk of 4 too, so chunks of 32 may.
    assert_eq!(next_chunk(260, 224, 32), 32);
    assert_eq!(next_chunk(260, 256, 32), 4);
    // Switching between the two mid-prompt keeps to the boundaries.
    assert_eq!(next_chunk(1000, 288, BLOCK), 224);
    assert_eq!(next_chunk(1000, 512, 32), 32);
}

#[test]
fn logprobs_are_a_log_softmax_with_the_best_first() {
    let (chosen, top) = logprobs(&[1.0, 3.0, 2.0, 3.0], 3);
    let z = (1f32.exp() + 2.0 * 3f32.exp() + 2f32.exp()).ln();
    assert!((chosen(0) - (1.0 - z)).abs() < 1e-5);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
    assert!((top[0].1 - (3.0 - z)).abs() < 1e-5);
    assert_eq!(chosen(99), f32::NEG_INFINITY);
}
