//! The connection server behind every strata HTTP surface (`strata serve` and `strata node`).
//!
//! `axum::serve` has no header deadline and no connection cap, so a client that opens
//! connections and sends a header byte now and then holds a descriptor each, forever, until the
//! process runs out and `/health` stops answering. This server runs hyper's HTTP/1.1 with:
//! - a header deadline, counted from the connection's start and again from each response (so it
//!   is the idle keep-alive timeout too): a slow or silent client is dropped;
//! - a body deadline, counted from the headers: a body trickled in byte by byte fails the request;
//! - a cap on open connections (by default half the descriptor limit): one over it is answered
//!   `503` with `Retry-After` and closed, with a log line, and the server keeps answering;
//! - a shutdown that stops accepting, lets requests in flight finish for a bounded time, then
//!   closes whatever is left, so a half-sent request cannot keep the process alive.
//!
//! [`crate::browser`] checks sit in front of every route here, so both surfaces get them, and
//! [`crate::access`] logs and observes every request, those checks' refusals included.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::browser::{self, BrowserPolicy};

/// How long clients may take, and how many may be connected.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A request's headers must arrive within this time of the connection's start or of the
    /// previous response; it is also how long an idle keep-alive connection stays open.
    pub header_timeout: Duration,
    /// A request's whole body must arrive within this time of its headers.
    pub body_timeout: Duration,
    /// Most connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// After the shutdown signal, how long requests in flight may still take.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: default_max_connections(),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Everything an HTTP surface is configured with besides its routes.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Which hosts and origins browsers may reach it from.
    pub browser: BrowserPolicy,
    /// Deadlines and the connection cap.
    pub limits: Limits,
    /// The access log and the request observers.
    pub access: crate::access::AccessOptions,
}

/// Half the process's soft descriptor limit (at least 16, at most 4096): the other half stays
/// for model files, the control plane's sockets and the data plane's links, so a flood of HTTP
/// connections cannot starve them.
pub fn default_max_connections() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer to a local.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    let soft = if ok { lim.rlim_cur } else { 1024 };
    usize::try_from(soft / 2).unwrap_or(4096).clamp(16, 4096)
}

/// Serves `router` (behind the [`crate::browser`] checks) on `listener` until `shutdown`
/// resolves, then waits at most `limits.shutdown_grace` for the requests in flight.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    opts: &HttpOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let limits = opts.limits.clone();
    let body_timeout = limits.body_timeout;
    let app = browser::protect(router, &opts.browser)
        .layer(middleware::from_fn(crate::in_dialect))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            body_deadline(body_timeout, req, next)
        }))
        .layer(middleware::from_fn_with_state(
            Arc::new(opts.access.clone()),
            crate::access::log_requests,
        ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let refusals = Arc::new(RefusalLog::default());
    let accept_errors = RefusalLog::default();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before accept: keep
                    // serving; pause a moment so a full descriptor table is not spun on.
                    if accept_errors.should_log() {
                        tracing::warn!("accepting an HTTP connection failed: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            if refusals.should_log() {
                tracing::warn!(
                    "{} HTTP connections are open, the most allowed (--max-connections); \
                     refusing new ones with 503 until some close",
                    limits.max_connections
                );
            }
            tokio::spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection's errors (a client gone, a header deadline passed) are the
            // client's business; the server goes on.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    let open = limits.max_connections.max(1) - permits.available_permits();
    if open > 0 {
        tracing::info!(
            "waiting up to {} s for {open} open connection(s) to finish",
            limits.shutdown_grace.as_secs_f64()
        );
    }
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        let left = limits.max_connections.max(1) - permits.available_permits();
        tracing::warn!("closing {left} connection(s) still open after the shutdown grace");
    }
    Ok(())
}

/// Logs at most once a second, so a flood of refusals does not flood the log.
#[derive(Debug, Default)]
struct RefusalLog {
    last_ms: AtomicU64,
}

impl RefusalLog {
    fn should_log(&self) -> bool {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let now = START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1000;
        let last = self.last_ms.load(Ordering::Relaxed);
        now >= last + 1000
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// The answer to a connection over the cap.
fn over_capacity() -> Vec<u8> {
    let body = r#"{"error":{"message":"the server has too many open connections; retry shortly","type":"server_error","code":"too_many_connections"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers a connection over the cap with 503 and closes it. What the client already sent is
/// read first (briefly), so closing does not reset the connection before it sees the answer.
async fn refuse(mut stream: TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(100), stream.readable()).await;
    let _ = stream.try_read(&mut buf);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(&over_capacity()).await?;
        stream.shutdown().await
    })
    .await;
}

/// Gives the request's body a deadline counted from now (its headers are in).
async fn body_deadline(limit: Duration, req: Request, next: Next) -> Response {
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    next.run(req.map(|b| Body::new(DeadlineBody::new(b, limit))))
        .await
}

/// A request body that fails once its deadline passes before its end.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl DeadlineBody {
    fn new(inner: Body, limit: Duration) -> DeadlineBody {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
        }
    }
}

