//! The HTTP server: routes, request validation, prompt building, and the translation of
//! scheduler events into OpenAI responses and server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use strata_engine::SamplingParams;
use strata_tokenizer::{ChatTemplate, RenderOptions, StreamDecoder, Tokenizer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::ApiError;
use crate::call_format::CallFormat;
use crate::grammar::Grammars;
use crate::output::{Output, Piece};
use crate::tenancy::Tenant;
use crate::tools::{self, Choice};
use crate::types::{ChatRequest, CompletionRequest, Message, Sampling, parse_body};
use strata_http::auth::Keys;
use strata_scheduler::Metrics;
use strata_scheduler::{Constraint, Event, Finish, Job, Scheduler, SubmitError, TokenLogprob};

/// Everything the handlers share.
pub struct AppState {
    /// The model id clients must name.
    pub model_id: String,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, if the model has one.
    pub template: Option<ChatTemplate>,
    /// Grammar compilation (it knows the model's tool-call syntax).
    pub grammars: Grammars,
    /// Control tokens that are markers of the tool-call syntax (Mistral's `[TOOL_CALLS]`):
    /// control tokens are not decoded as text, but these must reach the call parser.
    pub call_markers: Vec<u32>,
    /// The engine thread.
    pub scheduler: Scheduler,
    /// Context window per sequence.
    pub n_ctx: usize,
    /// Accepted keys (`None`: no authentication).
    pub keys: Option<Arc<Keys>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// When the server started (the model's `created`).
    pub created: u64,
    /// The longest text one token stands for, in bytes: a prompt of `n` bytes has at least
    /// `n / max_token_bytes` tokens, so a prompt that cannot fit is refused before tokenising.
    pub max_token_bytes: usize,
    /// What the model is (Ollama's `/api/show` and `/api/tags` tell it).
    pub info: crate::ModelInfo,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: Arc<crate::responses::Store>,
    /// Other names the model answers to (clients with hard-coded model names).
    pub aliases: Vec<String>,
    /// Sampling settings for requests that do not give them.
    pub defaults: crate::types::SamplingDefaults,
    /// Permits for preparing requests (parsing, templating, tokenising, compiling grammars)
    /// off the async workers: one per core, so a burst of huge requests queues here instead
    /// of stalling `/health` and every stream.
    pub prepare: Arc<tokio::sync::Semaphore>,
    /// Every model name answered at this address (see [`crate::Shared::set_served`]).
    pub served: crate::ServedNames,
    /// One prefix-cache partition for every key (`--shared-prefix-cache`; see
    /// [`crate::tenancy`]).
    pub shared_prefix_cache: bool,
}

impl AppState {
    /// The names a "not found" lists: this model's id and aliases, then every other model
    /// answered at this address.
    pub(crate) fn served_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::iter::once(&self.model_id)
            .chain(&self.aliases)
            .cloned()
            .collect();
        for n in self.served.get() {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        names
    }

    /// Whether requests naming `model` are served here: the model's id or one of its aliases.
    pub fn serves(&self, model: &str) -> bool {
        model == self.model_id || self.aliases.iter().any(|a| a == model)
    }

    /// [`AppState::serves`] as the request's 404.
    pub(crate) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if self.serves(model) {
            Ok(())
        } else {
            Err(ApiError::model_not_found(model, &self.served_names()))
        }
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model_id", &self.model_id)
            .field("n_ctx", &self.n_ctx)
            .finish_non_exhaustive()
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The routes.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.max_body;
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(crate::responses::create))
        .route(
            "/v1/responses/{id}",
            get(crate::responses::get).delete(crate::responses::delete),
        )
        .route("/v1/messages", post(crate::messages::create))
        .route(
            "/v1/messages/count_tokens",
            post(crate::messages::count_tokens),
        )
        .route("/api/chat", post(crate::ollama::chat))
        .route("/api/generate", post(crate::ollama::generate))
        .route("/api/tags", get(crate::ollama::tags))
        .route("/api/ps", get(crate::ollama::ps))
        .route("/api/show", post(crate::ollama::show))
        .route("/api/pull", post(crate::ollama::pull))
        .route("/api/version", get(crate::ollama::version))
        .route("/", get(root))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .merge(strata_http::dashboard::routes())
        .fallback(fallback)
        .method_not_allowed_fallback(not_allowed)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            crate::access::guard,
        ))
        .layer(middleware::from_fn(strata_http::in_dialect))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// What answers here: the dashboard to a browser; to clients (Claude Code probes `HEAD /`
