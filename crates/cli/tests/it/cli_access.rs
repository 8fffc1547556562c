//! What an operator sees of `strata serve`'s requests: one access line per request (typed
//! fields with `--log-format json`, none with `--quiet`) and every status counted in
//! `/metrics`, the refusals made before any route (415, 413, 401) included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::cli_hardening::{Proc, status};
use crate::cli_serve::key_file;

const CHAT: &str = r#"{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"Hi"}],"max_tokens":3}"#;
const GENERATE: &str =
    r#"{"model":"smollm2-135m-instruct","prompt":"Hi","stream":false,"options":{"num_predict":2}}"#;
const AUTH: &str = "authorization: Bearer sk-test-key-1234";
const JSON: &str = "content-type: application/json";

/// The access lines (as JSON) the server writes within `wait`, until `want` have come.
fn access_lines(p: &Proc, want: usize, wait: Duration) -> Vec<serde_json::Value> {
    let lines = p.lines.lock().unwrap();
    let end = Instant::now() + wait;
    let mut found = Vec::new();
    while found.len() < want {
        let Ok(line) = lines.recv_timeout(end.saturating_duration_since(Instant::now())) else {
            break;
        };
        assert!(
            !line.contains("sk-test-key-1234"),
            "a key in the log: {line}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["target"] == "strata::access" {
            found.push(v["fields"].clone());
        }
    }
    found
}

#[test]
fn every_request_is_logged_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let keys = key_file(dir.path(), "ops");
    let p = Proc::start(&[
        "serve",
        "--api-addr",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--api-key-file",
        keys.to_str().unwrap(),
        "--max-body",
        "1024",
        "--log-format",
        "json",
    ]);
    let sent = [
        (p.post("/v1/chat/completions", &[JSON, AUTH], CHAT), 200),
        (p.post("/v1/chat/completions", &[JSON], CHAT), 401),
        (
            p.post(
                "/v1/chat/completions",
                &["content-type: text/plain", AUTH],
                CHAT,
            ),
            415,
        ),
        (
            p.post("/v1/chat/completions", &[JSON, AUTH], &" ".repeat(4096)),
            413,
        ),
        // As `curl -d` sends it (Ollama's documented examples), and with no type (litellm).
        (
            p.post(
                "/api/generate",
                &["content-type: application/x-www-form-urlencoded", AUTH],
                GENERATE,
            ),
            200,
        ),
        (p.post("/api/generate", &[AUTH], GENERATE), 200),
    ];
    for (answer, want) in &sent {
        assert_eq!(status(answer), *want, "{answer}");
    }
    let logged = access_lines(&p, sent.len(), Duration::from_secs(30));
    let statuses: Vec<u64> = logged
        .iter()
        .map(|f| f["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 401, 415, 413, 200, 200], "{logged:?}");
    let chat = &logged[0];
    assert_eq!(chat["method"], "POST");
    assert_eq!(chat["route"], "/v1/chat/completions");
    assert_eq!(chat["model"], "smollm2-135m-instruct");
    assert_eq!(chat["key"], "ops");
    assert_eq!(chat["output_tokens"], 3);
    assert!(chat["prompt_tokens"].as_u64().unwrap() > 0, "{chat}");
    let (ttft, total) = (
        chat["ttft_ms"].as_f64().unwrap(),
        chat["total_ms"].as_f64().unwrap(),
    );
    assert!(ttft > 0.0 && ttft <= total, "{chat}");
    assert_eq!(logged[1]["key"], "-", "a refused key is not named");
    assert_eq!(logged[4]["output_tokens"], 2);

    let metrics = p.get("/metrics", "127.0.0.1");
    for want in [
        r#"endpoint="/v1/chat/completions",status="200"} 1"#,
        r#"endpoint="/v1/chat/completions",status="401"} 1"#,
        r#"endpoint="/v1/chat/completions",status="415"} 1"#,
        r#"endpoint="/v1/chat/completions",status="413"} 1"#,
        r#"endpoint="/api/generate",status="200"} 2"#,
    ] {
        assert!(metrics.contains(want), "{want} not in {metrics}");
    }
}

#[test]
fn quiet_servers_write_no_access_lines() {
    let p = Proc::start(&[
        "serve",
        "--api-addr",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--quiet",
        "--log-format",
        "json",
    ]);
    assert_eq!(status(&p.get("/health", "127.0.0.1")), 200);
    assert_eq!(status(&p.post("/v1/chat/completions", &[JSON], CHAT)), 200);
    assert!(access_lines(&p, 1, Duration::from_secs(2)).is_empty());
    // Still counted.
    let metrics = p.get("/metrics", "127.0.0.1");
    assert!(
        metrics.contains(r#"endpoint="/health",status="200"} 1"#),
        "{metrics}"
    );
}
