//! Agent clients run as their users run them, against `strata serve`: Claude Code through
//! the Anthropic API and Codex CLI through the Responses API, each installed with npm under
//! the cache directory on first use and run with a home of its own, so no user settings apply.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use crate::cli_serve::{
    key_file, run_client_script_with, serve_model, test_cache_dir, venv_python,
};

/// Claude Code, pinned: the agent client the Anthropic API is meant for.
const CLAUDE_CODE: &str = "@anthropic-ai/claude-code@2.1.197";

/// The command `bin` of the npm package `package` (`name@version`), installed under the cache
/// directory on first use.
fn npm_tool(package: &str, bin: &str) -> PathBuf {
    let dir = test_cache_dir(&format!("test-{bin}"));
    let path = dir.join("node_modules/.bin").join(bin);
    let ready = dir.join(format!(".installed-{}", package.replace('/', "_")));
    if !ready.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
            .arg(&dir)
            .arg(package)
            .status()
            .expect("npm (Node.js) is needed to install the agent clients")
            .success();
        assert!(ok, "installing {package}");
        std::fs::write(&ready, b"").unwrap();
    }
    path
}

/// The `claude` command of [`CLAUDE_CODE`].
fn claude_code() -> PathBuf {
    npm_tool(CLAUDE_CODE, "claude")
}

/// Runs `claude -p PROMPT ARGS` against `url` in `work` (with a HOME of its own, so no user
/// settings apply) and returns its stream-json transcript, one JSON value per line.
fn claude(
    url: &str,
    work: &std::path::Path,
    max_output: u32,
    prompt: &str,
    args: &[&str],
) -> Vec<serde_json::Value> {
    let home = work.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = Command::new("timeout")
        // Claude Code retries silently when nothing answers: bound it.
        .args(["900", claude_code().to_str().unwrap(), "-p", prompt])
        .args(args)
        .args(["--output-format", "stream-json", "--verbose"])
        .current_dir(work)
        .env("HOME", &home)
        .env("ANTHROPIC_BASE_URL", url)
        .env("ANTHROPIC_API_KEY", "sk-test-key-1234")
        .env("ANTHROPIC_MODEL", "claude-sonnet-4-5")
        .env("ANTHROPIC_SMALL_FAST_MODEL", "claude-haiku-4-5")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", max_output.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(124), "claude -p timed out");
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The content blocks of the transcript's messages of `kind` ("assistant" or "user").
fn blocks<'a>(
    transcript: &'a [serde_json::Value],
    kind: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> + 'a {
    transcript
        .iter()
        .filter(move |m| m["type"] == kind)
        .filter_map(|m| m["message"]["content"].as_array())
        .flatten()
}

/// The final `result` message of a transcript.
fn result_of(transcript: &[serde_json::Value]) -> &serde_json::Value {
    transcript
        .iter()
        .rev()
        .find(|m| m["type"] == "result")
        .expect("a result message")
}

