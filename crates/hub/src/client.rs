//! The hub's HTTP API, as much of it as finding and fetching a model needs:
//!
//! - `GET /api/models/{repo}/revision/{rev}`: the commit a revision stands for;
//! - `GET /api/models/{repo}/tree/{commit}?recursive=true`: every file with its size and, for
//!   files kept in LFS, its SHA-256 (paged with `Link: <...>; rel="next"`);
//! - `HEAD /{repo}/resolve/{commit}/{path}`: where the bytes are. For LFS files the hub answers
//!   302 to another host (its CDN) with `X-Linked-Etag` and `X-Linked-Size`; that host gets
//!   the ranged `GET`s and never the token.
//!
//! 429 and 5xx answers and dropped connections are retried with backoff (a `Retry-After` the
//! server sends is honoured); the hub's `X-Error-Code` turns 401/403/404 into errors that say
//! whether the repository, the revision, the file or the access is the problem.

use std::time::Duration;

use ureq::http::{Response, StatusCode};

use crate::error::{Error, Result};

/// An access token. Its `Debug` never shows it, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A token from its text (surrounding whitespace removed); `None` if empty.
    pub fn new(text: &str) -> Option<Token> {
        let t = text.trim();
        (!t.is_empty()).then(|| Token(t.to_string()))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

/// How failed requests are retried.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// The first wait, doubled each time up to [`Retry::max_wait`], when the server names none.
    pub first_wait: Duration,
    /// The longest wait, also the cap on a server's `Retry-After`.
    pub max_wait: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            attempts: 7,
            first_wait: Duration::from_millis(500),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// A file of a repository at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its path in the repository.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, for files kept in LFS (the hub's ETag for them).
    pub sha256: Option<String>,
    /// Its git blob id (the ETag of a file not kept in LFS).
    pub oid: String,
}

impl Entry {
    /// The name the hub cache keeps its bytes under.
    pub fn etag(&self) -> &str {
        self.sha256.as_deref().unwrap_or(&self.oid)
    }
}

/// Where a file's bytes are.
#[derive(Debug, Clone)]
pub(crate) struct Located {
    /// The URL to `GET` ranges of.
    pub url: String,
    /// Whether that URL is on the hub's own origin (and may see the token).
    pub same_origin: bool,
}

/// A client of one hub.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    pub endpoint: String,
    token: Option<Token>,
    agent: ureq::Agent,
    pub retry: Retry,
}

/// `scheme://host[:port]` of an absolute URL.
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    match url[after..].find('/') {
        Some(i) => &url[..after + i],
        None => url,
    }
}

/// A URL without its query, which may carry a signature.
pub(crate) fn bare(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_string()
}

/// Percent-encodes one path segment (everything but unreserved characters).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A repository path with each segment encoded.
fn path_segments(path: &str) -> String {
    path.split('/').map(segment).collect::<Vec<_>>().join("/")
}

fn header<'a>(resp: &'a Response<ureq::Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

