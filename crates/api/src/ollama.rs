//! Ollama's API: `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/version` and `/api/pull`, for the many tools that speak it (Open WebUI, editor plugins,
//! the `ollama` client libraries).
//!
//! Chat and generate requests are translated into the OpenAI requests strata serves (the same
//! template, tool grammar, constrained `format` and scheduler); answers are Ollama's: NDJSON
//! lines when streaming (Ollama streams by default), one object otherwise, with its counters
//! and durations in nanoseconds. Errors are `{"error": "…"}` through [`crate::Dialect`].
//! A model is named as strata serves it, with or without Ollama's `:latest` tag.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::ApiError;
use crate::answer::{Answer, Ending, Reply, run};
use crate::output::Piece;
use crate::prepare::{
    Prepared, body_bytes, prepare_chat_request, prepare_completion_request, prepared,
};
use crate::state::AppState;
use crate::types::{
    ChatRequest, CompletionRequest, FunctionCall, Message, Sampling, Tool, ToolCall, parse_body,
};
use strata_scheduler::Event;

/// The Ollama version strata answers as: the API it follows.
const OLLAMA_VERSION: &str = "0.12.0";

/// `POST /api/chat`.
#[derive(Debug, Deserialize)]
struct ChatBody {
    model: String,
    #[serde(default)]
    messages: Vec<InMessage>,
    tools: Option<Vec<Tool>>,
    /// `"json"` or a JSON schema.
    format: Option<Value>,
    #[serde(default)]
    options: Options,
    stream: Option<bool>,
    /// `true`, `false`, or an effort level: whether reasoning is given out.
    think: Option<Value>,
    /// How long Ollama keeps the model loaded; see [`loaded`].
    keep_alive: Option<Value>,
    /// As the OpenAI dialect's `cache_salt`.
    cache_salt: Option<String>,
}

/// `POST /api/generate`.
#[derive(Debug, Deserialize)]
struct GenerateBody {
    model: String,
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    suffix: Option<String>,
    /// The prompt is the model's input as it is (no template).
    #[serde(default)]
    raw: bool,
    format: Option<Value>,
    #[serde(default)]
    options: Options,
    stream: Option<bool>,
    think: Option<Value>,
    keep_alive: Option<Value>,
    context: Option<Vec<u32>>,
    images: Option<Vec<Value>>,
    template: Option<String>,
    /// As the OpenAI dialect's `cache_salt`.
    cache_salt: Option<String>,
}

/// One chat message.
#[derive(Debug, Deserialize)]
struct InMessage {
    role: String,
    #[serde(default)]
    content: String,
    images: Option<Vec<Value>>,
    tool_calls: Option<Vec<InCall>>,
    /// The tool whose result a `tool` message holds.
    tool_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct InCall {
    function: InFunction,
}

#[derive(Debug, Deserialize)]
struct InFunction {
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// The `options` strata honours; the rest of Ollama's (`num_gpu`, `num_thread`, `mirostat`…)
/// concern Ollama's own runner and are accepted and ignored.
#[derive(Debug, Default, Deserialize)]
struct Options {
    temperature: Option<f32>,
    top_k: Option<i64>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    seed: Option<i64>,
    /// Tokens to generate; -1 or -2 (or absent): until the context is full.
    num_predict: Option<i64>,
    /// The context window. Ollama reloads the model with it; here the server's window is
    /// fixed, so a smaller one caps prompt and answer together and a larger one is the
    /// server's.
    num_ctx: Option<i64>,
    stop: Option<Vec<String>>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
}

/// How an answer is written for Ollama.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// `/api/chat` (a `message`) or `/api/generate` (a `response`).
    chat: bool,
    /// Reasoning is given out (`thinking`).
    think: bool,
}

/// The served model's name as Ollama clients write it (`name:latest`), or the request's error.
pub(crate) fn check_model(st: &AppState, model: &str) -> Result<(), ApiError> {
    if st.serves(model) || model.strip_suffix(":latest").is_some_and(|m| st.serves(m)) {
        Ok(())
    } else {
        let served = st.served_names();
        let mut e = ApiError::model_not_found(model, &served);
        let list = served
            .iter()
            .map(|m| format!("\"{m}\""))
            .collect::<Vec<_>>()
            .join(", ");
        e.message = format!("model \"{model}\" not found; this server serves {list}");
        e.param = None;
        Err(e)
    }
}

impl Options {
    fn sampling(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed,
            stop: None,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            n: None,
            speculate: None,
        }
    }

