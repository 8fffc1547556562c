//! OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`, for
//! Codex CLI, the OpenAI Agents SDK and other clients built on it.
//!
//! A request (a string or input items, `instructions`, function tools, `text.format`) is
//! translated into the chat request strata serves; the answer is written as a response object
//! (output items: a message, function calls) or its stream of `response.*` events. Responses
//! are stored in memory unless `store: false`, within a byte budget (the oldest go first), so
//! `previous_response_id` can continue a conversation and `GET` can read one back.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

pub(crate) mod store;
mod tools;

use tools::{IGNORED_HEADER, ToolSet};

use crate::ApiError;
use crate::answer::{Answer, Ending, Reply};
use crate::output::Piece;
use crate::prepare::{Prepared, prepare_chat_request};
use crate::state::AppState;
use crate::tools::ParsedCall;
use crate::types::{ChatRequest, FunctionCall, Message, Sampling, ToolCall, parse_body};
use strata_scheduler::Event;

/// `POST /v1/responses`.
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: String,
    /// A string, or input items.
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", …}}`.
    text: Option<Value>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    stream: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    metadata: Option<Value>,
    background: Option<bool>,
    conversation: Option<Value>,
    top_logprobs: Option<i64>,
    /// As the chat dialect's `cache_salt`.
    cache_salt: Option<String>,
    /// Extra output to include; checked against the values OpenAI knows (see [`INCLUDES`]).
    include: Option<Vec<String>>,
    /// A client's hint for routing to a warm cache: echoed (the prefix cache needs no hint).
    prompt_cache_key: Option<String>,
    /// `{"effort": …, "summary": …}`: echoed (no model strata serves reasons on request).
    reasoning: Option<Value>,
}

/// The `include` values OpenAI accepts. strata writes no reasoning items and runs no hosted
/// tools, so each of them adds nothing to an answer here, as it adds nothing on OpenAI's side
/// to an answer without those items.
const INCLUDES: [&str; 8] = [
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "message.input_image.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
];

