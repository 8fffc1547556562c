//! The hub's own origin: the API and `resolve`.

use crate::repo::{Repo, RepoFile};
use crate::{Kind, State};
use axum::Router;
use axum::extract::{Path, Query, State as Extract};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::collections::HashMap;
use std::sync::Arc;

type Shared = Arc<State>;
/// An answer that ends a request early; boxed, as responses are large.
type Refusal = Box<Response>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/api/models/{owner}/{name}", get(info))
        .route("/api/models/{owner}/{name}/revision/{rev}", get(info_at))
        .route("/api/models/{owner}/{name}/tree/{rev}", get(tree_root))
        .route(
            "/api/models/{owner}/{name}/tree/{rev}/{*dir}",
            get(tree_dir),
        )
        .route("/{owner}/{name}/resolve/{rev}/{*path}", get(resolve))
        .with_state(state)
}

/// An error the way the hub sends one.
pub(crate) fn hub_error(status: u16, code: Option<&str>, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "error": message }).to_string(),
    )
        .into_response();
    let h = resp.headers_mut();
    if let Some(code) = code.and_then(|c| HeaderValue::from_str(c).ok()) {
        h.insert("x-error-code", code);
    }
    if let Ok(m) = HeaderValue::from_str(message) {
        h.insert("x-error-message", m);
    }
    resp
}

/// The injected answer due for this request, if any.
pub(crate) fn fault(state: &State, kind: Kind) -> Option<Response> {
    state.count(kind);
    let (status, retry_after) = state.take_fault(kind)?;
    let mut resp = hub_error(status, None, "injected fault");
    if let (Some(s), 429 | 503) = (retry_after, status) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    Some(resp)
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// The repository if this caller may see it (and its files, when `files`), else the
/// hub's answer.
fn visible(state: &State, id: &str, headers: &HeaderMap, files: bool) -> Result<Repo, Refusal> {
    let token = bearer(headers);
    if let Some(t) = token
        && !state.access.known(t)
    {
        return Err(Box::new(hub_error(
            401,
            None,
            "Invalid credentials in Authorization header",
        )));
    }
    let not_found = || {
        let status = if token.is_some() { 404 } else { 401 };
        Box::new(hub_error(
            status,
            Some("RepoNotFound"),
            "Repository not found",
        ))
    };
    let granted = |list: &Vec<String>| token.is_some_and(|t| list.iter().any(|x| x == t));
    if let Some(list) = state.access.private.get(id)
        && !granted(list)
    {
        return Err(not_found());
    }
    let repo = state.repo(id).ok_or_else(not_found)?;
    if files
        && let Some(list) = state.access.gated.get(id)
        && !granted(list)
    {
        let (status, msg) = match token {
            None => (
                401,
                "Access to this model is restricted. You must be authenticated to access it.",
            ),
            Some(_) => (
                403,
                "Access to this model is restricted and you are not in the authorized list.",
            ),
        };
        return Err(Box::new(hub_error(status, Some("GatedRepo"), msg)));
    }
    Ok(repo)
}

/// The answer a request of `kind` about `owner/name` gets before anything else: an injected
/// fault, or the repository's refusal; else the repository. Files (`resolve`) may be gated
/// where the listing is not.
fn admit(
    state: &State,
    kind: Kind,
    owner: &str,
    name: &str,
    headers: &HeaderMap,
) -> Result<(String, Repo), Refusal> {
    if let Some(r) = fault(state, kind) {
        return Err(Box::new(r));
    }
    let id = format!("{owner}/{name}");
    let repo = visible(state, &id, headers, kind == Kind::Resolve)?;
    Ok((id, repo))
}

fn commit_of<'a>(repo: &'a Repo, rev: &str) -> Result<&'a str, Refusal> {
    repo.resolve(rev).ok_or_else(|| {
        Box::new(hub_error(
            404,
            Some("RevisionNotFound"),
            &format!("Invalid rev id: {rev}"),
        ))
    })
}

