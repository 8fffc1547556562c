//! The node's own HTTP routes: the cluster view and the lifecycle commands the CLI sends, and
//! the key check that keeps them to admin keys.

use super::*;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/", get(root))
        .merge(strata_http::dashboard::routes())
        .route("/v1/cluster/status", get(status))
        .route("/v1/cluster/models", get(models))
        .route("/v1/cluster/whoami", get(whoami))
        .route("/v1/cluster/devices", get(devices))
        .route("/v1/cluster/drain", post(drain))
        .route("/v1/cluster/stop", post(stop))
        .route("/v1/cluster/load", post(load))
        .route("/v1/cluster/unload", post(unload))
        .route("/api/pull", post(pull))
        .fallback(to_instance)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            guard,
        ))
        .with_state(shared)
}

/// Routes that change the cluster: only admin keys may use them.
pub(super) fn is_admin_route(path: &str) -> bool {
    matches!(
        path,
        "/v1/cluster/drain"
            | "/v1/cluster/stop"
            | "/v1/cluster/load"
            | "/v1/cluster/unload"
            | "/api/pull"
    )
}

/// What the key check decides for a request to `path` with this `Authorization` header: the
/// slot it holds among its key's `max_concurrent`, or the refusal. Client keys may run inference
/// and read the cluster's state; cluster operations need `role=admin` (403 otherwise, so an
/// application's key cannot stop the node).
pub(super) fn authorize(
    keys: &Keys,
    path: &str,
    auth: Option<&str>,
) -> Result<Slot, Box<Response>> {
    let refused = match keys.check(auth) {
        Verdict::Allowed(g, _) if is_admin_route(path) && g.role != Role::Admin => error(
            StatusCode::FORBIDDEN,
            &format!(
                "key {:?} is a client key; {path} needs a key with role=admin in the API key file",
                g.name
            ),
        ),
        Verdict::Allowed(_, slot) => return Ok(slot),
        Verdict::Unknown => error(StatusCode::UNAUTHORIZED, "a valid API key is required"),
        Verdict::Limited(secs) => strata_http::ApiError::with_status(
            StatusCode::TOO_MANY_REQUESTS,
            format!("rate limit reached for this key; retry in {secs:.1} s"),
        )
        .retry_after(secs),
        Verdict::Busy(limit) => strata_http::ApiError::key_busy(limit).retry_after(1.0),
    };
    Err(Box::new(refused))
}

/// Whether a request may pass without a key: a read of `/health`, or of the dashboard's page
/// and files (the page asks for a key and sends it with every call it makes). Everything else,
/// an unknown path included, would be handed to an instance, perhaps on another node.
pub(super) fn is_open(method: &axum::http::Method, path: &str, headers: &HeaderMap) -> bool {
    let read = method == axum::http::Method::GET || method == axum::http::Method::HEAD;
    (read && path == "/health") || strata_http::dashboard::is_open(method, path, headers)
}

/// Every route but those [`is_open`] lets through needs a key whenever the node has keys.
pub(super) async fn guard(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let open = is_open(req.method(), req.uri().path(), req.headers());
    let Some(keys) = shared.keys.as_ref().filter(|_| !open) else {
        return next.run(req).await;
    };
    let auth = strata_http::auth::presented(req.headers());
    match authorize(keys, req.uri().path(), auth.as_deref()) {
        // The slot goes with the answer: a stream, forwarded from whichever node serves the
        // model, holds it until its last event.
        Ok(slot) => {
            // Who sent it goes with the request (and with it when forwarded): each key's
            // cached prompt blocks are its own.
            let mut req = req;
            if let Some(name) = keys.name_of(auth.as_deref()) {
                req.extensions_mut().insert(strata_http::auth::Tenant(name));
            }
            slot.hold(next.run(req).await)
        }
        Err(refused) => *refused,
    }
}

/// An error in the API's shape (OpenAI's, or Anthropic's on its routes).
pub(super) fn error(status: StatusCode, msg: &str) -> Response {
    strata_http::ApiError::with_status(status, msg).into_response()
}

/// The dashboard to a browser; anything else goes to the instance served here, as before.
pub(super) async fn root(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    if strata_http::dashboard::wants_page(req.headers()) {
        return strata_http::dashboard::index();
    }
    to_instance(State(shared), req).await
}