/// How an answer is written as a response, and what is stored of it.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    id: String,
    /// The request's settings, echoed in the response object.
    echo: Value,
    /// The conversation so far (previous responses' and this input), stored with the output.
    history: Vec<Message>,
    store: bool,
    /// The request's tools, to name calls as the client knows them.
    tools: ToolSet,
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(st): State<Arc<AppState>>,
    tenant: crate::prepare::From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::answer::answer(st, tenant, body, prepare).await
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn get(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    st.responses
        .get(&id)
        .map(|s| Json(s.response.clone()))
        .ok_or_else(|| not_found(&id))
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if st.responses.remove(&id) {
        Ok(Json(
            json!({"id": id, "object": "response.deleted", "deleted": true}),
        ))
    } else {
        Err(not_found(&id))
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::with_status(
        StatusCode::NOT_FOUND,
        format!("No response with id '{id}' is stored here (stored responses live in memory)."),
    )
}

fn prepare(st: &AppState, body: &[u8]) -> Result<(Prepared, Box<Shape>), ApiError> {
    let req: ResponsesRequest = parse_body(body)?;
    for (on, name, why) in [
        (
            req.background == Some(true),
            "background",
            "background responses are not supported",
        ),
        (
            req.conversation.is_some(),
            "conversation",
            "conversations are not supported; continue with previous_response_id",
        ),
        (
            req.top_logprobs.is_some_and(|k| k > 0),
            "top_logprobs",
            "log-probabilities are not offered on /v1/responses; use /v1/chat/completions",
        ),
    ] {
        if on {
            return Err(ApiError::invalid(name, format!("{why}.")));
        }
    }
    let mut history = match &req.previous_response_id {
        Some(prev) => st
            .responses
            .get(prev)
            .map(|s| s.history.clone())
            .ok_or_else(|| {
                ApiError::invalid(
                    "previous_response_id",
                    format!("Previous response with id '{prev}' not found."),
                )
            })?,
        None => Vec::new(),
    };
    for (i, inc) in req.include.iter().flatten().enumerate() {
        if !INCLUDES.contains(&inc.as_str()) {
            return Err(ApiError::invalid(
                format!("include[{i}]"),
                format!(
                    "Unknown include value `{inc}`: expected one of {}.",
                    INCLUDES.join(", ")
                ),
            ));
        }
    }
    let toolset = ToolSet::parse(req.tools.as_deref().unwrap_or_default())?;
    let input = req
        .input
        .as_ref()
        .ok_or_else(|| ApiError::invalid("input", "input is required."))?;
    items(input, &mut history, &toolset)?;
    let mut messages = history.clone();
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.insert(0, Message::plain("system", i.clone()));
    }
    let tools = &toolset.tools;
    let tool_choice = toolset.tool_choice(req.tool_choice.as_ref())?;
    let format = req.text.as_ref().and_then(|t| t.get("format")).cloned();
    let response_format = match format
        .as_ref()
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str)
    {
        None | Some("text") => None,
        Some("json_object") => format.clone(),
        Some("json_schema") => Some(json!({"type": "json_schema", "json_schema": format})),
        Some(other) => {
            return Err(ApiError::invalid(
                "text.format.type",
                format!(
                    "Unknown format type `{other}`: expected text, json_object or json_schema."
                ),
            ));
        }
    };
    let stream = req.stream.unwrap_or(false);
    let chat = ChatRequest {
        model: req.model.clone(),
        messages,
        max_tokens: req.max_output_tokens,
        max_completion_tokens: None,
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            ..Sampling::default()
        },
        logprobs: None,
        top_logprobs: None,
        stream: Some(stream),
        stream_options: None,
        tools: (!tools.is_empty()).then(|| tools.clone()),
        tool_choice: tool_choice.clone(),
        parallel_tool_calls: req.parallel_tool_calls,
        response_format,
        cache_salt: req.cache_salt.clone(),
    };
    let p = prepare_chat_request(st, chat).map_err(|mut e| {
        // The chat request's field names, as this API calls them.
        e.param = e.param.map(|p| {
            p.replace("max_tokens", "max_output_tokens")
                .replace("response_format", "text.format")
                .replace("messages", "input")
        });
        e
    })?;
    let echo = json!({
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata.unwrap_or_else(|| json!({})),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": req.previous_response_id,
        "temperature": req.temperature.unwrap_or(1.0),
        "top_p": req.top_p.unwrap_or(1.0),
        "tool_choice": tool_choice.map_or_else(|| json!(if tools.is_empty() { "none" } else { "auto" }), |c| match c {
            Value::Object(_) => json!({"type": "function", "name": c["function"]["name"]}),
            other => other,
        }),
        "tools": req.tools.unwrap_or_default(),
        "text": {"format": format.unwrap_or_else(|| json!({"type": "text"}))},
        "store": req.store.unwrap_or(true),
        "truncation": "disabled",
        "prompt_cache_key": req.prompt_cache_key,
        "reasoning": req.reasoning.unwrap_or_else(|| json!({"effort": null, "summary": null})),
    });
    let shape = Box::new(Shape {
        id: format!("resp_{:016x}", crate::prepare::rand_id()),
        echo,
        history,
        store: req.store.unwrap_or(true),
        tools: toolset,
    });
    Ok((p, shape))
}

/// The text of a message item's content: a string or text parts.
fn content_text(content: &Value, param: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                        out.push_str(t);
                    }
                    (Some("refusal"), _) => {
                        out.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or(""));
                    }
                    (Some(kind @ ("input_image" | "input_file" | "input_audio")), _) => {
                        return Err(ApiError::invalid(
                            format!("{param}[{j}]"),
                            format!(
                                "`{kind}` parts are not supported: this model reads text only."
                            ),
                        ));
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{param}[{j}]"),
                            "A content part must be {\"type\": \"input_text\", \"text\": \"...\"}.",
                        ));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid(
            param,
            "content must be a string or a list of parts.",
        )),
    }
}

