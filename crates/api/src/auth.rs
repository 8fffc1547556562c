//! API keys and per-key rate limits.
//!
//! The key file has one key per line, optionally followed by `name=NAME` and `rpm=N`
//! (requests per minute for that key); blank lines and `#` comments are skipped. Keys are
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
}

/// One accepted key.
#[derive(Debug, Clone)]
struct Key {
    digest: [u8; 32],
    name: String,
    rpm: Option<f64>,
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
    /// The key is valid; requests are counted under this name.
    Allowed(String),
    /// No key, or an unknown one.
    Unknown,
    /// A valid key over its rate; retry after this many seconds.
    Limited(f64),
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Keys {
    /// Reads a key file; `default_rpm` applies to keys without their own `rpm=`.
    pub fn from_file(path: &Path, default_rpm: Option<f64>) -> Result<Keys, KeyFileError> {
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
                    _ => {
                        return Err(err(format!(
                            "unexpected `{p}` (expected name=NAME or rpm=N)"
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

    /// Checks an `Authorization` header value and, for a valid key, takes one request from its
    /// bucket.
    pub fn check(&self, authorization: Option<&str>) -> Verdict {
        let Some(presented) = authorization
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
        else {
            return Verdict::Unknown;
        };
        let d = digest(presented);
        let mut found: Option<&Key> = None;
        for k in &self.keys {
            // Every key is compared, whatever matched before.
            let eq: bool = k.digest.ct_eq(&d).into();
            if eq && found.is_none() {
                found = Some(k);
            }
        }
        let Some(key) = found else {
            return Verdict::Unknown;
        };
        match key.rpm.or(self.default_rpm) {
            None => Verdict::Allowed(key.name.clone()),
            Some(rpm) => self.take(&key.name, rpm, Instant::now()),
        }
    }

    fn take(&self, name: &str, rpm: f64, now: Instant) -> Verdict {
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
            Verdict::Allowed(name.to_string())
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
        assert_eq!(
            k.check(Some("Bearer sk-bravo-123456")),
            Verdict::Allowed("key-4".into())
        );
        assert_eq!(
            k.check(Some("Bearer sk-alpha-123456")),
            Verdict::Allowed("alice".into())
        );
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
        let t0 = Instant::now();
        for _ in 0..60 {
            assert!(matches!(k.take("key-1", 60.0, t0), Verdict::Allowed(_)));
        }
        match k.take("key-1", 60.0, t0) {
            Verdict::Limited(s) => assert!(s > 0.0 && s <= 1.0, "{s}"),
            v => panic!("{v:?}"),
        }
        // One second later, one request's worth has refilled.
        let t1 = t0 + std::time::Duration::from_millis(1001);
        assert!(matches!(k.take("key-1", 60.0, t1), Verdict::Allowed(_)));
        assert!(matches!(k.take("key-1", 60.0, t1), Verdict::Limited(_)));
    }
}
