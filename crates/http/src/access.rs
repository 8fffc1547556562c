//! The access log: one line per request at `info` (target `strata::access`), written when its
//! answer has been sent (a stream's at its end), and the observers that count requests for the
//! metrics. It wraps every other check of [`crate::listen`], so requests refused before any
//! route (a foreign `Host`, a body that is not JSON, a body too slow) are logged and counted
//! too.
//!
//! Routes add what only they know through the [`Usage`] in the request's extensions: the
//! model that answered, the key's name (never the key), prompt and output tokens and the time
//! to the first token.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

/// What a route tells the access log about a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fields {
    /// The model that answered.
    pub model: Option<String>,
    /// The name of the key the request came with.
    pub key: Option<String>,
    /// Prompt and output tokens of a generating request.
    pub tokens: Option<(usize, usize)>,
    /// From the request's arrival to its first generated token.
    pub ttft: Option<Duration>,
}

/// The handle a route fills in (found in the request's extensions).
#[derive(Debug, Clone, Default)]
pub struct Usage(Arc<Mutex<Fields>>);

impl Usage {
    /// Changes the fields.
    pub fn update(&self, f: impl FnOnce(&mut Fields)) {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    fn get(&self) -> Fields {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A request once answered, as observers see it.
#[derive(Debug)]
pub struct Record<'a> {
    /// The method.
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The answer's status.
    pub status: u16,
    /// From the request's arrival to its answer's last byte (or the client leaving).
    pub total: Duration,
    /// What the route added.
    pub fields: &'a Fields,
}

/// Called once for every request answered.
pub type Observer = Arc<dyn Fn(&Record<'_>) + Send + Sync>;

/// How requests are logged and who else sees them.
#[derive(Clone, Default)]
pub struct AccessOptions {
    /// No access lines (`--quiet`); observers still see every request.
    pub quiet: bool,
    /// Called for every request (the metrics count through one).
    pub observers: Vec<Observer>,
}

impl fmt::Debug for AccessOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessOptions")
            .field("quiet", &self.quiet)
            .field("observers", &self.observers.len())
            .finish()
    }
}

/// The middleware: puts a [`Usage`] in the request and reports the request once its answer's
/// body is done with.
pub(crate) async fn log_requests(
    State(opts): State<Arc<AccessOptions>>,
    req: Request,
    next: Next,
) -> Response {
    // A request whose client leaves before the answer is ready is reported as nginx does it:
    // 499, client closed the request.
    let mut done = Done {
        opts,
        arrived: Instant::now(),
        method: req.method().as_str().to_string(),
        path: req.uri().path().to_string(),
        status: 499,
        usage: Usage::default(),
    };
    let mut req = req;
    req.extensions_mut().insert(done.usage.clone());
    let resp = next.run(req).await;
    done.status = resp.status().as_u16();
    resp.map(|inner| Body::new(Reported { inner, _done: done }))
}

/// Reports the request when dropped: after the body's last frame, or when the client left.
struct Done {
    opts: Arc<AccessOptions>,
    arrived: Instant,
    method: String,
    path: String,
    status: u16,
    usage: Usage,
}

impl Drop for Done {
    fn drop(&mut self) {
        let fields = self.usage.get();
        let record = Record {
            method: &self.method,
            path: &self.path,
            status: self.status,
            total: self.arrived.elapsed(),
            fields: &fields,
        };
        for o in &self.opts.observers {
            o(&record);
        }
        if !self.opts.quiet {
            log(&record);
        }
    }
}

/// The access line: the request, then what the route added, as fields a JSON log keeps typed
/// (token counts and the time to the first token only where the route generated).
fn log(r: &Record<'_>) {
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    let f = r.fields;
    tracing::info!(
        target: "strata::access",
        method = r.method,
        route = r.path,
        status = r.status,
        model = f.model.as_deref().unwrap_or("-"),
        key = f.key.as_deref().unwrap_or("-"),
        prompt_tokens = f.tokens.map(|t| t.0),
        output_tokens = f.tokens.map(|t| t.1),
        ttft_ms = f.ttft.map(ms),
        total_ms = ms(r.total),
        "request"
    );
}

/// A response body that carries its request's report until it is dropped.
struct Reported {
    inner: Body,
    _done: Done,
}

impl HttpBody for Reported {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
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
    use axum::Router;
    use axum::extract::Extension;
    use axum::http::StatusCode;
    use axum::routing::get;
    use tower::ServiceExt as _;

    type Seen = Arc<Mutex<Vec<(String, u16, Fields)>>>;

    fn app(seen: &Seen) -> Router {
        let seen = Arc::clone(seen);
        let opts = AccessOptions {
            quiet: true,
            observers: vec![Arc::new(move |r: &Record<'_>| {
                seen.lock()
                    .unwrap()
                    .push((r.path.to_string(), r.status, r.fields.clone()))
            })],
        };
        Router::new()
            .route(
                "/gen",
                get(|Extension(u): Extension<Usage>| async move {
                    u.update(|f| {
                        f.model = Some("m".into());
                        f.tokens = Some((3, 2));
                    });
                    "text"
                }),
            )
            .route("/teapot", get(|| async { StatusCode::IM_A_TEAPOT }))
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(opts),
                log_requests,
            ))
    }

    fn get_req(path: &str) -> Request {
        Request::builder().uri(path).body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn every_request_is_reported_once_its_body_is_done() {
        let seen: Seen = Arc::default();
        let resp = app(&seen).oneshot(get_req("/gen")).await.unwrap();
        // Not before the answer's body is done with.
        assert!(seen.lock().unwrap().is_empty());
        let mut body = resp.into_body();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frame.unwrap();
        }
        drop(body);
        drop(app(&seen).oneshot(get_req("/teapot")).await.unwrap());
        drop(app(&seen).oneshot(get_req("/nowhere")).await.unwrap());
        let seen = seen.lock().unwrap();
        let want_gen = Fields {
            model: Some("m".into()),
            tokens: Some((3, 2)),
            ..Fields::default()
        };
        assert_eq!(
            *seen,
            [
                ("/gen".to_string(), 200, want_gen),
                ("/teapot".to_string(), 418, Fields::default()),
                ("/nowhere".to_string(), 404, Fields::default()),
            ]
        );
    }
}