/// before its first request) a line of JSON naming the service.
async fn root(State(st): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> Response {
    if strata_http::dashboard::wants_page(&headers) {
        return strata_http::dashboard::index();
    }
    Json(json!({"service": "strata", "model": st.model_id})).into_response()
}

async fn fallback(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// 200 while the engine runs; 503 once it has stopped (after repeated internal errors), so a
/// load balancer or supervisor sees what clients see.
async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.scheduler.is_alive() {
        Json(json!({"status": "ok", "model": st.model_id, "n_ctx": st.n_ctx})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "failed", "model": st.model_id,
                "error": "the engine stopped after repeated internal errors"})),
        )
            .into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
        .into_response()
}

fn model_object(st: &AppState, id: &str) -> Value {
    json!({"id": id, "object": "model", "created": st.created, "owned_by": "strata"})
}

/// The served model, then each of its aliases.
async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = std::iter::once(&st.model_id)
        .chain(&st.aliases)
        .map(|id| model_object(&st, id))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn model(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if st.serves(&id) {
        Ok(Json(model_object(&st, &id)))
    } else {
        Err(ApiError::model_not_found(&id, &st.served_names()))
    }
}

pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_body(format!("Could not read the request body: {r}"))
        }
    })
}

/// Sampling and length settings shared by both endpoints, validated.
pub(crate) struct Common {
    pub(crate) sampling: SamplingParams,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) stops: Vec<String>,
}

fn common(req: &Sampling, max_tokens: Option<i64>, max_param: &str) -> Result<Common, ApiError> {
    if let Some(n) = req.n
        && n != 1
    {
        return Err(ApiError::invalid("n", "Only n = 1 is supported."));
    }
    let t = req.temperature.unwrap_or(1.0);
    if !t.is_finite() || !(0.0..=2.0).contains(&t) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be between 0 and 2, got {t}."),
        ));
    }
    let top_k = match req.top_k {
        Some(k) if k < 0 => return Err(ApiError::invalid("top_k", "top_k must be >= 0.")),
        Some(k) => k as usize,
        None => 0,
    };
    let sampling = SamplingParams {
        temperature: t,
        top_k,
        top_p: req.top_p.unwrap_or(1.0),
        min_p: req.min_p.unwrap_or(0.0),
        repeat_penalty: req.repetition_penalty.unwrap_or(1.0),
        presence_penalty: req.presence_penalty.unwrap_or(0.0),
        frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
        seed: req.seed.map_or_else(rand_seed, |s| s as u64),
        ..SamplingParams::default()
    };
    if let Err(m) = sampling.validate() {
        let param = m
            .split_whitespace()
            .next()
            .unwrap_or("sampling")
            .to_string();
        let param = match param.as_str() {
            "repeat_penalty" => "repetition_penalty".to_string(),
            _ => param,
        };
        return Err(ApiError::invalid(param, format!("{m}.")));
    }
    let max_tokens = match max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                max_param,
                format!("{max_param} must be at least 1, got {m}."),
            ));
        }
        Some(m) => Some(m as usize),
        None => None,
    };
    let stops = match &req.stop {
        Some(s) => s.strings()?,
        None => Vec::new(),
    };
    Ok(Common {
        sampling,
        max_tokens,
        stops,
    })
}

/// An id that differs between calls (a process-wide counter mixed into [`rand_seed`]).
pub(crate) fn rand_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    rand_seed() ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn rand_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (std::process::id() as u64).rotate_left(32)
}