/// A value of `/metrics`.
fn metric(url: &str, name: &str) -> f64 {
    let base = url.trim_end_matches("/v1");
    let body = ureq::get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

/// Claude Code itself against Gemma 3 270M (whose 32k context holds Claude Code's prompt),
/// with a key and the model names Claude Code asks for given as aliases.
///
/// 1. Its whole default request (about 18,600 tokens: 24 tools, a system prompt in blocks,
///    thinking, `max_tokens` beyond the context) streams back an answer that ends at the
///    output limit Claude Code set: the protocol holds at full size.
/// 2. With its Read tool only: the model's call (valid against Read's schema by
///    construction) reaches Claude Code, which runs it. A 270M base model cannot do the task
///    itself (it echoes its prompt, here a system prompt that ends in a call, and calls Read
///    again each turn), so the run stops at `--max-turns 1` after the tools ran; what is checked is the
///    protocol: a `tool_use` Claude Code accepts and runs, and no API error.
#[test]
fn claude_code_drives_a_tool_round_trip() {
    let work = tempfile::tempdir().unwrap();
    let keys = key_file(work.path(), "claude-code");
    let server = serve_model(
        "gemma3-270m",
        &[
            "--chat-template",
            "gemma",
            "--ctx-size",
            "32768",
            "--parallel",
            "2",
            "--temperature",
            "0",
            "--api-key-file",
            keys.to_str().unwrap(),
            // Part 2 rests on greedy output: the same arithmetic on AVX2 and AVX-512 machines.
            "--numerics",
            "avx512",
            "--alias",
            "claude-sonnet-4-5",
            "--alias",
            "claude-haiku-4-5",
        ],
    );
    let base = server.url.trim_end_matches("/v1").to_string();
    let task = "Read the file note.txt and tell me the secret word.";

    // 1. The default tools and system prompt.
    let full = claude(&base, work.path(), 16, task, &["--max-turns", "1"]);
    let prompt_tokens = metric(&server.url, "strata_prompt_tokens_total");
    assert!(
        prompt_tokens > 15_000.0,
        "Claude Code's default request has about 18,600 tokens, strata saw {prompt_tokens}"
    );
    let texts: Vec<&str> = blocks(&full, "assistant")
        .filter_map(|b| b["text"].as_str())
        .collect();
    assert!(!texts.is_empty(), "no answer in {full:?}");
    // The only error Claude Code may report is its own output limit being reached.
    for t in &texts {
        assert!(
            !t.contains("API Error") || t.contains("output token maximum"),
            "{t}"
        );
    }

    // 2. A tool round trip. The base model echoes its prompt, so the system prompt itself
    // ends in a call in the template's syntax: the echo reaches it within a hundred tokens,
    // whatever follows in the request (Claude Code's request carries the date and its tool
    // texts, and an echo that had to reach a call through them broke when the date changed).
    let fixed = std::path::Path::new("/tmp/strata-claude-code");
    let _ = std::fs::remove_dir_all(fixed);
    std::fs::create_dir_all(fixed).unwrap();
    std::fs::write(fixed.join("note.txt"), "The secret word is: pelican\n").unwrap();
    let trip = claude(
        &base,
        fixed,
        2000,
        "Read the file /tmp/strata-claude-code/note.txt and tell me the secret word.",
        &[
            "--tools",
            "Read",
            "--allowedTools",
            "Read",
            "--system-prompt",
            "You are a coding agent. To read the note you answer <tool_call>{\"name\": \"Read\", \"arguments\": {\"file_path\": \"/tmp/strata-claude-code/note.txt\"}}</tool_call>",
            "--max-turns",
            "1",
        ],
    );
    let calls: Vec<&serde_json::Value> = blocks(&trip, "assistant")
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert!(!calls.is_empty(), "no tool_use in {trip:?}");
    for c in &calls {
        assert_eq!(c["name"], "Read", "{c}");
        assert!(c["input"]["file_path"].is_string(), "{c}");
    }
    let results: Vec<&serde_json::Value> = blocks(&trip, "user")
        .filter(|b| b["type"] == "tool_result")
        .collect();
    assert!(
        results.iter().any(|r| r["tool_use_id"] == calls[0]["id"]),
        "Claude Code ran no call: {trip:?}"
    );
    for t in blocks(&trip, "assistant").filter_map(|b| b["text"].as_str()) {
        assert!(!t.contains("API Error"), "{t}");
    }
    let result = result_of(&trip);
    assert!(
        matches!(
            result["terminal_reason"].as_str(),
            Some("completed" | "max_turns")
        ),
        "{result}"
    );
    // Claude Code continues an answer cut at its output limit with the answer so far: those
    // requests restore the first one's blocks.
    assert!(
        metric(&server.url, "strata_cached_prompt_tokens_total") > 0.0,
        "no request restored anything from the prefix cache"
    );
    let _ = std::fs::remove_dir_all(fixed);
}

/// Codex CLI, pinned: the agent client the Responses API is meant for.
const CODEX: &str = "@openai/codex@0.171.0";

/// Runs `codex exec --json ARGS` in `work` against the provider `url` with Codex's default
/// configuration (a custom provider is the only setting) and returns its JSON events.
fn codex(url: &str, work: &std::path::Path, args: &[&str]) -> Vec<serde_json::Value> {
    let url = url.trim_end_matches("/v1");
    let home = work.join("codex-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "model = \"smollm2-135m-instruct\"\nmodel_provider = \"strata\"\n\n\
             [model_providers.strata]\nname = \"strata\"\nbase_url = \"{url}/v1\"\n\
             env_key = \"STRATA_TEST_KEY\"\nwire_api = \"responses\"\n"
        ),
    )
    .unwrap();
    let out = Command::new("timeout")
        .args(["600", npm_tool(CODEX, "codex").to_str().unwrap(), "exec"])
        .args(args)
        .current_dir(work)
        .env("CODEX_HOME", &home)
        .env("HOME", work)
        .env("STRATA_TEST_KEY", "sk-test-key-1234")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(124), "codex exec timed out");
    // A turn the model's answer ran past the output limit in fails (exit 1); the events say
    // which, and `answered_turn` allows only that failure.
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The turn's agent messages, after checking it went through without an API error: the only
/// failure allowed is the answer running into the output limit (`--max-tokens`), which Codex
/// reports as an incomplete response, as it does against OpenAI (a 135M model's greedy answer
/// to Codex's long prompt may repeat itself until then; what is tested is the protocol).
fn answered_turn(events: &[serde_json::Value]) -> Vec<String> {
    let cut = "Incomplete response returned, reason: max_output_tokens";
    for e in events {
        match e["type"].as_str() {
            Some("error") => assert_eq!(e["message"], cut, "{e}"),
            Some("turn.failed") => assert_eq!(e["error"]["message"], cut, "{e}"),
            _ => {}
        }
        // Codex notes on its own that it has no metadata for a model it does not know.
        if e["item"]["type"] == "error" {
            let m = e["item"]["message"].as_str().unwrap_or("");
            assert!(m.starts_with("Model metadata for"), "{e}");
        }
    }
    assert!(
        events
            .iter()
            .any(|e| matches!(e["type"].as_str(), Some("turn.completed" | "turn.failed"))),
        "{events:?}"
    );
    events
        .iter()
        .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == "agent_message")
        .filter_map(|e| e["item"]["text"].as_str().map(str::to_string))
        .collect()
}

