//! OpenAI-style errors: every failure a client can cause becomes a JSON error object with the
//! status OpenAI would use, never a 500 and never a dropped connection.

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

    /// 404: the model is not served here.
    pub fn model_not_found(model: &str, served: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist here; this server serves `{served}`."),
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
        (self.status, axum::Json(self.body())).into_response()
    }
}