/// Which role the presented key has, so the dashboard offers admin actions only to admin keys
/// (the routes check again: this only decides what is shown).
pub(super) async fn whoami(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let Some(keys) = &shared.keys else {
        return Json(serde_json::json!({ "keys": false, "admin": true, "name": null }))
            .into_response();
    };
    let auth = strata_http::auth::presented(&headers);
    // The guard has counted this request already, and refused unknown keys.
    match keys.grant(auth.as_deref()) {
        Some(g) => Json(serde_json::json!({
            "keys": true,
            "admin": g.role == Role::Admin,
            "name": g.name,
        }))
        .into_response(),
        None => error(StatusCode::UNAUTHORIZED, "a valid API key is required"),
    }
}

/// The models this node's store knows (catalog and imports) and whether each is here. Paths on
/// the node are left out: a client key learns what it may load, not the node's file system.
pub(super) async fn models() -> Response {
    let listed =
        tokio::task::spawn_blocking(|| strata_store::Store::from_env().map(|s| s.list())).await;
    match listed {
        Ok(Ok(models)) => {
            let models: Vec<serde_json::Value> = models
                .iter()
                .filter_map(|m| {
                    let mut v = serde_json::to_value(m).ok()?;
                    let o = v.as_object_mut()?;
                    o.remove("path");
                    o.remove("source");
                    o.remove("file_name");
                    Some(v)
                })
                .collect();
            Json(serde_json::json!({ "models": models })).into_response()
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

pub(super) async fn status(State(shared): State<Arc<Shared>>) -> Json<Status> {
    let snapshot = shared.control.snapshot();
    Json(Status {
        topology: topology(&snapshot),
        instances: leader_table(&snapshot).unwrap_or_default(),
        snapshot,
    })
}

pub(super) async fn devices(State(shared): State<Arc<Shared>>) -> Json<Vec<Profile>> {
    Json(
        shared
            .control
            .snapshot()
            .members
            .into_iter()
            .filter_map(|m| m.state.map(|s| s.profile))
            .collect(),
    )
}

pub(super) async fn drain(State(shared): State<Arc<Shared>>, _h: HeaderMap) -> Response {
    shared.flags.draining.store(true, Ordering::Relaxed);
    let _ = publish(&shared).await;
    Json(serde_json::json!({ "draining": true })).into_response()
}

pub(super) async fn stop(State(shared): State<Arc<Shared>>) -> Response {
    shared.stop.notify_one();
    Json(serde_json::json!({ "stopping": true })).into_response()
}

pub(super) async fn load(
    State(shared): State<Arc<Shared>>,
    Json(req): Json<LoadRequest>,
) -> Response {
    if req.dry_run {
        let snap = shared.control.snapshot();
        let (topo, names) = (topology(&snap), names(&snap));
        let peers = peers_of(&shared);
        let planned =
            tokio::task::spawn_blocking(move || instances::plan(&req, &topo, &names, &peers)).await;
        return match planned {
            Ok(Ok((p, facts))) => {
                Json(serde_json::json!({ "placement": p, "model": facts })).into_response()
            }
            Ok(Err(e)) => error(StatusCode::BAD_REQUEST, &e.to_string()),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
    }
    let body = serde_json::to_vec(&req).unwrap_or_default();
    match ask_leader(&shared, "load", body).await {
        Ok(v) => {
            if let Some(what) = slow_links(&shared.control.snapshot(), &v) {
                shared.control.note(what);
            }
            Json(v).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// When the placement of a loaded instance shows its nodes' links too slow for tensor
/// parallelism (the planner predicts tensor parallel slower than what it chose, or than the
/// pipeline it was forced past), an event that says so, naming the slowest link among them.
fn slow_links(snap: &Snapshot, spec: &serde_json::Value) -> Option<String> {
    let p = spec.get("placement")?;
    let considered: Vec<(String, f64)> = p
        .get("considered")?
        .as_array()?
        .iter()
        .filter_map(|c| Some((c.get(0)?.as_str()?.to_string(), c.get(1)?.as_f64()?)))
        .collect();
    let tensor = considered.iter().find(|(s, _)| s == "tensor")?.1;
    let (best, best_speed) = considered
        .iter()
        .filter(|(s, _)| s != "tensor")
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    if tensor >= *best_speed {
        return None;
    }
    let nodes: Vec<&str> = p
        .get("nodes")?
        .as_array()?
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    let topo = topology(snap);
    let slowest = topo
        .links
        .iter()
        .filter(|l| nodes.contains(&l.a.as_str()) && nodes.contains(&l.b.as_str()))
        .max_by(|a, b| a.latency.total_cmp(&b.latency))?;
    let names = names(snap);
    let name = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_string());
    Some(format!(
        "the link {}-{} ({:.0} µs) is too slow for tensor parallelism with {}: tensor parallel \
         is predicted to decode {tensor:.0} tok/s, {best} {best_speed:.0}",
        name(&slowest.a),
        name(&slowest.b),
        slowest.latency * 1e6,
        spec.pointer("/request/model")
            .and_then(|m| m.as_str())
            .unwrap_or("this model"),
    ))
}

#[derive(Deserialize)]
pub(super) struct PullBody {
    model: Option<String>,
    name: Option<String>,
    stream: Option<bool>,
}

/// Ollama's `POST /api/pull` on a node: fetches a catalog model into this node's store (it
/// changes the node's disk, so it takes an admin key), from where `strata load` places it.
pub(super) async fn pull(Json(b): Json<PullBody>) -> Response {
    let Some(model) = b.model.or(b.name) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": "model is required" })),
        )
            .into_response();
    };
    strata_api::pull::into_store(&model, b.stream.unwrap_or(true)).await
}

#[derive(Deserialize)]
pub(super) struct UnloadBody {
    instance: String,
}

pub(super) async fn unload(
    State(shared): State<Arc<Shared>>,
    Json(b): Json<UnloadBody>,
) -> Response {
    let body = serde_json::to_vec(&b.instance).unwrap_or_default();
    match ask_leader(&shared, "unload", body).await {
        Ok(_) => Json(serde_json::json!({ "unloaded": b.instance })).into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn keys() -> Keys {
        Keys::parse(
            "sk-admin-123456 name=ops role=admin\nsk-app-1234567 name=app\nsk-slow-1234567 rpm=1\n",
            None,
        )
        .unwrap()
    }

    #[test]
    fn client_keys_may_infer_and_read_but_not_operate_the_cluster() {
        let k = keys();
        let client = Some("Bearer sk-app-1234567");
        for path in ["/v1/chat/completions", "/v1/cluster/status", "/v1/models"] {
            assert!(authorize(&k, path, client).is_ok(), "{path}");
        }
        for path in [
            "/v1/cluster/stop",
            "/v1/cluster/drain",
            "/v1/cluster/load",
            "/v1/cluster/unload",
            "/api/pull",
        ] {
            let r = authorize(&k, path, client).unwrap_err();
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
            assert!(authorize(&k, path, Some("Bearer sk-admin-123456")).is_ok());
            assert_eq!(
                authorize(&k, path, None).unwrap_err().status(),
                StatusCode::UNAUTHORIZED
            );
        }
    }

    #[test]
    fn a_body_posted_under_ui_is_not_let_through_without_a_key() {
        use axum::http::Method;
        let none = HeaderMap::new();
        // Once, any path under /ui/ passed, and the node forwarded its body to an instance.
        for (m, path) in [
            (Method::POST, "/ui/x/y"),
            (Method::GET, "/ui/x/y"),
            (Method::POST, "/ui/app.js"),
            (Method::POST, "/health"),
            (Method::GET, "/"),
            (Method::GET, "/v1/chat/completions"),
        ] {
            assert!(!is_open(&m, path, &none), "{m} {path}");
        }
        for path in ["/health", "/ui/index.html", "/ui/app.js"] {
            assert!(is_open(&Method::GET, path, &none), "{path}");
        }
        let mut browser = HeaderMap::new();
        browser.insert(header::ACCEPT, "text/html".parse().unwrap());
        assert!(is_open(&Method::GET, "/", &browser));
        assert!(!is_open(&Method::POST, "/", &browser));
    }

    #[test]
    fn a_key_over_its_rate_gets_429_with_retry_after() {
        let k = keys();
        let slow = Some("Bearer sk-slow-1234567");
        assert!(authorize(&k, "/v1/models", slow).is_ok());
        let r = authorize(&k, "/v1/models", slow).unwrap_err();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(r.headers().get(header::RETRY_AFTER).is_some());
    }

    #[test]
    fn a_key_at_its_concurrency_limit_gets_429_while_another_is_served() {
        let k = Keys::parse(
            "sk-one-12345678 name=one max_concurrent=1\nsk-two-12345678 name=two\n",
            None,
        )
        .unwrap();
        let one = Some("Bearer sk-one-12345678");
        let held = authorize(&k, "/v1/chat/completions", one).unwrap();
        let r = authorize(&k, "/v1/chat/completions", one).unwrap_err();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert!(authorize(&k, "/v1/chat/completions", Some("Bearer sk-two-12345678")).is_ok());
        drop(held);
        assert!(authorize(&k, "/v1/chat/completions", one).is_ok());
    }
}
