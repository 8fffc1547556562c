//! The web dashboard: plain HTML, CSS and JavaScript modules embedded in the binary, served at
//! `/` (to browsers) and `/ui/FILE` by `strata serve` and by every `strata node`.
//!
//! There is no front-end build step: the files in `crates/http/dashboard/` are what the browser
//! runs, so `cargo build` stays the whole set-up and the UI can be read and changed like any
//! other source. The pages carry no data of their own: everything they show comes from the API
//! with the key the user types in, so they are served without a key (a node with keys shows a
//! key prompt instead of refusing the page).
//!
//! Every answer carries a strict Content-Security-Policy: scripts and styles only from this
//! origin (no inline code, no third-party origins), no framing, no form posts elsewhere.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The policy every dashboard answer carries.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; manifest-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// The files, by name under `/ui/`, with their content type.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../dashboard/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../dashboard/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/api.js"),
    ),
    (
        "cluster.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/cluster.js"),
    ),
    (
        "models.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/models.js"),
    ),
    (
        "chat.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/chat.js"),
    ),
    (
        "markdown.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/markdown.js"),
    ),
    (
        "metrics.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/metrics.js"),
    ),
    (
        "dom.js",
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/dom.js"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("../dashboard/favicon.svg"),
    ),
];

/// The `/ui/{file}` route, to merge into a router of any state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/ui/{file}", get(asset))
}

/// Whether a request for `/` comes from a browser that wants a page (it asks for HTML), rather
/// than a client probing the server (which gets the JSON it always got).
pub fn wants_page(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

/// Whether a request may pass without a key as the dashboard's: a GET or HEAD of one of its
/// files, or of `/` from a browser. Nothing else under `/ui/` is exempt: a key check that let
/// any `/ui/...` through would take a body from anyone and hand it to the routes behind (on a
/// node, to the node serving a model).
pub fn is_open(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    match path.strip_prefix("/ui/") {
        Some(name) => FILES.iter().any(|(n, _, _)| *n == name),
        None => path == "/" && wants_page(headers),
    }
}

/// The page.
pub fn index() -> Response {
    file("index.html").unwrap_or_else(|| StatusCode::NOT_FOUND.into_response())
}

async fn asset(Path(name): Path<String>) -> Response {
    file(&name).unwrap_or_else(|| {
        crate::ApiError::with_status(
            StatusCode::NOT_FOUND,
            format!("the dashboard has no file {name:?}"),
        )
        .into_response()
    })
}

fn file(name: &str) -> Option<Response> {
    let (_, ty, body) = FILES.iter().find(|(n, _, _)| *n == name)?;
    let mut r = (*body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ty));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The files change only with the binary: revalidate rather than keep a stale UI.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        // The page and its modules name each other by `./x.js`; a file missing from FILES
        // would load as an error page and break the whole UI.
        for (name, _, body) in FILES {
            if !name.ends_with(".js") && !name.ends_with(".html") {
                continue;
            }
            for part in body.split(['"', '\'']) {
                let Some(dep) = part.strip_prefix("./").or(part.strip_prefix("/ui/")) else {
                    continue;
                };
                if dep.ends_with(".js") || dep.ends_with(".css") || dep.ends_with(".svg") {
                    assert!(
                        FILES.iter().any(|(n, _, _)| *n == dep),
                        "{name} refers to {dep}, which is not served"
                    );
                }
            }
        }
    }

    #[test]
    fn no_inline_script_or_style_that_the_policy_would_block() {
        for (name, _, body) in FILES {
            if name.ends_with(".html") {
                assert!(!body.contains("<script>"), "{name} has an inline script");
                assert!(!body.contains("<style"), "{name} has an inline style");
                assert!(!body.contains(" style="), "{name} has a style attribute");
                assert!(!body.contains(" onclick="), "{name} has an inline handler");
            }
            if name.ends_with(".js") {
                assert!(
                    !body.contains("innerHTML"),
                    "{name} writes HTML from strings"
                );
                assert!(!body.contains("eval("), "{name} evaluates strings");
            }
        }
    }

    #[test]
    fn browsers_get_the_page_and_clients_do_not() {
        let mut h = HeaderMap::new();
        assert!(!wants_page(&h));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!wants_page(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html,application/xhtml+xml,*/*;q=0.8"),
        );
        assert!(wants_page(&h));
        let r = index();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_SECURITY_POLICY], CSP);
    }

    #[test]
    fn only_reads_of_real_files_pass_without_a_key() {
        let none = HeaderMap::new();
        let mut browser = HeaderMap::new();
        browser.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
        for name in ["/ui/index.html", "/ui/app.js", "/ui/favicon.svg"] {
            assert!(is_open(&Method::GET, name, &none), "{name}");
            assert!(is_open(&Method::HEAD, name, &none), "{name}");
            assert!(!is_open(&Method::POST, name, &none), "{name}");
        }
        // A body posted under /ui/ was let through and handed on (issue: 7 MB to /ui/x/y).
        for path in [
            "/ui/x/y",
            "/ui/",
            "/ui/missing.js",
            "/ui/../v1/models",
            "/uix",
        ] {
            assert!(!is_open(&Method::GET, path, &none), "{path}");
            assert!(!is_open(&Method::POST, path, &browser), "{path}");
        }
        assert!(is_open(&Method::GET, "/", &browser));
        assert!(!is_open(&Method::GET, "/", &none));
        assert!(!is_open(&Method::POST, "/", &browser));
    }
}
