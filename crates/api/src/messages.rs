//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request is translated into the chat request strata already serves (the same template,
//! tool grammar and scheduler), so tool inputs are held to their schemas exactly as OpenAI tool
//! calls are; the answer is written back as an Anthropic message, whole or as its stream of
//! events. Errors take Anthropic's shape through [`crate::Dialect`].
//!
//! Fields strata has no use for (`metadata`, `cache_control`, `context_management`, beta
//! fields) are accepted and ignored, as Anthropic's own API accepts them; what it cannot do
//! (images, documents, Anthropic's server tools) is refused with a 400 naming the field.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::ApiError;
use crate::answer::{Answer, Ending, Reply};
use crate::output::Piece;
use crate::prepare::{Prepared, body_bytes, prepare_chat_request, prepared, rendered_chat};
use crate::state::AppState;
use crate::types::{
    ChatRequest, FunctionCall, FunctionDef, Message, Sampling, Tool, ToolCall, parse_body,
};
use strata_scheduler::Event;

/// `POST /v1/messages` (and, without `max_tokens`, `count_tokens`).
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: String,
    messages: Vec<InMessage>,
    /// A string or text blocks.
    system: Option<Value>,
    max_tokens: Option<i64>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    stream: Option<bool>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    /// `{"type": "enabled" | "adaptive" | "between_tools" | "disabled", …}`.
    thinking: Option<Value>,
    /// `{"format": {"type": "json_schema", "schema": …}, "effort": …}`: structured output.
    output_config: Option<Value>,
    /// As the OpenAI dialect's `cache_salt`.
    cache_salt: Option<String>,
}

/// One message of the conversation.
#[derive(Debug, Deserialize)]
struct InMessage {
    role: String,
    /// A string or content blocks.
    content: Value,
}

/// How an answer is written as an Anthropic message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Reasoning goes out as `thinking` blocks (thinking was asked for); otherwise it is left
    /// out, as Anthropic leaves it out.
    thinking: bool,
    /// The `max_tokens` asked for, when the context left less (the answer's usage says so).
    asked: Option<usize>,
}

/// `POST /v1/messages`.
pub(crate) async fn create(
    State(st): State<Arc<AppState>>,
    tenant: crate::prepare::From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::answer::answer(st, tenant, body, prepare).await
}

/// `POST /v1/messages/count_tokens`: the prompt's length as the model would see it (system,
/// tools and messages through the template), long or not.
pub(crate) async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, st.max_body)?;
    let n = prepared(&st, move |st| count(st, &body)).await?;
    Ok(Json(json!({"input_tokens": n})).into_response())
}

fn count(st: &AppState, body: &[u8]) -> Result<usize, ApiError> {
    let req: MessagesRequest = parse_body(body)?;
    let t = translate(req, false)?;
    st.check_model(&t.chat.model)?;
    let (text, ..) = rendered_chat(st, &t.chat)?;
    let ids = st
        .tokenizer
        .encode_prompt(&text, true)
        .map_err(|e| ApiError::invalid("messages", format!("Could not tokenise: {e}")))?;
    Ok(ids.len())
}

fn prepare(st: &AppState, body: &[u8]) -> Result<(Prepared, Shape), ApiError> {
    let req: MessagesRequest = parse_body(body)?;
    let t = translate(req, true)?;
    let mut p = prepare_chat_request(st, t.chat)?;
    p.common.stops = t.stops;
    let room = st.n_ctx.saturating_sub(p.prompt.len());
    let shape = Shape {
        thinking: t.thinking,
        asked: t.max_tokens.filter(|&m| m > room),
    };
    Ok((p, shape))
}

/// A Messages request as a chat request, with what the chat request cannot carry.
struct Translated {
    chat: ChatRequest,
    stops: Vec<String>,
    thinking: bool,
    max_tokens: Option<usize>,
}

