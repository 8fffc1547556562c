//! Requests for an instance whose rank 0 runs on another node: forwarded over the control
//! plane, answered there, and streamed back.

use super::*;

/// Everything else goes to the API of the instance whose rank 0 runs here.
pub(super) async fn to_instance(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    use tower::ServiceExt as _;
    let path = req.uri().path();
    if shared.flags.draining.load(Ordering::Relaxed)
        && (path.starts_with("/v1/") || path.starts_with("/api/"))
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node is draining: it finishes what it has and takes no new requests",
        );
    }
    let router = locked(&shared.served).as_ref().map(|(_, r)| r.clone());
    match router {
        Some(r) => match r.oneshot(req).await {
            Ok(resp) => resp,
            Err(e) => match e {},
        },
        None => {
            let snap = shared.control.snapshot();
            let target = hosted_by(&snap)
                .into_iter()
                .find(|(id, hs)| {
                    *id != shared.control.me()
                        && hs.iter().any(|h| h.rank == 0 && h.status == "ready")
                })
                .map(|(id, _)| id);
            match target {
                Some(t) => forward(&shared, &t, req).await,
                None => nothing_served(&req),
            }
        }
    }
}

/// The answer while no instance serves: listings are empty (a client or a scraper asking what
/// is served gets "nothing", not an error); everything else is 503.
fn nothing_served(req: &Request) -> Response {
    match (req.method(), req.uri().path()) {
        (&axum::http::Method::GET, "/v1/models") => {
            Json(serde_json::json!({ "object": "list", "data": [] })).into_response()
        }
        (&axum::http::Method::GET, "/api/tags") => {
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
    let router = locked(&shared.served).as_ref().map(|(_, r)| r.clone());
    let response = match (parsed, router) {
        (Some((head, body)), Some(router)) => {
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
            match router.oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            }
        }
        (None, _) => error(StatusCode::BAD_REQUEST, "malformed forwarded request"),
        (_, None) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the instance is no longer served by this node",
        ),
    };
    let head = ForwardHead {
        method: String::new(),
        uri: String::new(),
        status: response.status().as_u16(),
        headers: head_of(response.headers()),
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

/// Any node: sends a request for an instance served elsewhere to its rank-0 node over the
/// (encrypted, authenticated) control plane and streams the answer back.
pub(super) async fn forward(shared: &Shared, target: &str, req: Request) -> Response {
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