/// The prompt of a chat request, rendered through the model's template.
fn chat_prompt(
    st: &AppState,
    req: &ChatRequest,
    tools_on: &[crate::types::Tool],
) -> Result<String, ApiError> {
    let template = st.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "This model has no chat template; use /v1/completions with a raw prompt.",
        )
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty."));
    }
    let native_tools = template.source().contains("tools");
    let format = st.grammars.format();
    let mut msgs: Vec<Value> = Vec::with_capacity(req.messages.len() + 1);
    for (i, m) in req.messages.iter().enumerate() {
        msgs.push(message_value(m, i, native_tools.then_some(format))?);
    }
    let mut opts = RenderOptions::new().generation_prompt(true);
    if !tools_on.is_empty() {
        if native_tools {
            opts = opts.tools(serde_json::to_value(tools_on).unwrap_or(Value::Null));
        } else {
            let text = tools::default_prompt(tools_on);
            match msgs.first_mut() {
                Some(first) if first["role"] == "system" => {
                    let old = first["content"].as_str().unwrap_or("").to_string();
                    first["content"] = json!(format!("{old}\n\n{text}"));
                }
                _ => msgs.insert(0, json!({"role": "system", "content": text})),
            }
        }
    }
    template.render_with(&msgs, &opts).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("The chat template refused the conversation: {e}"),
        )
    })
}

/// One message as the template gets it. With a template that knows tools (`native`, its call
/// syntax), earlier calls go in as transformers passes them: `tool_calls` whose arguments are
/// JSON objects (templates write them with `tojson`), ids as the syntax wants them.
fn message_value(m: &Message, i: usize, native: Option<CallFormat>) -> Result<Value, ApiError> {
    let role = match m.role.as_str() {
        "developer" => "system",
        r @ ("system" | "user" | "assistant" | "tool") => r,
        other => {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "Unknown role `{other}`: expected system, developer, user, assistant or tool."
                ),
            ));
        }
    };
    let mut content = m.text(i)?;
    let mut v = json!({"role": role});
    if let Some(calls) = &m.tool_calls {
        if let Some(format) = native {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let args = serde_json::from_str::<Value>(&c.function.arguments)
                        .unwrap_or_else(|_| Value::String(c.function.arguments.clone()));
                    let mut call = json!({
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": args},
                    });
                    if let Some(id) = &c.id {
                        call["id"] = json!(format.history_id(id));
                    }
                    call
                })
                .collect();
            v["tool_calls"] = Value::Array(calls);
        } else {
            for c in calls {
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&tools::call_text(c));
            }
        }
    }
    if role == "tool"
        && let Some(id) = &m.tool_call_id
    {
        let id = native.map_or_else(|| id.clone(), |f| f.history_id(id));
        v["tool_call_id"] = json!(id);
    }
    if let Some(n) = &m.name {
        v["name"] = json!(n);
    }
    v["content"] = json!(content);
    Ok(v)
}

/// Tokenises a prompt and checks it against the context window.
pub(crate) fn tokenize(st: &AppState, text: &str, special: bool) -> Result<Vec<u32>, ApiError> {
    let at_least = text.len() / st.max_token_bytes.max(1);
    if at_least >= st.n_ctx {
        return Err(ApiError::context_length_at_least(at_least, st.n_ctx));
    }
    let ids = st
        .tokenizer
        .encode_prompt(text, special)
        .map_err(|e| ApiError::invalid("prompt", format!("Could not tokenise the prompt: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "The prompt is empty."));
    }
    if ids.len() >= st.n_ctx {
        return Err(ApiError::context_length(ids.len(), st.n_ctx));
    }
    Ok(ids)
}

/// How a response is shaped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// A request ready for the scheduler, and how to answer it.
pub(crate) struct Prepared {
    pub(crate) kind: Kind,
    pub(crate) prompt: Vec<u32>,
    pub(crate) common: Common,
    pub(crate) logprobs: Option<usize>,
    pub(crate) constraint: Option<Box<dyn Constraint>>,
    pub(crate) tools: bool,
    /// Schemas whose keywords the grammar cannot all enforce, to check the finished output
    /// against: a tool's parameters (by its name) or, named `None`, the answer's JSON text.
    pub(crate) checks: Vec<(Option<String>, Value)>,
    /// The answer is a tool call, whatever the model writes (`tool_choice` required or named).
    pub(crate) forced_call: bool,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// Which API's shape the answer takes.
    pub(crate) reply: Reply,
    /// The request's `cache_salt` ([`crate::tenancy`]).
    pub(crate) cache_salt: Option<String>,
}

/// The API an answer is written for.
#[derive(Clone)]
pub(crate) enum Reply {
    /// OpenAI chat completion or text completion (as the request's [`Kind`]).
    OpenAi,
    /// An Anthropic message.
    Anthropic(crate::messages::Shape),
    /// An Ollama chat or generate answer.
    Ollama(crate::ollama::Shape),
    /// An OpenAI Responses API response.
    Responses(Box<crate::responses::Shape>),
}

/// How long preparing one request may take (a schema that takes longer to compile is the
/// request's fault); the work is bounded by the grammar limits, this bounds the wait.
const PREPARE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `f` (CPU work on a request) on the blocking pool, one request per core at a time.
pub(crate) async fn prepared<T: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = Arc::clone(&st.prepare)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("The server is stopping."))?;
    let state = Arc::clone(st);
    let work = tokio::task::spawn_blocking(move || {
        let r = f(&state);
        drop(permit);
        r
    });
    match tokio::time::timeout(PREPARE_DEADLINE, work).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(ApiError::unavailable(format!(
            "Preparing the request failed: {e}"
        ))),
        Err(_) => Err(ApiError::bad_body(format!(
            "The request took more than {} s to prepare (a schema too complex to compile?).",
            PREPARE_DEADLINE.as_secs()
        ))),
    }
}