fn translate(req: MessagesRequest, needs_max: bool) -> Result<Translated, ApiError> {
    let max_tokens = match req.max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens must be at least 1, got {m}."),
            ));
        }
        Some(m) => Some(m as usize),
        None if needs_max => return Err(ApiError::invalid("max_tokens", "Field required.")),
        None => None,
    };
    if let Some(t) = req.temperature
        && (!t.is_finite() || !(0.0..=1.0).contains(&t))
    {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be between 0 and 1, got {t}."),
        ));
    }
    let stops = req.stop_sequences.unwrap_or_default();
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop_sequences",
            "Stop sequences must not be empty.",
        ));
    }
    // Any kind of thinking but `disabled` shows the model's reasoning (kinds Anthropic adds
    // later are taken as asking for it).
    let thinking = match &req.thinking {
        None | Some(Value::Null) => false,
        Some(t) => match t.get("type").and_then(Value::as_str) {
            Some("disabled") => false,
            Some(_) => true,
            None => {
                return Err(ApiError::invalid(
                    "thinking.type",
                    "thinking needs a string `type` (enabled, adaptive or disabled).",
                ));
            }
        },
    };
    let response_format = output_format(req.output_config.as_ref())?;
    let mut system = system_text(req.system.as_ref())?;
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    let mut tool_ids = HashSet::new();
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "At least one message is required.",
        ));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let blocks = blocks(&m.content, &format!("messages.{i}.content"))?;
        match m.role.as_str() {
            "user" => user_turn(i, &blocks, &tool_ids, &mut messages)?,
            "assistant" => messages.push(assistant_turn(i, &blocks, &mut tool_ids)?),
            // Claude Code puts reminders in `system` messages: they join the system prompt.
            "system" => {
                let text = texts_only(&blocks, &format!("messages.{i}.content"))?;
                if !system.is_empty() {
                    system.push_str("\n\n");
                }
                system.push_str(&text);
            }
            other => {
                return Err(ApiError::invalid(
                    format!("messages.{i}.role"),
                    format!("Unexpected role `{other}`: expected user or assistant."),
                ));
            }
        }
    }
    if !system.is_empty() {
        messages.insert(0, Message::plain("system", system));
    }
    let (tools, tool_choice, parallel) = tools_of(req.tools.as_ref(), req.tool_choice.as_ref())?;
    Ok(Translated {
        chat: ChatRequest {
            model: req.model,
            messages,
            max_tokens: max_tokens.map(|m| m as i64),
            max_completion_tokens: None,
            sampling: Sampling {
                temperature: req.temperature,
                top_p: req.top_p,
                top_k: req.top_k,
                ..Sampling::default()
            },
            logprobs: None,
            top_logprobs: None,
            stream: req.stream,
            stream_options: None,
            tools,
            tool_choice,
            parallel_tool_calls: Some(parallel),
            response_format,
            cache_salt: req.cache_salt,
        },
        stops,
        thinking,
        max_tokens,
    })
}

/// `output_config.format` as OpenAI's `response_format`.
fn output_format(config: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(format) = config
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null())
    else {
        return Ok(None);
    };
    match (
        format.get("type").and_then(Value::as_str),
        format.get("schema"),
    ) {
        (Some("json_schema"), Some(schema)) if schema.is_object() => Ok(Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }))),
        _ => Err(ApiError::invalid(
            "output_config.format",
            "format must be {\"type\": \"json_schema\", \"schema\": {...}}.",
        )),
    }
}

/// A message's content as blocks (a string is one text block).
fn blocks(content: &Value, param: &str) -> Result<Vec<Value>, ApiError> {
    match content {
        Value::String(s) => Ok(vec![json!({"type": "text", "text": s})]),
        Value::Array(a) => Ok(a.clone()),
        _ => Err(ApiError::invalid(
            param,
            "Input should be a string or a list of content blocks.",
        )),
    }
}

fn block_type<'a>(b: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    b.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            format!("{param}.type"),
            "A content block must be an object with a string `type`.",
        )
    })
}

fn block_text(b: &Value, param: &str) -> Result<String, ApiError> {
    b.get("text")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{param}.text"),
                "A text block needs a string `text`.",
            )
        })
}

