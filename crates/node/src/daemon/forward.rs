//! Requests go to the instance serving the model they name: through its API here when its rank
//! 0 runs on this node, else forwarded over the control plane to the node that runs it,
//! answered there, and streamed back.

use super::*;

/// An instance that answers requests: its rank 0 is ready on `node`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Serving {
    /// The node its rank 0 runs on.
    pub(super) node: String,
    /// `id@epoch`, as the rank-0 node keys its served routers.
    pub(super) key: String,
    /// The model it was loaded as (what requests name).
    pub(super) model: String,
}

/// Every instance whose rank 0 is ready, this node's first, then by node and instance.
pub(super) fn serving(shared: &Shared) -> Vec<Serving> {
    let snap = shared.control.snapshot();
    let table = followed(shared).table;
    let me = shared.control.me();
    let mut out: Vec<Serving> = hosted_by(&snap)
        .into_iter()
        .flat_map(|(node, hs)| {
            let table = &table;
            hs.into_iter()
                .filter(|h| h.rank == 0 && h.status == "ready")
                .filter_map(move |h| {
                    let spec = table
                        .iter()
                        .find(|s| s.id == h.instance && s.epoch == h.epoch)?;
                    Some(Serving {
                        node: node.clone(),
                        key: format!("{}@{}", h.instance, h.epoch),
                        model: spec.request.model.clone(),
                    })
                })
        })
        .collect();
    out.sort_by_key(|s| (s.node != me, s.node.clone(), s.key.clone()));
    // What an instance's "not found" lists: every model the cluster serves.
    let mut names: Vec<String> = out.iter().map(|s| s.model.clone()).collect();
    names.sort();
    names.dedup();
    shared.served_names.set(names);
    out
}

/// The model a request names: its JSON body's `model` (or Ollama's `name`), or the id in a
/// `/v1/models/{id}` path. Ollama's `:latest` tag means the model itself.
fn named_model(path: &str, body: &[u8]) -> Option<String> {
    let from_path = path.strip_prefix("/v1/models/").map(str::to_string);
    let from_body = || {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let m = v.get("model").or_else(|| v.get("name"))?.as_str()?;
        Some(m.to_string())
    };
    let m = from_path.or_else(from_body)?;
    Some(m.strip_suffix(":latest").map(str::to_string).unwrap_or(m))
}

/// Which instance answers a request naming `model`: one loaded as that model (this node's
/// first); else, for a model no instance serves or a request naming none, the first instance,
/// whose API then answers (a model it does not serve gets that API's own "not found").
pub(super) fn route<'a>(serving: &'a [Serving], model: Option<&str>) -> Option<&'a Serving> {
    model
        .and_then(|m| serving.iter().find(|s| s.model == m))
        .or_else(|| serving.first())
}

/// Everything else goes to the API of an instance: the one serving the model the request
/// names, here or on the node running its rank 0. Listings (`/v1/models`, `/api/tags`,
/// `/api/ps`) gather every instance's.
pub(super) async fn to_instance(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    use tracing::Instrument as _;
    // The access log (strata_http::access) writes the request's line; the span puts the
    // events of its routing in context.
    let span = tracing::info_span!("request", method = %req.method(), path = %req.uri().path());
    routed(shared, req).instrument(span).await
}

/// [`to_instance`] inside its request's span.
async fn routed(shared: Arc<Shared>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if shared.flags.draining.load(Ordering::Relaxed)
        && (path.starts_with("/v1/") || path.starts_with("/api/"))
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node is draining: it finishes what it has and takes no new requests",
        );
    }
    let serving = serving(&shared);
    if serving.is_empty() {
        return nothing_served(&req);
    }
    if req.method() == axum::http::Method::GET
        && matches!(path.as_str(), "/v1/models" | "/api/tags" | "/api/ps")
    {
        // Through the joined listing even for one instance: one that is going away (unloaded
        // a moment ago) then drops out of the list instead of failing it.
        return gathered(&shared, &serving, req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_FORWARD_BODY).await else {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    };
    let model = named_model(&path, &body);
    let Some(target) = route(&serving, model.as_deref()) else {
        return nothing_served(&Request::from_parts(parts, axum::body::Body::empty()));
    };
    let req = Request::from_parts(parts, axum::body::Body::from(body));
    send(&shared, target, req).await
}

/// Runs `req` through `target`'s API: the router here when its rank 0 is here, else forwarded.
async fn send(shared: &Shared, target: &Serving, req: Request) -> Response {
    use tower::ServiceExt as _;
    if target.node == shared.control.me() {
        let router = shared.state().served.get(&target.key).cloned();
        if let Some(r) = router {
            return match r.oneshot(req).await {
                Ok(resp) => resp,
                Err(e) => match e {},
            };
        }
    }
    forward(shared, &target.node, Some(&target.key), req).await
}

