//! Browser safety for every HTTP surface: what stops a web page the operator happens to open
//! from driving a node on their machine or LAN.
//!
//! Three attacks, three checks, run before any route:
//! - **DNS rebinding.** A page at `evil.example` re-points its name to 127.0.0.1 and then reads
//!   the node's answers as same-origin. Its requests still say `Host: evil.example`, so only
//!   hosts this server is known by are accepted: IP literals (a page can only be same-origin with
//!   an address by being served from it), `localhost`, this machine's name, and the names given
//!   with `--allow-host`.
//! - **Cross-site requests.** A page may send a form or a `no-cors` fetch to any address and the
//!   browser delivers it, even though the page cannot read the answer: enough to stop a node.
//!   Browsers name the page in `Origin`; a state-changing request (anything but GET, HEAD and
//!   OPTIONS) from another origin is refused unless `--cors-origin` names it.
//! - **Simple requests without `Origin`.** Bodies must be JSON (`Content-Type:
//!   application/json`): a type no form can send and no cross-origin fetch can send without a
//!   CORS preflight. Two exceptions, for the command-line clients that send JSON under another
//!   type or none (litellm's Ollama providers send none; `curl -d`, as Ollama's documentation
//!   writes its examples, sends `application/x-www-form-urlencoded`): a request that carries no
//!   mark of a browser (no `Origin`, no `Sec-Fetch-*` header) may send its body with no type or
//!   as a URL-encoded form. Neither lets a page in: a browser names the page in `Origin` on
//!   every fetch that is not a GET or HEAD, a form cannot omit the type, and a URL-encoded
//!   form body cannot be JSON (the encoding escapes `{`, `[` and `"`). A `text/plain` body,
//!   which a form can shape into JSON, stays refused.
//!
//! CORS is off unless `--cors-origin` names origins; then those origins get the preflight and
//! response headers that let their pages call the API (with their own keys).

use std::net::IpAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::ApiError;

/// Which hosts and origins browsers may reach a server from.
#[derive(Debug, Clone, Default)]
pub struct BrowserPolicy {
    /// Host names accepted besides IP literals, `localhost` and this machine's name (`*`: any).
    pub allow_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) whose pages may call the API.
    pub cors_origins: Vec<String>,
}

impl BrowserPolicy {
    /// Checks the options: origins must be `scheme://host[:port]`, hosts plain names.
    pub fn check(&self) -> Result<(), String> {
        for o in &self.cors_origins {
            if parse_origin(o).is_none() {
                return Err(format!(
                    "--cors-origin {o:?} is not an origin: give scheme://host[:port], \
                     such as http://localhost:5173"
                ));
            }
        }
        for h in &self.allow_hosts {
            if h != "*" && (h.is_empty() || h.contains(['/', ':', ' '])) {
                return Err(format!(
                    "--allow-host {h:?} is not a host name: give a name such as strata.lan \
                     (no scheme or port), or * for any"
                ));
            }
        }
        Ok(())
    }
}

/// What the guard knows besides the request.
#[derive(Debug)]
struct Guard {
    policy: BrowserPolicy,
    /// This machine's host name, lower case.
    hostname: Option<String>,
}

/// Puts the browser checks (and CORS, when origins are named) in front of `router`.
pub fn protect(router: Router, policy: &BrowserPolicy) -> Router {
    let guard = Arc::new(Guard {
        policy: policy.clone(),
        hostname: hostname(),
    });
    let router = router.layer(middleware::from_fn_with_state(guard, check_request));
    let origins: Vec<HeaderValue> = policy
        .cors_origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok())
        .collect();
    if origins.is_empty() {
        return router;
    }
    router.layer(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("x-api-key"),
                HeaderName::from_static("anthropic-version"),
                HeaderName::from_static("anthropic-beta"),
                HeaderName::from_static("anthropic-dangerous-direct-browser-access"),
            ])
            .max_age(std::time::Duration::from_secs(600)),
    )
}

async fn check_request(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    match verdict(&guard, req.method(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refused) => refused.into_response(),
    }
}

