//! The attacks of issue 17 against real `strata node` and `strata serve` processes on loopback:
//! a web page driving a node (cross-origin form posts, DNS rebinding), slow and silent clients
//! holding connections, a half-sent request keeping the process from stopping. Every loop here
//! is bounded and every connection goes to 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub(crate) struct Proc {
    child: Child,
    addr: SocketAddr,
    pub(crate) lines: std::sync::Mutex<mpsc::Receiver<String>>,
    _dir: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Starts `strata ARGS` and waits for the line that names its API address.
    pub(crate) fn start(args: &[&str]) -> Proc {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .env("XDG_STATE_HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting strata");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[strata] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let addr = loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("strata exited or said nothing before serving");
            if let Some(at) = line.find("http://") {
                let url = line[at + 7..].split_whitespace().next().unwrap();
                break url.trim_end_matches(['/', ')', ',']).parse().unwrap();
            }
        };
        Proc {
            child,
            addr,
            lines: std::sync::Mutex::new(lines),
            _dir: dir,
        }
    }

    /// Sends a raw request and reads the answer until the server closes (5 s at most).
    fn raw(&self, req: &str) -> String {
        self.raw_within(req, Duration::from_secs(5))
    }

    /// [`Proc::raw`], waiting up to `limit` between reads (a long prefill on a busy machine).
    fn raw_within(&self, req: &str, limit: Duration) -> String {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(limit)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    pub(crate) fn get(&self, path: &str, host: &str) -> String {
        self.raw(&format!(
            "GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
        ))
    }

    pub(crate) fn post(&self, path: &str, headers: &[&str], body: &str) -> String {
        self.raw(&Self::post_request(self.addr, path, headers, body))
    }

    /// The text of a POST of `body` to `path` with `headers`.
    fn post_request(addr: SocketAddr, path: &str, headers: &[&str], body: &str) -> String {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        req.push_str(body);
        req
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit; how long it took.
    fn terminate(&mut self, within: Duration) -> Duration {
        let t = Instant::now();
        // SAFETY: kill sends a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        while t.elapsed() < within {
            if self.child.try_wait().unwrap().is_some() {
                return t.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("strata did not stop within {within:?} of SIGTERM");
    }
}

pub(crate) fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn start_node(extra: &[&str]) -> Proc {
    let mut args = vec![
        "node",
        "--api-addr",
        "127.0.0.1:0",
        "--control-addr",
        "127.0.0.1:0",
        "--no-multicast",
    ];
    args.extend_from_slice(extra);
    Proc::start(&args)
}

#[test]
fn a_web_page_cannot_stop_a_node_or_read_it_through_a_rebound_name() {
    let node = start_node(&[]);
    // The form a page at evil.example posts to the node (a "simple" request: no preflight).
    let form = node.post(
        "/v1/cluster/stop",
        &[
            "origin: http://evil.example",
            "content-type: application/x-www-form-urlencoded",
        ],
        "a=b",
    );
    assert_eq!(status(&form), 403, "{form}");
    assert!(form.contains("--cors-origin"), "{form}");
    // A fetch with a text/plain body and no Origin (older browsers).
    let plain = node.post("/v1/cluster/drain", &["content-type: text/plain"], "{}");
    assert_eq!(status(&plain), 415, "{plain}");
    // DNS rebinding: the page's own name, now pointing at 127.0.0.1.
    let rebound = node.get("/v1/cluster/status", "evil.example:8000");
    assert_eq!(status(&rebound), 403, "{rebound}");
    // The node is still up and answers its own names.
    let ok = node.get("/v1/cluster/status", "localhost");
    assert_eq!(status(&ok), 200, "{ok}");
    // Probing files through a load: refused before anything is opened, and the answers for a
    // file that exists and one that does not are the same.
    let json = ["content-type: application/json"];
    let shadow = node.post(
        "/v1/cluster/load",
        &json,
        r#"{"model": "/etc/passwd", "dry_run": true}"#,
    );
    let missing = node.post(
        "/v1/cluster/load",
        &json,
        r#"{"model": "/etc/no-such-file", "dry_run": true}"#,
    );
    assert_eq!(status(&shadow), 400, "{shadow}");
    assert!(shadow.contains("--allow-model-dir"), "{shadow}");
    assert!(!shadow.contains("magic"), "{shadow}");
    let body = |a: &str| {
        a.split("\r\n\r\n")
            .nth(1)
            .unwrap_or("")
            .replace("no-such-file", "passwd")
    };
    assert_eq!(body(&shadow), body(&missing));
    // `strata stop`'s own request (no body, no type) still works.
    let stop = node.post("/v1/cluster/stop", &[], "");
    assert_eq!(status(&stop), 200, "{stop}");
}

/// A key file (mode 0600) in `dir` with these lines.
fn key_file(dir: &std::path::Path, lines: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("keys");
    std::fs::write(&path, lines).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_string_lossy().into_owned()
}

/// Sends the head of a request announcing a `len`-byte body and only its first 64 KiB, then
/// reads what comes back within 5 s: a server that waits for the whole body answers nothing.
fn post_partial(addr: SocketAddr, path: &str, len: usize) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(&vec![b'x'; 64 << 10]);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn a_node_with_keys_takes_no_body_under_ui_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = key_file(dir.path(), "sk-admin-123456 name=ops role=admin\n");
    let node = start_node(&["--api-key-file", &keys]);
    // 7 MB announced to a path under /ui/ that is no file of the dashboard: refused at once,
    // before the body is read (it used to be read and forwarded to the instance).
    let refused = post_partial(node.addr, "/ui/x/y", 7_000_000);
    assert_eq!(status(&refused), 401, "{refused}");
    let page = node.get("/ui/app.js", "127.0.0.1");
    assert_eq!(status(&page), 200, "{page}");
    let other = node.get("/ui/x/y", "127.0.0.1");
    assert_eq!(status(&other), 401, "{other}");
}

#[test]
fn silent_clients_cannot_fill_a_node_and_a_half_sent_request_does_not_hold_its_stop() {
    let node = start_node(&[
        "--max-connections",
        "4",
        "--header-timeout",
        "1",
        "--shutdown-grace",
        "1",
    ]);
    let silent: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(node.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let full = node.get("/health", "127.0.0.1");
    assert_eq!(status(&full), 503, "{full}");
    assert!(t.elapsed() < Duration::from_secs(3));
    let logged = (0..50).any(|_| {
        node.lines
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_millis(100))
            .is_ok_and(|l| l.contains("--max-connections"))
    });
    assert!(logged, "no log line about the connection cap");
    // The header deadline frees the slots.
    std::thread::sleep(Duration::from_millis(1500));
    let ok = node.get("/health", "127.0.0.1");
    assert_eq!(status(&ok), 200, "{ok}");
    drop(silent);
    // SIGTERM while a client has sent half a request, on a server whose header deadline is
    // far away: the stop waits out the grace, not the client.
    let mut node = start_node(&["--header-timeout", "600", "--shutdown-grace", "1"]);
    let mut half = TcpStream::connect(node.addr).unwrap();
    half.write_all(b"POST /v1/cluster/load HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-le")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let took = node.terminate(Duration::from_secs(15));
    assert!(took < Duration::from_secs(8), "{took:?}");
}

#[test]
fn serve_takes_json_from_its_own_hosts_only() {
    let server = Proc::start(&[
        "serve",
        "--api-addr",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--allow-host",
        "strata.lan",
    ]);
    let body = r#"{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"Hi"}],"max_tokens":2}"#;
    let plain = server.post("/v1/chat/completions", &["content-type: text/plain"], body);
    assert_eq!(status(&plain), 415, "{plain}");
    assert!(plain.contains("application/json"), "{plain}");
    let cross = server.post(
        "/v1/chat/completions",
        &[
            "content-type: application/json",
            "origin: http://evil.example",
        ],
        body,
    );
    assert_eq!(status(&cross), 403, "{cross}");
    let rebound = server.get("/v1/models", "evil.example");
    assert_eq!(status(&rebound), 403, "{rebound}");
    let named = server.get("/v1/models", "strata.lan:8000");
    assert_eq!(status(&named), 200, "{named}");
    let ok = server.post(
        "/v1/chat/completions",
        &["content-type: application/json"],
        body,
    );
    assert_eq!(status(&ok), 200, "{ok}");
}

/// The longest `/health` took to answer, in milliseconds, over ten tries 50 ms apart.
fn worst_health_ms(p: &Proc) -> u128 {
    (0..10)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            let t = Instant::now();
            let a = p.get("/health", "127.0.0.1");
            assert_eq!(status(&a), 200, "{a}");
            t.elapsed().as_millis()
        })
        .max()
        .unwrap_or(0)
}

