//! API keys and per-key rate limits.
//!
//! The key file has one key per line, optionally followed by `name=NAME`, `rpm=N` (requests per
//! minute for that key), `max_concurrent=N` (requests in flight at once) and `role=admin` or
//! `role=client`; blank lines and `#` comments are skipped. A key is a client key unless it says `role=admin`: client keys may run inference and
//! read the cluster's state, only admin keys may change it (load, unload, drain, stop), so a key
//! handed to an application cannot take the cluster down. Keys are
//! compared through their SHA-256 digests with a constant-time equality over every listed key,
//! so neither the match nor its position leaks through timing. Keys are never logged: a key is
//! known to the rest of the server only by its name (or `key-N`, its line number).
//!
//! A request admitted under a key with a concurrency limit holds a [`Slot`] until its response
//! body ends: a stream holds it until its last event is sent or the client goes away, so one
//! key cannot keep every batch slot busy with long streams while others wait.

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::response::Response;
use http_body::{Frame, SizeHint};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("reading the API key file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("API key file line {line}: {why}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// No key in the file.
    #[error("the API key file {0} holds no key")]
    Empty(String),
    /// Other users may read or change the file.
    #[error("{0}")]
    Exposed(String),
}

/// The key a request presents, as an `Authorization` value: OpenAI clients send
/// `Authorization: Bearer KEY`, Anthropic's send `x-api-key: KEY`; both are taken everywhere.
pub fn presented(headers: &axum::http::HeaderMap) -> Option<String> {
    if let Some(v) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return Some(v.to_string());
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|k| format!("Bearer {}", k.trim()))
}

/// Refuses a secrets file that other users may read or change (as ssh does with private keys):
/// anyone on the machine could take the keys, or add their own. The error says how to fix it.
pub fn check_private(path: &Path, what: &str) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(format!(
                    "{what} {} is open to other users (mode {mode:04o}): anyone on this machine \
                     could read it. Run `chmod 600 {}`",
                    path.display(),
                    path.display()
                ));
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (path, what);
    Ok(())
}

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Inference and read-only cluster state.
    Client,
    /// Everything, including cluster operations (load, unload, drain, stop).
    Admin,
}

/// One accepted key.
#[derive(Debug, Clone)]
struct Key {
    digest: [u8; 32],
    name: String,
    rpm: Option<f64>,
    max_concurrent: Option<usize>,
    role: Role,
    /// Requests in flight under the key's name (lines with one name share it, as they share a
    /// rate bucket).
    in_flight: Arc<AtomicUsize>,
}

