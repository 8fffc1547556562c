//! Errors: every failure a client can cause becomes a JSON error object with the status the
//! client's API would use, never a 500 and never a dropped connection. An error is built once
//! and written in the dialect of the route that was asked ([`Dialect`]): OpenAI's shape by
//! default, Anthropic's for `/v1/messages`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to an HTTP client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, …).
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, …).
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// An error with this status and OpenAI's type for it.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> ApiError {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        };
        ApiError::new(status, kind, message)
    }

    /// 400: a parameter is missing, malformed or out of range.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        e.param = Some(param.into());
        e
    }

    /// 400: the body is not the JSON this endpoint takes.
    pub fn bad_body(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400: the prompt does not fit the context window.
    pub fn context_length(prompt: usize, limit: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!(
                "This model's maximum context length is {limit} tokens, but the prompt has \
                 {prompt} tokens (one more is needed to generate)."
            ),
        );
        e.param = Some("messages".into());
        e.code = Some("context_length_exceeded");
        e
    }

    /// 400: the prompt is longer than the context window by its size alone (it was not
    /// tokenised: it has at least `at_least` tokens).
    pub fn context_length_at_least(at_least: usize, limit: usize) -> ApiError {
        let mut e = ApiError::context_length(at_least, limit);
        e.message = format!(
            "This model's maximum context length is {limit} tokens, but the prompt has at least \
             {at_least} tokens."
        );
        e
    }

    /// 401: no key, or a key that is not on the list.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message);
        e.code = Some("invalid_api_key");
        e
    }

    /// 403: the request is not allowed from where it comes (a browser page, a client key).
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "permission_error", message)
    }

    /// 415: the body is not JSON.
    pub fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            message,
        )
    }

    /// 404: the model is not served here; the message names every model that is.
    pub fn model_not_found(model: &str, served: &[String]) -> ApiError {
        let list = served
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist here; this server serves {list}."),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 404: no such route.
    pub fn no_route(method: &str, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("Unknown request URL: {method} {path}."),
        )
    }

    /// 405: the route exists with another method.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("Method {method} is not allowed for {path}."),
        )
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is larger than {limit} bytes."),
        )
    }

    /// 429: this key has used up its request budget.
    pub fn rate_limited(retry_after_s: f64) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("Rate limit reached for this API key; try again in {retry_after_s:.1} s."),
        );
        e.code = Some("rate_limit_exceeded");
        e
    }

    /// 429: this key already has its `max_concurrent` requests in flight.
    pub fn key_busy(limit: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "This API key already has {limit} requests in flight (its max_concurrent); \
                 retry when one has finished."
            ),
        );
        e.code = Some("concurrency_limit_exceeded");
        e
    }

    /// 429: the scheduler's queue is full.
    pub fn queue_full(depth: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("The server is busy: {depth} requests are already waiting. Retry later."),
        );
        e.code = Some("queue_full");
        e
    }

    /// 503: no model instance can take the request.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }

    /// The answer, with a `Retry-After` of `secs` rounded up to whole seconds (at least one).
    pub fn retry_after(self, secs: f64) -> Response {
        let mut r = self.into_response();
        if let Ok(v) = format!("{}", secs.ceil().max(1.0) as u64).parse() {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
        }
        r
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        // Kept so [`Dialect::rewrite`] can write it again in another API's shape.
        r.extensions_mut().insert(self);
        r
    }
}

/// Which API's error objects a route answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}` with Anthropic's error types.
    Anthropic,
    /// `{"error": "message"}`, Ollama's.
    Ollama,
}

impl Dialect {
    /// The dialect of a request path.
    pub fn of_path(path: &str) -> Dialect {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Dialect::Anthropic
        } else if path.starts_with("/api/") {
            Dialect::Ollama
        } else {
            Dialect::OpenAi
        }
    }

    /// The error body in this dialect.
    pub fn body(self, e: &ApiError) -> serde_json::Value {
        match self {
            Dialect::OpenAi => e.body(),
            Dialect::Ollama => json!({"error": match &e.param {
                Some(p) => format!("{p}: {}", e.message),
                None => e.message.clone(),
            }}),
            // Anthropic's objects have no `param`: its messages start with the field at fault.
            Dialect::Anthropic => json!({
                "type": "error",
                "error": {
                    "type": anthropic_type(e),
                    "message": match &e.param {
                        Some(p) => format!("{p}: {}", e.message),
                        None => e.message.clone(),
                    },
                },
            }),
        }
    }

    /// Writes an error response again in this dialect (its status and headers stay); other
    /// responses pass unchanged.
    pub fn rewrite(self, mut r: Response) -> Response {
        if self == Dialect::OpenAi {
            return r;
        }
        let Some(e) = r.extensions_mut().remove::<ApiError>() else {
            return r;
        };
        let (mut parts, _) = r.into_parts();
        let body = self.body(&e).to_string();
        parts.headers.remove(axum::http::header::CONTENT_LENGTH);
        Response::from_parts(parts, axum::body::Body::from(body))
    }
}

/// Anthropic's error type for a status (its API documents one type per status).
fn anthropic_type(e: &ApiError) -> &'static str {
    match e.status.as_u16() {
        400 | 405 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Rewrites error responses in the dialect of the path asked (see [`Dialect`]).
pub async fn in_dialect(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let dialect = Dialect::of_path(req.uri().path());
    dialect.rewrite(next.run(req).await)
}
