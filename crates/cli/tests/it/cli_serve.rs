//! `strata serve` driven by the official `openai`, `anthropic` and `ollama` Python clients, as a user would
//! drive it: plain and streamed chat, tool calls and JSON output checked against their schemas,
//! every error status, keys and rate limits, a full queue, client disconnects and hostile JSON
//! (`crates/api/tests/py/*_client.py`). The clients are installed with pip into a venv under the
//! cache directory on first use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const MODEL: &str = "smollm2-135m-instruct";

pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

/// Starts `strata serve` on a free port and waits for its "serving" line.
pub(crate) fn serve(extra: &[&str]) -> Server {
    serve_model(MODEL, extra)
}

/// [`serve`] for any model (a catalog id or a path).
pub(crate) fn serve_model(model: &str, extra: &[&str]) -> Server {
    let mut child = strata()
        .args([
            "serve",
            "--model",
            model,
            "--api-addr",
            "127.0.0.1:0",
            "--threads",
            "2",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting strata serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("strata serve exited before serving")
            .unwrap();
        if let Some(at) = line.find("http://") {
            break line[at..].split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server { child, url }
}

/// Checks a client script's report: it ran, and every check passed.
fn expect_all_passed(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the client checks failed:\n{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

/// The official clients the API is tested with, pinned.
const CLIENTS: [&str; 4] = [
    "openai==3.54.0",
    "anthropic==2.13.0",
    "ollama==0.6.3",
    "jsonschema==4.26.0",
];

/// `~/.cache/strata/NAME`: where the test clients are installed once and kept.
pub(crate) fn test_cache_dir(name: &str) -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".cache/strata")
        .join(name)
}

/// A Python with the official clients ([`CLIENTS`]), in a venv kept under the cache directory.
fn python() -> PathBuf {
    venv_python("test-venv-clients", &CLIENTS)
}

/// The Python of a venv `~/.cache/strata/NAME` with `packages` installed by pip, made once
/// (a marker file names the packages, so a changed list installs again).
pub(crate) fn venv_python(name: &str, packages: &[&str]) -> PathBuf {
    let venv = test_cache_dir(name);
    let py = venv.join("bin/python");
    let ready = venv.join(format!(".installed-{}", packages.join("-")));
    // Tests run in parallel: one makes the venv while any other that wants one waits.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !ready.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "creating the venv {name}");
        let ok = Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "installing {packages:?}");
        std::fs::write(&ready, b"").expect("marker");
    }
    py
}

/// A key file in `dir` with the test key under `name` (owner-only, as strata requires).
pub(crate) fn key_file(dir: &std::path::Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("sk-test-key-1234 name={name}\n")).unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    keys
}

/// The client scripts' prompt through `strata run`, greedy: the APIs must answer the same text.
fn run_text() -> String {
    let run = strata()
        .args([
            "run",
            "--model",
            MODEL,
            "--max-tokens",
            "24",
            "What is the capital of France?",
        ])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout).unwrap()
}

#[test]
fn the_openai_client_gets_what_it_expects() {
    let py = python();
    let run_text = run_text();

    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        "# test keys\nsk-test-key-1234 name=tester\nsk-slow-key-1234 name=slow rpm=2\n",
    )
    .unwrap();
    // A key file others can read is refused; the owner's own is served.
    let exposed = strata()
        .args(["serve", "--api-key-file", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!exposed.status.success());
    let err = String::from_utf8_lossy(&exposed.stderr);
    assert!(err.contains("chmod 600"), "{err}");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let open = serve(&[]);
    let keyed = serve(&["--api-key-file", keys.to_str().unwrap(), "--parallel", "2"]);
    let tiny = serve(&["--parallel", "1", "--queue", "1", "--max-body", "200000"]);

    let out = Command::new(&py)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../api/tests/py/openai_client.py"
        ))
        .env("STRATA_URL", &open.url)
        .env("STRATA_KEYED_URL", &keyed.url)
        .env("STRATA_TINY_URL", &tiny.url)
        .env("STRATA_MODEL", MODEL)
        .env("STRATA_RUN_TEXT", run_text.trim_end_matches('\n'))
        .env("STRATA_KEY", "sk-test-key-1234")
        .env("STRATA_SLOW_KEY", "sk-slow-key-1234")
        .output()
        .unwrap();
    expect_all_passed(&out);
}