/// The accepted keys and their rate and concurrency limits.
#[derive(Debug)]
pub struct Keys {
    keys: Vec<Key>,
    default_rpm: Option<f64>,
    default_max_concurrent: Option<usize>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// A token bucket holding up to one minute's worth of requests.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What an authorisation check decided.
#[derive(Debug)]
pub enum Verdict {
    /// The key is valid; requests are counted under its name, and this one holds the slot
    /// until it is dropped (see [`Slot::hold`]).
    Allowed(Grant, Slot),
    /// No key, or an unknown one.
    Unknown,
    /// A valid key over its rate; retry after this many seconds.
    Limited(f64),
    /// A valid key with this many requests in flight already, its `max_concurrent`.
    Busy(usize),
}

/// One of a key's `max_concurrent` places, taken by [`Keys::check`] and given back when
/// dropped. A key without a limit gets a slot that holds nothing.
#[derive(Debug)]
pub struct Slot(Option<Arc<AtomicUsize>>);

impl Slot {
    /// Takes a place among `limit` on `count`, if one is free.
    fn take(count: &Arc<AtomicUsize>, limit: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Some(Arc::clone(count))))
    }

    /// `response`, holding this slot until its body has been sent to the end or dropped (the
    /// client went away): a request is in flight for as long as its answer is, which for a
    /// stream is far longer than the handler that returned it.
    pub fn hold(self, response: Response) -> Response {
        if self.0.is_none() {
            return response;
        }
        let (parts, body) = response.into_parts();
        Response::from_parts(
            parts,
            Body::new(Held {
                body,
                slot: Some(self),
            }),
        )
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(count) = &self.0 {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A response body that gives its [`Slot`] back when it ends or is dropped.
struct Held {
    body: Body,
    slot: Option<Slot>,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.slot = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Who a valid key belongs to and what it may do.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The key's name (never the key itself).
    pub name: String,
    /// Its role.
    pub role: Role,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Keys {
    /// Reads a key file; `default_rpm` applies to keys without their own `rpm=`.
    pub fn from_file(path: &Path, default_rpm: Option<f64>) -> Result<Keys, KeyFileError> {
        check_private(path, "the API key file").map_err(KeyFileError::Exposed)?;
        let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let keys = Keys::parse(&text, default_rpm)?;
        if keys.keys.is_empty() {
            return Err(KeyFileError::Empty(path.display().to_string()));
        }
        Ok(keys)
    }

    /// Parses key-file text.
    pub fn parse(text: &str, default_rpm: Option<f64>) -> Result<Keys, KeyFileError> {
        let mut keys = Vec::new();
        let mut counts: HashMap<String, Arc<AtomicUsize>> = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let Some(secret) = parts.next() else { continue };
            let err = |why: String| KeyFileError::Line { line: i + 1, why };
            if secret.len() < 8 {
                return Err(err("a key must be at least 8 characters long".into()));
            }
            let mut key = Key {
                digest: digest(secret),
                name: format!("key-{}", i + 1),
                rpm: None,
                max_concurrent: None,
                role: Role::Client,
                in_flight: Arc::default(),
            };
            for p in parts {
                match p.split_once('=') {
                    Some(("name", n)) if !n.is_empty() => key.name = n.to_string(),
                    Some(("rpm", r)) => {
                        let v: f64 = r
                            .parse()
                            .ok()
                            .filter(|v: &f64| v.is_finite() && *v > 0.0)
                            .ok_or_else(|| {
                                err(format!("rpm must be a positive number, got `{r}`"))
                            })?;
                        key.rpm = Some(v);
                    }
                    Some(("max_concurrent", n)) => {
                        let v: usize = n.parse().ok().filter(|v| *v > 0).ok_or_else(|| {
                            err(format!(
                                "max_concurrent must be a whole number above 0, got `{n}`"
                            ))
                        })?;
                        key.max_concurrent = Some(v);
                    }
                    Some(("role", "admin")) => key.role = Role::Admin,
                    Some(("role", "client")) => key.role = Role::Client,
                    Some(("role", r)) => {
                        return Err(err(format!("role must be admin or client, got `{r}`")));
                    }
                    _ => {
                        return Err(err(format!(
                            "unexpected `{p}` (expected name=NAME, rpm=N, max_concurrent=N or \
                             role=admin|client)"
                        )));
                    }
                }
            }
            key.in_flight = Arc::clone(counts.entry(key.name.clone()).or_default());
            keys.push(key);
        }
        Ok(Keys {
            keys,
            default_rpm,
            default_max_concurrent: None,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The same keys, with `limit` requests in flight at once for keys without their own
    /// `max_concurrent=` (`None`: no limit).
    pub fn with_max_concurrent(mut self, limit: Option<usize>) -> Keys {
        self.default_max_concurrent = limit.filter(|n| *n > 0);
        self
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks an `Authorization` header value (see [`presented`]) and, for a valid key, takes a
    /// slot among its `max_concurrent` (none free: [`Verdict::Busy`], and nothing is taken from
    /// its rate) and then one request from its bucket.
    pub fn check(&self, authorization: Option<&str>) -> Verdict {
        let Some(key) = self.find(authorization) else {
            return Verdict::Unknown;
        };
        let slot = match key.max_concurrent.or(self.default_max_concurrent) {
            None => Slot(None),
            Some(limit) => match Slot::take(&key.in_flight, limit) {
                Some(slot) => slot,
                None => return Verdict::Busy(limit),
            },
        };
        let grant = Grant {
            name: key.name.clone(),
            role: key.role,
        };
        match key.rpm.or(self.default_rpm) {
            None => Verdict::Allowed(grant, slot),
            Some(rpm) => match self.take(&grant.name, rpm, Instant::now()) {
                Ok(()) => Verdict::Allowed(grant, slot),
                Err(wait) => Verdict::Limited(wait),
            },
        }
    }

    /// Who a valid key belongs to, without counting a request (for a route that says which key
    /// asked, behind a check that counted it).
    pub fn grant(&self, authorization: Option<&str>) -> Option<Grant> {
        self.find(authorization).map(|k| Grant {
            name: k.name.clone(),
            role: k.role,
        })
    }

    /// Whether an `Authorization` header value carries a known key, without taking a request
    /// from its bucket (for a look at a request before the check that counts it).
    pub fn knows(&self, authorization: Option<&str>) -> bool {
        self.find(authorization).is_some()
    }

    /// The name of the key an `Authorization` header value carries, without taking a request
    /// from its bucket (for whoever passes the request on with who sent it).
    pub fn name_of(&self, authorization: Option<&str>) -> Option<String> {
        self.find(authorization).map(|k| k.name.clone())
    }

    /// The key an `Authorization` header value carries, compared in constant time.
    fn find(&self, authorization: Option<&str>) -> Option<&Key> {
        let presented = authorization
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)?;
        let d = digest(presented);
        let mut found: Option<&Key> = None;
        for k in &self.keys {
            // Every key is compared, whatever matched before.
            let eq: bool = k.digest.ct_eq(&d).into();
            if eq && found.is_none() {
                found = Some(k);
            }
        }
        found
    }

    /// Whether any key may administer the cluster.
    pub fn has_admin(&self) -> bool {
        self.keys.iter().any(|k| k.role == Role::Admin)
    }

    /// Takes one request from `name`'s bucket, or says how many seconds until one is there.
    fn take(&self, name: &str, rpm: f64, now: Instant) -> Result<(), f64> {
        let mut buckets = match self.buckets.lock() {
            Ok(b) => b,
            Err(poisoned) => poisoned.into_inner(),
        };
        let b = buckets.entry(name.to_string()).or_insert(Bucket {
            tokens: rpm,
            at: now,
        });
        let refill = now.duration_since(b.at).as_secs_f64() * rpm / 60.0;
        b.tokens = (b.tokens + refill).min(rpm.max(1.0));
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err((1.0 - b.tokens) * 60.0 / rpm)
        }
    }
}

/// Who sent a request, as the key check named them: a request extension set by the server's
/// key check (or a cluster node's, for the requests it runs or forwards), never by a header a
/// client could write. The API server partitions its prefix cache by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The grant of an allowed verdict, as (name, role).
    fn allowed(v: Verdict) -> (String, Role) {
        match v {
            Verdict::Allowed(g, _) => (g.name, g.role),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn parses_names_limits_and_comments() {
        let k = Keys::parse(
            "# team keys\nsk-alpha-123456 name=alice rpm=2 max_concurrent=3\n\nsk-bravo-123456\n",
            None,
        )
        .unwrap();
        assert_eq!(k.len(), 2);
        let client = |name: &str| (name.to_string(), Role::Client);
        assert_eq!(
            allowed(k.check(Some("Bearer sk-bravo-123456"))),
            client("key-4")
        );
        assert_eq!(
            allowed(k.check(Some("Bearer sk-alpha-123456"))),
            client("alice")
        );
        assert!(!k.has_admin());
    }

    #[test]
    fn keys_are_clients_unless_they_say_admin() {
        let k = Keys::parse(
            "sk-admin-123456 name=ops role=admin\nsk-app-1234567 name=app role=client rpm=100\n",
            None,
        )
        .unwrap();
        assert!(k.has_admin());
        let ops = ("ops".to_string(), Role::Admin);
        assert_eq!(allowed(k.check(Some("Bearer sk-admin-123456"))), ops);
        let app = ("app".to_string(), Role::Client);
        assert_eq!(allowed(k.check(Some("Bearer sk-app-1234567"))), app);
        assert!(Keys::parse("sk-alpha-123456 role=root", None).is_err());
    }

    #[test]
    fn refuses_missing_wrong_and_malformed_keys() {
        let k = Keys::parse("sk-alpha-123456", None).unwrap();
        let unknown = |v: Verdict| matches!(v, Verdict::Unknown);
        assert!(unknown(k.check(None)));
        assert!(unknown(k.check(Some("sk-alpha-123456"))));
        assert!(unknown(k.check(Some("Bearer sk-alpha-12345"))));
        assert!(unknown(k.check(Some("Bearer "))));
        assert!(k.grant(Some("Bearer sk-alpha-12345")).is_none());
        assert!(Keys::parse("short", None).is_err());
        assert!(Keys::parse("sk-alpha-123456 rpm=-1", None).is_err());
        assert!(Keys::parse("sk-alpha-123456 colour=red", None).is_err());
        for bad in ["0", "-1", "1.5", "many", ""] {
            let e = Keys::parse(&format!("sk-alpha-123456 max_concurrent={bad}"), None);
            assert!(
                e.unwrap_err().to_string().contains("max_concurrent"),
                "{bad}"
            );
        }
    }

    #[test]
    fn token_bucket_limits_and_refills() {
        let k = Keys::parse("sk-alpha-123456 rpm=60", None).unwrap();
        let t0 = Instant::now();
        for _ in 0..60 {
            assert!(k.take("key-1", 60.0, t0).is_ok());
        }
        match k.take("key-1", 60.0, t0) {
            Err(s) => assert!(s > 0.0 && s <= 1.0, "{s}"),
            v => panic!("{v:?}"),
        }
        // One second later, one request's worth has refilled.
        let t1 = t0 + std::time::Duration::from_millis(1001);
        assert!(k.take("key-1", 60.0, t1).is_ok());
        assert!(k.take("key-1", 60.0, t1).is_err());
    }

    #[test]
    fn a_key_at_its_concurrency_limit_is_busy_while_others_are_served() {
        let k = Keys::parse(
            "sk-alpha-123456 name=alice max_concurrent=2 rpm=3\nsk-bravo-123456 name=bob\n\
             sk-alpha-654321 name=alice\n",
            None,
        )
        .unwrap()
        .with_max_concurrent(Some(1));
        let alice = Some("Bearer sk-alpha-123456");
        let (a1, a2) = (k.check(alice), k.check(alice));
        assert!(matches!(a1, Verdict::Allowed(..)) && matches!(a2, Verdict::Allowed(..)));
        // A third in flight is refused, and costs nothing from the key's rate.
        assert!(matches!(k.check(alice), Verdict::Busy(2)));
        // Another key is served at once; the server's default (1) applies to it.
        let b1 = k.check(Some("Bearer sk-bravo-123456"));
        assert!(matches!(b1, Verdict::Allowed(..)));
        assert!(matches!(
            k.check(Some("Bearer sk-bravo-123456")),
            Verdict::Busy(1)
        ));
        // A second line with the same name shares its count.
        assert!(matches!(
            k.check(Some("Bearer sk-alpha-654321")),
            Verdict::Busy(1)
        ));
        // A finished request frees its place; the rate still counts the ones let through.
        drop(a1);
        assert!(matches!(k.check(alice), Verdict::Allowed(..)));
        drop(a2);
        assert!(matches!(k.check(alice), Verdict::Limited(_)));
        drop(b1);
        assert!(matches!(
            k.check(Some("Bearer sk-bravo-123456")),
            Verdict::Allowed(..)
        ));
    }

    async fn next_frame(body: &mut Body) -> Option<Result<Frame<Bytes>, axum::Error>> {
        std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut *body), cx)).await
    }

    #[tokio::test]
    async fn a_streamed_answer_holds_its_slot_until_its_body_ends() {
        // Once, a slot taken around the handler was free again when the handler returned its
        // stream, so a key with max_concurrent=1 could hold any number of streams open.
        let k = Keys::parse("sk-alpha-123456 max_concurrent=1", None).unwrap();
        let key = Some("Bearer sk-alpha-123456");
        let Verdict::Allowed(_, slot) = k.check(key) else {
            panic!("the first request is refused")
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let stream = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut body = slot.hold(Response::new(stream)).into_body();
        tx.send(Ok(Bytes::from("a"))).await.unwrap();
        assert!(next_frame(&mut body).await.is_some());
        assert!(matches!(k.check(key), Verdict::Busy(1)), "freed mid-stream");
        drop(tx);
        assert!(next_frame(&mut body).await.is_none());
        assert!(
            matches!(k.check(key), Verdict::Allowed(..)),
            "held after the end"
        );

        // A client that goes away drops the body: the slot comes back too.
        let Verdict::Allowed(_, slot) = k.check(key) else {
            panic!("refused")
        };
        let body = slot.hold(Response::new(Body::from("x"))).into_body();
        assert!(matches!(k.check(key), Verdict::Busy(1)));
        drop(body);
        assert!(matches!(k.check(key), Verdict::Allowed(..)));
    }
}