/// The [`Tenant`] extension a generating route takes: set by the key check, absent on a
/// server without keys.
pub(crate) type From = Option<axum::Extension<Tenant>>;

/// A generating route: reads the body, prepares it with `prepare` (off the async workers) and
/// answers it for `tenant`.
pub(crate) async fn answer(
    st: Arc<AppState>,
    tenant: From,
    body: Result<Bytes, BytesRejection>,
    prepare: fn(&AppState, &[u8]) -> Result<Prepared, ApiError>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body_bytes(body, st.max_body)?;
    let p = prepared(&st, move |st| prepare(st, &body)).await?;
    run(st, p, tenant, arrived).await
}

async fn chat(
    State(st): State<Arc<AppState>>,
    tenant: From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(st, tenant, body, prepare_chat).await
}

/// Everything a chat request needs before the scheduler: checked, rendered, tokenised, and its
/// constraint compiled.
fn prepare_chat(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    prepare_chat_request(st, parse_body(body)?)
}

/// [`prepare_chat`] for a request already parsed (or translated from another API).
pub(crate) fn prepare_chat_request(st: &AppState, req: ChatRequest) -> Result<Prepared, ApiError> {
    st.check_model(&req.model)?;
    let mut req = req;
    st.defaults.fill(&mut req.sampling);
    let (max, max_param) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    let common = common(&req.sampling, max, max_param)?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(k)) if !(0..=20).contains(&k) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs must be between 0 and 20.",
            ));
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true.",
            ));
        }
        (true, k) => Some(k.unwrap_or(0) as usize),
        (false, None) => None,
    };
    let (text, all_tools, choice) = rendered_chat(st, &req)?;
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let prompt = tokenize(st, &text, true)?;

    let format = response_format(req.response_format.as_ref())?;
    if format.is_some() && matches!(choice, Choice::Required | Choice::Named(_)) {
        return Err(ApiError::invalid(
            "response_format",
            "response_format cannot be combined with a tool_choice that forces a call.",
        ));
    }
    let parallel = parallel && st.grammars.format().parallel();
    let mut checks: Vec<(Option<String>, Value)> = Vec::new();
    if choice != Choice::None {
        for t in tools::picked(&all_tools, &choice) {
            let p = tools::parameters(t);
            if tools::needs_check(&p) {
                checks.push((Some(t.function.name.clone()), p));
            }
        }
    }
    if let Some(schema) = format.as_ref().filter(|s| tools::needs_check(s)) {
        checks.push((None, schema.clone()));
    }
    let grammar_err = |param: &str| {
        let param = param.to_string();
        move |e: String| ApiError::invalid(param, format!("The schema cannot be used: {e}"))
    };
    let constraint = match (&choice, format) {
        (Choice::Required | Choice::Named(_), _) => Some(
            st.grammars
                .tool_calls(&all_tools, &choice, parallel && choice == Choice::Required)
                .map_err(grammar_err("tools"))?,
        ),
        (_, Some(schema)) => Some(
            st.grammars
                .json(schema)
                .map_err(grammar_err("response_format"))?,
        ),
        (Choice::Auto, None) => Some(
            st.grammars
                .lazy_tool_calls(&all_tools, &choice, parallel)
                .map_err(grammar_err("tools"))?,
        ),
        (Choice::None, None) => None,
    };
    Ok(Prepared {
        kind: Kind::Chat,
        prompt,
        common,
        logprobs,
        constraint,
        tools: choice != Choice::None,
        checks,
        forced_call: matches!(choice, Choice::Required | Choice::Named(_)),
        stream: req.stream.unwrap_or(false),
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        reply: Reply::OpenAi,
        cache_salt: req.cache_salt.clone(),
    })
}

