//! A small but real server for fuzzing and tests of the HTTP surface: a byte-level vocabulary
//! with ChatML's control tokens, a two-layer Qwen-family model with random weights (written by
//! the engine's synthesiser), Qwen's chat template (tools and all), and the real scheduler.
//!
//! [`exercise`] sends one body to one route through the real router and checks what every
//! answer must be, whatever the body: never a 500, never a panic, an error that is an
//! OpenAI-style JSON object, and a stream that ends. The bounded fuzz test in this crate and
//! the libFuzzer target `http_bodies` (under `fuzz/`) both drive it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use strata_engine::synth::{SynthSpec, synth};
use strata_engine::{Arch, Batch, Model};
use strata_gguf::{GgmlType, GgufFile};
use strata_tokenizer::{ChatTemplate, Tokenizer};

use crate::state::AppState;
use crate::{EngineOptions, StartError, start_engine};

/// The model id the test server serves.
pub const MODEL_ID: &str = "tiny";

/// Context window of the test server (room for a prompt with tools; the model is tiny, so a
/// generation that runs to the end of it still takes well under a second).
pub const N_CTX: usize = 2048;

/// The routes [`exercise`] can send bodies to.
pub const ROUTES: [&str; 11] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/api/chat",
    "/api/generate",
    "/api/show",
    "/v1/responses",
    "/v1/embeddings",
    "/api/embed",
    "/api/embeddings",
];

/// GGUF metadata of a byte-level vocabulary with ChatML's markers (the engine's, which its
/// probe model uses too).
pub(crate) fn vocabulary() -> Vec<u8> {
    strata_engine::synth::byte_vocabulary()
}

/// Starts the test server's state (model, tokenizer, template, scheduler): ~50 ms.
pub fn tiny_state() -> Result<Arc<AppState>, StartError> {
    tiny_state_with(crate::Shared::new(None, 1))
}

/// [`tiny_state`] with these keys and shared state.
pub fn tiny_state_with(shared: crate::Shared) -> Result<Arc<AppState>, StartError> {
    let vocab = GgufFile::from_bytes(vocabulary())?;
    let spec = SynthSpec {
        arch: Arch::Qwen2,
        layers: 2,
        embd: 64,
        ff: 128,
        heads: 4,
        kv_heads: 2,
        head_dim: None,
        ty: GgmlType::Q8_0,
        tensor_types: Vec::new(),
        seed: 7,
        sliding_window: None,
        chat_template: None,
        pooling: None,
        experts: None,
    };
    let file = GgufFile::from_bytes(synth(&spec, &vocab)?)?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.metadata())?);
    let template = ChatTemplate::from_gguf(file.metadata())?;
    let batch = Batch::new(Model::load_full(&file)?, 1, 2, N_CTX)?;
    start_engine(
        Box::new(batch),
        tokenizer,
        template,
        EngineOptions {
            model_id: MODEL_ID.into(),
            queue: 8,
            shared,
            max_body: 1 << 20,
            info: crate::ModelInfo::from_gguf(&file),
            aliases: vec!["tiny-alias".into()],
            defaults: crate::types::SamplingDefaults::default(),
        },
    )
}

/// How a streamed answer is framed.
enum Streamed {
    /// Server-sent events (OpenAI, Anthropic).
    Sse,
    /// One JSON object per line (Ollama).
    Ndjson,
}