/// Why a request is refused before any route sees it.
fn verdict(guard: &Guard, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    let host = match headers.get(header::HOST) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(split_authority)
                .ok_or_else(|| ApiError::bad_body("The Host header is not a valid host."))?,
        ),
    };
    if let Some((name, _)) = &host
        && !host_allowed(guard, name)
    {
        return Err(ApiError::forbidden(format!(
            "This server does not answer to the host {name:?} (a guard against DNS rebinding). \
             If that is a name of this server, start it with --allow-host {name}."
        )));
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let text = origin.to_str().unwrap_or("");
        let same = parse_origin(text).is_some_and(|(scheme, name, port)| {
            host.as_ref().is_some_and(|(h, p)| {
                name.eq_ignore_ascii_case(h)
                    && port == p.unwrap_or(if scheme == "https" { 443 } else { 80 })
            })
        });
        let listed = guard
            .policy
            .cors_origins
            .iter()
            .any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(text));
        if !same && !listed {
            return Err(ApiError::forbidden(format!(
                "A cross-origin request from the page at {text:?} was refused. To let pages \
                 from that origin call this server, start it with --cors-origin {text}."
            )));
        }
    } else if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return Err(ApiError::forbidden(
            "A cross-site request from a web page was refused.",
        ));
    }
    let browser = headers.contains_key(header::ORIGIN)
        || headers.keys().any(|k| k.as_str().starts_with("sec-fetch-"));
    match headers.get(header::CONTENT_TYPE) {
        Some(ct) if is_json(ct) => Ok(()),
        Some(ct) if !browser && is_form(ct) => Ok(()),
        Some(ct) => Err(ApiError::unsupported_media_type(format!(
            "Request bodies must be JSON: send Content-Type: application/json (got {:?}; \
             with curl, add -H 'Content-Type: application/json').",
            ct.to_str().unwrap_or("?")
        ))),
        None if browser && has_body(headers) => Err(ApiError::unsupported_media_type(
            "Request bodies must be JSON: send Content-Type: application/json.".to_string(),
        )),
        None => Ok(()),
    }
}

/// Whether a request announces a body (a length above 0, or chunked).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// `application/json`, with any parameters (`; charset=utf-8`).
fn is_json(ct: &HeaderValue) -> bool {
    media_type_is(ct, "application/json")
}

/// `application/x-www-form-urlencoded`, with any parameters.
fn is_form(ct: &HeaderValue) -> bool {
    media_type_is(ct, "application/x-www-form-urlencoded")
}

fn media_type_is(ct: &HeaderValue, want: &str) -> bool {
    ct.to_str().is_ok_and(|s| {
        s.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case(want))
    })
}

fn host_allowed(guard: &Guard, name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name.parse::<IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || guard.policy.allow_hosts.iter().any(|h| h == "*")
    {
        return true;
    }
    if let Some(me) = &guard.hostname
        && (name == *me || name == format!("{me}.local"))
    {
        return true;
    }
    guard
        .policy
        .allow_hosts
        .iter()
        .any(|h| h.trim_end_matches('.').eq_ignore_ascii_case(&name))
}