/// A short chat whose answer must follow `schema` (`response_format`); the raw answer.
fn schema_chat(p: &Proc, schema: &str) -> String {
    p.post(
        "/v1/chat/completions",
        &["content-type: application/json"],
        &format!(
            r#"{{"model":"smollm2-135m-instruct","max_tokens":4,
                "messages":[{{"role":"user","content":"Hi"}}],
                "response_format":{{"type":"json_schema","json_schema":{{"name":"x","schema":{schema}}}}}}}"#
        ),
    )
}

/// Peak resident memory of a process, in MiB.
#[cfg(not(target_os = "macos"))]
fn peak_rss_mib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024
}

/// Peak memory of a process, in MiB: its lifetime maximum physical footprint, macOS's
/// counterpart of VmHWM (see `strata_node::host::peak_memory`).
#[cfg(target_os = "macos")]
fn peak_rss_mib(pid: u32) -> u64 {
    strata_node::host::peak_memory(Some(pid)).unwrap() >> 20
}

#[test]
fn huge_prompts_and_hostile_schemas_get_400_without_stalling_the_server() {
    let server = std::sync::Arc::new(Proc::start(&[
        "serve",
        "--api-addr",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--max-body",
        "8000000",
        // Its peak memory is read by pid: the server's own, not a supervisor's.
        "--no-supervise",
    ]));
    let before = peak_rss_mib(server.child.id());
    // Four 3.9 MB messages at once: refused by their size, before tokenising them.
    let huge = format!(
        r#"{{"model":"smollm2-135m-instruct","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "word ".repeat(780_000)
    );
    let posts: Vec<_> = (0..4)
        .map(|_| {
            let (server, huge) = (std::sync::Arc::clone(&server), huge.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                let a = server.post(
                    "/v1/chat/completions",
                    &["content-type: application/json"],
                    &huge,
                );
                (a, t.elapsed())
            })
        })
        .collect();
    let worst = worst_health_ms(&server);
    for p in posts {
        let (a, took) = p.join().unwrap();
        assert_eq!(status(&a), 400, "{}", &a[..a.len().min(400)]);
        assert!(a.contains("at least"), "{}", &a[..a.len().min(400)]);
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
    assert!(
        worst < 1000,
        "/health took {worst} ms while huge prompts were refused"
    );
    let grown = peak_rss_mib(server.child.id()).saturating_sub(before);
    assert!(
        grown < 300,
        "peak memory grew by {grown} MiB for four refused prompts"
    );

    // Schemas that cannot be compiled, or only at great cost: 400 with the reason, fast.
    let chat = |schema: &str| schema_chat(&server, schema);
    let own = chat(r##"{"$ref": "#"}"##);
    assert_eq!(status(&own), 400, "{own}");
    assert!(own.contains("schema cannot be used"), "{own}");
    let t = Instant::now();
    let big = chat(&format!(r#"{{"const": "{}"}}"#, "x".repeat(3_000_000)));
    assert_eq!(status(&big), 400, "{}", &big[..big.len().min(400)]);
    assert!(big.contains("KiB"), "{}", &big[..big.len().min(400)]);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A 2,000-branch anyOf compiles off the async workers: /health stays quick meanwhile.
    let branches: Vec<String> = (0..2000)
        .map(|i| format!(r#"{{"const": "v{i}"}}"#))
        .collect();
    let wide = format!(r#"{{"anyOf": [{}]}}"#, branches.join(","));
    let server2 = std::sync::Arc::clone(&server);
    let compiling = std::thread::spawn(move || schema_chat(&server2, &wide));
    let worst = worst_health_ms(&server);
    let a = compiling.join().unwrap();
    assert!(
        matches!(status(&a), 200 | 400),
        "{}",
        &a[..a.len().min(400)]
    );
    assert!(
        worst < 1000,
        "/health took {worst} ms while a schema compiled"
    );
}

/// A `$ref` chain of `n` definitions (`d0 -> d1 -> ... -> {"type": "string"}`).
fn ref_chain(n: usize) -> serde_json::Value {
    let mut d = serde_json::Map::new();
    for i in 0..n {
        d.insert(
            format!("d{i}"),
            serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    d.insert(format!("d{n}"), serde_json::json!({"type": "string"}));
    serde_json::json!({"$defs": d, "$ref": "#/$defs/d0"})
}

/// Definitions each an array of any of all of them.
fn mutual_defs(names: &str) -> serde_json::Value {
    let mut d = serde_json::Map::new();
    for x in names.chars() {
        let any: Vec<serde_json::Value> = names
            .chars()
            .map(|y| serde_json::json!({"$ref": format!("#/$defs/{y}")}))
            .collect();
        d.insert(
            x.to_string(),
            serde_json::json!({"type": "array", "items": {"anyOf": any}}),
        );
    }
    serde_json::json!({"$defs": d, "$ref": "#/$defs/A"})
}

/// `schema` as each dialect's structured output and tool parameters: (route, body).
fn every_schema_path(schema: &serde_json::Value) -> Vec<(&'static str, String)> {
    use serde_json::json;
    let model = "smollm2-135m-instruct";
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let function = json!({"type": "function", "function": {"name": "f", "parameters": schema}});
    [
        (
            "/v1/chat/completions",
            json!({"model": model, "messages": msgs, "max_tokens": 8,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema}}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": model, "messages": msgs, "max_tokens": 8,
                "tools": [function], "tool_choice": "required"}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": model, "messages": msgs, "max_tokens": 8, "tools": [function]}),
        ),
        (
            "/api/chat",
            json!({"model": model, "messages": msgs, "stream": false, "format": schema,
                "options": {"num_predict": 8}}),
        ),
        (
            "/api/chat",
            json!({"model": model, "messages": msgs, "stream": false, "tools": [function],
                "options": {"num_predict": 8}}),
        ),
        (
            "/api/generate",
            json!({"model": model, "prompt": "Hi", "stream": false, "format": schema,
                "options": {"num_predict": 8}}),
        ),
        (
            "/v1/responses",
            json!({"model": model, "input": "Hi", "max_output_tokens": 16,
                "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}),
        ),
        (
            "/v1/responses",
            json!({"model": model, "input": "Hi", "max_output_tokens": 16,
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
                "tool_choice": "required"}),
        ),
        (
            "/v1/messages",
            json!({"model": model, "messages": msgs, "max_tokens": 8,
                "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
        ),
        (
            "/v1/messages",
            json!({"model": model, "messages": msgs, "max_tokens": 8,
                "tools": [{"name": "f", "input_schema": schema}],
                "tool_choice": {"type": "any"}}),
        ),
    ]
    .into_iter()
    .map(|(route, body)| (route, body.to_string()))
    .collect()
}

/// The schemas that aborted `strata serve` (a stack overflow in the grammar compiler, an
/// exponential expansion ending in an allocation failure, a pattern that built millions of
/// regex nodes), sent through every dialect's structured output and tool parameters: each is a
/// 400 that names the limit, or (a recursion the server can bound) an answer, and the process
/// lives on with flat memory.
#[test]
fn schemas_that_aborted_the_process_are_refused_through_every_dialect() {
    use serde_json::json;
    // Unsupervised, so an abort ends the test's process instead of being restarted.
    let server = Proc::start(&[
        "serve",
        "--no-supervise",
        "--api-addr",
        "127.0.0.1:0",
        "--threads",
        "2",
    ]);
    let json_type = ["content-type: application/json"];
    let refused = [
        (ref_chain(700), "at most 256"),
        (ref_chain(200), "levels deep"),
        (ref_chain(70), "levels deep"),
        (
            json!({"type": "object", "properties": {"s": {"type": "string",
                "pattern": "^(x{1000}){1000}$"}}, "required": ["s"]}),
            "/properties/s/pattern",
        ),
    ];
    let bounded = [mutual_defs("ABCDE"), mutual_defs("ABCD")];
    let before = peak_rss_mib(server.child.id());
    for (schema, why) in &refused {
        for (route, body) in every_schema_path(schema) {
            let t = Instant::now();
            let a = server.post(route, &json_type, &body);
            let head = &a[..a.len().min(600)];
            assert_eq!(status(&a), 400, "{route}: {head}");
            assert!(a.contains(why), "{route}: {head}");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{route} took {:?}",
                t.elapsed()
            );
        }
    }
    for schema in &bounded {
        for (route, body) in every_schema_path(schema) {
            // Answered, not refused: generation under a grammar takes its time on a busy
            // machine, and what is checked here is that the process lives on.
            let req = Proc::post_request(server.addr, route, &json_type, &body);
            let a = server.raw_within(&req, Duration::from_secs(60));
            let head = &a[..a.len().min(600)];
            assert!(matches!(status(&a), 200 | 400), "{route}: {head}");
        }
    }
    let mut server = server;
    assert!(server.child.try_wait().unwrap().is_none(), "strata exited");
    let ok = server.get("/health", "127.0.0.1");
    assert_eq!(status(&ok), 200, "{ok}");
    let grown = peak_rss_mib(server.child.id()).saturating_sub(before);
    assert!(grown < 200, "peak memory grew by {grown} MiB");
}

/// A key file of two client keys, `alice` and `bob`, readable by its owner only.
fn two_keys(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let keys = dir.join("keys");
    std::fs::write(
        &keys,
        "sk-alice-0123456 name=alice\nsk-bob-01234567 name=bob\n",
    )
    .unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    keys
}

/// One token of a chat on a long system prompt, as `key` (with `salt`, if any): the tokens the
/// answer says were cached, and how long the request took.
fn cached_chat(p: &Proc, key: &str, system: &str, salt: Option<&str>) -> (u64, Duration) {
    let mut body = serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 1,
        "messages": [{"role": "system", "content": system},
            {"role": "user", "content": "Summarise the rules."}]});
    if let Some(s) = salt {
        body["cache_salt"] = serde_json::json!(s);
    }
    let auth = format!("authorization: Bearer {key}");
    let t = Instant::now();
    // A cold 1,800-token prefill takes seconds, more beside the suite's other servers.
    let a = p.raw_within(
        &Proc::post_request(
            p.addr,
            "/v1/chat/completions",
            &["content-type: application/json", &auth],
            &body.to_string(),
        ),
        Duration::from_secs(120),
    );
    let took = t.elapsed();
    assert_eq!(status(&a), 200, "{a}");
    let v: serde_json::Value =
        serde_json::from_str(a.split("\r\n\r\n").nth(1).unwrap_or("")).unwrap();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (cached, took)
}

/// The prefix cache once told one key what another had sent: Bob's copy of Alice's 1,800-token
/// system prompt answered ten times sooner and said 1,792 tokens were cached. Each key's
/// blocks are now its own, `cache_salt` separates a key's requests further, and
/// `--shared-prefix-cache` gives a single-tenant server one cache again.
#[test]
fn one_key_gets_nothing_from_the_prefix_cache_that_another_filled() {
    let dir = tempfile::tempdir().unwrap();
    let keys = two_keys(dir.path());
    let keys = keys.to_str().unwrap();
    let system = (0..150)
        .map(|i| format!("Rule {i}: answer in plain words and cite rule {i}."))
        .collect::<Vec<_>>()
        .join(" ");
    let (alice, bob) = ("sk-alice-0123456", "sk-bob-01234567");
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--api-addr",
            "127.0.0.1:0",
            "--threads",
            "2",
            "--api-key-file",
            keys,
        ];
        args.extend_from_slice(extra);
        Proc::start(&args)
    };
    let server = serve(&[]);
    let (cold, cold_took) = cached_chat(&server, alice, &system, None);
    assert_eq!(cold, 0);
    let (warm, warm_took) = cached_chat(&server, alice, &system, None);
    assert!(warm >= 1024, "Alice's own prompt was not cached: {warm}");
    let (theirs, theirs_took) = cached_chat(&server, bob, &system, None);
    assert_eq!(theirs, 0, "Bob was told of Alice's prompt");
    // Alice's repeat skips most of the prefill; Bob's copy of it does not.
    assert!(
        theirs_took > warm_took * 3,
        "Bob {theirs_took:?}, Alice warm {warm_took:?}, cold {cold_took:?}"
    );
    // A salt is a partition of its own, within a key.
    let (salted, _) = cached_chat(&server, alice, &system, Some("team-red"));
    assert_eq!(salted, 0);
    let (again, _) = cached_chat(&server, alice, &system, Some("team-red"));
    assert!(again >= 1024, "{again}");
    let (other_salt, _) = cached_chat(&server, alice, &system, Some("team-blue"));
    assert_eq!(other_salt, 0);
    drop(server);

    let single = serve(&["--shared-prefix-cache"]);
    let (cold, _) = cached_chat(&single, alice, &system, None);
    assert_eq!(cold, 0);
    let (shared, _) = cached_chat(&single, bob, &system, None);
    assert!(shared >= 1024, "--shared-prefix-cache: {shared}");
    let (salted, _) = cached_chat(&single, bob, &system, Some("x"));
    assert_eq!(
        salted, 0,
        "a salt still separates under --shared-prefix-cache"
    );
}

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// Whether a line containing `what` arrives from `p` within `limit`.
fn says(p: &Proc, what: &str, limit: Duration) -> bool {
    let t = Instant::now();
    let lines = p.lines.lock().unwrap();
    while t.elapsed() < limit {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(100))
            && l.contains(what)
        {
            return true;
        }
    }
    false
}

#[test]
fn two_nodes_started_with_one_state_dir_are_not_one_member() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let node = |name: &str, control: &str, peer: &[&str]| {
        let mut args = vec!["node", "--api-addr", "127.0.0.1:0", "--no-multicast"];
        args.extend_from_slice(&[
            "--state-dir",
            dir,
            "--name",
            name,
            "--control-addr",
            control,
        ]);
        args.extend_from_slice(peer);
        Proc::start(&args)
    };
    let first_control = format!("127.0.0.1:{}", free_port());
    let first = node("first", &first_control, &[]);
    let second_control = format!("127.0.0.1:{}", free_port());
    let mut second = node("second", &second_control, &["--peer", &first_control]);
    // The later one stops with one line saying what to do; the first warns and stays.
    assert!(
        says(
            &second,
            "node-id, or give this node its own --state-dir",
            Duration::from_secs(20)
        ),
        "the second node did not say why it stops"
    );
    let t = Instant::now();
    let exited = loop {
        if let Some(s) = second.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the second node kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!exited.success());
    assert!(says(
        &first,
        "two nodes claim the node id",
        Duration::from_secs(5)
    ));
    let ok = first.get("/health", "127.0.0.1");
    assert_eq!(status(&ok), 200, "{ok}");
}

#[test]
fn a_key_at_its_concurrency_limit_gets_429_while_another_key_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let keys = key_file(
        dir.path(),
        "sk-one-12345678 name=one max_concurrent=1\nsk-two-12345678 name=two\n",
    );
    let server = Proc::start(&[
        "serve",
        "--api-addr",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--api-key-file",
        &keys,
    ]);
    let chat = |extra: &str| {
        format!(
            r#"{{"model":"smollm2-135m-instruct","messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#
        )
    };
    let json = "content-type: application/json";
    // A long stream under key one: 300 numbers at least, so it outlasts what follows.
    let long = chat(
        r#","stream":true,"max_tokens":3000,"response_format":{"type":"json_schema",
            "json_schema":{"name":"n","schema":{"type":"array","items":{"type":"integer"},
            "minItems":300}}}"#,
    );
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n{json}\r\n\
                 authorization: Bearer sk-one-12345678\r\ncontent-length: {}\r\n\r\n{long}",
                long.len()
            )
            .as_bytes(),
        )
        .unwrap();
    let mut first = [0u8; 512];
    let n = stream.read(&mut first).unwrap();
    let head = String::from_utf8_lossy(&first[..n]).into_owned();
    assert_eq!(status(&head), 200, "{head}");

    // While it streams, key one is refused at once, with Retry-After and one clear line ...
    let short = chat(r#","max_tokens":2"#);
    let busy = server.post(
        "/v1/chat/completions",
        &[json, "authorization: Bearer sk-one-12345678"],
        &short,
    );
    assert_eq!(status(&busy), 429, "{busy}");
    assert!(busy.to_lowercase().contains("retry-after: 1"), "{busy}");
    assert!(busy.contains("max_concurrent"), "{busy}");
    assert!(busy.contains("\"type\":\"rate_limit_error\""), "{busy}");
    // ... and key two is served meanwhile.
    let t = Instant::now();
    let other = server.post(
        "/v1/chat/completions",
        &[json, "authorization: Bearer sk-two-12345678"],
        &short,
    );
    assert_eq!(status(&other), 200, "{other}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // Still streaming: the slot is held by the answer, not by the handler that returned it.
    let still = server.post(
        "/v1/chat/completions",
        &[json, "authorization: Bearer sk-one-12345678"],
        &short,
    );
    assert_eq!(status(&still), 429, "{still}");
    // The client goes away: key one is served again within seconds.
    drop(stream);
    let t = Instant::now();
    loop {
        let again = server.post(
            "/v1/chat/completions",
            &[json, "authorization: Bearer sk-one-12345678"],
            &short,
        );
        if status(&again) == 200 {
            break;
        }
        assert_eq!(status(&again), 429, "{again}");
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the slot was never given back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // strata serve takes no body under /ui/ without a key either.
    let ui = post_partial(server.addr, "/ui/x/y", 7_000_000);
    assert_eq!(status(&ui), 401, "{ui}");
}

/// The pids of `parent`'s children.
#[cfg(not(target_os = "macos"))]
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                // pid (comm) state ppid ...: the name may hold spaces, so read after the ')'.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// The pids of `parent`'s children (`proc_listchildpids`).
#[cfg(target_os = "macos")]
fn children_of(parent: u32) -> Vec<u32> {
    strata_node::host::children(parent)
}

/// Whether process `pid` exists (a zombie included).
fn exists(pid: u32) -> bool {
    #[cfg(not(target_os = "macos"))]
    return std::path::Path::new(&format!("/proc/{pid}")).exists();
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    #[cfg(target_os = "macos")]
    return unsafe { libc::kill(pid as i32, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
}

/// Waits (bounded) until `p` answers `/health` with 200.
fn healthy_within(p: &Proc, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        let ok =
            TcpStream::connect(p.addr).is_ok() && status(&p.get("/health", "127.0.0.1")) == 200;
        if ok {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < limit,
            "not answering {limit:?} after the crash"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_killed_by_an_abort_is_restarted_on_its_port() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut server = Proc::start(&["serve", "--api-addr", &addr, "--threads", "2"]);
    healthy_within(&server, Duration::from_secs(30));
    let served = children_of(server.child.id());
    assert_eq!(served.len(), 1, "{served:?}");
    // What a stack overflow or a failed allocation does: abort, which no panic handler sees.
    // SAFETY: kill(2) on the server process this test started (through its supervisor).
    unsafe { libc::kill(served[0] as i32, libc::SIGABRT) };
    assert!(
        says(&server, "died of SIGABRT", Duration::from_secs(10)),
        "no log line about the abort"
    );
    let back = healthy_within(&server, Duration::from_secs(30));
    let again = children_of(server.child.id());
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again, served, "the same process answers");
    eprintln!("answering again {back:?} after the restart was logged");
    // A stop is forwarded, and not taken for a crash: both processes end.
    server.terminate(Duration::from_secs(15));
    assert!(!exists(again[0]));
}