/// Sends `body` to `route` through the real router and checks the answer; returns its status.
///
/// # Panics
/// When the server breaks a promise: a 500 or a panic while answering, an error body that is
/// not the route's API's error object, a successful answer that is not JSON (or, streamed, events
/// or lines that are not), or an answer that takes longer than a minute.
pub async fn exercise(state: &Arc<AppState>, route: &str, body: Vec<u8>) -> u16 {
    use tower::ServiceExt as _;
    let req = Request::post(route)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap_or_else(|e| panic!("building a request: {e}"));
    let app = crate::router::router(Arc::clone(state));
    let answer = tokio::time::timeout(Duration::from_secs(60), async move {
        let resp = app.oneshot(req).await.unwrap_or_else(|e| match e {});
        let status = resp.status();
        let kind = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default();
        let streamed = if kind.starts_with(b"text/event-stream") {
            Some(Streamed::Sse)
        } else if kind.starts_with(b"application/x-ndjson") {
            Some(Streamed::Ndjson)
        } else {
            None
        };
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap_or_else(|e| panic!("reading the answer: {e}"));
        (status, streamed, bytes)
    })
    .await;
    let (status, streamed, bytes) = answer.unwrap_or_else(|_| panic!("no answer within 60 s"));
    let text = String::from_utf8_lossy(&bytes);
    assert_ne!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "500 for a client's body: {text}"
    );
    if let Some(kind) = streamed {
        let events: Vec<&str> = match kind {
            Streamed::Sse => text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect(),
            Streamed::Ndjson => text.lines().collect(),
        };
        for data in events {
            if data != "[DONE]" {
                let v: serde_json::Value = serde_json::from_str(data)
                    .unwrap_or_else(|e| panic!("a stream event that is not JSON ({e}): {data}"));
                assert!(v.is_object(), "{data}");
            }
        }
    } else {
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("an answer that is not JSON ({e}): {text}"));
        if !status.is_success() {
            assert!(
                v["error"]["message"]
                    .as_str()
                    .or(v["error"].as_str())
                    .is_some_and(|m| !m.is_empty()),
                "an error without a message: {text}"
            );
            if crate::Dialect::of_path(route) == crate::Dialect::Ollama {
                assert!(v["error"].is_string(), "not an Ollama error object: {text}");
            } else if crate::Dialect::of_path(route) == crate::Dialect::Anthropic {
                assert!(
                    v["type"] == "error" && v["error"]["type"].is_string(),
                    "not an Anthropic error object: {text}"
                );
            }
        }
    }
    status.as_u16()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use serde_json::{Value as J, json};

    /// Valid bodies covering what each route takes: the fuzzer's starting points.
    fn seeds() -> Vec<(&'static str, J)> {
        let weather = json!({"type": "function", "function": {"name": "get_weather",
            "description": "Weather of a city", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer",
            "minimum": 1, "maximum": 7}}, "required": ["city"]}}});
        let user = json!([{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"}]);
        let chat = ROUTES[0];
        let completion = ROUTES[1];
        let (messages, count) = (ROUTES[2], ROUTES[3]);
        let (ollama_chat, generate, show) = (ROUTES[4], ROUTES[5], ROUTES[6]);
        let responses = ROUTES[7];
        let (embeddings, embed, legacy_embed) = (ROUTES[8], ROUTES[9], ROUTES[10]);
        let flat = json!({"type": "function", "name": "get_weather",
            "parameters": weather["function"]["parameters"]});
        let anthropic_tool = json!({"name": "get_weather", "description": "Weather of a city",
            "input_schema": weather["function"]["parameters"]});
        let round_trip = json!([{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
            "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": "sunny"}], "is_error": false},
            {"type": "text", "text": "Thanks"}]}]);
        vec![
            (
                responses,
                json!({"model": MODEL_ID, "input": "Hi", "max_output_tokens": 8,
                "instructions": "Be brief.", "temperature": 0.5, "store": false}),
            ),
            (
                responses,
                json!({"model": MODEL_ID, "max_output_tokens": 16, "stream": true,
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                "arguments": "{\"city\": \"P\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
                "tools": [flat], "tool_choice": "auto", "parallel_tool_calls": false}),
            ),
            (
                responses,
                json!({"model": MODEL_ID, "input": "Hi", "max_output_tokens": 16,
                "tools": [flat], "tool_choice": {"type": "function", "name": "get_weather"},
                "text": {"format": {"type": "text"}}, "metadata": {"a": "b"}}),
            ),
            (
                ollama_chat,
                json!({"model": MODEL_ID, "messages": user, "stream": false,
                "options": {"num_predict": 8, "temperature": 0.5, "stop": ["x"], "seed": 1}}),
            ),
            (
                ollama_chat,
                json!({"model": format!("{MODEL_ID}:latest"), "messages": [
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "P"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"}],
                "tools": [weather], "format": "json", "think": false,
                "options": {"num_predict": 8}}),
            ),
            (
                generate,
                json!({"model": MODEL_ID, "prompt": "Once", "raw": true, "stream": true,
                "options": {"num_predict": 4}, "format": {"type": "object"}}),
            ),
            (
                generate,
                json!({"model": MODEL_ID, "prompt": "Hi", "system": "Be brief.", "stream": false,
                "options": {"num_predict": 4}}),
            ),
            (show, json!({"model": MODEL_ID})),
            (
                embeddings,
                json!({"model": MODEL_ID, "input": ["Hi", "there"], "dimensions": 8,
                "encoding_format": "base64"}),
            ),
            (
                embeddings,
                json!({"model": MODEL_ID, "input": [[1, 2, 3], [4]]}),
            ),
            (
                embed,
                json!({"model": MODEL_ID, "input": "Hi", "truncate": false, "dimensions": 4}),
            ),
            (legacy_embed, json!({"model": MODEL_ID, "prompt": "Hi"})),
            (
                messages,
                json!({"model": MODEL_ID, "max_tokens": 8, "system": "Be brief.",
                "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.5,
                "top_k": 5, "top_p": 0.9, "metadata": {"user_id": "u"}}),
            ),
            (
                messages,
                json!({"model": MODEL_ID, "max_tokens": 24, "stream": true,
                "system": [{"type": "text", "text": "Be brief.",
                "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                "tools": [anthropic_tool], "tool_choice": {"type": "any"},
                "thinking": {"type": "adaptive"}, "stop_sequences": ["\n\n"]}),
            ),
            (
                messages,
                json!({"model": MODEL_ID, "max_tokens": 16, "messages": round_trip,
                "tools": [anthropic_tool], "tool_choice": {"type": "tool",
                "name": "get_weather", "disable_parallel_tool_use": true}}),
            ),
            (
                count,
                json!({"model": MODEL_ID, "messages": round_trip,
                "tools": [anthropic_tool], "system": "Be brief."}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "messages": user, "max_tokens": 8}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "messages": user, "max_tokens": 8, "stream": true,
                "stream_options": {"include_usage": true}}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "messages": user, "max_tokens": 24,
                "tools": [weather], "tool_choice": "required"}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "messages": user, "max_tokens": 8,
                "tools": [weather], "tool_choice": "auto", "stream": true}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "messages": user, "max_tokens": 16,
                "tools": [weather], "tool_choice": {"type": "function",
                "function": {"name": "get_weather"}}}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "messages": user, "max_tokens": 16,
                "response_format": {"type": "json_schema", "json_schema": {"name": "a",
                "schema": {"type": "object", "properties": {"a": {"type": "array",
                "items": {"enum": [1, "x", null]}}}}}}}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
                "tools": [weather], "max_tokens": 4, "logprobs": true, "top_logprobs": 3,
                "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n", "x"],
                "presence_penalty": 0.5, "frequency_penalty": 0.2}),
            ),
            (
                chat,
                json!({"model": MODEL_ID, "max_completion_tokens": 4, "messages": [{"role":
                "user", "content": [{"type": "text", "text": "Hi"}]}],
                "response_format": {"type": "json_object"}}),
            ),
            (
                completion,
                json!({"model": MODEL_ID, "prompt": "Once upon", "max_tokens": 8,
                "logprobs": 2, "stop": "."}),
            ),
            (
                completion,
                json!({"model": MODEL_ID, "prompt": [1, 40, 41, 42], "max_tokens": 4,
                "stream": true}),
            ),
            (
                completion,
                json!({"model": MODEL_ID, "prompt": ["a"], "max_tokens": 4,
                "echo": false, "best_of": 1, "n": 1}),
            ),
        ]
    }

    /// A value of a hostile kind.
    fn hostile(rng: &mut StdRng) -> J {
        let deep = (0..300).fold(json!(0), |v, _| json!([v]));
        let pool = [
            J::Null,
            json!(true),
            json!(-1),
            json!(0),
            json!(1e308),
            json!(-1e308),
            json!(0.5),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(""),
            json!("x".repeat(5000)),
            json!("\u{0}\u{ffff}<|im_start|>\u{1F600}"),
            json!([]),
            json!({}),
            deep,
            json!([{"role": "user"}]),
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}}),
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
            json!("</s>"),
        ];
        pool[rng.random_range(0..pool.len())].clone()
    }

    /// Replaces, removes or adds one value somewhere inside `v` (never `v` itself at the
    /// top, whose shape the routes check first).
    fn mutate_json(v: &mut J, rng: &mut StdRng, top: bool) {
        let depth_stop = !top && rng.random_bool(0.3);
        match v {
            J::Object(m) if !m.is_empty() && !depth_stop => {
                let keys: Vec<String> = m.keys().cloned().collect();
                let k = &keys[rng.random_range(0..keys.len())];
                match rng.random_range(0..6) {
                    0 => {
                        m.remove(k);
                    }
                    1 => {
                        m.insert(format!("{k}_x"), hostile(rng));
                    }
                    _ => mutate_json(m.get_mut(k).unwrap_or(&mut J::Null), rng, false),
                }
            }
            J::Array(a) if !a.is_empty() && !depth_stop => {
                let i = rng.random_range(0..a.len());
                match rng.random_range(0..5) {
                    0 => {
                        a.remove(i);
                    }
                    1 => a.push(a[i].clone()),
                    _ => mutate_json(&mut a[i], rng, false),
                }
            }
            _ => *v = hostile(rng),
        }
    }

    /// Flips, inserts or removes a few bytes.
    fn mutate_bytes(b: &mut Vec<u8>, rng: &mut StdRng) {
        for _ in 0..rng.random_range(1..4) {
            if b.is_empty() {
                b.push(b'{');
            }
            let i = rng.random_range(0..b.len());
            match rng.random_range(0..3) {
                0 => b[i] = rng.random(),
                1 => b.insert(
                    i,
                    *b"{}[]\",:\\0-e\x00\xff"
                        .get(rng.random_range(0..15))
                        .unwrap_or(&0),
                ),
                _ => {
                    b.remove(i);
                }
            }
        }
    }

    /// Bounded, seeded fuzzing of every route's body (a fixed number of cases and at most
    /// 40 s): whatever the body, the answer keeps the promises [`exercise`] checks.
    #[test]
    fn every_route_answers_any_body_without_a_500() {
        let state = tiny_state().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let seeds = seeds();
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        let started = std::time::Instant::now();
        // The seeds as they are: all valid, all answered 200.
        for (route, body) in &seeds {
            let status = rt.block_on(exercise(&state, route, body.to_string().into_bytes()));
            assert_eq!(status, 200, "{route} {body}");
        }
        let mut cases = 0;
        while cases < 1500 && started.elapsed() < Duration::from_secs(40) {
            let (route, seed) = &seeds[rng.random_range(0..seeds.len())];
            let mut body = seed.clone();
            for _ in 0..rng.random_range(1..4) {
                mutate_json(&mut body, &mut rng, true);
            }
            let mut bytes = body.to_string().into_bytes();
            if rng.random_bool(0.25) {
                mutate_bytes(&mut bytes, &mut rng);
            }
            let status = rt.block_on(exercise(&state, route, bytes));
            *statuses.entry(status).or_default() += 1;
            cases += 1;
        }
        println!("{cases} bodies in {:?}: {statuses:?}", started.elapsed());
        assert!(cases >= 200, "only {cases} cases ran");
        assert!(statuses.contains_key(&200) && statuses.contains_key(&400));
    }
}
