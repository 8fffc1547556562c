//! Several models behind one address: a request goes to the model its body (`model`, or
//! Ollama's older `name`) or path (`/v1/models/{id}`) names, and the lists (`/v1/models`,
//! `/api/tags`, `/api/ps`) gather every model's entries. Each model keeps its own routes, so
//! every check, error and reply is the one a single-model server gives; a request naming no
//! served model goes to the first, which answers with its API's own "not found".

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use tower::ServiceExt as _;

use crate::ApiError;
use crate::state::AppState;

/// The routes of `models` (at least one) behind one address.
pub(crate) fn router(mut models: Vec<Arc<AppState>>) -> Router {
    if models.len() == 1
        && let Some(only) = models.pop()
    {
        return crate::router::router(only);
    }
    let served = Arc::new(
        models
            .into_iter()
            .map(|m| (Arc::clone(&m), crate::router::router(m)))
            .collect::<Vec<_>>(),
    );
    Router::new().fallback(dispatch).with_state(served)
}

type Served = Arc<Vec<(Arc<AppState>, Router)>>;

/// The field a body names its model in.
#[derive(Deserialize)]
struct Named {
    model: Option<Value>,
    name: Option<Value>,
}

/// Routes whose JSON body names the model.
fn names_model_in_body(path: &str) -> bool {
    matches!(
        path,
        "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/responses"
            | "/v1/embeddings"
            | "/api/embed"
            | "/api/embeddings"
            | "/v1/messages"
            | "/v1/messages/count_tokens"
            | "/api/chat"
            | "/api/generate"
            | "/api/show"
            | "/api/pull"
    )
}

async fn dispatch(State(served): State<Served>, req: Request) -> Response {
    let Some((first, first_routes)) = served.first() else {
        return ApiError::unavailable("No model is served.").into_response();
    };
    let path = req.uri().path().to_string();
    let get = req.method() == Method::GET;
    let target = if get && path == "/v1/models" {
        return gathered(&served, req, "data").await;
    } else if get && (path == "/api/tags" || path == "/api/ps") {
        return gathered(&served, req, "models").await;
    } else if let Some(id) = path.strip_prefix("/v1/models/") {
        pick(&served, id)
    } else if req.method() == Method::POST && names_model_in_body(&path) {
        // A request without a valid key goes where it is refused before its body is read.
        let auth = strata_http::auth::presented(req.headers());
        if first
            .keys
            .as_ref()
            .is_some_and(|k| !k.knows(auth.as_deref()))
        {
            return send(first_routes, req).await;
        }
        let (parts, body) = req.into_parts();
        let limit = first.max_body;
        let bytes = match axum::body::to_bytes(body, limit).await {
            Ok(b) => b,
            Err(_) => return ApiError::too_large(limit).into_response(),
        };
        let routes = model_in(&bytes)
            .and_then(|m| pick(&served, &m))
            .unwrap_or(first_routes);
        return send(routes, Request::from_parts(parts, Body::from(bytes))).await;
    } else {
        None
    };
    send(target.unwrap_or(first_routes), req).await
}

/// The model a body names, if it is JSON that names one.
fn model_in(body: &Bytes) -> Option<String> {
    let n: Named = serde_json::from_slice(body).ok()?;
    match n.model.or(n.name)? {
        Value::String(s) => Some(s),
        _ => None,
    }
}

/// The routes of the model served as `name` (an id or an alias, Ollama's `:latest` allowed).
fn pick<'a>(served: &'a Served, name: &str) -> Option<&'a Router> {
    let bare = name.strip_suffix(":latest");
    served
        .iter()
        .find(|(st, _)| st.serves(name) || bare.is_some_and(|b| st.serves(b)))
        .map(|(_, r)| r)
}

async fn send(routes: &Router, req: Request) -> Response {
    match routes.clone().oneshot(req).await {
        Ok(r) => r,
        Err(e) => match e {},
    }
}

/// Asks every model for its list and answers with one list of all their `key` entries; a
/// refusal (a missing key) is answered as it came.
async fn gathered(served: &Served, req: Request, key: &str) -> Response {
    let (parts, _) = req.into_parts();
    let mut merged: Option<Value> = None;
    for (_, routes) in served.iter() {
        let mut one = Request::new(Body::empty());
        *one.method_mut() = parts.method.clone();
        *one.uri_mut() = parts.uri.clone();
        *one.headers_mut() = parts.headers.clone();
        let resp = send(routes, one).await;
        if !resp.status().is_success() {
            return resp;
        }
        let (head, body) = resp.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
            return ApiError::unavailable("A model's list could not be read.").into_response();
        };
        let Ok(mut list) = serde_json::from_slice::<Value>(&bytes) else {
            return Response::from_parts(head, Body::from(bytes));
        };
        match merged.as_mut() {
            None => merged = Some(list),
            Some(all) => {
                if let (Some(into), Some(Value::Array(more))) = (
                    all.get_mut(key).and_then(Value::as_array_mut),
                    list.get_mut(key),
                ) {
                    into.append(more);
                }
            }
        }
    }
    let mut merged = merged.unwrap_or(Value::Null);
    // Anthropic's list names its last entry, which is now another model's.
    let last = merged
        .get(key)
        .and_then(Value::as_array)
        .and_then(|a| a.last())
        .map(|m| m["id"].clone());
    if let (Some(slot), Some(last)) = (merged.get_mut("last_id"), last) {
        *slot = last;
    }
    axum::Json(merged).into_response()
}