    fn max_tokens(&self) -> Option<i64> {
        self.num_predict.filter(|&n| n > 0)
    }

    fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = self.stop.clone().unwrap_or_default();
        if stops.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "options.stop",
                "stop sequences must not be empty",
            ));
        }
        Ok(stops)
    }
}

/// Whether `think` asks for reasoning, refused as Ollama refuses it for a model that cannot
/// reason: one without gpt-oss's harmony channels or a template that writes `<think>` blocks
/// (whose reasoning then stays in the answer's text).
fn thinks(st: &AppState, think: Option<&Value>) -> Result<bool, ApiError> {
    let on = match think {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    };
    let can = st.grammars.format() == crate::call_format::CallFormat::Harmony
        || st
            .template
            .as_ref()
            .is_some_and(|t| t.source().contains("<think>"));
    if on && !can {
        let mut e = ApiError::invalid(
            "think",
            format!("\"{}\" does not support thinking", st.model_id),
        );
        e.param = None;
        return Err(e);
    }
    Ok(on)
}

/// What a request without anything to generate is answered with: Ollama loads the model
/// (`load`), or unloads it when `keep_alive` is zero (`unload`). The model here is loaded
/// for as long as the server runs, so neither changes anything but the answer.
enum Prep {
    Run(Prepared, Shape),
    Loaded(&'static str),
}

fn loaded(keep_alive: Option<&Value>) -> Prep {
    let zero = match keep_alive {
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => s
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .parse::<f64>()
            .is_ok_and(|v| v == 0.0),
        _ => false,
    };
    Prep::Loaded(if zero { "unload" } else { "load" })
}

/// The prompt's and answer's room when `num_ctx` is below the server's window: the answer's
/// limit, so that both fit in `num_ctx`; the prompt alone over it is refused.
fn within_num_ctx(st: &AppState, p: &mut Prepared, num_ctx: Option<i64>) -> Result<(), ApiError> {
    let Some(ctx) = num_ctx
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0 && n < st.n_ctx)
    else {
        return Ok(());
    };
    let room = ctx
        .checked_sub(p.prompt.len())
        .filter(|&r| r > 0)
        .ok_or_else(|| {
            let mut e = ApiError::invalid(
                "options.num_ctx",
                format!(
                    "the prompt has {} tokens, more than num_ctx {ctx} leaves room for",
                    p.prompt.len()
                ),
            );
            e.param = None;
            e
        })?;
    p.common.max_tokens = Some(p.common.max_tokens.map_or(room, |m| m.min(room)));
    Ok(())
}

/// `format` as OpenAI's `response_format`.
fn response_format(format: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(json!({"type": "json_object"}))),
        Some(schema @ Value::Object(_)) => Ok(Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": schema},
        }))),
        Some(_) => Err(ApiError::invalid(
            "format",
            "format must be \"json\" or a JSON schema object",
        )),
    }
}

fn no_images(images: Option<&Vec<Value>>, param: &str) -> Result<(), ApiError> {
    match images {
        Some(v) if !v.is_empty() => Err(ApiError::invalid(
            param,
            "images are not supported: this model reads text only",
        )),
        _ => Ok(()),
    }
}