/// The refusal for a block this server cannot read.
fn unsupported(kind: &str, param: &str, allowed: &str) -> ApiError {
    let why = match kind {
        "image" | "document" => {
            format!("`{kind}` blocks are not supported: this model reads text only.")
        }
        _ => format!("Unknown content block type `{kind}`: expected {allowed}."),
    };
    ApiError::invalid(format!("{param}.type"), why)
}

/// The text of text-only blocks (system prompts, tool results).
fn texts_only(blocks: &[Value], param: &str) -> Result<String, ApiError> {
    let mut out = String::new();
    for (j, b) in blocks.iter().enumerate() {
        let p = format!("{param}.{j}");
        match block_type(b, &p)? {
            "text" => {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&block_text(b, &p)?);
            }
            other => return Err(unsupported(other, &p, "text")),
        }
    }
    Ok(out)
}

fn system_text(system: Option<&Value>) -> Result<String, ApiError> {
    match system {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => texts_only(blocks, "system"),
        Some(_) => Err(ApiError::invalid(
            "system",
            "system must be a string or a list of text blocks.",
        )),
    }
}

/// A user turn: its tool results become tool messages (in order), its text a user message.
fn user_turn(
    i: usize,
    blocks: &[Value],
    tool_ids: &HashSet<String>,
    out: &mut Vec<Message>,
) -> Result<(), ApiError> {
    let mut text = String::new();
    let mut wrote = false;
    for (j, b) in blocks.iter().enumerate() {
        let p = format!("messages.{i}.content.{j}");
        match block_type(b, &p)? {
            "text" => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&block_text(b, &p)?);
            }
            "tool_result" => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("{p}.tool_use_id"),
                            "A tool_result block needs a string `tool_use_id`.",
                        )
                    })?;
                if !tool_ids.contains(id) {
                    return Err(ApiError::invalid(
                        format!("{p}.tool_use_id"),
                        format!(
                            "Unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each \
                             `tool_result` block must answer a `tool_use` block of an earlier \
                             assistant message."
                        ),
                    ));
                }
                let mut result = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(inner)) => texts_only(inner, &format!("{p}.content"))?,
                    Some(_) => {
                        return Err(ApiError::invalid(
                            format!("{p}.content"),
                            "A tool result's content must be a string or text blocks.",
                        ));
                    }
                };
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    result = format!("Error: {result}");
                }
                if !text.is_empty() {
                    out.push(Message::plain("user", std::mem::take(&mut text)));
                }
                out.push(Message {
                    role: "tool".into(),
                    content: Some(Value::String(result)),
                    name: None,
                    tool_calls: None,
                    tool_call_id: Some(id.to_string()),
                });
                wrote = true;
            }
            other => return Err(unsupported(other, &p, "text or tool_result")),
        }
    }
    if !text.is_empty() || !wrote {
        out.push(Message::plain("user", text));
    }
    Ok(())
}

/// An assistant turn: its text, and its `tool_use` blocks as calls. Thinking blocks are not
/// shown to the model again (as Anthropic drops them from earlier turns).
fn assistant_turn(
    i: usize,
    blocks: &[Value],
    tool_ids: &mut HashSet<String>,
) -> Result<Message, ApiError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let p = format!("messages.{i}.content.{j}");
        match block_type(b, &p)? {
            "text" => text.push_str(&block_text(b, &p)?),
            "thinking" | "redacted_thinking" => {}
            "tool_use" => {
                let field = |k: &str| {
                    b.get(k).and_then(Value::as_str).ok_or_else(|| {
                        ApiError::invalid(
                            format!("{p}.{k}"),
                            format!("A tool_use block needs a string `{k}`."),
                        )
                    })
                };
                let (id, name) = (field("id")?, field("name")?);
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                if !input.is_object() {
                    return Err(ApiError::invalid(
                        format!("{p}.input"),
                        "A tool_use block's input must be an object.",
                    ));
                }
                tool_ids.insert(id.to_string());
                calls.push(ToolCall {
                    id: Some(id.to_string()),
                    kind: Some("function".into()),
                    function: FunctionCall {
                        name: name.to_string(),
                        arguments: input.to_string(),
                    },
                });
            }
            other => return Err(unsupported(other, &p, "text, thinking or tool_use")),
        }
    }
    let mut m = Message::plain("assistant", text);
    if !calls.is_empty() {
        m.tool_calls = Some(calls);
    }
    Ok(m)
}