/// A listing route answered by every instance, their lists joined (`data` for OpenAI's
/// models, `models` for Ollama's), each entry once.
async fn gathered(shared: &Shared, serving: &[Serving], req: Request) -> Response {
    let (parts, _) = req.into_parts();
    let field = if parts.uri.path() == "/v1/models" {
        "data"
    } else {
        "models"
    };
    let mut joined: Vec<serde_json::Value> = Vec::new();
    let mut first: Option<serde_json::Value> = None;
    for target in serving {
        let mut one = Request::new(axum::body::Body::empty());
        *one.method_mut() = parts.method.clone();
        *one.uri_mut() = parts.uri.clone();
        *one.headers_mut() = parts.headers.clone();
        let resp = send(shared, target, one).await;
        if !resp.status().is_success() {
            continue;
        }
        let Ok(bytes) = axum::body::to_bytes(resp.into_body(), MAX_FORWARD_BODY).await else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        for e in v
            .get(field)
            .and_then(|d| d.as_array())
            .into_iter()
            .flatten()
        {
            let id = |x: &serde_json::Value| x.get("id").or_else(|| x.get("name")).cloned();
            if !joined.iter().any(|j| id(j) == id(e)) {
                joined.push(e.clone());
            }
        }
        first.get_or_insert(v);
    }
    let Some(mut out) = first else {
        let mut empty = Request::new(axum::body::Body::empty());
        *empty.method_mut() = parts.method;
        *empty.uri_mut() = parts.uri;
        return nothing_served(&empty);
    };
    out[field] = serde_json::Value::Array(joined);
    Json(out).into_response()
}

/// The answer while no instance serves: listings are empty (a client or a scraper asking what
/// is served gets "nothing", not an error); everything else is 503.
fn nothing_served(req: &Request) -> Response {
    match (req.method(), req.uri().path()) {
        (&axum::http::Method::GET, "/v1/models") => {
            Json(serde_json::json!({ "object": "list", "data": [] })).into_response()
        }
        (&axum::http::Method::GET, "/api/tags" | "/api/ps") => {
            Json(serde_json::json!({ "models": [] })).into_response()
        }
        (&axum::http::Method::GET, "/metrics") => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            "# EOF\n",
        )
            .into_response(),
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no model instance is loaded; run `strata load MODEL`",
        ),
    }
}

/// Largest request body forwarded to another node.
pub(super) const MAX_FORWARD_BODY: usize = 8 << 20;

/// The head of a forwarded HTTP request or response.
#[derive(Serialize, Deserialize)]
pub(super) struct ForwardHead {
    method: String,
    uri: String,
    status: u16,
    headers: Vec<(String, String)>,
    /// The instance (`id@epoch`) the request is for; without one, any served here.
    #[serde(default)]
    instance: Option<String>,
    /// Who sent the request, as the node that checked its key named them (the serving node
    /// trusts the control plane's mutual TLS for it, as for the rest of the head).
    #[serde(default)]
    tenant: Option<String>,
}

/// The headers to pass on. A client's key stays on the node that checked it: the node serving
/// a forwarded request trusts the control plane's mutual TLS, not the client's header.
pub(super) fn head_of(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(k, _)| *k != header::AUTHORIZATION)
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect()
}

/// Rank-0 node: runs a forwarded request through the local instance's API and streams the
/// answer back as replies (the head first, then body chunks as they come).
pub(super) async fn serve_forwarded(shared: Arc<Shared>, q: zenoh::query::Query) {
    use futures_util::StreamExt as _;
    use tower::ServiceExt as _;
    let key = q.key_expr().clone();
    let payload = q
        .payload()
        .map(|p| p.to_bytes().to_vec())
        .unwrap_or_default();
    let parsed = (|| {
        let n = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
        let head: ForwardHead = serde_json::from_slice(payload.get(4..4 + n)?).ok()?;
        Some((head, payload.get(4 + n..)?.to_vec()))
    })();
    let router = |head: &ForwardHead| {
        let st = shared.state();
        match &head.instance {
            Some(k) => st.served.get(k).cloned(),
            None => st.served.values().next().cloned(),
        }
    };
    // Brings the list of served models the instance's "not found" names up to date.
    serving(&shared);
    let parsed = parsed.map(|(head, body)| {
        let r = router(&head);
        (head, body, r)
    });
    let response = match parsed {
        Some((head, body, Some(router))) => {
            let mut req = Request::new(axum::body::Body::from(body));
            *req.method_mut() = head.method.parse().unwrap_or_default();
            *req.uri_mut() = head.uri.parse().unwrap_or_default();
            for (k, v) in &head.headers {
                if let (Ok(k), Ok(v)) = (
                    header::HeaderName::from_bytes(k.as_bytes()),
                    header::HeaderValue::from_str(v),
                ) {
                    req.headers_mut().append(k, v);
                }
            }
            if let Some(t) = &head.tenant {
                req.extensions_mut()
                    .insert(strata_http::auth::Tenant(t.clone()));
            }
            match router.oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            }
        }
        None => error(StatusCode::BAD_REQUEST, "malformed forwarded request"),
        Some((_, _, None)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the instance is no longer served by this node",
        ),
    };
    let head = ForwardHead {
        method: String::new(),
        uri: String::new(),
        status: response.status().as_u16(),
        headers: head_of(response.headers()),
        instance: None,
        tenant: None,
    };
    if q.reply(key.clone(), serde_json::to_vec(&head).unwrap_or_default())
        .await
        .is_err()
    {
        return;
    }
    let mut body = response.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        if q.reply(key.clone(), chunk.to_vec()).await.is_err() {
            break;
        }
    }
}