/// A chat request's prompt text (its tools validated and shown unless `tool_choice` is none),
/// with the tools and the choice.
pub(crate) fn rendered_chat(
    st: &AppState,
    req: &ChatRequest,
) -> Result<(String, Vec<crate::types::Tool>, Choice), ApiError> {
    let all_tools = req.tools.clone().unwrap_or_default();
    tools::validate(&all_tools)?;
    let choice = tools::choice(&all_tools, req.tool_choice.as_ref())?;
    let shown: &[crate::types::Tool] = if choice == Choice::None {
        &[]
    } else {
        &all_tools
    };
    let text = chat_prompt(st, req, shown)?;
    Ok((text, all_tools, choice))
}

/// The JSON schema `response_format` asks for, if any.
fn response_format(rf: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(rf) = rf else { return Ok(None) };
    let bad = |m: &str| ApiError::invalid("response_format", m);
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => {
            let js = rf
                .get("json_schema")
                .ok_or_else(|| bad("json_schema needs a `json_schema` object."))?;
            let schema = js
                .get("schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            if !schema.is_object() {
                return Err(bad("json_schema.schema must be a JSON schema object."));
            }
            Ok(Some(schema))
        }
        _ => Err(bad(
            "response_format.type must be text, json_object or json_schema.",
        )),
    }
}

async fn completions(
    State(st): State<Arc<AppState>>,
    tenant: From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(st, tenant, body, prepare_completion).await
}

/// [`prepare_chat`] for a completion request.
fn prepare_completion(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    prepare_completion_request(st, parse_body(body)?)
}

/// [`prepare_completion`] for a request already parsed (or translated from another API).
pub(crate) fn prepare_completion_request(
    st: &AppState,
    req: CompletionRequest,
) -> Result<Prepared, ApiError> {
    st.check_model(&req.model)?;
    let mut req = req;
    st.defaults.fill(&mut req.sampling);
    if req.echo.unwrap_or(false) {
        return Err(ApiError::invalid("echo", "echo is not supported."));
    }
    if req.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "suffix is not supported."));
    }
    if let Some(b) = req.best_of
        && b != 1
    {
        return Err(ApiError::invalid(
            "best_of",
            "Only best_of = 1 is supported.",
        ));
    }
    let common = common(
        &req.sampling,
        Some(req.max_tokens.unwrap_or(16)),
        "max_tokens",
    )?;
    let logprobs = match req.logprobs {
        Some(k) if !(0..=5).contains(&k) => {
            return Err(ApiError::invalid(
                "logprobs",
                "logprobs must be between 0 and 5.",
            ));
        }
        k => k.map(|k| k as usize),
    };
    let prompt = match &req.prompt {
        Value::String(s) => tokenize(st, s, false)?,
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            tokenize(st, a[0].as_str().unwrap_or(""), false)?
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let vocab = st.tokenizer.vocab_size() as u64;
            let ids: Vec<u32> = a
                .iter()
                .filter_map(Value::as_u64)
                .map(|t| if t < vocab { Ok(t as u32) } else { Err(t) })
                .collect::<Result<_, _>>()
                .map_err(|t| {
                    ApiError::invalid(
                        "prompt",
                        format!("Token id {t} is outside the vocabulary ({vocab} tokens)."),
                    )
                })?;
            if ids.len() >= st.n_ctx {
                return Err(ApiError::context_length(ids.len(), st.n_ctx));
            }
            ids
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt must be a string, a one-element array of strings, or an array of token ids.",
            ));
        }
    };
    Ok(Prepared {
        kind: Kind::Completion,
        prompt,
        common,
        logprobs,
        constraint: None,
        tools: false,
        checks: Vec::new(),
        forced_call: false,
        stream: req.stream.unwrap_or(false),
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        reply: Reply::OpenAi,
        cache_salt: req.cache_salt.clone(),
    })
}