/// Runs `crates/api/tests/py/{script}` against an open server (with the alias
/// `claude-sonnet-4`) and one with a key (and `--temperature 0`).
fn run_client_script(script: &str) {
    run_client_script_with(&python(), script);
}

/// [`run_client_script`] with the Python of another venv.
pub(crate) fn run_client_script_with(py: &std::path::Path, script: &str) {
    let run_text = run_text();
    let dir = tempfile::tempdir().unwrap();
    let keys = key_file(dir.path(), "tester");
    // The open server answers to an alias too; the keyed one samples greedily unless asked.
    let open = serve(&["--parallel", "2", "--alias", "claude-sonnet-4"]);
    let keyed = serve(&[
        "--api-key-file",
        keys.to_str().unwrap(),
        "--parallel",
        "1",
        "--temperature",
        "0",
    ]);
    let out = Command::new(py)
        .arg(format!(
            "{}/../api/tests/py/{script}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .env("STRATA_URL", &open.url)
        .env("STRATA_KEYED_URL", &keyed.url)
        .env("STRATA_MODEL", MODEL)
        .env("STRATA_RUN_TEXT", run_text.trim_end_matches('\n'))
        .env("STRATA_KEY", "sk-test-key-1234")
        .output()
        .unwrap();
    expect_all_passed(&out);
}

/// Anthropic's Messages API through the official `anthropic` client: greedy text equal to
/// `strata run`'s, the stream's events, tools round trip, count_tokens, structured output, keys
/// as `x-api-key`, errors.
#[test]
fn the_anthropic_client_gets_what_it_expects() {
    run_client_script("anthropic_client.py");
}

/// OpenAI's Responses API through the official `openai` client: text equal to `strata run`'s,
/// the `response.*` events, function calls continued with `previous_response_id`, text.format,
/// stored responses read and deleted, errors naming the field.
#[test]
fn the_responses_api_gets_what_the_openai_client_expects() {
    run_client_script("responses_client.py");
}

/// Ollama's API through the official `ollama` client: chat and generate (NDJSON streams and
/// whole), options, format, tools, tags / show / ps / version / pull, errors, keys.
#[test]
fn the_ollama_client_gets_what_it_expects() {
    run_client_script("ollama_client.py");
}

/// The tool-call eval (`scripts/eval-tools.py`) on the default model: 22 schemas x 2 prompts,
/// forced and auto, through OpenAI's and Anthropic's APIs; at least 95 % of forced requests
/// return a schema-valid call within 128 tokens and every returned call validates.
#[test]
fn tool_call_eval_meets_its_thresholds() {
    let py = python();
    let server = serve(&["--parallel", "4"]);
    let out = Command::new(&py)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/eval-tools.py"
        ))
        .args(["--url", &server.url, "--model", MODEL])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("PASS"), "{stdout}");
}

/// Two models behind one address (the default model and Gemma 3 270M, which has no chat
/// template in its GGUF and gets the built-in one): every API routes by the request's model,
/// the lists name both, unknown models get each API's "not found", metrics carry the model.
#[test]
fn several_models_are_served_by_the_name_each_request_gives() {
    let py = python();
    let server = serve(&[
        "--model",
        "gemma3-270m",
        "--chat-template",
        "gemma3-270m=gemma",
        "--alias",
        "tiny-gemma=gemma3-270m",
        "--ctx-size",
        "2048",
    ]);
    let out = Command::new(&py)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../api/tests/py/several_models.py"
        ))
        .env("STRATA_URL", &server.url)
        .env("STRATA_MODEL", MODEL)
        .env("STRATA_SECOND", "gemma3-270m")
        .env("STRATA_SECOND_ALIAS", "tiny-gemma")
        .output()
        .unwrap();
    expect_all_passed(&out);
}

