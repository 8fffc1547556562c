//! API keys and per-key rate limits.
//!
//! The key file has one key per line, optionally followed by `name=NAME`, `rpm=N` (requests per
//! minute for that key) and `role=admin` or `role=client`; blank lines and `#` comments are
//! skipped. A key is a client key unless it says `role=admin`: client keys may run inference and
//! read the cluster's state, only admin keys may change it (load, unload, drain, stop), so a key
//! handed to an application cannot take the cluster down. Keys are
//! compared through their SHA-256 digests with a constant-time equality over every listed key,
//! so neither the match nor its position leaks through timing. Keys are never logged: a key is
//! known to the rest of the server only by its name (or `key-N`, its line number).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

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
    role: Role,
}

/// The accepted keys and their rate limits.
#[derive(Debug)]
pub struct Keys {
    keys: Vec<Key>,
    default_rpm: Option<f64>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// A token bucket holding up to one minute's worth of requests.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What an authorisation check decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The key is valid; requests are counted under its name.
    Allowed(Grant),
    /// No key, or an unknown one.
    Unknown,
    /// A valid key over its rate; retry after this many seconds.
    Limited(f64),
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
                role: Role::Client,
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
                    Some(("role", "admin")) => key.role = Role::Admin,
                    Some(("role", "client")) => key.role = Role::Client,
                    Some(("role", r)) => {
                        return Err(err(format!("role must be admin or client, got `{r}`")));
                    }
                    _ => {
                        return Err(err(format!(
                            "unexpected `{p}` (expected name=NAME, rpm=N or role=admin|client)"
                        )));
                    }
                }
            }
            keys.push(key);
        }
        Ok(Keys {
            keys,
            default_rpm,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks an `Authorization` header value (see [`presented`]) and, for a valid key, takes one
    /// request from its bucket.
    pub fn check(&self, authorization: Option<&str>) -> Verdict {
        let Some(key) = self.find(authorization) else {
            return Verdict::Unknown;
        };
        let grant = Grant {
            name: key.name.clone(),
            role: key.role,
        };
        match key.rpm.or(self.default_rpm) {
            None => Verdict::Allowed(grant),
            Some(rpm) => self.take(grant, rpm, Instant::now()),
        }
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

    fn take(&self, grant: Grant, rpm: f64, now: Instant) -> Verdict {
        let name = grant.name.as_str();
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
            Verdict::Allowed(grant)
        } else {
            Verdict::Limited((1.0 - b.tokens) * 60.0 / rpm)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_names_limits_and_comments() {
        let k = Keys::parse(
            "# team keys\nsk-alpha-123456 name=alice rpm=2\n\nsk-bravo-123456\n",
            None,
        )
        .unwrap();
        assert_eq!(k.len(), 2);
        let client = |name: &str| {
            Verdict::Allowed(Grant {
                name: name.into(),
                role: Role::Client,
            })
        };
        assert_eq!(k.check(Some("Bearer sk-bravo-123456")), client("key-4"));
        assert_eq!(k.check(Some("Bearer sk-alpha-123456")), client("alice"));
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
        match k.check(Some("Bearer sk-admin-123456")) {
            Verdict::Allowed(g) => assert_eq!((g.name.as_str(), g.role), ("ops", Role::Admin)),
            v => panic!("{v:?}"),
        }
        match k.check(Some("Bearer sk-app-1234567")) {
            Verdict::Allowed(g) => assert_eq!((g.name.as_str(), g.role), ("app", Role::Client)),
            v => panic!("{v:?}"),
        }
        assert!(Keys::parse("sk-alpha-123456 role=root", None).is_err());
    }

    #[test]
    fn refuses_missing_wrong_and_malformed_keys() {
        let k = Keys::parse("sk-alpha-123456", None).unwrap();
        assert_eq!(k.check(None), Verdict::Unknown);
        assert_eq!(k.check(Some("sk-alpha-123456")), Verdict::Unknown);
        assert_eq!(k.check(Some("Bearer sk-alpha-12345")), Verdict::Unknown);
        assert_eq!(k.check(Some("Bearer ")), Verdict::Unknown);
        assert!(Keys::parse("short", None).is_err());
        assert!(Keys::parse("sk-alpha-123456 rpm=-1", None).is_err());
        assert!(Keys::parse("sk-alpha-123456 colour=red", None).is_err());
    }

    #[test]
    fn token_bucket_limits_and_refills() {
        let k = Keys::parse("sk-alpha-123456 rpm=60", None).unwrap();
        let g = || Grant {
            name: "key-1".into(),
            role: Role::Client,
        };
        let t0 = Instant::now();
        for _ in 0..60 {
            assert!(matches!(k.take(g(), 60.0, t0), Verdict::Allowed(_)));
        }
        match k.take(g(), 60.0, t0) {
            Verdict::Limited(s) => assert!(s > 0.0 && s <= 1.0, "{s}"),
            v => panic!("{v:?}"),
        }
        // One second later, one request's worth has refilled.
        let t1 = t0 + std::time::Duration::from_millis(1001);
        assert!(matches!(k.take(g(), 60.0, t1), Verdict::Allowed(_)));
        assert!(matches!(k.take(g(), 60.0, t1), Verdict::Limited(_)));
    }
}