/// `host[:port]` (IPv6 in brackets) into the host, without brackets, and the port.
fn split_authority(s: &str) -> Option<(String, Option<u16>)> {
    let s = s.trim();
    if s.is_empty() || s.contains(['/', '@', ' ', '?', '#']) {
        return None;
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        ip.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        return Some((ip.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !h.contains(':') => {
            Some((h.to_string(), Some(p.parse().ok()?)))
        }
        Some(_) => None,
        None => Some((s.to_string(), None)),
    }
}

/// `scheme://host[:port]` into its parts, with the scheme's default port filled in.
fn parse_origin(s: &str) -> Option<(String, String, u16)> {
    let (scheme, rest) = s.trim_end_matches('/').split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (host, port) = split_authority(rest)?;
    Some((scheme, host, port.unwrap_or(default)))
}

/// This machine's host name, lower case.
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the local buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..end])
        .ok()?
        .trim()
        .to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow: &[&str], cors: &[&str]) -> Guard {
        Guard {
            policy: BrowserPolicy {
                allow_hosts: allow.iter().map(|s| s.to_string()).collect(),
                cors_origins: cors.iter().map(|s| s.to_string()).collect(),
            },
            hostname: Some("gpu-box".into()),
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("test header"));
        }
        h
    }

    fn status(g: &Guard, m: Method, pairs: &[(&'static str, &str)]) -> u16 {
        match verdict(g, &m, &headers(pairs)) {
            Ok(()) => 200,
            Err(e) => e.status.as_u16(),
        }
    }

    #[test]
    fn a_rebound_name_is_refused_and_known_names_pass() {
        let g = guard(&["strata.lan"], &[]);
        for host in [
            "127.0.0.1:8000",
            "localhost:8000",
            "LOCALHOST",
            "app.localhost:8000",
            "[::1]:8000",
            "192.168.1.20:8000",
            "gpu-box:8000",
            "gpu-box.local",
            "strata.lan:8000",
            "strata.lan.",
        ] {
            assert_eq!(status(&g, Method::GET, &[("host", host)]), 200, "{host}");
        }
        for host in [
            "evil.example:8000",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            assert_eq!(status(&g, Method::GET, &[("host", host)]), 403, "{host}");
        }
        assert_eq!(status(&g, Method::GET, &[("host", "a b")]), 400);
        assert_eq!(status(&g, Method::GET, &[("host", "x:notaport")]), 400);
        let any = guard(&["*"], &[]);
        assert_eq!(status(&any, Method::GET, &[("host", "evil.example")]), 200);
    }

    #[test]
    fn cross_origin_state_changes_are_refused_unless_listed() {
        let g = guard(&[], &["http://localhost:5173"]);
        let json = ("content-type", "application/json");
        let host = ("host", "localhost:8000");
        // The page at evil.example posting to the node.
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[host, ("origin", "http://evil.example"), json]
            ),
            403
        );
        assert_eq!(
            status(&g, Method::POST, &[host, ("origin", "null"), json]),
            403
        );
        // Same origin, and the listed origin.
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[host, ("origin", "http://localhost:8000"), json]
            ),
            200
        );
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[host, ("origin", "http://localhost:5173"), json]
            ),
            200
        );
        // Another port is another origin.
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[host, ("origin", "http://localhost:8001"), json]
            ),
            403
        );
        // Default ports.
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[("host", "gpu-box"), ("origin", "http://gpu-box"), json]
            ),
            200
        );
        // Reads are not refused (CORS keeps their answers from the page).
        assert_eq!(
            status(&g, Method::GET, &[host, ("origin", "http://evil.example")]),
            200
        );
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[host, ("sec-fetch-site", "cross-site"), json]
            ),
            403
        );
    }

    #[test]
    fn only_json_bodies_are_accepted() {
        let g = guard(&[], &[]);
        let host = ("host", "127.0.0.1:8000");
        let page = ("origin", "http://127.0.0.1:8000");
        let fetch = ("sec-fetch-mode", "no-cors");
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            for mark in [page, fetch] {
                assert_eq!(
                    status(
                        &g,
                        Method::POST,
                        &[host, mark, ("content-type", ct), ("content-length", "5")]
                    ),
                    415,
                    "{ct} {mark:?}"
                );
            }
        }
        // Without a browser's marks: JSON sent as a URL-encoded form (`curl -d`) or without a
        // type (litellm) passes; text/plain, which a form can shape into JSON, does not.
        for (ct, want) in [
            (Some("application/x-www-form-urlencoded"), 200),
            (None, 200),
            (Some("text/plain"), 415),
            (Some("multipart/form-data; boundary=x"), 415),
        ] {
            let mut h = vec![host, ("content-length", "5")];
            h.extend(ct.map(|c| ("content-type", c)));
            assert_eq!(status(&g, Method::POST, &h), want, "{ct:?}");
            h.push(fetch);
            assert_eq!(status(&g, Method::POST, &h), 415, "{ct:?} from a page");
        }
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[host, ("content-type", "Application/JSON; charset=utf-8")]
            ),
            200
        );
        // A command without a body (`strata stop`) needs no type; a body without one does.
        assert_eq!(status(&g, Method::POST, &[host]), 200);
        assert_eq!(
            status(&g, Method::POST, &[host, ("content-length", "0")]),
            200
        );
        assert_eq!(
            status(&g, Method::POST, &[host, page, ("content-length", "2")]),
            415
        );
        assert_eq!(
            status(
                &g,
                Method::POST,
                &[host, fetch, ("transfer-encoding", "chunked")]
            ),
            415
        );
    }

    #[test]
    fn options_are_checked() {
        let bad = BrowserPolicy {
            allow_hosts: vec![],
            cors_origins: vec!["localhost:5173".into()],
        };
        assert!(bad.check().is_err());
        let bad = BrowserPolicy {
            allow_hosts: vec!["http://x".into()],
            cors_origins: vec![],
        };
        assert!(bad.check().is_err());
        let good = BrowserPolicy {
            allow_hosts: vec!["strata.lan".into(), "*".into()],
            cors_origins: vec!["https://app.example:8443/".into()],
        };
        assert!(good.check().is_ok());
    }
}