/// Submits a prepared request and answers it, streamed or whole.
pub(crate) async fn run(
    st: Arc<AppState>,
    p: Prepared,
    tenant: From,
    arrived: Instant,
) -> Result<Response, ApiError> {
    crate::tenancy::check_salt(p.cache_salt.as_deref())?;
    let partition = crate::tenancy::partition(
        st.shared_prefix_cache,
        tenant.as_ref().map(|t| &t.0),
        p.cache_salt.as_deref(),
    );
    let room = st.n_ctx - p.prompt.len();
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        partition,
        max_tokens: p.common.max_tokens.unwrap_or(room).min(room),
        prompt: p.prompt,
        sampling: p.common.sampling,
        logprobs: p.logprobs,
        constraint: p.constraint,
        events: tx,
        arrived,
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
    };
    match (p.reply, p.stream) {
        (Reply::Anthropic(shape), true) => {
            Ok(crate::messages::stream(answer, rx, shape).into_response())
        }
        (Reply::Anthropic(shape), false) => crate::messages::whole(answer, rx, shape).await,
        (Reply::Ollama(shape), true) => Ok(crate::ollama::stream(answer, rx, shape, arrived)),
        (Reply::Ollama(shape), false) => crate::ollama::whole(answer, rx, shape, arrived).await,
        (Reply::Responses(shape), true) => {
            Ok(crate::responses::stream(answer, rx, shape).into_response())
        }
        (Reply::Responses(shape), false) => crate::responses::whole(answer, rx, shape).await,
        (Reply::OpenAi, true) => Ok(stream(answer, rx, p.include_usage).into_response()),
        (Reply::OpenAi, false) => whole(answer, rx).await,
    }
}

/// The state of one answer being built.
pub(crate) struct Answer {
    pub(crate) st: Arc<AppState>,
    kind: Kind,
    pub(crate) id: String,
    pub(crate) created: u64,
    decoder: StreamDecoder<Arc<Tokenizer>>,
    pub(crate) out: Output,
    logprobs: bool,
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
}

/// How a finished generation ended, for the response.
pub(crate) struct Ending {
    /// OpenAI's `finish_reason`.
    pub(crate) reason: &'static str,
    usage: Value,
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
        finish: Finish,
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
            match finish {
                Finish::Stop => "stop",
                Finish::Length => "length",
            }
        };
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
    fn logprobs_json(&self, items: &[(u32, TokenLogprob)]) -> Value {
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

fn call_json(index: usize, call: &tools::ParsedCall, id: &str) -> Value {
    json!({
        "index": index,
        "id": format!("call_{id}_{index}"),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
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
                let (mut rest, e) = self.on_done(Finish::Stop, pt, n);
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

/// Collects the whole answer.
async fn whole(mut a: Answer, rx: mpsc::UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let ending = a.collect(rx).await?;
    let lp = if a.logprobs {
        a.logprobs_json(&a.out.logprobs)
    } else {
        Value::Null
    };
    let body = match a.kind {
        Kind::Chat => {
            let calls: Vec<Value> = a
                .out
                .calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut v = call_json(i, c, &a.id);
                    if let Some(o) = v.as_object_mut() {
                        o.remove("index");
                        if let Some(e) = a.call_errors(i) {
                            o.insert("schema_errors".into(), json!(e));
                        }
                    }
                    v
                })
                .collect();
            let content = if a.out.content.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                json!(a.out.content)
            };
            let mut message = json!({"role": "assistant", "content": content});
            if !a.out.reasoning.is_empty() {
                message["reasoning_content"] = json!(a.out.reasoning);
            }
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
            }
            if let Some((_, e)) = a.schema_errors.iter().find(|(at, _)| at.is_none()) {
                message["schema_errors"] = json!(e);
            }
            json!({
                "id": a.id,
                "object": "chat.completion",
                "created": a.created,
                "model": a.st.model_id,
                "choices": [{"index": 0, "message": message, "logprobs": lp, "finish_reason": ending.reason}],
                "usage": ending.usage,
            })
        }
        Kind::Completion => json!({
            "id": a.id,
            "object": "text_completion",
            "created": a.created,
            "model": a.st.model_id,
            "choices": [{"index": 0, "text": a.out.content, "logprobs": lp, "finish_reason": ending.reason}],
            "usage": ending.usage,
        }),
    };
    Ok(Json(body).into_response())
}

