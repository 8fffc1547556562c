//! OpenAI's chat completions and text completions: the routes, and the answer as a
//! `chat.completion` / `text_completion` object or its `chunk` events.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use strata_scheduler::Event;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::ApiError;
use crate::answer::{Answer, Reply};
use crate::output::Piece;
use crate::prepare::{From, Kind, Prepared, prepare_chat_request, prepare_completion_request};
use crate::state::AppState;
use crate::tools;
use crate::types::parse_body;

/// The OpenAI shape of an answer.
pub(crate) struct OpenAi;

impl Reply for OpenAi {
    async fn send(
        self,
        a: Answer,
        rx: mpsc::UnboundedReceiver<Event>,
        streamed: bool,
    ) -> Result<Response, ApiError> {
        if streamed {
            let usage = a.include_usage;
            Ok(stream(a, rx, usage).into_response())
        } else {
            whole(a, rx).await
        }
    }
}

pub(crate) async fn chat(
    State(st): State<Arc<AppState>>,
    tenant: From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::answer::answer(st, tenant, body, prepare_chat).await
}

/// Everything a chat request needs before the scheduler: checked, rendered, tokenised, and its
/// constraint compiled.
fn prepare_chat(st: &AppState, body: &[u8]) -> Result<(Prepared, OpenAi), ApiError> {
    Ok((prepare_chat_request(st, parse_body(body)?)?, OpenAi))
}

pub(crate) async fn completions(
    State(st): State<Arc<AppState>>,
    tenant: From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::answer::answer(st, tenant, body, prepare_completion).await
}

/// [`prepare_chat`] for a completion request.
fn prepare_completion(st: &AppState, body: &[u8]) -> Result<(Prepared, OpenAi), ApiError> {
    Ok((prepare_completion_request(st, parse_body(body)?)?, OpenAi))
}

fn call_json(index: usize, call: &tools::ParsedCall, id: &str) -> Value {
    json!({
        "index": index,
        "id": format!("call_{id}_{index}"),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
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