/// Tools, `tool_choice` and whether calls may come several at a time, as OpenAI's.
type OpenAiTools = (Option<Vec<Tool>>, Option<Value>, bool);

/// Anthropic's `tools` and `tool_choice` as [`OpenAiTools`].
fn tools_of(tools: Option<&Vec<Value>>, choice: Option<&Value>) -> Result<OpenAiTools, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.into_iter().flatten().enumerate() {
        let p = format!("tools.{i}");
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(format!("{p}.name"), "A tool needs a string `name`.")
        })?;
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(kind) => {
                return Err(ApiError::invalid(
                    format!("{p}.type"),
                    format!(
                        "Tool `{name}` has type `{kind}`: Anthropic's server tools do not run \
                         here. Define it as a client tool with an `input_schema`."
                    ),
                ));
            }
        }
        let schema = t.get("input_schema").cloned().ok_or_else(|| {
            ApiError::invalid(
                format!("{p}.input_schema"),
                "A tool needs an `input_schema`.",
            )
        })?;
        out.push(Tool {
            kind: "function".into(),
            function: FunctionDef {
                name: name.to_string(),
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                parameters: Some(schema),
                strict: None,
            },
        });
    }
    let Some(c) = choice.filter(|c| !c.is_null()) else {
        return Ok(((!out.is_empty()).then_some(out), None, true));
    };
    let bad = |m: &str| ApiError::invalid("tool_choice", m);
    let parallel = !c
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let openai = match c.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice of type `tool` needs a `name`."))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad("tool_choice.type must be auto, any, tool or none.")),
    };
    if out.is_empty() && openai != json!("none") && openai != json!("auto") {
        return Err(bad("tool_choice needs tools."));
    }
    Ok(((!out.is_empty()).then_some(out), Some(openai), parallel))
}

/// Anthropic's `stop_reason` for an ending.
fn stop_reason(a: &Answer, e: &Ending) -> &'static str {
    match e.reason {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ if a.out.stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

fn usage(a: &Answer, shape: Shape, input: usize, output: usize) -> Value {
    // Anthropic counts cache reads apart from the input tokens.
    let cached = a.cached_tokens.min(input);
    let mut u = json!({
        "input_tokens": input - cached,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    });
    if let Some(asked) = shape.asked {
        // Asked for more than the context leaves: the answer was given what it leaves.
        u["max_tokens_requested"] = json!(asked);
        u["max_tokens_applied"] = json!(a.budget);
    }
    u
}

fn message_id(a: &Answer) -> String {
    format!("msg_{}", a.id.trim_start_matches("chatcmpl-"))
}

fn tool_use_id(a: &Answer, index: usize) -> String {
    format!("toolu_{}_{index}", a.id.trim_start_matches("chatcmpl-"))
}

impl Reply for Shape {
    async fn send(
        self,
        a: Answer,
        rx: mpsc::UnboundedReceiver<Event>,
        streamed: bool,
    ) -> Result<Response, ApiError> {
        if streamed {
            Ok(stream(a, rx, self).into_response())
        } else {
            whole(a, rx, self).await
        }
    }
}

/// Answers with the whole message.
async fn whole(
    mut a: Answer,
    rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let ending = a.collect(rx).await?;
    let mut content = Vec::new();
    if shape.thinking && !a.out.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": a.out.reasoning, "signature": ""}));
    }
    if !a.out.content.is_empty() || a.out.calls.is_empty() {
        content.push(json!({"type": "text", "text": a.out.content}));
    }
    for (i, c) in a.out.calls.iter().enumerate() {
        let mut block = json!({
            "type": "tool_use",
            "id": tool_use_id(&a, i),
            "name": c.name,
            "input": c.arguments_object(),
        });
        if let Some(e) = a.call_errors(i) {
            block["schema_errors"] = json!(e);
        }
        content.push(block);
    }
    let (input, output) = ending.tokens;
    Ok(Json(json!({
        "id": message_id(&a),
        "type": "message",
        "role": "assistant",
        "model": a.st.model_id,
        "content": content,
        "stop_reason": stop_reason(&a, &ending),
        "stop_sequence": a.out.stop_sequence,
        "usage": usage(&a, shape, input, output),
    }))
    .into_response())
}