/// Streams the answer as server-sent events ending in `data: [DONE]`.
fn stream(
    mut a: Answer,
    mut rx: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
) -> impl IntoResponse {
    let (tx, out) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let send = |v: Value| tx.send(Ok(SseEvent::default().data(v.to_string()))).is_ok();
        if a.kind == Kind::Chat
            && !send(chunk(
                &a,
                json!({"role": "assistant",
                    "content": if a.forced_call { Value::Null } else { json!("") }}),
                None,
                Value::Null,
            ))
        {
            return;
        }
        let mut lp_sent = 0;
        loop {
            let (pieces, ending) = match a.step(rx.recv().await) {
                Ok(step) => step,
                Err(e) => {
                    send(e.body());
                    return;
                }
            };
            let lp = if a.logprobs && a.out.logprobs.len() > lp_sent {
                let v = a.logprobs_json(&a.out.logprobs[lp_sent..]);
                lp_sent = a.out.logprobs.len();
                v
            } else {
                Value::Null
            };
            let mut lp = Some(lp);
            for piece in pieces {
                // As OpenAI streams calls: the name with an empty argument string first, then
                // the arguments in pieces.
                let delta = match (piece, a.kind) {
                    (Piece::Content(t), Kind::Chat) => json!({"content": t}),
                    (Piece::Content(t), Kind::Completion) => json!(t),
                    (Piece::CallStart(i, name), _) => json!({"tool_calls": [call_json(
                        i,
                        &tools::ParsedCall { name, arguments: String::new() },
                        &a.id,
                    )]}),
                    (Piece::CallArgs(i, t), _) => {
                        json!({"tool_calls": [{"index": i, "function": {"arguments": t}}]})
                    }
                    (Piece::Call(..), _) => continue,
                    (Piece::Reasoning(t), Kind::Chat) => json!({"reasoning_content": t}),
                    (Piece::Reasoning(_), Kind::Completion) => continue,
                };
                if !send(chunk(&a, delta, None, lp.take().unwrap_or(Value::Null))) {
                    return;
                }
            }
            if let Some(e) = ending {
                let empty = if a.kind == Kind::Chat {
                    json!({})
                } else {
                    json!("")
                };
                if !send(chunk(
                    &a,
                    empty,
                    Some(e.reason),
                    lp.take().unwrap_or(Value::Null),
                )) {
                    return;
                }
                if include_usage {
                    let mut u = chunk(&a, Value::Null, None, Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = e.usage;
                    if !send(u) {
                        return;
                    }
                }
                let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
                return;
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    Sse::new(UnboundedReceiverStream::new(out)).keep_alive(KeepAlive::default())
}

/// One streamed chunk; `delta` is the chat delta or the completion text.
fn chunk(a: &Answer, delta: Value, finish: Option<&str>, logprobs: Value) -> Value {
    match a.kind {
        Kind::Chat => json!({
            "id": a.id,
            "object": "chat.completion.chunk",
            "created": a.created,
            "model": a.st.model_id,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }),
        Kind::Completion => json!({
            "id": a.id,
            "object": "text_completion",
            "created": a.created,
            "model": a.st.model_id,
            "choices": [{"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}],
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use strata_engine::Arch;
    use strata_engine::synth::chat_template;

    /// Llama 3.1's way with tools (tools in the first user turn, one bare JSON call).
    const LLAMA31: &str = include_str!("../tests/templates/llama31-tools.jinja");
    /// Mistral Nemo's way (a JSON list with nine-character ids, which the template insists on).
    const NEMO: &str = include_str!("../tests/templates/mistral-nemo-tools.jinja");

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "add", "parameters":
                {"type": "object", "properties": {"a": {"type": "integer"}}}}},
        ])
    }

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    /// The template renders an earlier answer with `calls`; the output parser, reading that
    /// text as if the model wrote it, finds the same calls.
    fn round_trip(src: &str, want: CallFormat, calls: &[(&str, Value)]) {
        let format = CallFormat::detect(Some(src));
        assert_eq!(format, want);
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let user = msg(json!({"role": "user", "content": "Weather in Paris, and 2 + 3?"}));
        let tool_calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({"id": format!("call_{i}"), "type": "function",
                       "function": {"name": name, "arguments": args.to_string()}})
            })
            .collect();
        let answer = msg(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
        let native = Some(format);
        let opts = RenderOptions::new().tools(tools());
        let prefix = t
            .render_with(
                &[message_value(&user, 0, native).unwrap()],
                &opts.clone().generation_prompt(true),
            )
            .unwrap();
        let full = t
            .render_with(
                &[
                    message_value(&user, 0, native).unwrap(),
                    message_value(&answer, 1, native).unwrap(),
                ],
                &opts,
            )
            .unwrap();
        let written = full
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{format:?}: {prefix:?} does not begin {full:?}"));
        let mut o = Output::new(Vec::new(), Some(format));
        if format == CallFormat::Harmony {
            o = o.with_channels();
        }
        let mut chars = [0u8; 4];
        for c in written.chars() {
            o.push(c.encode_utf8(&mut chars), None);
        }
        o.finish("");
        let got: Vec<(String, Value)> = o
            .calls
            .iter()
            .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap()))
            .collect();
        let want: Vec<(String, Value)> = calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.clone()))
            .collect();
        assert_eq!(got, want, "{format:?} parsing {written:?}");
        assert!(!o.cut_call);
        assert_eq!(o.content, "", "{written:?}");
    }

    #[test]
    fn every_call_syntax_parses_what_its_template_writes() {
        let two = [
            ("get_weather", json!({"city": "Paris \"}]"})),
            ("add", json!({"a": 2})),
        ];
        let qwen = chat_template(Arch::Qwen2).unwrap();
        round_trip(qwen, CallFormat::Hermes, &two);
        round_trip(
            chat_template(Arch::Mistral3).unwrap(),
            CallFormat::MistralArgs,
            &two,
        );
        round_trip(
            chat_template(Arch::Granite).unwrap(),
            CallFormat::Granite,
            &two,
        );
        round_trip(NEMO, CallFormat::MistralList, &two);
        round_trip(LLAMA31, CallFormat::Llama3, &two[..1]);
        round_trip(
            chat_template(Arch::GptOss).unwrap(),
            CallFormat::Harmony,
            &two,
        );
    }

    #[test]
    fn mistral_ids_match_between_a_call_and_its_result() {
        let format = CallFormat::detect(Some(NEMO));
        let t = ChatTemplate::new(NEMO, "<s>", "</s>").unwrap();
        let msgs = [
            msg(json!({"role": "user", "content": "Weather?"})),
            msg(
                json!({"role": "assistant", "tool_calls": [{"id": "call_8f2e_long_id",
                "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}),
            ),
            msg(json!({"role": "tool", "tool_call_id": "call_8f2e_long_id", "content": "sunny"})),
        ];
        let values: Vec<Value> = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| message_value(m, i, Some(format)).unwrap())
            .collect();
        let text = t
            .render_with(&values, &RenderOptions::new().tools(tools()))
            .unwrap();
        let id = format.history_id("call_8f2e_long_id");
        assert_eq!(text.matches(&format!("\"{id}\"")).count(), 2, "{text}");
        assert!(text.contains("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}"));
    }
}
