//! Ollama's `POST /api/pull` through strata's own model store: a catalog model is fetched (and
//! its SHA-256 checked) exactly as `strata models pull` does, and so is a Hugging Face
//! reference (`hf:OWNER/REPO[:QUANT]`, every part of a split set, into the hub's cache), with
//! progress reported as Ollama's NDJSON lines (`pulling manifest`, `pulling DIGEST` with
//! `total` and `completed`, `verifying sha256 digest`, `success`), so Ollama clients and tools
//! can fetch models into a node. A hub file's digest in those lines is its path in the
//! repository (the hub names files, Ollama names blobs). `strata serve` answers for its own
//! models at once; a node pulls into its store, from where `strata load` (or the dashboard)
//! places the model.

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

/// Turns store events into Ollama's progress lines.
struct Lines {
    /// What the bytes lines say is being pulled (`pulling ID`).
    id: String,
    /// The digest of the file whose bytes are counted now.
    digest: String,
    /// The percentage of the bytes last reported, so a line goes out for every whole percent
    /// of a file, not for every chunk.
    last: Option<u64>,
}

impl Lines {
    /// The progress line for a store event, if it makes one.
    fn line(&mut self, ev: &PullEvent<'_>) -> Option<Value> {
        Some(match *ev {
            PullEvent::WaitingForLock { .. } => {
                json!({"status": "waiting for another pull of it"})
            }
            PullEvent::Fetching { part, parts, .. } => {
                json!({"status": format!("pulling manifest (part {part} of {parts})")})
            }
            PullEvent::Resolving { what } => {
                json!({"status": format!("pulling manifest ({what})")})
            }
            PullEvent::Plan {
                files,
                bytes,
                missing,
            } => json!({"status": format!(
                "pulling manifest ({files} file{}, {bytes} bytes, {missing} to fetch)",
                if files == 1 { "" } else { "s" }
            )}),
            PullEvent::Downloading { file } => {
                self.digest = file.to_string();
                self.last = None;
                return None;
            }
            PullEvent::Progress { done, total } => {
                let pct = done.saturating_mul(100) / total.max(1);
                if self.last == Some(pct) {
                    return None;
                }
                self.last = Some(pct);
                json!({"status": format!("pulling {}", self.id), "digest": self.digest,
                    "total": total, "completed": done})
            }
            PullEvent::Verifying { .. } | PullEvent::AlreadyPresent { .. } => {
                json!({"status": "verifying sha256 digest"})
            }
            PullEvent::Checking { file } => {
                self.digest = file.to_string();
                self.last = None;
                json!({"status": "verifying sha256 digest", "digest": file})
            }
            PullEvent::Installed { .. } => json!({"status": "writing manifest"}),
            _ => return None,
        })
    }
}