/// Appends the input items to `history` as chat messages: messages, function calls (joined to
/// the assistant turn they belong to) and their outputs (which must answer a call made before).
/// A call to a namespaced function is named as the prompt names it (see [`ToolSet`]).
fn items(input: &Value, history: &mut Vec<Message>, tools: &ToolSet) -> Result<(), ApiError> {
    let list = match input {
        Value::String(s) => {
            history.push(Message::plain("user", s.clone()));
            return Ok(());
        }
        Value::Array(a) => a,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or a list of items.",
            ));
        }
    };
    for (i, item) in list.iter().enumerate() {
        let param = format!("input[{i}]");
        let field = |k: &str| -> Result<String, ApiError> {
            item.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    ApiError::invalid(format!("{param}.{k}"), format!("`{k}` must be a string."))
                })
        };
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        match kind {
            "message" => {
                let role = match field("role")?.as_str() {
                    "developer" => "system".to_string(),
                    r @ ("user" | "assistant" | "system") => r.to_string(),
                    other => {
                        return Err(ApiError::invalid(
                            format!("{param}.role"),
                            format!(
                                "Unknown role `{other}`: expected user, assistant, system or developer."
                            ),
                        ));
                    }
                };
                let content = item.get("content").unwrap_or(&Value::Null);
                let text = content_text(content, &format!("{param}.content"))?;
                history.push(Message::plain(&role, text));
            }
            "function_call" => {
                let call = ToolCall {
                    id: Some(field("call_id")?),
                    kind: Some("function".into()),
                    function: FunctionCall {
                        name: tools.prompt_name(
                            item.get("namespace").and_then(Value::as_str),
                            &field("name")?,
                        ),
                        arguments: field("arguments")?,
                    },
                };
                match history.last_mut() {
                    Some(m) if m.role == "assistant" => {
                        m.tool_calls.get_or_insert_with(Vec::new).push(call);
                    }
                    _ => {
                        let mut m = Message::plain("assistant", String::new());
                        m.tool_calls = Some(vec![call]);
                        history.push(m);
                    }
                }
            }
            "function_call_output" => {
                let id = field("call_id")?;
                let known = history
                    .iter()
                    .flat_map(|m| m.tool_calls.iter().flatten())
                    .any(|c| c.id.as_deref() == Some(id.as_str()));
                if !known {
                    return Err(ApiError::invalid(
                        format!("{param}.call_id"),
                        format!("No tool call found for function call output with call_id {id}."),
                    ));
                }
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(v, &format!("{param}.output"))?,
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{param}.output"),
                            "output must be a string.",
                        ));
                    }
                };
                let mut m = Message::plain("tool", output);
                m.tool_call_id = Some(id);
                history.push(m);
            }
            // Reasoning is not shown to the model again.
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid(
                    format!("{param}.type"),
                    format!(
                        "Input items of type `{other}` are not supported: expected message, \
                         function_call, function_call_output or reasoning."
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn message_id(shape: &Shape) -> String {
    format!("msg_{}", shape.id.trim_start_matches("resp_"))
}

fn call_ids(shape: &Shape, i: usize) -> (String, String) {
    let base = shape.id.trim_start_matches("resp_");
    (format!("fc_{base}_{i}"), format!("call_{base}_{i}"))
}

fn message_item(shape: &Shape, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": message_id(shape),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

fn call_item(shape: &Shape, i: usize, call: &ParsedCall, status: &str) -> Value {
    let (id, call_id) = call_ids(shape, i);
    let (name, namespace) = shape.tools.wire_name(&call.name);
    let mut item = json!({
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": call.arguments,
        "status": status,
    });
    if let Some(ns) = namespace {
        item["namespace"] = json!(ns);
    }
    item
}

/// The response object; `ending` is `None` while it is being generated.
fn response_object(a: &Answer, shape: &Shape, ending: Option<&Ending>) -> Value {
    let mut r = json!({
        "id": shape.id,
        "object": "response",
        "created_at": a.created,
        "model": a.st.model_id,
        "status": "in_progress",
        "error": null,
        "incomplete_details": null,
        "output": [],
        "usage": null,
    });
    if let (Some(o), Value::Object(echo)) = (r.as_object_mut(), shape.echo.clone()) {
        o.extend(echo);
    }
    let Some(e) = ending else { return r };
    let cut = e.reason == "length";
    let mut output = Vec::new();
    if !a.out.content.is_empty() || a.out.calls.is_empty() {
        output.push(message_item(
            shape,
            &a.out.content,
            if cut { "incomplete" } else { "completed" },
        ));
    }
    for (i, c) in a.out.calls.iter().enumerate() {
        output.push(call_item(shape, i, c, "completed"));
    }
    r["output"] = Value::Array(output);
    r["status"] = json!(if cut { "incomplete" } else { "completed" });
    if cut {
        r["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    let (input, out) = e.tokens;
    r["usage"] = json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": a.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + out,
    });
    r
}

/// Stores the finished response (unless `store: false`) with the conversation it ends.
fn store(a: &Answer, shape: &Shape, response: &Value) {
    if !shape.store {
        return;
    }
    let mut history = shape.history.clone();
    let mut m = Message::plain("assistant", a.out.content.clone());
    if !a.out.calls.is_empty() {
        m.tool_calls = Some(
            a.out
                .calls
                .iter()
                .enumerate()
                .map(|(i, c)| ToolCall {
                    id: Some(call_ids(shape, i).1),
                    kind: Some("function".into()),
                    function: FunctionCall {
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                })
                .collect(),
        );
    }
    history.push(m);
    a.st.responses
        .put(shape.id.clone(), history, response.clone());
}

impl Reply for Box<Shape> {
    async fn send(
        self,
        a: Answer,
        rx: mpsc::UnboundedReceiver<Event>,
        streamed: bool,
    ) -> Result<Response, ApiError> {
        let ignored = self.tools.ignored.join(", ");
        let mut resp = if streamed {
            stream(a, rx, self).into_response()
        } else {
            whole(a, rx, self).await?
        };
        if !ignored.is_empty()
            && let Ok(v) = axum::http::HeaderValue::from_str(&ignored)
        {
            resp.headers_mut().insert(IGNORED_HEADER, v);
        }
        Ok(resp)
    }
}

/// Answers with the whole response.
async fn whole(
    mut a: Answer,
    rx: mpsc::UnboundedReceiver<Event>,
    shape: Box<Shape>,
) -> Result<Response, ApiError> {
    let ending = a.collect(rx).await?;
    let r = response_object(&a, &shape, Some(&ending));
    store(&a, &shape, &r);
    Ok(Json(r).into_response())
}

/// What is open in a streamed response.
enum Open {
    /// The message item at this output index, with its text so far.
    Message(usize, String),
    /// The function call at this output index (the call's index among calls), arguments so far.
    Call(usize, usize, String),
}

/// Streams the response as `response.*` events.
fn stream(
    mut a: Answer,
    mut rx: mpsc::UnboundedReceiver<Event>,
    shape: Box<Shape>,
) -> impl IntoResponse {
    let (tx, out) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let mut seq = 0u64;
        let mut send = |mut v: Value| {
            v["sequence_number"] = json!(seq);
            seq += 1;
            let name = v["type"].as_str().unwrap_or("message").to_string();
            tx.send(Ok(SseEvent::default().event(name).data(v.to_string())))
                .is_ok()
        };
        let start = response_object(&a, &shape, None);
        if !send(json!({"type": "response.created", "response": start}))
            || !send(json!({"type": "response.in_progress", "response": start}))
        {
            return;
        }
        let mut open: Option<Open> = None;
        let mut items = 0usize;
        let close = |open: &mut Option<Open>, shape: &Shape| -> Vec<Value> {
            match open.take() {
                Some(Open::Message(at, text)) => {
                    let id = message_id(shape);
                    let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                    vec![
                        json!({"type": "response.output_text.done", "item_id": id, "output_index": at, "content_index": 0, "text": text, "logprobs": []}),
                        json!({"type": "response.content_part.done", "item_id": id, "output_index": at, "content_index": 0, "part": part}),
                        json!({"type": "response.output_item.done", "output_index": at, "item": message_item(shape, &text, "completed")}),
                    ]
                }
                Some(Open::Call(at, i, args)) => {
                    let (id, _) = call_ids(shape, i);
                    vec![
                        json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": at, "arguments": args}),
                    ]
                }
                None => Vec::new(),
            }
        };
        loop {
            let (pieces, ending) = match a.step(rx.recv().await) {
                Ok(step) => step,
                Err(e) => {
                    let mut v = crate::Dialect::OpenAi.body(&e)["error"].clone();
                    v["type"] = json!("error");
                    send(v);
                    return;
                }
            };
            let mut events = Vec::new();
            for piece in pieces {
                match piece {
                    Piece::Content(t) if t.is_empty() => {}
                    Piece::Content(t) => {
                        if !matches!(open, Some(Open::Message(..))) {
                            events.extend(close(&mut open, &shape));
                            let at = items;
                            items += 1;
                            let id = message_id(&shape);
                            events.push(json!({"type": "response.output_item.added", "output_index": at,
                                "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}));
                            events.push(json!({"type": "response.content_part.added", "item_id": id, "output_index": at, "content_index": 0,
                                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}));
                            open = Some(Open::Message(at, String::new()));
                        }
                        if let Some(Open::Message(at, text)) = open.as_mut() {
                            text.push_str(&t);
                            events.push(json!({"type": "response.output_text.delta", "item_id": message_id(&shape),
                                "output_index": *at, "content_index": 0, "delta": t, "logprobs": []}));
                        }
                    }
                    Piece::CallStart(i, name) => {
                        events.extend(close(&mut open, &shape));
                        let at = items;
                        items += 1;
                        let call = ParsedCall {
                            name,
                            arguments: String::new(),
                        };
                        events.push(
                            json!({"type": "response.output_item.added", "output_index": at,
                            "item": call_item(&shape, i, &call, "in_progress")}),
                        );
                        open = Some(Open::Call(at, i, String::new()));
                    }
                    Piece::CallArgs(_, t) => {
                        if let Some(Open::Call(at, i, args)) = open.as_mut() {
                            args.push_str(&t);
                            events.push(json!({"type": "response.function_call_arguments.delta",
                                "item_id": call_ids(&shape, *i).0, "output_index": *at, "delta": t}));
                        }
                    }
                    Piece::Call(i, call) => {
                        if let Some(Open::Call(at, ..)) = open {
                            events.extend(close(&mut open, &shape));
                            events.push(
                                json!({"type": "response.output_item.done", "output_index": at,
                                "item": call_item(&shape, i, &call, "completed")}),
                            );
                        }
                    }
                    Piece::Reasoning(_) => {}
                }
            }
            if let Some(e) = &ending {
                events.extend(close(&mut open, &shape));
                let r = response_object(&a, &shape, Some(e));
                store(&a, &shape, &r);
                let kind = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                events.push(json!({"type": kind, "response": r}));
            }
            for ev in events {
                if !send(ev) {
                    return;
                }
            }
            if ending.is_some() || tx.is_closed() {
                return;
            }
        }
    });
    Sse::new(UnboundedReceiverStream::new(out)).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn input_items_become_a_conversation_and_outputs_must_answer_calls() {
        let mut h = Vec::new();
        let none = ToolSet::default();
        items(
            &json!([
                {"role": "developer", "content": "Be brief."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c2", "output": "sunny"},
            ]),
            &mut h,
            &none,
        )
        .unwrap();
        let roles: Vec<&str> = h.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(h[2].tool_calls.as_ref().unwrap().len(), 2);
        let e = items(
            &json!([{"type": "function_call_output", "call_id": "nope", "output": "x"}]),
            &mut h,
            &none,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].call_id"));
        let e = items(&json!([{"type": "web_search_call"}]), &mut h, &none).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].type"));
    }
}