impl Client {
    pub(crate) fn new(endpoint: &str, token: Option<Token>, retry: Retry) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(120)))
            .timeout_per_read(Some(Duration::from_secs(120)))
            .user_agent(format!("strata/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            agent,
            retry,
        }
    }

    pub(crate) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// One request, retried on 429, 5xx and network errors; other answers are returned.
    pub(crate) fn send(
        &self,
        method: &str,
        url: &str,
        with_token: bool,
        range: Option<(u64, u64)>,
    ) -> Result<Response<ureq::Body>> {
        let mut wait = self.retry.first_wait;
        let mut attempt = 1;
        loop {
            let mut req = ureq::http::Request::builder()
                .method(method)
                .uri(url)
                .header("Accept-Encoding", "identity");
            if let (true, Some(t)) = (with_token, &self.token) {
                req = req.header("Authorization", format!("Bearer {}", t.0));
            }
            if let Some((a, b)) = range {
                req = req.header("Range", format!("bytes={a}-{}", b - 1));
            }
            let req = req.body(()).map_err(|e| Error::Protocol {
                url: bare(url),
                message: e.to_string(),
            })?;
            let retry_after = match self.agent.run(req) {
                Ok(mut r)
                    if r.status() == StatusCode::TOO_MANY_REQUESTS
                        || r.status().is_server_error() =>
                {
                    if attempt >= self.retry.attempts {
                        return Err(http_error(url, &mut r));
                    }
                    header(&r, "retry-after").and_then(|v| v.trim().parse::<u64>().ok())
                }
                Ok(r) => return Ok(r),
                Err(e) if retryable(&e) && attempt < self.retry.attempts => None,
                Err(e) => {
                    return Err(Error::Network {
                        url: bare(url),
                        message: format!("{e} (after {attempt} attempts)"),
                    });
                }
            };
            let pause = match retry_after {
                Some(s) => Duration::from_secs(s).min(self.retry.max_wait),
                None => wait,
            };
            tracing::debug!(url = %bare(url), attempt, ?pause, "retrying");
            std::thread::sleep(pause);
            wait = (wait * 2).min(self.retry.max_wait);
            attempt += 1;
        }
    }

    /// `GET` JSON from the API, mapping the hub's errors for `repo`.
    fn api_json(
        &self,
        path: &str,
        repo: &str,
        rev: &str,
    ) -> Result<(serde_json::Value, Option<String>)> {
        let url = format!("{}{path}", self.endpoint);
        let mut resp = self.send("GET", &url, true, None)?;
        if !resp.status().is_success() {
            return Err(self.repo_error(&url, repo, rev, None, &mut resp));
        }
        let next = header(&resp, "link").and_then(next_link);
        let value = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_json::<serde_json::Value>()
            .map_err(|e| Error::Protocol {
                url: bare(&url),
                message: e.to_string(),
            })?;
        Ok((value, next))
    }

    /// The commit `rev` stands for in `repo`.
    pub(crate) fn revision(&self, repo: &str, rev: &str) -> Result<String> {
        let path = format!("/api/models/{repo}/revision/{}", segment(rev));
        let (v, _) = self.api_json(&path, repo, rev)?;
        match v["sha"].as_str() {
            Some(s) if s.len() >= 7 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(s.to_string())
            }
            _ => Err(Error::Protocol {
                url: format!("{}{path}", self.endpoint),
                message: "no commit sha in the answer".into(),
            }),
        }
    }

    /// Every file of `repo` at `commit`.
    pub(crate) fn tree(&self, repo: &str, commit: &str) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        let mut path = format!("/api/models/{repo}/tree/{commit}?recursive=true&expand=false");
        for _ in 0..10_000 {
            let (v, next) = self.api_json(&path, repo, commit)?;
            let items = v.as_array().ok_or_else(|| Error::Protocol {
                url: format!("{}{}", self.endpoint, bare(&path)),
                message: "the tree is not a list".into(),
            })?;
            for item in items {
                if item["type"] != "file" {
                    continue;
                }
                let (Some(p), Some(size), Some(oid)) = (
                    item["path"].as_str(),
                    item["size"].as_u64(),
                    item["oid"].as_str(),
                ) else {
                    continue;
                };
                let sha256 = item["lfs"]["oid"]
                    .as_str()
                    .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(str::to_ascii_lowercase);
                out.push(Entry {
                    path: p.to_string(),
                    size: item["lfs"]["size"].as_u64().unwrap_or(size),
                    sha256,
                    oid: oid.to_string(),
                });
            }
            match next {
                // The next page is on the same API; keep only its path and query.
                Some(n) if n.starts_with(origin(&self.endpoint)) || n.starts_with('/') => {
                    path = n.trim_start_matches(origin(&self.endpoint)).to_string();
                }
                Some(n) => {
                    return Err(Error::Protocol {
                        url: bare(&n),
                        message: "a tree page on another host".into(),
                    });
                }
                None => return Ok(out),
            }
        }
        Err(Error::Protocol {
            url: format!("{}/api/models/{repo}/tree/{commit}", self.endpoint),
            message: "more than 10,000 pages".into(),
        })
    }

    /// Where the bytes of `path` at `commit` are: a `HEAD` that follows the hub's own
    /// (relative) redirects and stops at the first one to another host.
    pub(crate) fn locate(&self, repo: &str, commit: &str, path: &str) -> Result<Located> {
        let mut url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            path_segments(path)
        );
        for _ in 0..5 {
            let mut resp = self.send("HEAD", &url, true, None)?;
            let status = resp.status();
            if status.is_success() {
                return Ok(Located {
                    url,
                    same_origin: true,
                });
            }
            if !status.is_redirection() {
                return Err(self.repo_error(&url, repo, commit, Some(path), &mut resp));
            }
            let Some(loc) = header(&resp, "location") else {
                return Err(Error::Protocol {
                    url: bare(&url),
                    message: format!("HTTP {status} without a Location"),
                });
            };
            if loc.starts_with('/') {
                url = format!("{}{loc}", origin(&self.endpoint));
                continue;
            }
            let same_origin = origin(loc) == origin(&self.endpoint);
            return Ok(Located {
                url: loc.to_string(),
                same_origin,
            });
        }
        Err(Error::Protocol {
            url: bare(&url),
            message: "too many redirects".into(),
        })
    }

    /// The error a non-success answer about `repo` means.
    pub(crate) fn repo_error(
        &self,
        url: &str,
        repo: &str,
        rev: &str,
        file: Option<&str>,
        resp: &mut Response<ureq::Body>,
    ) -> Error {
        let code = header(resp, "x-error-code").unwrap_or("").to_string();
        let token = self.has_token();
        let endpoint = self.endpoint.clone();
        let repo = repo.to_string();
        match (resp.status().as_u16(), code.as_str()) {
            (_, "RepoNotFound") => Error::RepoNotFound {
                repo,
                endpoint,
                token,
            },
            (_, "GatedRepo") => Error::Gated {
                repo,
                endpoint,
                token,
            },
            (_, "RevisionNotFound") => Error::RevisionNotFound {
                repo,
                revision: rev.to_string(),
            },
            (_, "EntryNotFound") => Error::NoSuchModel(format!(
                "{repo}@{rev} has no file {}",
                file.unwrap_or("(asked for)")
            )),
            (401, _) if token => Error::BadToken { endpoint },
            (401, _) => Error::RepoNotFound {
                repo,
                endpoint,
                token,
            },
            (403, _) => Error::Gated {
                repo,
                endpoint,
                token,
            },
            _ => http_error(url, resp),
        }
    }
}

