//! A request made ready for the scheduler, whatever API it came through: checked, its chat
//! rendered through the template, tokenised, its sampling settings validated and its
//! constraint (tools, JSON output) compiled. The dialects translate their requests into
//! OpenAI's chat or completion request and prepare that.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::{Value, json};
use strata_engine::SamplingParams;
use strata_scheduler::Constraint;
use strata_tokenizer::RenderOptions;

use crate::ApiError;
use crate::call_format::CallFormat;
use crate::state::AppState;
use crate::tenancy::Tenant;
use crate::tools::{self, Choice};
use crate::types::{ChatRequest, CompletionRequest, Message, Sampling};

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
    /// The request's own speculative decoding setting (`None`: the server's).
    pub(crate) speculate: Option<bool>,
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
        speculate: req.speculate,
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
    /// The request's `cache_salt` ([`crate::tenancy`]).
    pub(crate) cache_salt: Option<String>,
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

/// What a generating route takes from the request besides its body: the [`Tenant`] the key
/// check set (absent on a server without keys) and the access log's
/// [`strata_http::access::Usage`], which the answer fills in.
#[derive(Debug, Clone, Default)]
pub(crate) struct From {
    pub(crate) tenant: Option<Tenant>,
    pub(crate) usage: Option<strata_http::access::Usage>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for From {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<From, Self::Rejection> {
        Ok(From {
            tenant: parts.extensions.get::<Tenant>().cloned(),
            usage: parts
                .extensions
                .get::<strata_http::access::Usage>()
                .cloned(),
        })
    }
}

/// [`prepare_chat`] for a request already parsed (or translated from another API).
pub(crate) fn prepare_chat_request(st: &AppState, req: ChatRequest) -> Result<Prepared, ApiError> {
    st.check_model(&req.model)?;
    let mut req = req;
    st.defaults.fill(&mut req.sampling);
    let (max, max_param) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m.or(st.defaults.max_tokens), "max_tokens"),
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
        move |e: crate::grammar::GrammarError| {
            ApiError::invalid(param, format!("The schema cannot be used: {e}"))
        }
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
        // llama.cpp's server (and older instructor versions) send a schema with json_object.
        Some("json_object") => match rf.get("schema") {
            None | Some(Value::Null) => Ok(Some(json!({"type": "object"}))),
            Some(schema) if schema.is_object() => Ok(Some(schema.clone())),
            Some(_) => Err(bad("response_format.schema must be a JSON schema object.")),
        },
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
        Some(req.max_tokens.or(st.defaults.max_tokens).unwrap_or(16)),
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
        cache_salt: req.cache_salt.clone(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::output::Output;
    use strata_engine::Arch;
    use strata_engine::synth::chat_template;
    use strata_tokenizer::ChatTemplate;

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

    #[test]
    fn json_object_takes_a_schema_too() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"type": "json_object", "schema": schema});
        assert_eq!(response_format(Some(&rf)).unwrap(), Some(schema));
        let plain = json!({"type": "json_object"});
        assert_eq!(
            response_format(Some(&plain)).unwrap(),
            Some(json!({"type": "object"}))
        );
        let bad = json!({"type": "json_object", "schema": "object"});
        assert!(response_format(Some(&bad)).is_err());
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
