//! End-to-end tests of `strata run` as a user runs it: a real process on the real model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    // Make sure the default model is in the store first, so the test output is only the run's.
    strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("default model");
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("running strata")
}

fn fixture_case(i: usize) -> serde_json::Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/reference/smollm2-135m-instruct.json"
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["cases"][i].clone()
}

#[test]
fn greedy_chat_run_prints_llama_cpp_text_and_stats() {
    let case = fixture_case(0);
    // The reference came from an AVX-512 build of llama.cpp.
    let out = strata(&[
        "run",
        "--numerics",
        "avx512",
        "--threads",
        "2",
        "--max-tokens",
        "64",
        "--stats-json",
        case["prompt"].as_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim_end(),
        case["generated_text"].as_str().unwrap().trim_end()
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    let stats: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!(
        stats["prompt_tokens"],
        case["prompt_ids"].as_array().unwrap().len()
    );
    assert_eq!(stats["completion_tokens"], 64);
    for k in ["ttft_ms", "prefill_tok_s", "decode_tok_s"] {
        assert!(stats[k].as_f64().unwrap() > 0.0, "{k}");
    }
}

/// With prompt-lookup drafts the text is still llama.cpp's on its reference prompts, and a
/// prompt whose answer copies it gets drafts accepted and the same text as without them.
#[test]
fn speculative_runs_print_the_same_text() {
    let run = |extra: &[&str], prompt: &str| -> (String, serde_json::Value) {
        let mut args = vec!["run", "--numerics", "avx512", "--max-tokens", "64"];
        args.extend_from_slice(extra);
        args.extend(["--stats-json", prompt]);
        let out = strata(&args);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(out.status.success(), "{stderr}");
        let stats = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
        (String::from_utf8(out.stdout).unwrap(), stats)
    };
    // The cases without a system prompt of their own.
    for i in [0, 1, 3] {
        let case = fixture_case(i);
        let (text, stats) = run(&["--speculate", "ngram"], case["prompt"].as_str().unwrap());
        assert_eq!(
            text.trim_end(),
            case["generated_text"].as_str().unwrap().trim_end()
        );
        assert!(stats["speculation"].is_object(), "{stats}");
    }
    let code = "Repeat this list exactly:\n- apples, 3 kg\n- pears, 2 kg\n- plums, 5 kg\n\
                - cherries, 1 kg\n- grapes, 4 kg\n";
    let (want, plain) = run(&["--speculate", "off"], code);
    let (got, stats) = run(&["--speculate", "ngram"], code);
    assert_eq!(got, want);
    assert!(plain.get("speculation").is_none(), "{plain}");
    assert!(
        stats["speculation"]["accepted"].as_u64().unwrap() > 0,
        "{stats}"
    );
}

#[test]
fn greedy_raw_run_matches_llama_cpp() {
    let case = fixture_case(4);
    let out = strata(&[
        "run",
        "--raw",
        "--numerics",
        "avx512",
        "--threads",
        "1",
        "-n",
        "64",
        case["prompt"].as_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim_end(),
        case["generated_text"].as_str().unwrap().trim_end()
    );
}

fn fails_with(args: &[&str], needle: &str) {
    let out = strata(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    fails_with(
        &["run", "--model", "no-such-model", "hi"],
        "unknown model 'no-such-model'",
    );

    let dir = tempdir();
    let model = strata_store::Store::from_env()
        .unwrap()
        .path("smollm2-135m-instruct")
        .unwrap();
    let bytes = std::fs::read(&model).unwrap();
    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(
        &["run", "--model", truncated.to_str().unwrap(), "hi"],
        "exceeds file size",
    );
    let garbage = dir.join("garbage.gguf");
    std::fs::write(&garbage, b"not a model at all").unwrap();
    fails_with(
        &["run", "--model", garbage.to_str().unwrap(), "hi"],
        "not a GGUF file",
    );

    let long = "word ".repeat(3000);
    fails_with(
        &["run", "--raw", "--ctx-size", "512", &long],
        "context overflow",
    );
    fails_with(&["run", "--top-p", "2", "hi"], "--top-p");
    // A context no machine can hold is refused, not an allocation abort.
    fails_with(
        &["run", "--ctx-size", "100000000000", "hi"],
        "cannot allocate a KV cache",
    );
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("strata-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bad_options_are_refused_in_one_line_before_any_model_loads() {
    // A model path that does not exist: an error about it would mean the options were checked
    // after the load began.
    let missing = "/nonexistent/strata-test-model.gguf";
    let cases: [(&[&str], &str); 9] = [
        (&["--temperature", "-1", "hi"], "--temperature must be >= 0"),
        (&["--temperature=-1", "hi"], "--temperature must be >= 0"),
        (&["--top-p", "2", "hi"], "--top-p must be in (0, 1]"),
        (
            &["--max-tokens", "0", "hi"],
            "'--max-tokens <MAX_TOKENS>': takes a whole number, 1 or more",
        ),
        (
            &["--max-tokens", "-1", "hi"],
            "'--max-tokens <MAX_TOKENS>': takes a whole number, 1 or more",
        ),
        (
            &["--threads", "0", "hi"],
            "'--threads <THREADS>': takes a whole number",
        ),
        (
            &["--ctx-size", "0", "hi"],
            "'--ctx-size <CTX_SIZE>': takes a whole number",
        ),
        (&["  "], "the prompt is empty"),
        (&[], "no prompt"),
    ];
    refused_in_one_line(&["run", "-m", missing], &cases);
}

/// Each `(args, want)`: `strata PREFIX ARGS` fails with one line of stderr containing `want`
/// and never reaches the (missing) model file.
fn refused_in_one_line(prefix: &[&str], cases: &[(&[&str], &str)]) {
    for &(args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(prefix)
            .args(args)
            .output()
            .expect("running strata");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("nonexistent"),
            "{args:?} loaded first: {stderr}"
        );
    }
}

#[test]
fn serve_and_models_refuse_bad_options_in_their_own_words() {
    let missing = "/nonexistent/strata-test-model.gguf";
    let cases: [(&[&str], &str); 7] = [
        (
            &["serve", "--model", missing, "--temperature", "-1"],
            "--temperature must be between 0 and 2",
        ),
        (
            &["serve", "--model", missing, "--ctx-size", "0"],
            "'--ctx-size <CTX_SIZE>': takes a whole number, 1 or more",
        ),
        (
            &["serve", "--model", missing, "--max-body", "0"],
            "'--max-body <MAX_BODY>': takes a whole number, 1 or more",
        ),
        (
            &["serve", "--model", missing, "--parallel", "-2"],
            "'--parallel <PARALLEL>': takes a whole number, 1 or more",
        ),
        (
            &["serve", "--model", missing, "--cache-mem", "-5"],
            "is not a size",
        ),
        (
            &["models", "pull", "nope"],
            "`strata models pull` takes a model id, and 'nope' is none",
        ),
        (
            &["models", "rm", "nope"],
            "`strata models rm` takes a model id",
        ),
    ];
    refused_in_one_line(&[], &cases);
}

#[test]
fn the_prompt_can_come_from_a_file_or_standard_input() {
    use std::io::Write;
    let prompt = "The capital of France is";
    let base = ["run", "--raw", "--max-tokens", "8", "--threads", "2"];
    let direct = strata(&[&base[..], &[prompt]].concat());
    assert!(direct.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    let from_file = strata(&[&base[..], &["-f", file.to_str().unwrap()]].concat());
    assert!(from_file.status.success());
    assert_eq!(from_file.stdout, direct.stdout);
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(base)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running strata");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(prompt.as_bytes())
        .unwrap();
    let from_stdin = child.wait_with_output().unwrap();
    assert!(from_stdin.status.success());
    assert_eq!(from_stdin.stdout, direct.stdout);
    assert!(!direct.stdout.is_empty());
}

/// Models other tools downloaded run in place by their ids: SmolLM2 as a split set in a
/// Hugging Face cache (`hf:owner/repo:Q4_1`, its parts linked into blobs as the hub's clients
/// lay them out) and as an Ollama blob (`ollama:smollm2:135m`) answer what the catalog model
/// answers, and `strata models list` shows both.
#[test]
fn models_other_tools_downloaded_run_in_place_by_their_ids() {
    let catalog = strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("default model");
    let home = tempfile::tempdir().unwrap();
    let whole = strata_gguf::GgufFile::open(&catalog).unwrap();
    let parts = strata_gguf::split::split_by_tensors(&whole, 100);
    let repo = home.path().join("hub/models--someone--SmolLM2-GGUF");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    let snap = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    let n = parts.len() as u32;
    for (i, bytes) in parts.iter().enumerate() {
        let blob = repo.join(format!("blobs/{i:064x}"));
        std::fs::write(&blob, bytes).unwrap();
        let name = strata_gguf::split::part_name("SmolLM2-135M-Q4_1", i as u32 + 1, n);
        std::os::unix::fs::symlink(&blob, snap.join(name)).unwrap();
    }
    drop(parts);
    let ollama = home.path().join("ollama");
    let hex = "5e".repeat(32);
    std::fs::create_dir_all(ollama.join("manifests/registry.ollama.ai/library/smollm2")).unwrap();
    std::fs::create_dir_all(ollama.join("blobs")).unwrap();
    std::fs::write(
        ollama.join("manifests/registry.ollama.ai/library/smollm2/135m"),
        format!(
            r#"{{"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{hex}"}}]}}"#
        ),
    )
    .unwrap();
    std::fs::hard_link(&catalog, ollama.join(format!("blobs/sha256-{hex}")))
        .or_else(|_| {
            std::fs::copy(&catalog, ollama.join(format!("blobs/sha256-{hex}"))).map(|_| ())
        })
        .unwrap();
    let run = |model: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["run", "-m", model, "--threads", "2", "--max-tokens", "12"])
            .args(["--numerics", "avx2", "Name three rivers."])
            .env("HF_HUB_CACHE", home.path().join("hub"))
            .env("OLLAMA_MODELS", &ollama)
            .env("LMSTUDIO_MODELS", home.path().join("none"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let reference = run("smollm2-135m-instruct");
    assert!(!reference.trim().is_empty());
    assert_eq!(run("hf:someone/SmolLM2-GGUF:q4_1"), reference);
    assert_eq!(run("ollama:smollm2:135m"), reference);
    let list = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["models", "list"])
        .env("HF_HUB_CACHE", home.path().join("hub"))
        .env("OLLAMA_MODELS", &ollama)
        .env("LMSTUDIO_MODELS", home.path().join("none"))
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.contains("hf:someone/SmolLM2-GGUF:Q4_1"), "{list}");
    assert!(list.contains("ollama:smollm2:135m"), "{list}");
    // A tag the repository does not have says what it has.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", "-m", "hf:someone/SmolLM2-GGUF:Q8_0", "hi"])
        .env("HF_HUB_CACHE", home.path().join("hub"))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Q4_1"), "{err}");
}
