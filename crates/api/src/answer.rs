//! A prepared request submitted to the scheduler, and the answer built from its events:
//! the decoded text, tool calls and stop sequences ([`Output`]), the finish reason and usage.
//! How the answer is written back is the dialect's ([`Reply`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde_json::{Value, json};
use strata_engine::StopReason;
use strata_engine::speculate::Speculation;
use strata_scheduler::{Event, Job, SubmitError, TokenLogprob};
use strata_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::ApiError;
use crate::call_format::CallFormat;
use crate::output::{Output, Piece};
use crate::prepare::{From, Kind, Prepared, body_bytes, prepared, rand_id};
use crate::state::AppState;
use crate::tools;
use crate::unix_now;

/// How an answer is written back to the client: each dialect's response shape, streamed as
/// its server-sent events or collected whole.
pub(crate) trait Reply: Send + 'static {
    /// Writes the answer `a` from the scheduler's events `rx`.
    fn send(
        self,
        a: Answer,
        rx: mpsc::UnboundedReceiver<Event>,
        streamed: bool,
    ) -> impl Future<Output = Result<Response, ApiError>> + Send;
}

/// A dialect's preparation of a request body: the request for the scheduler, and how its
/// answer is written back.
pub(crate) type Prepare<R> = fn(&AppState, &[u8]) -> Result<(Prepared, R), ApiError>;

/// A generating route: reads the body, prepares it with `prepare` (off the async workers) and
/// answers it for `tenant`.
pub(crate) async fn answer<R: Reply>(
    st: Arc<AppState>,
    tenant: From,
    body: Result<Bytes, BytesRejection>,
    prepare: Prepare<R>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body_bytes(body, st.max_body)?;
    let (p, reply) = prepared(&st, move |st| prepare(st, &body)).await?;
    run(st, p, reply, tenant, arrived).await
}

/// Submits a prepared request and answers it, streamed or whole.
pub(crate) async fn run(
    st: Arc<AppState>,
    p: Prepared,
    reply: impl Reply,
    tenant: From,
    arrived: Instant,
) -> Result<Response, ApiError> {
    crate::embeddings::refuse_generation(&st)?;
    crate::tenancy::check_salt(p.cache_salt.as_deref())?;
    let partition = crate::tenancy::partition(
        st.shared_prefix_cache,
        tenant.tenant.as_ref(),
        p.cache_salt.as_deref(),
    );
    let room = st.n_ctx - p.prompt.len();
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        partition,
        embed: None,
        max_tokens: p.common.max_tokens.unwrap_or(room).min(room),
        prompt: p.prompt,
        sampling: p.common.sampling,
        logprobs: p.logprobs,
        constraint: p.constraint,
        events: tx,
        arrived,
        speculation: match p.common.speculate {
            Some(true) if st.defaults.speculation.drafts() => st.defaults.speculation,
            Some(true) => Speculation::Ngram,
            Some(false) => Speculation::Off,
            None => st.defaults.speculation,
        },
    };
    let prompt_len = job.prompt.len();
    let job_max = job.max_tokens;
    st.scheduler.submit(job).map_err(|e| match e {
        SubmitError::Full(n) => ApiError::queue_full(n),
        SubmitError::Stopped => ApiError::unavailable("The model instance has stopped."),
    })?;
    let id = format!(
        "{}-{:016x}",
        if p.kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        rand_id()
    );
    let answer = Answer {
        st: Arc::clone(&st),
        kind: p.kind,
        id,
        created: unix_now(),
        decoder: StreamDecoder::new(Arc::clone(&st.tokenizer), false),
        out: {
            let out = Output::new(p.common.stops, p.tools.then_some(st.grammars.format()));
            // gpt-oss answers in harmony messages; a chat answer is read out of them.
            if p.kind == Kind::Chat && st.grammars.format() == CallFormat::Harmony {
                out.with_channels()
            } else {
                out
            }
        },
        logprobs: p.logprobs.is_some(),
        forced_call: p.forced_call,
        checks: p.checks,
        schema_errors: Vec::new(),
        prompt_tokens: prompt_len,
        cached_tokens: 0,
        generated: 0,
        budget: job_max,
        first_token: None,
        include_usage: p.include_usage,
        arrived,
        usage: tenant.usage,
    };
    reply.send(answer, rx, p.stream).await
}