async fn info(
    Extract(state): Extract<Shared>,
    Path((owner, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    model_info(&state, &owner, &name, "main", &headers)
}

async fn info_at(
    Extract(state): Extract<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    model_info(&state, &owner, &name, &rev, &headers)
}

fn model_info(state: &State, owner: &str, name: &str, rev: &str, headers: &HeaderMap) -> Response {
    let (id, repo) = match admit(state, Kind::Api, owner, name, headers) {
        Ok(x) => x,
        Err(e) => return *e,
    };
    let commit = match commit_of(&repo, rev) {
        Ok(c) => c,
        Err(e) => return *e,
    };
    let siblings: Vec<_> = repo
        .files
        .keys()
        .map(|p| serde_json::json!({ "rfilename": p }))
        .collect();
    let gated = if state.access.gated.contains_key(&id) {
        serde_json::json!("manual")
    } else {
        serde_json::json!(false)
    };
    let body = serde_json::json!({
        "_id": &commit[..24],
        "id": id,
        "modelId": id,
        "author": owner,
        "sha": commit,
        "private": state.access.private.contains_key(&id),
        "gated": gated,
        "disabled": false,
        "downloads": 0,
        "likes": 0,
        "tags": ["gguf"],
        "library_name": "gguf",
        "createdAt": "2026-01-01T00:00:00.000Z",
        "lastModified": "2026-01-01T00:00:00.000Z",
        "siblings": siblings,
    });
    axum::Json(body).into_response()
}

async fn tree_root(
    Extract(state): Extract<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    tree(&state, &owner, &name, &rev, "", &q, &headers)
}

async fn tree_dir(
    Extract(state): Extract<Shared>,
    Path((owner, name, rev, dir)): Path<(String, String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    tree(&state, &owner, &name, &rev, &dir, &q, &headers)
}

fn tree(
    state: &State,
    owner: &str,
    name: &str,
    rev: &str,
    dir: &str,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let (id, repo) = match admit(state, Kind::Api, owner, name, headers) {
        Ok(x) => x,
        Err(e) => return *e,
    };
    if let Err(e) = commit_of(&repo, rev) {
        return *e;
    }
    let recursive = q
        .get("recursive")
        .is_some_and(|v| v == "true" || v == "1" || v == "True");
    let Some(entries) = repo.entries(dir, recursive) else {
        return hub_error(
            404,
            Some("EntryNotFound"),
            &format!("{dir} does not exist on \"{rev}\""),
        );
    };
    let from: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let to = (from + state.page_size).min(entries.len());
    let page: Vec<_> = entries
        .get(from..to)
        .unwrap_or_default()
        .iter()
        .map(|e| e.json())
        .collect();
    let mut resp = axum::Json(page).into_response();
    if to < entries.len() {
        let dir_part = if dir.is_empty() {
            String::new()
        } else {
            format!("/{dir}")
        };
        let next = format!(
            "<{}/api/models/{id}/tree/{rev}{dir_part}?recursive={recursive}&expand=false&cursor={to}>; rel=\"next\"",
            state.api_url
        );
        if let Ok(v) = HeaderValue::from_str(&next) {
            resp.headers_mut().insert(header::LINK, v);
        }
    }
    resp
}

async fn resolve(
    Extract(state): Extract<Shared>,
    Path((owner, name, rev, path)): Path<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let (_, repo) = match admit(&state, Kind::Resolve, &owner, &name, &headers) {
        Ok(x) => x,
        Err(e) => return *e,
    };
    let commit = match commit_of(&repo, &rev) {
        Ok(c) => c.to_string(),
        Err(e) => return *e,
    };
    let Some(file) = repo.files.get(&path) else {
        return hub_error(
            404,
            Some("EntryNotFound"),
            &format!("{path} does not exist on \"{rev}\""),
        );
    };
    let mut resp = if file.lfs {
        redirect(&state, file)
    } else {
        let mut r = crate::cdn::serve(
            &state,
            file,
            method == Method::HEAD,
            headers.get(header::RANGE),
            None,
        )
        .await;
        if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", file.oid)) {
            r.headers_mut().insert(header::ETAG, v);
        }
        r
    };
    if let Ok(v) = HeaderValue::from_str(&commit) {
        resp.headers_mut().insert("x-repo-commit", v);
    }
    resp
}

/// The hub's answer for an LFS file: a redirect to a signed CDN URL.
fn redirect(state: &State, file: &RepoFile) -> Response {
    let url = crate::cdn::signed_url(state, file);
    let body = format!("Found. Redirecting to {url}");
    let mut resp = (StatusCode::FOUND, body).into_response();
    let h = resp.headers_mut();
    for (name, value) in [
        ("location", url),
        ("x-linked-etag", format!("\"{}\"", file.sha256)),
        ("x-linked-size", file.size.to_string()),
        ("etag", format!("\"{}\"", file.oid)),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    resp
}