/// A body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0} s")]
struct BodyTimedOut(u64);

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            let secs = self.limit.as_secs();
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(secs)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use axum::routing::{get, post};
    use std::io::{Read, Write};

    /// A server with tight limits on a loopback port; the sender stops it.
    fn start(
        limits: Limits,
        browser: BrowserPolicy,
    ) -> (
        std::net::SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<Duration>,
    ) {
        let router = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/echo", post(|b: Bytes| async move { b }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let opts = HttpOptions {
                    browser,
                    limits,
                    ..HttpOptions::default()
                };
                let mut stopped_at = None;
                let shutdown = async {
                    let _ = rx.await;
                    stopped_at = Some(Instant::now());
                };
                serve(listener, router, &opts, shutdown).await.unwrap();
                stopped_at.map_or(Duration::ZERO, |t| t.elapsed())
            })
        });
        (addr_rx.recv().unwrap(), tx, handle)
    }

    fn limits(max_connections: usize) -> Limits {
        Limits {
            header_timeout: Duration::from_millis(600),
            body_timeout: Duration::from_millis(600),
            max_connections,
            shutdown_grace: Duration::from_millis(300),
        }
    }

    /// Sends `req` and reads until the server closes (or 5 s pass): the whole answer.
    fn exchange(addr: std::net::SocketAddr, req: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    fn get_health(addr: std::net::SocketAddr) -> String {
        exchange(
            addr,
            b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        )
    }

    /// Whether the server closed `s` within `within`.
    fn closed_within(s: &mut std::net::TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    #[test]
    fn slow_clients_are_dropped_and_a_full_server_says_503_and_recovers() {
        let (addr, stop, handle) = start(limits(4), BrowserPolicy::default());
        // Four clients trickle a request's headers one byte at a time (slowloris), filling the cap.
        let mut slow: Vec<std::net::TcpStream> = (0..4)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /health HTTP/1.1\r\nX-").unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        // A fifth is told the server is full, at once, instead of waiting in the backlog.
        let t = Instant::now();
        let full = get_health(addr);
        assert!(full.starts_with("HTTP/1.1 503"), "{full}");
        assert!(full.contains("retry-after: 1"), "{full}");
        assert!(full.contains("too_many_connections"), "{full}");
        assert!(t.elapsed() < Duration::from_secs(2));
        // The trickle does not keep them: each is closed by the header deadline.
        for _ in 0..3 {
            for s in &mut slow {
                let _ = s.write_all(b"a");
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        for s in &mut slow {
            assert!(closed_within(s, Duration::from_secs(3)));
        }
        let ok = get_health(addr);
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        stop.send(()).unwrap();
        handle.join().unwrap();
    }

    #[test]
    fn an_idle_keep_alive_connection_is_closed_by_the_header_deadline() {
        let (addr, stop, handle) = start(limits(8), BrowserPolicy::default());
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let t = Instant::now();
        assert!(closed_within(&mut s, Duration::from_secs(5)));
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        stop.send(()).unwrap();
        handle.join().unwrap();
    }

    #[test]
    fn a_trickled_body_fails_the_request_at_its_deadline() {
        let (addr, stop, handle) = start(limits(8), BrowserPolicy::default());
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(
            b"POST /echo HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"a\":",
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        let t = Instant::now();
        let mut buf = [0u8; 1024];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(text.contains("did not arrive within"), "{text}");
        assert!(t.elapsed() < Duration::from_secs(3));
        // A whole body within the deadline is served.
        let ok = exchange(
            addr,
            b"POST /echo HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
              content-length: 2\r\nconnection: close\r\n\r\n{}",
        );
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("{}"), "{ok}");
        stop.send(()).unwrap();
        handle.join().unwrap();
    }

    #[test]
    fn shutdown_does_not_wait_on_a_half_sent_request_past_its_grace() {
        let lim = Limits {
            header_timeout: Duration::from_secs(60),
            ..limits(8)
        };
        let (addr, stop, handle) = start(lim, BrowserPolicy::default());
        let mut half = std::net::TcpStream::connect(addr).unwrap();
        half.write_all(b"POST /echo HTTP/1.1\r\nhost: loc").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        stop.send(()).unwrap();
        let took = handle.join().unwrap();
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(closed_within(&mut half, Duration::from_secs(2)));
    }

    #[test]
    fn browser_checks_and_cors_run_in_front_of_the_routes() {
        let policy = BrowserPolicy {
            allow_hosts: vec![],
            cors_origins: vec!["http://localhost:5173".into()],
        };
        let (addr, stop, handle) = start(limits(8), policy);
        let rebound = exchange(
            addr,
            b"GET /health HTTP/1.1\r\nhost: evil.example:8000\r\nconnection: close\r\n\r\n",
        );
        assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");
        assert!(rebound.contains("--allow-host evil.example"), "{rebound}");
        let form = exchange(
            addr,
            b"POST /echo HTTP/1.1\r\nhost: 127.0.0.1\r\norigin: http://evil.example\r\n\
              content-type: text/plain\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        );
        assert!(form.starts_with("HTTP/1.1 403"), "{form}");
        let preflight = exchange(
            addr,
            b"OPTIONS /echo HTTP/1.1\r\nhost: 127.0.0.1\r\norigin: http://localhost:5173\r\n\
              access-control-request-method: POST\r\n\
              access-control-request-headers: authorization, content-type\r\n\
              connection: close\r\n\r\n",
        )
        .to_ascii_lowercase();
        assert!(
            preflight.contains("access-control-allow-origin: http://localhost:5173"),
            "{preflight}"
        );
        let listed = exchange(
            addr,
            b"POST /echo HTTP/1.1\r\nhost: 127.0.0.1:1\r\norigin: http://localhost:5173\r\n\
              content-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        )
        .to_ascii_lowercase();
        assert!(listed.starts_with("http/1.1 200"), "{listed}");
        assert!(
            listed.contains("access-control-allow-origin: http://localhost:5173"),
            "{listed}"
        );
        let other = exchange(
            addr,
            b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\norigin: http://evil.example\r\n\
              connection: close\r\n\r\n",
        )
        .to_ascii_lowercase();
        assert!(!other.contains("access-control-allow-origin"), "{other}");
        stop.send(()).unwrap();
        handle.join().unwrap();
    }
}
