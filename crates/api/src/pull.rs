//! Ollama's `POST /api/pull` through strata's own model store: a catalog model is fetched (and
//! its SHA-256 checked) exactly as `strata models pull` does, its progress reported as Ollama's
//! NDJSON lines (`pulling manifest`, `pulling sha256:...` with `total` and `completed`,
//! `verifying sha256 digest`, `success`), so Ollama clients and tools can fetch models into a
//! node. `strata serve` answers for its own models at once; a node pulls into its store, from
//! where `strata load` (or the dashboard) places the model.

use axum::Json;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use strata_store::{PullEvent, Store};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// An error in Ollama's shape.
fn refuse(status: StatusCode, msg: String) -> Response {
    (status, Json(json!({ "error": msg }))).into_response()
}

/// The progress line for a store event, if it makes one. `last` is the percentage of the
/// bytes last reported, so a line goes out for every whole percent, not for every chunk.
fn line(ev: &PullEvent<'_>, id: &str, digest: &str, last: &mut Option<u64>) -> Option<Value> {
    Some(match *ev {
        PullEvent::WaitingForLock { .. } => json!({"status": "waiting for another pull of it"}),
        PullEvent::Fetching { part, parts, .. } => {
            json!({"status": format!("pulling manifest (part {part} of {parts})")})
        }
        PullEvent::Extracting { .. } => return None,
        PullEvent::Progress { done, total } => {
            let pct = done.saturating_mul(100) / total.max(1);
            if *last == Some(pct) {
                return None;
            }
            *last = Some(pct);
            json!({"status": format!("pulling {id}"), "digest": digest,
                "total": total, "completed": done})
        }
        PullEvent::Verifying { .. } | PullEvent::AlreadyPresent { .. } => {
            json!({"status": "verifying sha256 digest"})
        }
        PullEvent::Installed { .. } => json!({"status": "writing manifest"}),
        _ => return None,
    })
}

/// Pulls catalog model `model` (`:latest` ignored) into this machine's store: NDJSON progress
/// lines ending in `{"status": "success"}` or `{"error": ...}` when `stream`, else one answer.
/// A model the catalog does not know is a 404 that says where models come from.
pub async fn into_store(model: &str, stream: bool) -> Response {
    let id = model.strip_suffix(":latest").unwrap_or(model).to_string();
    let opened = tokio::task::spawn_blocking(Store::from_env).await;
    let store = match opened {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let Some(card) = store.catalog().get(&id).cloned() else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!(
                "model \"{id}\" is not in strata's catalog (`strata models list` shows it); a \
                 local GGUF becomes one with `strata models import FILE`"
            ),
        );
    };
    let digest = format!("sha256:{}", card.sha256);
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let _ = tx.send(json!({"status": "pulling manifest"}));
    let worker = tokio::task::spawn_blocking(move || {
        let (mut last, mut said) = (None, false);
        let done = store.resolve_with(&id, &mut |ev| {
            if let Some(l) = line(&ev, &id, &digest, &mut last) {
                said = true;
                let _ = tx.send(l);
            }
        });
        if done.is_ok() && !said {
            // Installed and checked before: the store trusts it without a word.
            let _ = tx.send(json!({"status": format!("{id} is in the store already")}));
        }
        let _ = tx.send(match done {
            Ok(_) => json!({"status": "success"}),
            Err(e) => json!({"error": e.to_string()}),
        });
    });
    if stream {
        let lines = UnboundedReceiverStream::new(rx);
        let body = tokio_stream::StreamExt::map(lines, |l| {
            Ok::<_, std::convert::Infallible>(format!("{l}\n"))
        });
        return (
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            Body::from_stream(body),
        )
            .into_response();
    }
    let _ = worker.await;
    let mut rx = rx;
    let mut last = json!({"error": "the pull ended without an answer"});
    while let Ok(l) = rx.try_recv() {
        last = l;
    }
    match last.get("error") {
        Some(_) => (StatusCode::INTERNAL_SERVER_ERROR, Json(last)).into_response(),
        None => Json(last).into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn progress_lines_are_ollamas_one_a_percent() {
        let mut last = None;
        let mut l = |ev| line(&ev, "m", "sha256:ab", &mut last);
        let first = l(PullEvent::Progress {
            done: 10,
            total: 1000,
        })
        .unwrap();
        assert_eq!(first["completed"], 10);
        assert_eq!(first["total"], 1000);
        assert_eq!(first["digest"], "sha256:ab");
        // Same whole percent: no line.
        assert!(
            l(PullEvent::Progress {
                done: 11,
                total: 1000
            })
            .is_none()
        );
        assert!(
            l(PullEvent::Progress {
                done: 20,
                total: 1000
            })
            .is_some()
        );
        let v = l(PullEvent::Verifying {
            path: std::path::Path::new("/x"),
        })
        .unwrap();
        assert_eq!(v["status"], "verifying sha256 digest");
    }
}