/// Ollama's chat messages as OpenAI's. Ollama's calls have no ids: each gets one, and a
/// `tool` message answers the earliest unanswered call (of its `tool_name`, when given).
fn messages(body: &[InMessage]) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::with_capacity(body.len());
    let mut open: Vec<(String, String)> = Vec::new();
    for (i, m) in body.iter().enumerate() {
        no_images(m.images.as_ref(), &format!("messages[{i}].images"))?;
        let mut msg = Message::plain(&m.role, m.content.clone());
        match m.role.as_str() {
            "assistant" => {
                let calls: Vec<ToolCall> = m
                    .tool_calls
                    .iter()
                    .flatten()
                    .enumerate()
                    .map(|(j, c)| {
                        let id = format!("call_{i}_{j}");
                        open.push((id.clone(), c.function.name.clone()));
                        ToolCall {
                            id: Some(id),
                            kind: Some("function".into()),
                            function: FunctionCall {
                                name: c.function.name.clone(),
                                arguments: match &c.function.arguments {
                                    Value::Null => "{}".into(),
                                    Value::String(s) => s.clone(),
                                    v => v.to_string(),
                                },
                            },
                        }
                    })
                    .collect();
                if !calls.is_empty() {
                    msg.tool_calls = Some(calls);
                }
            }
            "tool" => {
                let at = open
                    .iter()
                    .position(|(_, name)| m.tool_name.as_ref().is_none_or(|t| t == name));
                msg.tool_call_id = at.map(|k| open.remove(k).0);
                msg.name.clone_from(&m.tool_name);
            }
            "system" | "user" => {}
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("unknown role \"{other}\": expected system, user, assistant or tool"),
                ));
            }
        }
        out.push(msg);
    }
    Ok(out)
}

/// `POST /api/chat`.
pub(crate) async fn chat(
    State(st): State<Arc<AppState>>,
    tenant: crate::prepare::From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body_bytes(body, st.max_body)?;
    match prepared(&st, move |st| prepare_chat(st, &body)).await? {
        Prep::Run(p, shape) => run(st, p, shape, tenant, arrived).await,
        Prep::Loaded(reason) => Ok(Json(json!({
            "model": st.model_id, "created_at": now(),
            "message": {"role": "assistant", "content": ""}, "done": true,
            "done_reason": reason,
        }))
        .into_response()),
    }
}

fn prepare_chat(st: &AppState, body: &[u8]) -> Result<Prep, ApiError> {
    let req: ChatBody = parse_body(body)?;
    check_model(st, &req.model)?;
    let think = thinks(st, req.think.as_ref())?;
    if req.messages.is_empty() {
        return Ok(loaded(req.keep_alive.as_ref()));
    }
    let stops = req.options.stops()?;
    let chat = ChatRequest {
        model: st.model_id.clone(),
        messages: messages(&req.messages)?,
        max_tokens: req.options.max_tokens(),
        max_completion_tokens: None,
        sampling: req.options.sampling(),
        logprobs: None,
        top_logprobs: None,
        stream: Some(req.stream.unwrap_or(true)),
        stream_options: None,
        tool_choice: None,
        tools: req.tools.filter(|t| !t.is_empty()),
        parallel_tool_calls: None,
        response_format: response_format(req.format.as_ref())?,
        cache_salt: req.cache_salt,
    };
    let mut p = prepare_chat_request(st, chat)?;
    p.common.stops = stops;
    within_num_ctx(st, &mut p, req.options.num_ctx)?;
    Ok(Prep::Run(p, Shape { chat: true, think }))
}

/// `POST /api/generate`.
pub(crate) async fn generate(
    State(st): State<Arc<AppState>>,
    tenant: crate::prepare::From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body_bytes(body, st.max_body)?;
    let p = prepared(&st, move |st| prepare_generate(st, &body)).await?;
    match p {
        Prep::Run(p, shape) => run(st, p, shape, tenant, arrived).await,
        Prep::Loaded(reason) => Ok(Json(json!({
            "model": st.model_id, "created_at": now(), "response": "", "done": true,
            "done_reason": reason,
        }))
        .into_response()),
    }
}