/// Pulls `model` into this machine's store: a catalog id (`:latest` ignored) or a Hugging Face
/// reference. NDJSON progress lines ending in `{"status": "success"}` or `{"error": ...}` when
/// `stream`, else one answer. Any other name is a 404 that says where models come from.
pub async fn into_store(model: &str, stream: bool) -> Response {
    let id = model.strip_suffix(":latest").unwrap_or(model).to_string();
    let opened = tokio::task::spawn_blocking(Store::from_env).await;
    let store = match opened {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let digest = match store.catalog().get(&id) {
        Some(card) => format!("sha256:{}", card.sha256),
        None if strata_store::is_elsewhere(&id) => id.clone(),
        None => {
            return refuse(
                StatusCode::NOT_FOUND,
                format!(
                    "model \"{id}\" is not in strata's catalog (`strata models list` shows it); \
                     a Hugging Face model is pulled as hf:OWNER/REPO[:QUANT], a local GGUF \
                     becomes one with `strata models import FILE`"
                ),
            );
        }
    };
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let _ = tx.send(json!({"status": "pulling manifest"}));
    let worker = tokio::task::spawn_blocking(move || {
        let mut lines = Lines {
            id: id.clone(),
            digest,
            last: None,
        };
        let mut said = false;
        let done = store.resolve_with(&id, &mut |ev| {
            if let Some(l) = lines.line(&ev) {
                said = true;
                let _ = tx.send(l);
            }
        });
        if done.is_ok() && !said {
            // Installed and checked before: the store trusts it without a word.
            let _ = tx.send(json!({"status": format!("{id} is in the store already")}));
        }
        let _ = tx.send(match &done {
            Ok(_) => json!({"status": "success"}),
            Err(e) => json!({"error": e.to_string()}),
        });
        done.err().map(|e| status_of(&e))
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
    let failed = worker
        .await
        .unwrap_or(Some(StatusCode::INTERNAL_SERVER_ERROR));
    let mut rx = rx;
    let mut last = json!({"error": "the pull ended without an answer"});
    while let Ok(l) = rx.try_recv() {
        last = l;
    }
    match (last.get("error"), failed) {
        (Some(_), status) => (
            status.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(last),
        )
            .into_response(),
        (None, _) => Json(last).into_response(),
    }
}

/// The status of a pull that failed: what the client got wrong (no such repository or file,
/// a gated one without access, a bad token) is theirs to fix, the rest is the server's.
fn status_of(e: &strata_store::Error) -> StatusCode {
    use strata_hub::Error as Hub;
    match e {
        strata_store::Error::Hub(h) => match h {
            Hub::BadReference(_) => StatusCode::BAD_REQUEST,
            Hub::RepoNotFound { .. }
            | Hub::RevisionNotFound { .. }
            | Hub::NoSuchModel(_)
            | Hub::MissingParts { .. } => StatusCode::NOT_FOUND,
            Hub::Gated { .. } => StatusCode::FORBIDDEN,
            Hub::BadToken { .. } => StatusCode::UNAUTHORIZED,
            _ => StatusCode::BAD_GATEWAY,
        },
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn progress_lines_are_ollamas_one_a_percent() {
        let mut lines = Lines {
            id: "m".into(),
            digest: "sha256:ab".into(),
            last: None,
        };
        let mut l = |ev| lines.line(&ev);
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

    #[test]
    fn hub_files_report_their_bytes_under_their_own_names() {
        let mut lines = Lines {
            id: "hf:o/r:Q4_1".into(),
            digest: "hf:o/r:Q4_1".into(),
            last: None,
        };
        let plan = lines
            .line(&PullEvent::Plan {
                files: 2,
                bytes: 300,
                missing: 200,
            })
            .unwrap();
        assert_eq!(
            plan["status"],
            "pulling manifest (2 files, 300 bytes, 200 to fetch)"
        );
        assert!(
            lines
                .line(&PullEvent::Downloading {
                    file: "m-00001-of-00002.gguf"
                })
                .is_none()
        );
        let p = lines
            .line(&PullEvent::Progress {
                done: 50,
                total: 100,
            })
            .unwrap();
        assert_eq!(p["digest"], "m-00001-of-00002.gguf");
        assert_eq!(p["status"], "pulling hf:o/r:Q4_1");
        lines.line(&PullEvent::Downloading {
            file: "m-00002-of-00002.gguf",
        });
        // A new file starts its own percentages.
        let p = lines
            .line(&PullEvent::Progress {
                done: 50,
                total: 100,
            })
            .unwrap();
        assert_eq!(p["digest"], "m-00002-of-00002.gguf");
        let c = lines
            .line(&PullEvent::Checking {
                file: "m-00002-of-00002.gguf",
            })
            .unwrap();
        assert_eq!(c["status"], "verifying sha256 digest");
    }

    #[test]
    fn a_hub_error_is_the_clients_when_the_client_can_fix_it() {
        let hub = |e| status_of(&strata_store::Error::Hub(e));
        assert_eq!(
            hub(strata_hub::Error::NoSuchModel("no GGUF".into())),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            hub(strata_hub::Error::BadToken {
                endpoint: "http://h".into()
            }),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            hub(strata_hub::Error::Gated {
                repo: "o/r".into(),
                endpoint: "http://h".into(),
                token: false
            }),
            StatusCode::FORBIDDEN
        );
    }
}