/// Any node: sends a request for an instance (`id@epoch`) served elsewhere to its rank-0 node
/// over the (encrypted, authenticated) control plane and streams the answer back.
pub(super) async fn forward(
    shared: &Shared,
    target: &str,
    instance: Option<&str>,
    req: Request,
) -> Response {
    use futures_util::StreamExt as _;
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_FORWARD_BODY).await else {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    };
    let head = ForwardHead {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        status: 0,
        headers: head_of(&parts.headers),
        instance: instance.map(str::to_string),
        tenant: parts
            .extensions
            .get::<strata_http::auth::Tenant>()
            .map(|t| t.0.clone()),
    };
    let head = serde_json::to_vec(&head).unwrap_or_default();
    let mut payload = (head.len() as u32).to_le_bytes().to_vec();
    payload.extend_from_slice(&head);
    payload.extend_from_slice(&body);
    let key = format!("{}/rpc/{target}/http", shared.control.prefix());
    let replies = match shared
        .control
        .session()
        .get(key)
        .payload(payload)
        // Every reply is a piece of one answer: none may be merged away, and order matters.
        .consolidation(zenoh::query::ConsolidationMode::None)
        .timeout(Duration::from_secs(3600))
        .await
    {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_GATEWAY, &format!("forwarding: {e}")),
    };
    let first = match replies.recv_async().await {
        Ok(r) => r,
        Err(_) => {
            return error(
                StatusCode::BAD_GATEWAY,
                &format!("node {target} did not answer the forwarded request"),
            );
        }
    };
    let Some(head) = first
        .result()
        .ok()
        .and_then(|s| serde_json::from_slice::<ForwardHead>(&s.payload().to_bytes()).ok())
    else {
        return error(StatusCode::BAD_GATEWAY, "malformed forwarded answer");
    };
    let chunks = futures_util::stream::unfold(replies, |replies| async move {
        let r = replies.recv_async().await.ok()?;
        let bytes = r.result().ok()?.payload().to_bytes().to_vec();
        Some((Ok::<_, std::io::Error>(bytes), replies))
    })
    .boxed();
    let mut resp = Response::new(axum::body::Body::from_stream(chunks));
    *resp.status_mut() = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (k, v) in head.headers {
        if let (Ok(k), Ok(v)) = (
            header::HeaderName::from_bytes(k.as_bytes()),
            header::HeaderValue::from_str(&v),
        ) {
            resp.headers_mut().append(k, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(node: &str, key: &str, model: &str) -> Serving {
        Serving {
            node: node.into(),
            key: key.into(),
            model: model.into(),
        }
    }

    #[test]
    fn a_request_goes_to_the_instance_of_the_model_it_names() {
        let serving = [s("me", "i-1@1", "small"), s("peer", "i-2@3", "big")];
        assert_eq!(
            route(&serving, Some("big")).map(|x| &x.key[..]),
            Some("i-2@3")
        );
        assert_eq!(
            route(&serving, Some("small")).map(|x| &x.key[..]),
            Some("i-1@1")
        );
        // Naming none, or one nobody serves: the first answers (and says "not found").
        assert_eq!(route(&serving, None).map(|x| &x.key[..]), Some("i-1@1"));
        assert_eq!(
            route(&serving, Some("x")).map(|x| &x.key[..]),
            Some("i-1@1")
        );
        assert_eq!(route(&[], Some("x")), None);
    }

    #[test]
    fn the_model_is_read_from_the_body_or_the_path() {
        let m = |path: &str, body: &str| named_model(path, body.as_bytes());
        assert_eq!(
            m("/v1/chat/completions", r#"{"model":"big"}"#).as_deref(),
            Some("big")
        );
        assert_eq!(
            m("/api/show", r#"{"name":"big:latest"}"#).as_deref(),
            Some("big")
        );
        assert_eq!(m("/v1/models/big", "").as_deref(), Some("big"));
        assert_eq!(m("/v1/chat/completions", "not json"), None);
        assert_eq!(m("/health", ""), None);
    }
}