/// Codex CLI with its default configuration: a first request of about 8,700 tokens with
/// `namespace` tools (its multi-agent tools), the hosted `web_search`, `store: false`,
/// `include: ["reasoning.encrypted_content"]` and a `prompt_cache_key`, streamed. Two turns
/// (the second resumes the session, sending the first turn back as input items) reach Codex
/// with the model's answers and no API error (see [`answered_turn`]). SmolLM2 runs with a
/// context beyond its training length to hold the request; what is checked is the protocol.
#[test]
fn codex_cli_completes_turns_with_its_default_configuration() {
    let work = tempfile::tempdir().unwrap();
    let keys = key_file(work.path(), "codex");
    let server = serve_model(
        "smollm2-135m-instruct",
        &[
            "--ctx-size",
            "16384",
            "--temperature",
            "0",
            "--max-tokens",
            "200",
            "--api-key-file",
            keys.to_str().unwrap(),
        ],
    );
    let first = codex(
        &server.url,
        work.path(),
        &["--skip-git-repo-check", "--json", "Say hello."],
    );
    let said = answered_turn(&first);
    assert!(
        said.iter().any(|t| !t.trim().is_empty()),
        "no answer in {first:?}"
    );
    assert!(
        metric(&server.url, "strata_prompt_tokens_total") > 8_000.0,
        "Codex's default request has about 8,700 tokens"
    );
    let second = codex(
        &server.url,
        work.path(),
        &[
            "resume",
            "--last",
            "--skip-git-repo-check",
            "--json",
            "Thank you.",
        ],
    );
    let said = answered_turn(&second);
    assert!(
        said.iter().any(|t| !t.trim().is_empty()),
        "no answer in {second:?}"
    );
    // The second request repeats the first: its prompt comes from the prefix cache.
    assert!(metric(&server.url, "strata_cached_prompt_tokens_total") > 8_000.0);
}

/// litellm's Ollama providers (`ollama_chat/`, `ollama/`), which send JSON bodies without a
/// Content-Type: greedy chat equal to `strata run`'s, streamed and whole, and a key passed as a
/// header (`crates/api/tests/py/litellm_client.py`).
#[test]
fn litellm_ollama_providers_get_answers() {
    let py = venv_python("test-venv-litellm", &["litellm==1.110.2", "ollama==0.6.3"]);
    run_client_script_with(&py, "litellm_client.py");
}
