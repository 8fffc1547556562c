//! The CDN: LFS bytes behind signed URLs, in byte ranges, with the faults a test asks for.

use crate::repo::{RepoFile, hex};
use crate::server::{fault, hub_error};
use crate::{Kind, State};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, State as Extract};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::get;
use sha2::Digest as _;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};

/// How long a signed URL lasts.
const URL_LIFETIME: Duration = Duration::from_secs(3600);
/// Bytes per body chunk.
const CHUNK: usize = 256 << 10;

pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/blob/{sha256}", get(blob))
        .with_state(state)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn signature(state: &State, sha256: &str, expires: u64, file: &str) -> String {
    let mut h = sha2::Sha256::new();
    h.update(state.secret().to_le_bytes());
    h.update(format!("{sha256}\n{expires}\n{file}").as_bytes());
    hex(&h.finalize())
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A CDN URL for `file` that works until it expires or the hub's secret changes.
pub(crate) fn signed_url(state: &State, file: &RepoFile) -> String {
    let expires = now() + URL_LIFETIME.as_secs();
    let sig = signature(state, &file.sha256, expires, &file.path);
    format!(
        "{}/blob/{}?file={}&expires={expires}&signature={sig}",
        state.cdn_url,
        file.sha256,
        encode(&file.path)
    )
}

async fn blob(
    Extract(state): Extract<Arc<State>>,
    Path(sha256): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    if headers.contains_key(header::AUTHORIZATION) {
        state.saw_authorization();
    }
    if let Some(r) = fault(&state, Kind::Cdn) {
        return r;
    }
    let file = q.get("file").map(String::as_str).unwrap_or_default();
    let expires: u64 = q.get("expires").and_then(|e| e.parse().ok()).unwrap_or(0);
    let sig = q.get("signature").map(String::as_str).unwrap_or_default();
    if expires < now() || sig != signature(&state, &sha256, expires, file) {
        return hub_error(
            403,
            None,
            "Request has expired or its signature does not match",
        );
    }
    let Some(f) = state.blob(&sha256) else {
        return hub_error(404, None, "NoSuchKey");
    };
    let mut resp = serve(
        &state,
        &f,
        method == Method::HEAD,
        headers.get(header::RANGE),
        Some(peer.ip()),
    )
    .await;
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", f.sha256)) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp
}

/// The one range `bytes=a-b`, `bytes=a-` or `bytes=-n` of a `size`-byte file names, as a
/// half-open interval; `Err` for a range the file cannot satisfy.
fn range(value: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    let (a, b) = spec.split_once('-').ok_or(())?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().map_err(|_| ())?;
            (size.saturating_sub(n), size)
        }
        (a, "") => (a.parse().map_err(|_| ())?, size),
        (a, b) => {
            let a: u64 = a.parse().map_err(|_| ())?;
            let b: u64 = b.parse().map_err(|_| ())?;
            (a, b.saturating_add(1).min(size))
        }
    };
    if start >= end {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// Ends the CDN's count of a stream when its body is dropped, however it ends.
struct StreamGuard(Arc<State>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.stream_ended();
    }
}

struct FileBody {
    file: tokio::fs::File,
    pos: u64,
    end: u64,
    sent: u64,
    cut: Option<u64>,
    corrupt: bool,
    rate: u64,
    started: Instant,
    peer: Option<(IpAddr, Arc<State>, StreamGuard)>,
    path: String,
}

impl FileBody {
    async fn next(mut self) -> Option<(std::io::Result<Bytes>, FileBody)> {
        if self.pos >= self.end {
            return None;
        }
        if self.cut.is_some_and(|c| self.sent >= c) {
            // Let the bytes before the cut reach the client, as they do when a link drops.
            tokio::time::sleep(Duration::from_millis(30)).await;
            self.end = self.pos;
            let cut = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "cut");
            return Some((Err(cut), self));
        }
        let mut n = (self.end - self.pos).min(CHUNK as u64);
        if let Some(c) = self.cut {
            n = n.min(c - self.sent).max(1);
        }
        if self.rate > 0 {
            n = n.min((self.rate / 20).max(1));
            let due = Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        let mut buf = vec![0u8; n as usize];
        if let Err(e) = self.file.read_exact(&mut buf).await {
            self.end = self.pos;
            return Some((Err(e), self));
        }
        if self.corrupt && self.sent == 0 {
            buf[0] ^= 0xff;
        }
        self.pos += n;
        self.sent += n;
        if let Some((ip, state, _)) = &self.peer {
            state.sent(*ip, &self.path, n);
        }
        Some((Ok(Bytes::from(buf)), self))
    }
}

/// `file`'s bytes (the range asked for, if any); `cdn` names the client when the CDN
/// serves them, so they are counted and get the faults due.
pub(crate) async fn serve(
    state: &Arc<State>,
    file: &RepoFile,
    head: bool,
    range_header: Option<&HeaderValue>,
    cdn: Option<IpAddr>,
) -> Response {
    let size = file.size;
    let asked = match range_header.and_then(|v| v.to_str().ok()) {
        Some(v) => match range(v, size) {
            Ok(r) => r,
            Err(()) => {
                let mut r = hub_error(416, None, "Requested range not satisfiable");
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    r.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return r;
            }
        },
        None => None,
    };
    let (start, end) = asked.unwrap_or((0, size));
    let mut builder = Response::builder()
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_LENGTH, end - start)
        .header(header::CONTENT_TYPE, "application/octet-stream");
    builder = match asked {
        Some(_) => builder.status(StatusCode::PARTIAL_CONTENT).header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", end.saturating_sub(1)),
        ),
        None => builder.status(StatusCode::OK),
    };
    if head || start == end {
        return builder
            .body(Body::empty())
            .unwrap_or_else(|e| hub_error(500, None, &e.to_string()));
    }
    let mut f = match tokio::fs::File::open(&file.disk).await {
        Ok(f) => f,
        Err(e) => return hub_error(500, None, &e.to_string()),
    };
    if let Err(e) = f.seek(std::io::SeekFrom::Start(start)).await {
        return hub_error(500, None, &e.to_string());
    }
    let (cut, corrupt) = match cdn {
        Some(_) => state.take_body_faults(),
        None => (None, false),
    };
    let peer = cdn.map(|ip| {
        state.stream_started();
        (ip, state.clone(), StreamGuard(state.clone()))
    });
    let body = FileBody {
        file: f,
        pos: start,
        end,
        sent: 0,
        cut,
        corrupt,
        rate: if cdn.is_some() {
            state.stream_rate()
        } else {
            0
        },
        started: Instant::now(),
        peer,
        path: file.path.clone(),
    };
    let stream = futures_util::stream::unfold(body, FileBody::next);
    builder
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| hub_error(500, None, &e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::range;

    #[test]
    fn ranges_are_read_as_http_says() {
        assert_eq!(range("bytes=0-9", 100), Ok(Some((0, 10))));
        assert_eq!(range("bytes=90-", 100), Ok(Some((90, 100))));
        assert_eq!(range("bytes=-5", 100), Ok(Some((95, 100))));
        assert_eq!(range("bytes=95-200", 100), Ok(Some((95, 100))));
        assert_eq!(range("bytes=100-", 100), Err(()));
        assert_eq!(range("bytes=x-", 100), Err(()));
        assert_eq!(range("items=1-2", 100), Ok(None));
    }
}