/// The state of one answer being built.
pub(crate) struct Answer {
    pub(crate) st: Arc<AppState>,
    pub(crate) kind: Kind,
    pub(crate) id: String,
    pub(crate) created: u64,
    decoder: StreamDecoder<Arc<Tokenizer>>,
    pub(crate) out: Output,
    pub(crate) logprobs: bool,
    /// The answer is a tool call (its first chunk's `content` is null, as OpenAI's is).
    pub(crate) forced_call: bool,
    /// See [`Prepared::checks`].
    checks: Vec<(Option<String>, Value)>,
    /// What the finished output breaks of [`Answer::checks`]: per call (its index) or for the
    /// text (`None`), the errors.
    pub(crate) schema_errors: Vec<(Option<usize>, Vec<String>)>,
    pub(crate) prompt_tokens: usize,
    /// Prompt tokens restored from the prefix cache (known once the request has a slot).
    pub(crate) cached_tokens: usize,
    /// Tokens received so far.
    pub(crate) generated: usize,
    /// The most tokens it may have (what was asked, or what the context leaves).
    pub(crate) budget: usize,
    /// When the first token arrived.
    pub(crate) first_token: Option<Instant>,
    /// OpenAI's `stream_options.include_usage`: a streamed answer ends with a usage chunk.
    pub(crate) include_usage: bool,
    /// When the request arrived (Ollama's durations count from it).
    pub(crate) arrived: Instant,
    /// The access log's record of the request, given the tokens and the first token's time.
    usage: Option<strata_http::access::Usage>,
}

/// How a finished generation ended, for the response.
pub(crate) struct Ending {
    /// OpenAI's `finish_reason`.
    pub(crate) reason: &'static str,
    pub(crate) usage: Value,
    /// Prompt and generated tokens.
    pub(crate) tokens: (usize, usize),
}

impl Answer {
    pub(crate) fn on_token(&mut self, id: u32, lp: Option<TokenLogprob>) -> Vec<Piece> {
        self.generated += 1;
        self.first_token.get_or_insert_with(Instant::now);
        let mut text = self.decoder.push(id).unwrap_or_default();
        if self.out.reads_calls() && self.st.call_markers.contains(&id) {
            text.push_str(&String::from_utf8_lossy(
                self.st.tokenizer.token_piece(id, true),
            ));
        }
        self.out.push(&text, lp.map(|l| (id, l)))
    }

    pub(crate) fn on_done(
        &mut self,
        finish: StopReason,
        prompt: usize,
        completion: usize,
    ) -> (Vec<Piece>, Ending) {
        let rest = self.decoder.finish().unwrap_or_default();
        let pieces = self.out.finish(&rest);
        self.check_output();
        let reason = if self.out.cut_call {
            // A call was cut short by the token budget; a streamed answer has sent part of it.
            "length"
        } else if !self.out.calls.is_empty() {
            "tool_calls"
        } else if self.out.stopped {
            "stop"
        } else {
            if finish.is_length() { "length" } else { "stop" }
        };
        if let Some(u) = &self.usage {
            let ttft = self.first_token.map(|t| t - self.arrived);
            u.update(|f| {
                f.tokens = Some((prompt, completion));
                f.ttft = ttft;
            });
        }
        (
            pieces,
            Ending {
                reason,
                usage: usage(prompt, completion, self.cached_tokens),
                tokens: (prompt, completion),
            },
        )
    }