/// The content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
    /// A tool call, by its index among the answer's calls.
    Call(usize),
}

/// How often a stream with nothing to say sends a `ping`.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Streams the answer as Anthropic's events: `message_start`, `ping`, each content block's
/// start, deltas and stop, `message_delta` with the stop reason and usage, `message_stop`.
fn stream(
    mut a: Answer,
    mut rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
) -> impl IntoResponse {
    let (tx, out) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let send = |v: Value| {
            let name = v["type"].as_str().unwrap_or("message").to_string();
            tx.send(Ok(SseEvent::default().event(name).data(v.to_string())))
                .is_ok()
        };
        // The usage in message_start counts cache reads, known once the request has a slot.
        let mut early = a.admitted(&mut rx).await;
        let start = json!({
            "type": "message_start",
            "message": {
                "id": message_id(&a),
                "type": "message",
                "role": "assistant",
                "model": a.st.model_id,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": usage(&a, shape, a.prompt_tokens, 0),
            },
        });
        if !send(start) || !send(json!({"type": "ping"})) {
            return;
        }
        let mut blocks = Blocks::default();
        // One timer for the whole stream, pushed back by every event (not one per token).
        let mut idle =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            let ev = match early.take() {
                Some(ev) => ev,
                None => loop {
                    // A long prompt takes minutes on a small machine: pings, as Anthropic's
                    // API sends them, keep clients from taking the silence for a dead stream.
                    tokio::select! {
                        ev = rx.recv() => {
                            idle.reset();
                            break ev;
                        }
                        _ = idle.tick() => {
                            if !send(json!({"type": "ping"})) {
                                return;
                            }
                        }
                    }
                },
            };
            let (pieces, ending) = match a.step(ev) {
                Ok(step) => step,
                Err(e) => {
                    send(crate::Dialect::Anthropic.body(&e));
                    return;
                }
            };
            for piece in pieces {
                let events = match piece {
                    Piece::Content(t) if t.is_empty() => continue,
                    Piece::Content(t) => blocks.delta(
                        Open::Text,
                        json!({"type": "text", "text": ""}),
                        json!({"type": "text_delta", "text": t}),
                    ),
                    Piece::Reasoning(_) if !shape.thinking => continue,
                    Piece::Reasoning(t) => blocks.delta(
                        Open::Thinking,
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        json!({"type": "thinking_delta", "thinking": t}),
                    ),
                    Piece::CallStart(i, name) => blocks.open(
                        Open::Call(i),
                        json!({"type": "tool_use", "id": tool_use_id(&a, i), "name": name,
                            "input": {}}),
                    ),
                    Piece::CallArgs(i, t) => blocks.delta(
                        Open::Call(i),
                        json!({}),
                        json!({"type": "input_json_delta", "partial_json": t}),
                    ),
                    Piece::Call(..) => blocks.close(),
                };
                for ev in events {
                    if !send(ev) {
                        return;
                    }
                }
            }
            if let Some(e) = ending {
                let mut events = blocks.close();
                if blocks.count == 0 {
                    // Every message has at least one block, if only an empty text.
                    events = blocks.open(Open::Text, json!({"type": "text", "text": ""}));
                    events.extend(blocks.close());
                }
                events.push(json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason(&a, &e), "stop_sequence": a.out.stop_sequence},
                    "usage": usage(&a, shape, e.tokens.0, e.tokens.1),
                }));
                events.push(json!({"type": "message_stop"}));
                for ev in events {
                    if !send(ev) {
                        return;
                    }
                }
                return;
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    Sse::new(UnboundedReceiverStream::new(out)).keep_alive(KeepAlive::default())
}

