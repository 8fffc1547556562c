//! Embeddings: OpenAI's `POST /v1/embeddings`, Ollama's `POST /api/embed` and its older
//! `POST /api/embeddings`.
//!
//! Each input is tokenised as llama.cpp's embedding paths do (the model's BOS and EOS, special
//! tokens parsed), computed alone by the engine thread between decode steps (one pass, no
//! slot), pooled as `--pooling` or the file's `pooling_type` says (mean for a model that
//! names none) and
//! normalised to unit length, so the vectors are llama.cpp's bit for bit (see
//! [`strata_engine::embed`]). A model whose file names a pooling is an embedding model and
//! takes no generation requests (see [`refuse_generation`]).

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use strata_engine::embed::{Pooling, normalize};
use strata_engine::prefix::Partition;
use strata_scheduler::{Event, Job, SubmitError};
use tokio::sync::mpsc;

use crate::ApiError;
use crate::prepare::{From, body_bytes, prepared};
use crate::state::AppState;
use crate::types::parse_body;

/// Most inputs one request may carry (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// The pooling this model's embeddings use: `--pooling`, else the file's, else mean.
pub(crate) fn pooling(st: &AppState) -> Pooling {
    st.info
        .embed_with
        .or(st.info.pooling)
        .unwrap_or(Pooling::Mean)
}