#[test]
fn bad_aliases_and_sampling_defaults_are_refused_before_loading() {
    for (args, want) in [
        (&["--alias", "x=other-model"][..], "serves"),
        (&["--alias", "=smollm2-135m-instruct"][..], "empty"),
        (&["--alias", MODEL][..], "already names"),
        (&["--model", MODEL][..], "given twice"),
        (
            &["--model", "gemma3-270m", "--alias", "x"][..],
            "name the model",
        ),
        (
            &["--chat-template", "no-such-template"][..],
            "neither a built-in",
        ),
        (&["--cache-mem", "lots"][..], "not a size"),
        (&["--temperature", "3"][..], "--temperature"),
        (&["--top-p", "0"][..], "--top-p"),
        (&["--top-k=-1"][..], "--top-k"),
    ] {
        let out = strata()
            .args(["serve", "--model", MODEL, "--api-addr", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn serving_beyond_loopback_without_keys_is_refused() {
    let out = strata()
        .args(["serve", "--model", MODEL, "--api-addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without API keys"), "{err}");
    let out = strata()
        .args(["serve", "--api-key-file", "/nonexistent/keys"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/keys"));
}

/// `strata serve` on a small synthetic model of `arch` whose template (the family's, or the
/// file `template` under `crates/api/tests/templates`) writes one tool-call syntax: the syntax,
/// not the weights, is under test.
fn serve_synth(dir: &std::path::Path, arch: &str, template: Option<&str>) -> Server {
    let path = dir.join(format!("{arch}-{}.gguf", template.unwrap_or("own")));
    let p = path.to_str().unwrap();
    let mut args = vec![
        "synth",
        "-o",
        p,
        "--arch",
        arch,
        "--type",
        "q8_0",
        "--layers",
        "2",
        "--embd",
        "256",
        "--ff",
        "512",
        "--heads",
        "4",
        "--kv-heads",
        "2",
    ];
    let file = template.map(|t| {
        format!(
            "{}/../api/tests/templates/{t}.jinja",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    if let Some(f) = &file {
        args.extend(["--chat-template", f.as_str()]);
    }
    let out = strata().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serve_model(p, &["--parallel", "2"])
}

#[test]
fn tool_calls_are_written_in_each_familys_syntax() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let servers = [
        ("hermes", serve_synth(dir.path(), "qwen2", None)),
        ("mistral-args", serve_synth(dir.path(), "mistral3", None)),
        ("granite", serve_synth(dir.path(), "granite", None)),
        (
            "mistral-list",
            serve_synth(dir.path(), "llama", Some("mistral-nemo-tools")),
        ),
        (
            "llama3",
            serve_synth(dir.path(), "llama", Some("llama31-tools")),
        ),
        ("harmony", serve_synth(dir.path(), "gpt-oss", None)),
    ];
    let list: Vec<String> = servers
        .iter()
        .map(|(syntax, s)| format!("{syntax}={}", s.url))
        .collect();
    let out = Command::new(&py)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../api/tests/py/call_formats.py"
        ))
        .env("STRATA_SERVERS", list.join(","))
        .output()
        .unwrap();
    expect_all_passed(&out);
}

/// A fixture of `fixtures/reference/`.
fn reference(name: &str) -> serde_json::Value {
    let path = format!(
        "{}/../../fixtures/reference/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The SHA-256 of a JSON list of numbers as f32 bytes (how the embedding fixtures keep
/// vectors).
fn f32_digest(v: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for x in v.as_array().unwrap() {
        h.update((x.as_f64().unwrap() as f32).to_le_bytes());
    }
    format!("{:x}", h.finalize())
}

/// Embeddings through the API are llama.cpp's bit for bit: the server runs the arithmetic of
/// the build that made `fixtures/reference/embeddings-smollm2-135m-instruct.json`
/// (`--numerics`), and each of its mean-pooled texts comes back as the fixture's normalised
/// vector through `/v1/embeddings` and `/api/embed`; with `--pooling last`, each last-token
/// one.
#[test]
fn embeddings_through_the_api_are_llama_cpps() {
    let fx = reference("embeddings-smollm2-135m-instruct");
    let numerics = fx["simd"].as_str().unwrap();
    let server = serve(&["--numerics", numerics]);
    let base = server.url.trim_end_matches("/v1");
    let post = |base: &str, path: &str, body: serde_json::Value| -> serde_json::Value {
        ureq::post(&format!("{base}{path}"))
            .send_json(&body)
            .unwrap()
            .into_body()
            .read_json()
            .unwrap()
    };
    let cases: Vec<&serde_json::Value> = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["pooling"] == "mean")
        .collect();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = &case["prompt"];
        let openai = post(
            base,
            "/v1/embeddings",
            serde_json::json!({"model": MODEL, "input": text, "encoding_format": "float"}),
        );
        assert_eq!(
            f32_digest(&openai["data"][0]["embedding"]),
            case["norm_sha256"],
            "{text}"
        );
        assert_eq!(
            openai["usage"]["prompt_tokens"],
            case["tokens"].as_array().unwrap().len()
        );
        let ollama = post(
            base,
            "/api/embed",
            serde_json::json!({"model": MODEL, "input": text}),
        );
        assert_eq!(
            f32_digest(&ollama["embeddings"][0]),
            case["norm_sha256"],
            "{text}"
        );
    }
    // `--pooling last` pools by the last token instead of the mean a chat model gets.
    let last = serve(&["--numerics", numerics, "--pooling", "last"]);
    let base = last.url.trim_end_matches("/v1");
    for case in fx["cases"].as_array().unwrap() {
        if case["pooling"] == "last" {
            let body = serde_json::json!({"model": MODEL, "input": case["prompt"]});
            let answer = post(base, "/v1/embeddings", body);
            assert_eq!(
                f32_digest(&answer["data"][0]["embedding"]),
                case["norm_sha256"]
            );
        }
    }
}

/// A model whose file names a pooling is an embedding model: served, it answers embeddings
/// with that pooling (a Qwen3-Embedding-shaped synthetic model: last token, EOS appended, as
/// llama.cpp computes it, `fixtures/reference/embeddings-synth-qwen3-embedding.json`) and
/// refuses generation with a 400 that says why.
#[test]
fn an_embedding_model_answers_embeddings_and_refuses_generation() {
    let fx = reference("embeddings-synth-qwen3-embedding");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3-embedding.gguf");
    let sy = &fx["synth"];
    let arg = |k: &str| sy[k].to_string().trim_matches('"').to_string();
    let out = strata()
        .args(["synth", "-o", path.to_str().unwrap()])
        .args(["--arch", &arg("arch"), "--type", &arg("type")])
        .args([
            "--layers",
            &arg("layers"),
            "--embd",
            &arg("embd"),
            "--ff",
            &arg("ff"),
        ])
        .args(["--heads", &arg("heads"), "--kv-heads", &arg("kv_heads")])
        .args(["--pooling", &arg("pooling")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = serve_model(
        path.to_str().unwrap(),
        &["--numerics", fx["simd"].as_str().unwrap()],
    );
    let base = server.url.trim_end_matches("/v1");
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["pooling"] == "last")
        .unwrap();
    let answer: serde_json::Value = ureq::post(&format!("{base}/v1/embeddings"))
        .send_json(serde_json::json!({"model": "qwen3-embedding", "input": case["prompt"]}))
        .unwrap()
        .into_body()
        .read_json()
        .unwrap();
    assert_eq!(
        f32_digest(&answer["data"][0]["embedding"]),
        case["norm_sha256"]
    );
    let chat = ureq::post(&format!("{base}/v1/chat/completions"))
        .config()
        .http_status_as_error(false)
        .build()
        .send_json(serde_json::json!({"model": "qwen3-embedding",
            "messages": [{"role": "user", "content": "Hi"}]}))
        .unwrap();
    assert_eq!(chat.status(), 400);
    let text = chat.into_body().read_to_string().unwrap();
    assert!(text.contains("is an embedding model"), "{text}");
}

/// Requests sent together to a server that speculates get, token for token, the greedy
/// answers of a server that does not: drafts of every stream verified in one pass, a request
/// that turns drafts off or on for itself, and one with a grammar (which takes none). The
/// metrics count what was drafted and accepted.
#[test]
fn speculative_serving_answers_as_plain_serving_does() {
    let list = "- apples, 3 kg\n- pears, 2 kg\n- plums, 5 kg\n- cherries, 1 kg\n- grapes, 4 kg\n";
    let bodies: Vec<serde_json::Value> = vec![
        serde_json::json!({"model": MODEL, "max_tokens": 48, "temperature": 0,
            "messages": [{"role": "user", "content": format!("Repeat this list exactly:\n{list}")}]}),
        serde_json::json!({"model": MODEL, "max_tokens": 48, "temperature": 0,
            "prompt": format!("{list}{list}{list}")}),
        serde_json::json!({"model": MODEL, "max_tokens": 32, "temperature": 0, "speculate": false,
            "prompt": format!("{list}{list}")}),
        serde_json::json!({"model": MODEL, "max_tokens": 32, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a haiku about the sea."}]}),
        serde_json::json!({"model": MODEL, "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": "Give me a fruit as JSON."}],
            "response_format": {"type": "json_object"}}),
    ];
    let answers = |server: &Server, extra: Option<(&str, bool)>| -> Vec<String> {
        std::thread::scope(|s| {
            let calls: Vec<_> = bodies
                .iter()
                .map(|b| {
                    let mut b = b.clone();
                    if let Some((k, v)) = extra {
                        b[k] = v.into();
                    }
                    let route = if b.get("prompt").is_some() {
                        "/v1/completions"
                    } else {
                        "/v1/chat/completions"
                    };
                    let url = format!("{}{route}", server.url);
                    s.spawn(move || {
                        let v: serde_json::Value = ureq::post(&url)
                            .send_json(&b)
                            .unwrap()
                            .into_body()
                            .read_json()
                            .unwrap();
                        let c = &v["choices"][0];
                        c["text"]
                            .as_str()
                            .or(c["message"]["content"].as_str())
                            .unwrap_or_else(|| panic!("{v}"))
                            .to_string()
                    })
                })
                .collect();
            calls.into_iter().map(|c| c.join().unwrap()).collect()
        })
    };
    let plain = serve(&["--parallel", "4"]);
    let want = answers(&plain, None);
    // Turned on per request, on a server that does not speculate by itself.
    assert_eq!(answers(&plain, Some(("speculate", true))), want);
    drop(plain);
    let fast = serve(&["--parallel", "4", "--speculate", "ngram"]);
    assert_eq!(answers(&fast, None), want);
    let count = |name: &str| metric(&fast, name).unwrap_or_else(|| panic!("no {name}"));
    let drafted = count("strata_speculative_drafted_tokens_total{source=\"ngram\"}");
    let accepted = count("strata_speculative_accepted_tokens_total{source=\"ngram\"}");
    assert!(
        accepted > 10.0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
    assert!(count("strata_speculative_verify_passes_total") > 0.0);
}

/// A server with `--speculate suffix` drafts a request's answer from an earlier request's
/// answer, which its own prompt does not hold, and answers token for token as without drafts.
#[test]
fn suffix_drafts_copy_an_earlier_answer_into_another_request() {
    let fast = serve(&["--speculate", "suffix"]);
    let ask = |speculate: bool| -> String {
        let body = serde_json::json!({"model": MODEL, "max_tokens": 64, "temperature": 0,
            "speculate": speculate,
            "messages": [{"role": "user", "content": "Write a short poem about the sea."}]});
        let v: serde_json::Value = ureq::post(format!("{}/v1/chat/completions", fast.url))
            .send_json(&body)
            .unwrap()
            .into_body()
            .read_json()
            .unwrap();
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"))
            .to_string()
    };
    let count = |name: &str| metric(&fast, name).unwrap_or(0.0);
    let suffix = "strata_speculative_accepted_tokens_total{source=\"suffix\"}";
    // Without drafts, nothing is recorded; the first answer with drafts is (little of a poem
    // repeats within itself, so few of its tokens come from drafts).
    let want = ask(false);
    let first = ask(true);
    assert_eq!(first, want);
    let before = count(suffix);
    // The same question again: its answer so far matches the first answer, and what followed
    // there is drafted and accepted.
    assert_eq!(ask(true), want);
    let accepted = count(suffix) - before;
    assert!(
        accepted >= 32.0,
        "{accepted} tokens accepted from suffix drafts for {want:?}"
    );
}

/// The value of the sample `name` (with its labels) in `server`'s `/metrics`, if present.
fn metric(server: &Server, name: &str) -> Option<f64> {
    let metrics = ureq::get(format!("{}/metrics", server.url))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}