fn prepare_generate(st: &AppState, body: &[u8]) -> Result<Prep, ApiError> {
    let req: GenerateBody = parse_body(body)?;
    check_model(st, &req.model)?;
    let think = thinks(st, req.think.as_ref())?;
    no_images(req.images.as_ref(), "images")?;
    for (given, name) in [
        (req.suffix.is_some(), "suffix"),
        (
            req.context.as_ref().is_some_and(|c| !c.is_empty()),
            "context",
        ),
        (
            req.template.as_ref().is_some_and(|t| !t.is_empty()),
            "template",
        ),
    ] {
        if given {
            return Err(ApiError::invalid(
                name,
                format!("{name} is not supported; send the whole conversation to /api/chat"),
            ));
        }
    }
    if req.prompt.is_empty() && req.system.is_none() {
        return Ok(loaded(req.keep_alive.as_ref()));
    }
    let stops = req.options.stops()?;
    let shape = Shape { chat: false, think };
    let stream = Some(req.stream.unwrap_or(true));
    let format = response_format(req.format.as_ref())?;
    let mut p = if req.raw || st.template.is_none() {
        // The prompt as it is: a completion, constrained by `format` when given.
        let mut p = prepare_completion_request(
            st,
            CompletionRequest {
                model: st.model_id.clone(),
                prompt: Value::String(req.prompt),
                // Until the context is full unless `num_predict` says otherwise (the answer is
                // clamped to what the context leaves).
                max_tokens: Some(req.options.max_tokens().unwrap_or(i64::MAX >> 1)),
                sampling: req.options.sampling(),
                logprobs: None,
                stream,
                stream_options: None,
                echo: None,
                suffix: None,
                best_of: None,
                cache_salt: req.cache_salt.clone(),
            },
        )?;
        if let Some(f) = format {
            let schema = match f["type"].as_str() {
                Some("json_schema") => f["json_schema"]["schema"].clone(),
                _ => json!({"type": "object"}),
            };
            p.constraint = Some(st.grammars.json(schema).map_err(|e| {
                ApiError::invalid("format", format!("The schema cannot be used: {e}"))
            })?);
        }
        p
    } else {
        let mut messages = Vec::new();
        if let Some(s) = req.system {
            messages.push(InMessage {
                role: "system".into(),
                content: s,
                images: None,
                tool_calls: None,
                tool_name: None,
            });
        }
        messages.push(InMessage {
            role: "user".into(),
            content: req.prompt,
            images: None,
            tool_calls: None,
            tool_name: None,
        });
        prepare_chat_request(
            st,
            ChatRequest {
                model: st.model_id.clone(),
                messages: self::messages(&messages)?,
                max_tokens: req.options.max_tokens(),
                max_completion_tokens: None,
                sampling: req.options.sampling(),
                logprobs: None,
                top_logprobs: None,
                stream,
                stream_options: None,
                tools: None,
                tool_choice: None,
                parallel_tool_calls: None,
                response_format: format,
                cache_salt: req.cache_salt.clone(),
            },
        )?
    };
    p.common.stops = stops;
    within_num_ctx(st, &mut p, req.options.num_ctx)?;
    Ok(Prep::Run(p, shape))
}

/// Ollama's time stamps: RFC 3339 with nanoseconds.
fn now() -> String {
    humantime::format_rfc3339_nanos(SystemTime::now()).to_string()
}

/// Ollama's counters and durations (nanoseconds) for a finished answer.
fn done_fields(e: &Ending, arrived: Instant, first: Option<Instant>) -> Value {
    let end = Instant::now();
    let first = first.unwrap_or(end);
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    json!({
        "done": true,
        "done_reason": if e.reason == "length" { "length" } else { "stop" },
        "total_duration": ns(end - arrived),
        "load_duration": 0,
        "prompt_eval_count": e.tokens.0,
        "prompt_eval_duration": ns(first.saturating_duration_since(arrived)),
        "eval_count": e.tokens.1,
        "eval_duration": ns(end.saturating_duration_since(first)),
    })
}

fn calls_json(calls: &[crate::tools::ParsedCall]) -> Vec<Value> {
    calls
        .iter()
        .map(|c| json!({"function": {"name": c.name, "arguments": c.arguments_object()}}))
        .collect()
}

