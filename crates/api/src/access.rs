//! Who may reach `strata serve`'s routes: the key check in front of every route, and the request
//! counter behind it.
//!
//! With keys, every request needs one except reads that carry nothing of a client's: `GET` or
//! `HEAD` of `/health`, `/metrics`, `/openapi.json`, `/` (the service's name, or the dashboard's
//! page) and the dashboard's own files. Anything else, an unknown route included, is refused
//! before its body is read, so a body from someone without a key is never taken in.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ApiError;
use crate::state::AppState;
use crate::tenancy::Tenant;
use strata_http::access::Usage;
use strata_http::auth::Verdict;

/// The name a request is counted under in `strata_http_requests_total`.
pub(crate) fn endpoint(path: &str) -> &str {
    match path {
        "/v1/chat/completions"
        | "/v1/completions"
        | "/v1/models"
        | "/v1/messages"
        | "/v1/messages/count_tokens"
        | "/v1/responses"
        | "/v1/embeddings"
        | "/api/embed"
        | "/api/embeddings"
        | "/api/chat"
        | "/api/generate"
        | "/api/tags"
        | "/api/ps"
        | "/api/show"
        | "/api/pull"
        | "/api/version"
        | "/health"
        | "/metrics"
        | "/openapi.json" => path,
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        p if p.starts_with("/v1/responses/") => "/v1/responses/{id}",
        _ => "other",
    }
}

/// Whether a request may pass without a key (see the module's comment).
pub(crate) fn is_open(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    let read = method == Method::GET || method == Method::HEAD;
    (read && matches!(path, "/" | "/health" | "/metrics" | "/openapi.json"))
        || strata_http::dashboard::is_open(method, path, headers)
}

/// The key check for every route that needs one, and the request counter for every route.
pub(crate) async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    // The access log names the model that answered; a request that names none reached no
    // model's routes, and the server counts it (see `crate::serve`).
    let usage = req.extensions().get::<Usage>().cloned();
    if let Some(u) = &usage {
        u.update(|f| f.model = Some(st.model_id.clone()));
    }
    let resp = match &st.keys {
        Some(keys) if !is_open(req.method(), &path, req.headers()) => {
            let auth = strata_http::auth::presented(req.headers());
            match keys.check(auth.as_deref()) {
                // The slot goes with the answer: a stream holds it until its last event.
                Verdict::Allowed(grant, slot) => {
                    if let Some(u) = &usage {
                        u.update(|f| f.key = Some(grant.name.clone()));
                    }
                    let mut req = req;
                    req.extensions_mut().insert(Tenant(grant.name));
                    slot.hold(next.run(req).await)
                }
                Verdict::Unknown => ApiError::unauthorized(if auth.is_some() {
                    "Incorrect API key provided."
                } else {
                    "Missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`."
                })
                .into_response(),
                Verdict::Limited(s) => ApiError::rate_limited(s).retry_after(s),
                Verdict::Busy(limit) => ApiError::key_busy(limit).retry_after(1.0),
            }
        }
        _ => next.run(req).await,
    };
    st.metrics
        .count_request(endpoint(&path), resp.status().as_u16());
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::body::Body;
    use axum::http::StatusCode;
    use tower::ServiceExt as _;

    fn keyed() -> Arc<AppState> {
        let keys = strata_http::auth::Keys::parse("sk-alpha-123456 name=alice", None).unwrap();
        crate::testkit::tiny_state_with(crate::Shared::new(Some(keys), 1)).unwrap()
    }

    async fn status(st: &Arc<AppState>, req: axum::http::Request<Body>) -> StatusCode {
        let app = crate::router::router(Arc::clone(st));
        app.oneshot(req).await.unwrap().status()
    }

    fn req(method: &str, path: &str) -> axum::http::request::Builder {
        axum::http::Request::builder().method(method).uri(path)
    }

    #[tokio::test]
    async fn a_body_posted_under_ui_needs_a_key_like_any_route() {
        let st = keyed();
        let body = || Body::from(vec![b'x'; 1 << 16]);
        for path in ["/ui/x/y", "/ui/app.js", "/ui/", "/nowhere", "/health"] {
            let r = req("POST", path).body(body()).unwrap();
            assert_eq!(status(&st, r).await, StatusCode::UNAUTHORIZED, "{path}");
        }
        let r = req("GET", "/ui/x/y").body(Body::empty()).unwrap();
        assert_eq!(status(&st, r).await, StatusCode::UNAUTHORIZED);
        // With the key, the same requests reach the routes (and find none).
        let r = req("POST", "/ui/x/y")
            .header("authorization", "Bearer sk-alpha-123456")
            .body(body())
            .unwrap();
        assert_eq!(status(&st, r).await, StatusCode::NOT_FOUND);
        // The dashboard's files, its page and the probes still load without one.
        for path in ["/ui/index.html", "/ui/app.js", "/health", "/metrics", "/"] {
            let r = req("GET", path).body(Body::empty()).unwrap();
            assert_eq!(status(&st, r).await, StatusCode::OK, "{path}");
        }
        let r = req("GET", "/")
            .header("accept", "text/html")
            .body(Body::empty())
            .unwrap();
        assert_eq!(status(&st, r).await, StatusCode::OK);
        let r = req("GET", "/v1/models").body(Body::empty()).unwrap();
        assert_eq!(status(&st, r).await, StatusCode::UNAUTHORIZED);
    }
}
