//! The request bodies of the OpenAI API that strata accepts, and their validation.
//!
//! Unknown fields are ignored (clients send many optional ones); fields strata cannot honour
//! (`n > 1`, image parts, `suffix`) are refused with a 400 naming the field rather than
//! silently ignored.

use serde::Deserialize;
use serde_json::Value;

use crate::ApiError;

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The model id.
    pub model: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Legacy name of `max_completion_tokens`.
    pub max_tokens: Option<i64>,
    /// Most tokens to generate.
    pub max_completion_tokens: Option<i64>,
    /// Sampling and stopping.
    #[serde(flatten)]
    pub sampling: Sampling,
    /// Return log-probabilities of the chosen tokens.
    pub logprobs: Option<bool>,
    /// And of this many alternatives per position (0..=20).
    pub top_logprobs: Option<i64>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Functions the model may call.
    pub tools: Option<Vec<Tool>>,
    /// `none`, `auto`, `required`, or `{"type":"function","function":{"name":…}}`.
    pub tool_choice: Option<Value>,
    /// Allow more than one call in a turn (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `{"type":"text"|"json_object"|"json_schema", …}`.
    pub response_format: Option<Value>,
    /// Keeps the request's cached prompt blocks apart from those of requests without the same
    /// salt (vLLM's field; see [`crate::tenancy`]).
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The model id.
    pub model: String,
    /// A string, a one-element array of strings, or an array of token ids.
    pub prompt: Value,
    /// Most tokens to generate (OpenAI's default: 16).
    pub max_tokens: Option<i64>,
    /// Sampling and stopping.
    #[serde(flatten)]
    pub sampling: Sampling,
    /// Number of top alternatives to return per token (0..=5).
    pub logprobs: Option<i64>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Echo the prompt (unsupported when true).
    pub echo: Option<bool>,
    /// Insertion suffix (unsupported).
    pub suffix: Option<String>,
    /// Server-side best-of (only 1 is supported).
    pub best_of: Option<i64>,
    /// As [`ChatRequest::cache_salt`].
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// The sampling and stopping settings both endpoints take.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    /// Sampling temperature, 0..=2.
    pub temperature: Option<f32>,
    /// Nucleus sampling, (0, 1].
    pub top_p: Option<f32>,
    /// Top-k (extension).
    pub top_k: Option<i64>,
    /// Min-p (extension).
    pub min_p: Option<f32>,
    /// Repetition penalty as llama.cpp applies it (extension).
    pub repetition_penalty: Option<f32>,
    /// Random seed.
    pub seed: Option<i64>,
    /// Stop sequences: a string or up to four strings.
    pub stop: Option<Stop>,
    /// -2..=2.
    pub presence_penalty: Option<f32>,
    /// -2..=2.
    pub frequency_penalty: Option<f32>,
    /// Choices to generate; only 1 is supported.
    pub n: Option<i64>,
    /// Speculative decoding for this request (extension): `false` turns it off, `true` on
    /// (the server's `--speculate` drafts, prompt lookup where that is off); unset, the
    /// server's `--speculate` applies. The tokens are the same either way.
    pub speculate: Option<bool>,
}

/// Sampling settings the server applies to requests that do not give them (`strata serve
/// --temperature …`): clients such as Claude Code and recent Anthropic SDKs cannot set them.
#[derive(Debug, Clone, Default)]
pub struct SamplingDefaults {
    /// Temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k.
    pub top_k: Option<i64>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// The output limit of requests that set none (agents such as Codex CLI send none, and a
    /// base model may otherwise write until the context is full).
    pub max_tokens: Option<i64>,
    /// Where speculative drafts come from for requests that do not say (`strata serve
    /// --speculate`).
    pub speculation: strata_engine::speculate::Speculation,
}

impl SamplingDefaults {
    /// Fills what `s` leaves unset.
    pub fn fill(&self, s: &mut Sampling) {
        s.temperature = s.temperature.or(self.temperature);
        s.top_p = s.top_p.or(self.top_p);
        s.top_k = s.top_k.or(self.top_k);
        s.min_p = s.min_p.or(self.min_p);
        s.repetition_penalty = s.repetition_penalty.or(self.repetition_penalty);
    }
}

/// One stop string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Up to four stop strings.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` before `[DONE]`.
    pub include_usage: Option<bool>,
}

/// A chat message.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text, or an array of content parts (text parts only).
    pub content: Option<Value>,
    /// Participant name (passed to the template).
    pub name: Option<String>,
    /// Calls an assistant made earlier in the conversation.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Which call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// A call in an earlier assistant message.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct ToolCall {
    /// The call id.
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function and its arguments (a JSON string).
    pub function: FunctionCall,
}

/// `{"name", "arguments"}` of a call.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct FunctionCall {
    /// The function name.
    pub name: String,
    /// The arguments as a JSON string.
    pub arguments: String,
}

/// A tool definition.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Tool {
    /// Must be `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct FunctionDef {
    /// The name (`[a-zA-Z0-9_-]{1,64}`).
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Accepted and ignored: arguments always follow the schema here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl Stop {
    /// The stop strings, validated: at most four, none empty.
    pub fn strings(&self) -> Result<Vec<String>, ApiError> {
        let v = match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        };
        if v.len() > 4 {
            return Err(ApiError::invalid(
                "stop",
                "At most 4 stop sequences are allowed.",
            ));
        }
        if v.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                "Stop sequences must not be empty.",
            ));
        }
        Ok(v)
    }
}

impl Message {
    /// A message of `role` with plain text, as the other APIs' translations build them.
    pub fn plain(role: &str, text: String) -> Message {
        Message {
            role: role.into(),
            content: Some(Value::String(text)),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }

    /// The text of the message: a string, or the concatenated text parts.
    pub fn text(&self, index: usize) -> Result<String, ApiError> {
        let param = || format!("messages[{index}].content");
        match &self.content {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Array(parts)) => {
                let mut out = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => out.push_str(t),
                        (Some(kind), _) if kind != "text" => {
                            return Err(ApiError::invalid(
                                format!("{}[{j}]", param()),
                                format!(
                                    "Content parts of type `{kind}` are not supported; this model reads text only."
                                ),
                            ));
                        }
                        _ => {
                            return Err(ApiError::invalid(
                                format!("{}[{j}]", param()),
                                "A content part must be {\"type\": \"text\", \"text\": \"...\"}.",
                            ));
                        }
                    }
                }
                Ok(out)
            }
            Some(_) => Err(ApiError::invalid(
                param(),
                "Message content must be a string or an array of text parts.",
            )),
        }
    }
}

/// Parses a JSON body into `T`, turning serde's message (with its line and column) into a 400.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_body(
            "The request body is empty; send a JSON object.",
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_body(format!(
            "The request body is not valid for this endpoint: {e}"
        ))
    })
}