/// An error for an answer nothing more specific fits, with the server's message.
pub(crate) fn http_error(url: &str, resp: &mut Response<ureq::Body>) -> Error {
    let status = resp.status().as_u16();
    let mut message = header(resp, "x-error-message").unwrap_or("").to_string();
    if message.is_empty() {
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 << 10)
            .read_to_string()
            .unwrap_or_default();
        message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(body);
    }
    let message: String = message.trim().chars().take(200).collect();
    Error::Http {
        url: bare(url),
        status,
        message,
    }
}

/// Whether a transport error is worth another attempt.
pub(crate) fn retryable(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::Protocol(_)
    )
}

/// The `rel="next"` target of a `Link` header.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let params = params.replace(' ', "");
        (params.contains("rel=\"next\"") || params.contains("rel=next")).then(|| {
            target
                .trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_are_built_and_shown_safely() {
        assert_eq!(origin("https://h.co:8080/a/b?x"), "https://h.co:8080");
        assert_eq!(bare("http://c/blobs/x?sig=s3cret"), "http://c/blobs/x");
        assert_eq!(path_segments("dir/a b+c.gguf"), "dir/a%20b%2Bc.gguf");
        assert_eq!(segment("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(
            format!("{:?}", Token::new(" hf_x ").unwrap()),
            "Token(<hidden>)"
        );
        assert!(Token::new("  ").is_none());
    }

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        let l = r#"<https://hub/api/models/o/r/tree/c?cursor=abc>; rel="next""#;
        assert_eq!(
            next_link(l).as_deref(),
            Some("https://hub/api/models/o/r/tree/c?cursor=abc")
        );
        assert_eq!(next_link(r#"<https://x>; rel="prev""#), None);
    }
}