/// The 400 a generation request gets from an embedding model.
pub(crate) fn refuse_generation(st: &AppState) -> Result<(), ApiError> {
    match st.info.pooling {
        Some(p) => Err(ApiError::invalid(
            "model",
            format!(
                "{} is an embedding model (its file sets {} pooling): it answers \
                 /v1/embeddings, /api/embed and /api/embeddings, not generation.",
                st.model_id,
                p.name()
            ),
        )),
        None => Ok(()),
    }
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
struct OpenAiBody {
    model: String,
    /// A string, a list of strings, a list of token ids, or a list of such lists.
    input: Value,
    /// Keep the first this many dimensions (then normalise again).
    dimensions: Option<i64>,
    /// `float` (the default) or `base64` (little-endian f32s).
    encoding_format: Option<String>,
}

/// `POST /api/embed`.
#[derive(Debug, Deserialize)]
struct EmbedBody {
    model: String,
    /// A string or a list of strings.
    input: Value,
    /// Cut inputs longer than the context (Ollama's default) instead of refusing them.
    truncate: Option<bool>,
    dimensions: Option<i64>,
}

/// `POST /api/embeddings` (Ollama's older route).
#[derive(Debug, Deserialize)]
struct LegacyBody {
    model: String,
    prompt: String,
}

/// One input, tokenised.
type Tokens = Vec<u32>;

/// The inputs of `input` (`param` names it in errors), as token lists.
fn inputs(
    st: &AppState,
    input: &Value,
    param: &str,
    truncate: bool,
) -> Result<Vec<Tokens>, ApiError> {
    let bad = |m: &str| ApiError::invalid(param, m);
    let list: Vec<&Value> = match input {
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![input]
        }
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    if list.is_empty() {
        return Err(bad("input must not be empty."));
    }
    if list.len() > MAX_INPUTS {
        return Err(bad(&format!("At most {MAX_INPUTS} inputs per request.")));
    }
    let vocab = st.tokenizer.vocab_size();
    list.into_iter()
        .map(|item| {
            let mut tokens = match item {
                Value::String(s) if s.is_empty() => {
                    return Err(bad("An input must not be an empty string."));
                }
                Value::String(s) => st.tokenizer.encode_prompt(s, true).map_err(|e| {
                    ApiError::bad_body(format!("The input cannot be tokenised: {e}"))
                })?,
                Value::Array(ids) if !ids.is_empty() => ids
                    .iter()
                    .map(|v| {
                        v.as_u64()
                            .filter(|&id| (id as usize) < vocab)
                            .map(|id| id as u32)
                            .ok_or_else(|| {
                                bad(&format!("Token ids must be integers below {vocab}."))
                            })
                    })
                    .collect::<Result<Vec<u32>, ApiError>>()?,
                _ => {
                    return Err(bad(
                        "input must be a string, a list of strings, a list of token ids or a \
                         list of such lists.",
                    ));
                }
            };
            if tokens.len() > st.n_ctx {
                if !truncate {
                    let mut e = ApiError::context_length(tokens.len(), st.n_ctx);
                    e.param = Some(param.into());
                    return Err(e);
                }
                tokens.truncate(st.n_ctx);
            }
            Ok(tokens)
        })
        .collect()
}

/// `dimensions`, checked against the model's width.
fn dimensions(st: &AppState, d: Option<i64>) -> Result<Option<usize>, ApiError> {
    let Some(d) = d else { return Ok(None) };
    let width = st.info.embedding_length;
    match usize::try_from(d) {
        Ok(n) if n >= 1 && (width == 0 || n as u64 <= width) => Ok(Some(n)),
        _ => Err(ApiError::invalid(
            "dimensions",
            format!("dimensions must be between 1 and the model's {width}."),
        )),
    }
}

/// Computes every input's vector on the engine thread, in order: pooled, cut to `dims`,
/// normalised. Inputs go one at a time, so a request of many inputs holds one place in the
/// queue, not as many as it has inputs.
async fn compute(
    st: &AppState,
    all: Vec<Tokens>,
    dims: Option<usize>,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let pooling = pooling(st);
    let mut out = Vec::with_capacity(all.len());
    for tokens in all {
        let (tx, mut rx) = mpsc::unbounded_channel();
        st.scheduler
            .submit(Job {
                prompt: tokens,
                max_tokens: 0,
                sampling: strata_engine::SamplingParams::default(),
                logprobs: None,
                constraint: None,
                events: tx,
                arrived: Instant::now(),
                partition: Partition::SHARED,
                embed: Some(pooling),
                speculation: Default::default(),
            })
            .map_err(|e| match e {
                SubmitError::Full(n) => ApiError::queue_full(n),
                SubmitError::Stopped => ApiError::unavailable("The model instance has stopped."),
            })?;
        let mut v = match rx.recv().await {
            Some(Event::Embedding(v)) => v,
            Some(Event::Failed(m)) => {
                return Err(ApiError::unavailable(format!("Embedding failed: {m}")));
            }
            _ => return Err(ApiError::unavailable("The model instance stopped.")),
        };
        if let Some(d) = dims {
            v.truncate(d);
        }
        normalize(&mut v);
        out.push(v);
    }
    Ok(out)
}

/// Records the tokens read for the access log and the metrics.
fn account(caller: &From, tokens: usize) {
    if let Some(u) = &caller.usage {
        u.update(|f| f.tokens = Some((tokens, 0)));
    }
}

/// `POST /v1/embeddings`.
pub(crate) async fn openai(
    State(st): State<Arc<AppState>>,
    caller: From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, st.max_body)?;
    let (all, dims, base64) = prepared(&st, move |st| {
        let req: OpenAiBody = parse_body(&body)?;
        st.check_model(&req.model)?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("encoding_format must be float or base64, not {other:?}."),
                ));
            }
        };
        let dims = dimensions(st, req.dimensions)?;
        Ok((inputs(st, &req.input, "input", false)?, dims, base64))
    })
    .await?;
    let tokens: usize = all.iter().map(Vec::len).sum();
    let vectors = compute(&st, all, dims).await?;
    account(&caller, tokens);
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": st.model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// `POST /api/embed`.
pub(crate) async fn ollama_embed(
    State(st): State<Arc<AppState>>,
    caller: From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let body = body_bytes(body, st.max_body)?;
    let (all, dims) = prepared(&st, move |st| {
        let req: EmbedBody = parse_body(&body)?;
        crate::ollama::check_model(st, &req.model)?;
        let dims = dimensions(st, req.dimensions)?;
        Ok((
            inputs(st, &req.input, "input", req.truncate.unwrap_or(true))?,
            dims,
        ))
    })
    .await?;
    let tokens: usize = all.iter().map(Vec::len).sum();
    let vectors = compute(&st, all, dims).await?;
    account(&caller, tokens);
    let ns = started.elapsed().as_nanos() as u64;
    Ok(Json(json!({
        "model": st.model_id,
        "embeddings": vectors,
        "total_duration": ns,
        "load_duration": 0,
        "prompt_eval_count": tokens,
    })))
}

/// `POST /api/embeddings`.
pub(crate) async fn ollama_legacy(
    State(st): State<Arc<AppState>>,
    caller: From,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, st.max_body)?;
    let all = prepared(&st, move |st| {
        let req: LegacyBody = parse_body(&body)?;
        crate::ollama::check_model(st, &req.model)?;
        // An empty prompt loads the model in Ollama, and answers an empty vector.
        if req.prompt.is_empty() {
            return Ok(Vec::new());
        }
        inputs(st, &Value::String(req.prompt), "prompt", true)
    })
    .await?;
    if all.is_empty() {
        return Ok(Json(json!({"embedding": []})));
    }
    let tokens: usize = all.iter().map(Vec::len).sum();
    let mut vectors = compute(&st, all, None).await?;
    account(&caller, tokens);
    Ok(Json(
        json!({"embedding": vectors.pop().unwrap_or_default()}),
    ))
}