/// A line of the answer: `text` as the message's content (chat) or the response (generate).
fn line(a: &Answer, shape: Shape, text: &str, thinking: &str, calls: &[Value]) -> Value {
    let mut v = json!({"model": a.st.model_id, "created_at": now()});
    if shape.chat {
        let mut m = json!({"role": "assistant", "content": text});
        if !thinking.is_empty() {
            m["thinking"] = json!(thinking);
        }
        if !calls.is_empty() {
            m["tool_calls"] = json!(calls);
        }
        v["message"] = m;
    } else {
        v["response"] = json!(text);
        if !thinking.is_empty() {
            v["thinking"] = json!(thinking);
        }
    }
    v
}

fn merge(mut v: Value, fields: Value) -> Value {
    if let (Some(o), Value::Object(f)) = (v.as_object_mut(), fields) {
        o.extend(f);
    }
    v
}

impl Reply for Shape {
    async fn send(
        self,
        a: Answer,
        rx: mpsc::UnboundedReceiver<Event>,
        streamed: bool,
    ) -> Result<Response, ApiError> {
        if streamed {
            Ok(stream(a, rx, self))
        } else {
            whole(a, rx, self).await
        }
    }
}

/// Answers with one object.
async fn whole(
    mut a: Answer,
    rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let arrived = a.arrived;
    let ending = a.collect(rx).await?;
    let thinking = if shape.think {
        a.out.reasoning.clone()
    } else {
        String::new()
    };
    let calls = calls_json(&a.out.calls);
    let v = line(&a, shape, &a.out.content, &thinking, &calls);
    Ok(Json(merge(v, done_fields(&ending, arrived, a.first_token))).into_response())
}