/// The content blocks of a streamed message: which is open, and how many were started.
#[derive(Default)]
struct Blocks {
    open: Option<Open>,
    count: usize,
}

impl Blocks {
    /// Closes the open block, if any.
    fn close(&mut self) -> Vec<Value> {
        match self.open.take() {
            Some(_) => vec![json!({"type": "content_block_stop", "index": self.count - 1})],
            None => Vec::new(),
        }
    }

    /// Starts a block of this kind (closing the one open).
    fn open(&mut self, kind: Open, block: Value) -> Vec<Value> {
        let mut ev = self.close();
        ev.push(
            json!({"type": "content_block_start", "index": self.count, "content_block": block}),
        );
        self.open = Some(kind);
        self.count += 1;
        ev
    }

    /// A delta for a block of this kind, starting it (as `block`) if another is open.
    fn delta(&mut self, kind: Open, block: Value, delta: Value) -> Vec<Value> {
        let mut ev = if self.open == Some(kind) {
            Vec::new()
        } else {
            self.open(kind, block)
        };
        ev.push(json!({"type": "content_block_delta", "index": self.count - 1, "delta": delta}));
        ev
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn req(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_tool_round_trip_becomes_calls_and_tool_messages() {
        let t = translate(
            req(json!({
                "model": "m", "max_tokens": 64,
                "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "x"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                        {"type": "text", "text": "And tomorrow?"}]},
                    {"role": "system", "content": "Reminder."},
                ],
                "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "stop_sequences": ["\n\nHuman:"],
                "thinking": {"type": "adaptive"},
            })),
            true,
        )
        .unwrap();
        let roles: Vec<&str> = t.chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(
            t.chat.messages[0].content,
            Some(json!("Be brief.\n\nReminder."))
        );
        let call = &t.chat.messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.id.as_deref(), Some("toolu_1"));
        assert_eq!(call.function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(t.chat.messages[3].content, Some(json!("18 C")));
        assert_eq!(t.chat.tool_choice, Some(json!("required")));
        assert_eq!(t.chat.parallel_tool_calls, Some(false));
        assert_eq!(t.stops, ["\n\nHuman:"]);
        assert!(t.thinking);
    }

    #[test]
    fn bad_requests_name_the_field_at_fault() {
        let cases = [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}),
                "messages.0.content.0.tool_use_id",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {}}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "hologram"}]}]}),
                "messages.0.content.0.type",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "temperature": 1.5,
                    "messages": [{"role": "user", "content": "hi"}]}),
                "temperature",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools.0.type",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                    "tool_choice": {"type": "any"}}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}),
                "messages.0.role",
            ),
        ];
        for (body, param) in cases {
            let e = translate(req(body.clone()), true).err().unwrap();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.status, 400);
        }
    }

    #[test]
    fn streamed_blocks_are_numbered_opened_and_closed_in_order() {
        let mut b = Blocks::default();
        let mut ev = b.delta(Open::Text, json!({"type": "text"}), json!({"t": 1}));
        ev.extend(b.delta(Open::Text, json!({"type": "text"}), json!({"t": 2})));
        ev.extend(b.open(Open::Call(0), json!({"type": "tool_use"})));
        ev.extend(b.delta(Open::Call(0), json!({}), json!({"p": 1})));
        ev.extend(b.close());
        let kinds: Vec<(String, i64)> = ev
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_string(),
                    e["index"].as_i64().unwrap(),
                )
            })
            .collect();
        let want = [
            ("content_block_start", 0),
            ("content_block_delta", 0),
            ("content_block_delta", 0),
            ("content_block_stop", 0),
            ("content_block_start", 1),
            ("content_block_delta", 1),
            ("content_block_stop", 1),
        ];
        assert_eq!(
            kinds,
            want.map(|(k, i)| (k.to_string(), i)).to_vec(),
            "{ev:?}"
        );
    }
}
