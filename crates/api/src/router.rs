//! The routes of one model's server: each dialect's generating routes, and the routes that
//! answer from the state alone (health, metrics, the model list, the OpenAPI document).
//! The dialects' modules know nothing of this one.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::ApiError;
use crate::state::AppState;

/// The routes.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.max_body;
    Router::new()
        .route("/v1/chat/completions", post(crate::openai::chat))
        .route("/v1/completions", post(crate::openai::completions))
        .route("/v1/responses", post(crate::responses::create))
        .route(
            "/v1/responses/{id}",
            get(crate::responses::get).delete(crate::responses::delete),
        )
        .route("/v1/messages", post(crate::messages::create))
        .route(
            "/v1/messages/count_tokens",
            post(crate::messages::count_tokens),
        )
        .route("/v1/embeddings", post(crate::embeddings::openai))
        .route("/api/embed", post(crate::embeddings::ollama_embed))
        .route("/api/embeddings", post(crate::embeddings::ollama_legacy))
        .route("/api/chat", post(crate::ollama::chat))
        .route("/api/generate", post(crate::ollama::generate))
        .route("/api/tags", get(crate::ollama::tags))
        .route("/api/ps", get(crate::ollama::ps))
        .route("/api/show", post(crate::ollama::show))
        .route("/api/pull", post(crate::ollama::pull))
        .route("/api/version", get(crate::ollama::version))
        .route("/", get(root))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .merge(strata_http::dashboard::routes())
        .fallback(fallback)
        .method_not_allowed_fallback(not_allowed)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            crate::access::guard,
        ))
        .layer(middleware::from_fn(strata_http::in_dialect))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// What answers here: the dashboard to a browser; to clients (Claude Code probes `HEAD /`
/// before its first request) a line of JSON naming the service.
async fn root(State(st): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> Response {
    if strata_http::dashboard::wants_page(&headers) {
        return strata_http::dashboard::index();
    }
    Json(json!({"service": "strata", "model": st.model_id})).into_response()
}

async fn fallback(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// 200 while the engine runs; 503 once it has stopped (after repeated internal errors), so a
/// load balancer or supervisor sees what clients see.
async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.scheduler.is_alive() {
        Json(json!({"status": "ok", "model": st.model_id, "n_ctx": st.n_ctx})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "failed", "model": st.model_id,
                "error": "the engine stopped after repeated internal errors"})),
        )
            .into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
        .into_response()
}

/// Whether a request comes from an Anthropic client (its SDKs and Claude Code send
/// `anthropic-version` on every request), which reads models in Anthropic's shape.
fn anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

fn model_object(st: &AppState, id: &str, anthropic: bool) -> Value {
    if anthropic {
        let created = std::time::UNIX_EPOCH + std::time::Duration::from_secs(st.created);
        json!({"type": "model", "id": id, "display_name": id,
            "created_at": humantime::format_rfc3339_seconds(created).to_string()})
    } else {
        json!({"id": id, "object": "model", "created": st.created, "owned_by": "strata"})
    }
}

/// The served model, then each of its aliases.
async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Json<Value> {
    let anthropic = anthropic(&headers);
    let data: Vec<Value> = std::iter::once(&st.model_id)
        .chain(&st.aliases)
        .map(|id| model_object(&st, id, anthropic))
        .collect();
    if anthropic {
        let (first, last) = (
            data.first().map(|m| m["id"].clone()),
            data.last().map(|m| m["id"].clone()),
        );
        Json(json!({"data": data, "has_more": false, "first_id": first, "last_id": last}))
    } else {
        Json(json!({"object": "list", "data": data}))
    }
}

async fn model(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    if st.serves(&id) {
        Ok(Json(model_object(&st, &id, anthropic(&headers))))
    } else {
        Err(ApiError::model_not_found(&id, &st.served_names()))
    }
}