/// Streams the answer as NDJSON lines, ending with the `done` line.
fn stream(mut a: Answer, mut rx: mpsc::UnboundedReceiver<Event>, shape: Shape) -> Response {
    let arrived = a.arrived;
    let (tx, out) = mpsc::unbounded_channel::<Result<Bytes, Infallible>>();
    tokio::spawn(async move {
        let send = |v: Value| tx.send(Ok(Bytes::from(format!("{v}\n")))).is_ok();
        loop {
            let (pieces, ending) = match a.step(rx.recv().await) {
                Ok(step) => step,
                Err(e) => {
                    send(crate::Dialect::Ollama.body(&e));
                    return;
                }
            };
            for piece in pieces {
                // Ollama gives a call out whole, once complete.
                let v = match piece {
                    Piece::Content(t) if !t.is_empty() => line(&a, shape, &t, "", &[]),
                    Piece::Reasoning(t) if shape.think && !t.is_empty() => {
                        line(&a, shape, "", &t, &[])
                    }
                    Piece::Call(_, call) if shape.chat => {
                        line(&a, shape, "", "", &calls_json(&[call]))
                    }
                    _ => continue,
                };
                if !send(merge(v, json!({"done": false}))) {
                    return;
                }
            }
            if let Some(e) = ending {
                let v = line(&a, shape, "", "", &[]);
                send(merge(v, done_fields(&e, arrived, a.first_token)));
                return;
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(UnboundedReceiverStream::new(out)),
    )
        .into_response()
}

/// The served model as `/api/tags` and `/api/ps` list it.
fn model_entry(st: &AppState) -> Value {
    let info = &st.info;
    let name = format!("{}:latest", st.model_id);
    json!({
        "name": name,
        "model": name,
        "modified_at": humantime::format_rfc3339_seconds(
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(st.created)).to_string(),
        "size": info.size,
        // Ollama's digests are SHA-256 hex; this one names the served model, not its bytes
        // (hashing a multi-GiB file at every listing is not worth it).
        "digest": sha256_hex(st.model_id.as_bytes()),
        "details": details(info),
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn details(info: &crate::ModelInfo) -> Value {
    let p = info.parameters as f64;
    let size = if p >= 1e9 {
        format!("{:.1}B", p / 1e9)
    } else {
        format!("{:.0}M", p / 1e6)
    };
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": info.arch,
        "families": [info.arch],
        "parameter_size": size,
        "quantization_level": info.quantization,
    })
}

/// `GET /api/tags`.
pub(crate) async fn tags(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"models": [model_entry(&st)]}))
}

/// `GET /api/ps`: the model is loaded for as long as the server runs.
pub(crate) async fn ps(State(st): State<Arc<AppState>>) -> Json<Value> {
    let mut m = model_entry(&st);
    m["expires_at"] = json!("9999-12-31T23:59:59Z");
    m["size_vram"] = json!(0);
    m["context_length"] = json!(st.n_ctx);
    Json(json!({"models": [m]}))
}

/// `GET /api/version`.
pub(crate) async fn version() -> Json<Value> {
    Json(json!({"version": OLLAMA_VERSION}))
}

#[derive(Deserialize)]
struct NamedBody {
    model: Option<String>,
    /// Older clients' name for `model`.
    name: Option<String>,
    stream: Option<bool>,
}

fn named(body: &[u8]) -> Result<(String, bool), ApiError> {
    let b: NamedBody = parse_body(body)?;
    let model = b
        .model
        .or(b.name)
        .ok_or_else(|| ApiError::invalid("model", "model is required"))?;
    Ok((model, b.stream.unwrap_or(true)))
}

/// `POST /api/show`.
pub(crate) async fn show(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (model, _) = named(&body_bytes(body, st.max_body)?)?;
    check_model(&st, &model)?;
    let info = &st.info;
    let mut capabilities = vec!["completion"];
    if st.template.is_some() {
        capabilities.push("tools");
    }
    let mut model_info = HashMap::new();
    model_info.insert("general.architecture".to_string(), json!(info.arch));
    model_info.insert(
        "general.parameter_count".to_string(),
        json!(info.parameters),
    );
    model_info.insert(
        format!("{}.context_length", info.arch),
        json!(info.context_length),
    );
    Ok(Json(json!({
        "modelfile": format!("FROM {}\n", st.model_id),
        "parameters": format!("num_ctx {}", st.n_ctx),
        "template": st.template.as_ref().map(|t| t.source().to_string()).unwrap_or_default(),
        "details": details(info),
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": model_entry(&st)["modified_at"],
    })))
}

/// `POST /api/pull`: a model served here is here already; any other catalog model is fetched
/// into this machine's store ([`crate::pull`]), from where `strata serve --model` serves it.
pub(crate) async fn pull(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (model, stream) = named(&body_bytes(body, st.max_body)?)?;
    if check_model(&st, &model).is_err() {
        return Ok(crate::pull::into_store(&model, stream).await);
    }
    let lines = [
        json!({"status": "pulling manifest"}),
        json!({"status": "success"}),
    ];
    if !stream {
        return Ok(Json(json!({"status": "success"})).into_response());
    }
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], text).into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn calls_get_ids_and_results_answer_them_in_order() {
        let body: Vec<InMessage> = serde_json::from_value(json!([
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"function": {"name": "get_time", "arguments": {}}}]},
            {"role": "tool", "content": "12:00", "tool_name": "get_time"},
            {"role": "tool", "content": "sunny"},
        ]))
        .unwrap();
        let m = messages(&body).unwrap();
        let calls = m[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1_1"));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1_0"));
        let bad: Vec<InMessage> =
            serde_json::from_value(json!([{"role": "robot", "content": ""}])).unwrap();
        assert_eq!(
            messages(&bad).unwrap_err().param.as_deref(),
            Some("messages[0].role")
        );
    }

    #[test]
    fn format_is_json_or_a_schema() {
        assert_eq!(
            response_format(Some(&json!("json"))).unwrap(),
            Some(json!({"type": "json_object"}))
        );
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            response_format(Some(&s)).unwrap().unwrap()["json_schema"]["schema"],
            s
        );
        assert!(response_format(Some(&json!(3))).is_err());
        assert_eq!(response_format(Some(&json!(""))).unwrap(), None);
    }
}