    /// Checks the finished calls and JSON text against the keywords the grammar left
    /// unenforced; what breaks them is kept for the reply, counted and logged (never hidden).
    fn check_output(&mut self) {
        for (name, schema) in &self.checks {
            let found = match name {
                Some(n) => self
                    .out
                    .calls
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.name == *n)
                    .map(|(i, c)| (Some(i), tools::violations(schema, &c.arguments_object())))
                    .collect::<Vec<_>>(),
                None => match serde_json::from_str::<Value>(&self.out.content) {
                    Ok(v) => vec![(None, tools::violations(schema, &v))],
                    // Text cut short by the budget is not JSON yet; the finish reason says so.
                    Err(_) => Vec::new(),
                },
            };
            for (at, errors) in found.into_iter().filter(|(_, e)| !e.is_empty()) {
                self.st.metrics.schema_violations.inc();
                tracing::warn!(
                    "{} breaks its schema: {}",
                    name.as_deref()
                        .map_or("a JSON answer".to_string(), |n| format!("a call of {n}")),
                    errors.join("; ")
                );
                self.schema_errors.push((at, errors));
            }
        }
    }

    /// The schema errors of call `i`, if any.
    pub(crate) fn call_errors(&self, i: usize) -> Option<&[String]> {
        self.schema_errors
            .iter()
            .find(|(at, _)| *at == Some(i))
            .map(|(_, e)| e.as_slice())
    }

    fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.st.tokenizer.token_piece(id, true)).into_owned()
    }

    /// Log-probabilities in the endpoint's format, for the given tokens.
    pub(crate) fn logprobs_json(&self, items: &[(u32, TokenLogprob)]) -> Value {
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, lp: f32| {
                    let t = self.token_text(id);
                    json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
                };
                let content: Vec<Value> = items
                    .iter()
                    .map(|(id, l)| {
                        let mut e = entry(*id, l.logprob);
                        e["top_logprobs"] =
                            Value::Array(l.top.iter().map(|(t, p)| entry(*t, *p)).collect());
                        e
                    })
                    .collect();
                json!({"content": content})
            }
            Kind::Completion => {
                let tokens: Vec<String> =
                    items.iter().map(|(id, _)| self.token_text(*id)).collect();
                let lps: Vec<f32> = items.iter().map(|(_, l)| l.logprob).collect();
                let tops: Vec<Value> = items
                    .iter()
                    .map(|(_, l)| {
                        let mut m = serde_json::Map::new();
                        for (t, p) in &l.top {
                            m.insert(self.token_text(*t), json!(p));
                        }
                        Value::Object(m)
                    })
                    .collect();
                json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops})
            }
        }
    }
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

impl Answer {
    /// Reads one scheduler event (`None`: the engine is gone): the pieces it gives out, and
    /// the ending once generation is over (a stop sequence counts: dropping the receiver then
    /// stops the engine).
    pub(crate) fn step(
        &mut self,
        ev: Option<Event>,
    ) -> Result<(Vec<Piece>, Option<Ending>), ApiError> {
        match ev {
            Some(Event::Token { id, logprob }) => {
                let mut p = self.on_token(id, logprob);
                if !self.out.stopped {
                    return Ok((p, None));
                }
                let (pt, n) = (self.prompt_tokens, self.generated);
                let (mut rest, e) = self.on_done(StopReason::Cancelled, pt, n);
                p.append(&mut rest);
                Ok((p, Some(e)))
            }
            Some(Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            }) => {
                let (p, e) = self.on_done(finish, prompt_tokens, completion_tokens);
                Ok((p, Some(e)))
            }
            Some(Event::Admitted { cached }) => {
                self.cached_tokens = cached;
                Ok((Vec::new(), None))
            }
            Some(Event::Failed(m)) => Err(ApiError::unavailable(format!("Generation failed: {m}"))),
            Some(Event::Refused(m)) => Err(ApiError::bad_body(format!(
                "The request's schema or tools could not be followed: {m}"
            ))),
            Some(Event::Embedding(_)) => Err(ApiError::unavailable(
                "The engine answered a generation with an embedding.",
            )),
            None => Err(ApiError::unavailable(
                "The model instance stopped during generation.",
            )),
        }
    }

    /// Waits until the request has a slot (so the cached prompt tokens are known, for replies
    /// that give usage before the first token); an event that came instead is handed back to
    /// be read first.
    pub(crate) async fn admitted(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
    ) -> Option<Option<Event>> {
        match rx.recv().await {
            Some(Event::Admitted { cached }) => {
                self.cached_tokens = cached;
                None
            }
            other => Some(other),
        }
    }

    /// Reads events until generation is over.
    pub(crate) async fn collect(
        &mut self,
        mut rx: mpsc::UnboundedReceiver<Event>,
    ) -> Result<Ending, ApiError> {
        loop {
            if let (_, Some(e)) = self.step(rx.recv().await)? {
                return Ok(e);
            }
        }
    }
}
