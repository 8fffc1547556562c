//! End-to-end tests of Hugging Face references as a user runs them: the real binary against a
//! local hub that speaks the real one's protocol (`strata-testhub`, `HF_ENDPOINT`), serving
//! the default model as a llama.cpp-style split set. A pull killed mid-way resumes from what
//! it held, `strata run -m hf:...` answers what the catalog model answers (pulling by itself
//! when the model is not in the cache), and gated repositories take a token from a file that
//! never shows up in any output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use strata_testhub::{Kind, TestHub};

const STRATA: &str = env!("CARGO_BIN_EXE_strata");
const REPO: &str = "someone/SmolLM2-135M-Instruct-GGUF";
const COPY: &str = "someone/SmolLM2-copy";
const GATED: &str = "someone/gated";
const TOKEN: &str = "hf_secret_0123456789";

struct World {
    dir: tempfile::TempDir,
    hub: TestHub,
    catalog: PathBuf,
}

impl World {
    fn cache(&self) -> PathBuf {
        self.dir.path().join("hf-cache")
    }

    fn strata(&self, args: &[&str]) -> Command {
        let mut c = Command::new(STRATA);
        c.args(args)
            .env("STRATA_HOME", self.dir.path().join("home"))
            .env("STRATA_PYTHON", self.dir.path().join("no-python-here"))
            .env("HF_ENDPOINT", self.hub.endpoint())
            .env("HF_HUB_CACHE", self.cache())
            .env("HF_HOME", self.dir.path().join("hf-home"))
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE")
            .env("OLLAMA_MODELS", self.dir.path().join("none"))
            .env("LMSTUDIO_MODELS", self.dir.path().join("none"));
        c
    }

    fn output(&self, args: &[&str]) -> Output {
        self.strata(args).output().expect("running strata")
    }

    /// The greedy answer of `model`.
    fn answer(&self, model: &str) -> String {
        let out = self.output(&[
            "run",
            "-m",
            model,
            "--threads",
            "2",
            "--max-tokens",
            "12",
            "--numerics",
            "avx2",
            "Name three rivers.",
        ]);
        assert!(
            out.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// The default model split into parts (as `llama-gguf-split` lays them out) in two
/// repositories, and a small gated one.
fn world() -> World {
    let catalog = strata_store::Store::from_env()
        .expect("store")
        .ensure(strata_store::DEFAULT_MODEL_ID)
        .expect("default model");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("hub-root");
    let whole = strata_gguf::GgufFile::open(&catalog).unwrap();
    let parts = strata_gguf::split::split_by_tensors(&whole, 100);
    let n = parts.len() as u32;
    assert!(n >= 2, "the model splits into parts");
    for repo in [REPO, COPY] {
        std::fs::create_dir_all(root.join(repo)).unwrap();
        std::fs::write(root.join(repo).join("README.md"), "SmolLM2 in parts\n").unwrap();
        for (i, bytes) in parts.iter().enumerate() {
            let name = strata_gguf::split::part_name("SmolLM2-135M-Instruct-Q4_1", i as u32 + 1, n);
            std::fs::write(root.join(repo).join(name), bytes).unwrap();
        }
    }
    drop(parts);
    std::fs::create_dir_all(root.join(GATED)).unwrap();
    std::fs::write(root.join(GATED).join("tiny-Q4_0.gguf"), vec![7u8; 200_000]).unwrap();
    let hub = TestHub::builder(&root)
        .gated(GATED, &[TOKEN])
        .start()
        .unwrap();
    World { dir, hub, catalog }
}

/// Every file under `dir`, recursively, with its size.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        if md.is_dir() {
            out.extend(files_under(&e.path()));
        } else {
            out.push((e.path(), md.len()));
        }
    }
    out
}

#[test]
fn a_killed_pull_resumes_and_the_split_model_runs_like_the_catalog_one() {
    let w = world();
    let total = std::fs::metadata(&w.catalog).unwrap().len();
    let id = format!("hf:{REPO}:Q4_1");
    // Slow enough to kill mid-way: each stream gets 6 MB/s.
    w.hub.faults().set_stream_rate(6 << 20);
    let mut child = w
        .strata(&["models", "pull", &id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while w.hub.stats().cdn_bytes() < total / 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the pull did not progress"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pull ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let first = w.hub.stats().cdn_bytes();
    assert!(first < total, "killed before the end");

    w.hub.reset().unwrap();
    let out = w.output(&["models", "pull", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = w.hub.stats().cdn_bytes();
    assert!(
        second + total / 4 <= total,
        "the second pull fetched {second} of {total} bytes: it did not resume"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("downloaded"), "{stderr}");
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(
        path.starts_with(
            w.cache()
                .join("models--someone--SmolLM2-135M-Instruct-GGUF/snapshots")
        )
    );
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("SmolLM2-135M-Instruct-Q4_1-00001-of-"),
        "{name}"
    );
    assert!(path.exists());
    let leftovers: Vec<_> = files_under(&w.cache())
        .into_iter()
        .filter(|(p, _)| p.to_string_lossy().contains("strata-partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Every part checks against the hub's SHA-256, offline.
    let out = w
        .strata(&["models", "verify", &id])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parts = report
        .lines()
        .filter(|l| l.starts_with("ok ") && l.contains(" sha256 "))
        .count();
    assert!(parts >= 2 && report.lines().count() == parts, "{report}");

    // In the cache now: running it asks the hub nothing and answers as the catalog model does.
    w.hub.reset().unwrap();
    let reference = w.answer(w.catalog.to_str().unwrap());
    assert!(!reference.trim().is_empty());
    assert_eq!(w.answer(&id), reference);
    let stats = w.hub.stats();
    assert_eq!(
        stats.requests_of(Kind::Api) + stats.requests_of(Kind::Cdn),
        0
    );
}

#[test]
fn run_pulls_a_model_it_does_not_have_and_lists_it() {
    let w = world();
    let id = format!("hf:{COPY}:q4_1");
    let reference = w.answer(w.catalog.to_str().unwrap());
    assert_eq!(w.answer(&id), reference);
    let total = std::fs::metadata(&w.catalog).unwrap().len();
    assert!(
        w.hub.stats().cdn_bytes() >= total * 9 / 10,
        "run fetched the model"
    );
    let list = w.output(&["models", "list"]);
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.contains(&format!("hf:{COPY}:Q4_1")), "{list}");

    // `models rm` takes it out of the hub cache again.
    let out = w.output(&["models", "rm", &id]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("removed"), "{said}");
    let list = w.output(&["models", "list"]);
    assert!(!String::from_utf8_lossy(&list.stdout).contains(COPY));

    // Offline, the cache still serves it and a model not there is a clear error.
    let out = w
        .strata(&["run", "-m", &format!("hf:{REPO}:Q4_1"), "hi"])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(REPO), "{err}");
}

#[test]
fn a_gated_repository_takes_a_token_from_a_file_and_never_shows_it() {
    let w = world();
    let id = format!("hf:{GATED}");
    let out = w.output(&["models", "pull", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("gated") && err.contains("--hf-token-file"),
        "{err}"
    );

    let token_file = w.dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let out = w
        .strata(&[
            "--hf-token-file",
            token_file.to_str().unwrap(),
            "models",
            "pull",
            &id,
        ])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stderr.contains(TOKEN) && !stdout.contains(TOKEN),
        "the token was shown"
    );
    assert!(
        !w.hub.stats().cdn_saw_authorization,
        "the token reached the CDN"
    );

    // HF_TOKEN works the same way; a missing token file is refused before anything runs.
    let out = w
        .strata(&["models", "pull", &id])
        .env("HF_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let asked = w.hub.stats().requests_of(Kind::Api);
    let out = w.output(&[
        "--hf-token-file",
        "/nonexistent/token",
        "models",
        "pull",
        &id,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("/nonexistent/token"),
        "{err}"
    );
    assert_eq!(
        w.hub.stats().requests_of(Kind::Api),
        asked,
        "the refused run asked nothing"
    );
}

#[test]
fn a_hub_that_keeps_failing_is_one_clear_line() {
    let w = world();
    w.hub.faults().fail_next(Kind::Api, 1000, 404);
    let out = w.output(&["models", "pull", &format!("hf:{REPO}:Q4_1")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("404"), "{err}");
}

#[test]
fn serve_pulls_a_hub_model_and_answers_for_it() {
    use std::io::{BufRead, BufReader};
    let w = world();
    let id = format!("hf:{COPY}:Q4_1");
    let mut child = w
        .strata(&[
            "serve",
            "--model",
            &id,
            "--api-addr",
            "127.0.0.1:0",
            "--threads",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let url = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("strata serve exited before serving:\n{}", seen.join("\n"));
        };
        if let Some(at) = line.find("http://") {
            break line[at..].split_whitespace().next().unwrap().to_string();
        }
        seen.push(line);
    };
    std::thread::spawn(move || for _ in lines {});
    let curl = |path: &str, body: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-s", "-m", "60", "-H", "content-type: application/json"]);
        if let Some(b) = body {
            c.args(["-d", b]);
        }
        let out = c.arg(format!("{url}{path}")).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let models: serde_json::Value = serde_json::from_str(&curl("/v1/models", None)).unwrap();
    let name = models["data"][0]["id"].as_str().unwrap().to_string();
    assert!(name.contains("SmolLM2-copy"), "{models}");
    let body = serde_json::json!({
        "model": name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
    });
    let answer: serde_json::Value =
        serde_json::from_str(&curl("/v1/completions", Some(&body.to_string()))).unwrap();
    let text = answer["choices"][0]["text"].as_str().unwrap_or_default();
    assert!(!text.is_empty(), "{answer}");
    let total = std::fs::metadata(&w.catalog).unwrap().len();
    assert!(
        w.hub.stats().cdn_bytes() >= total * 9 / 10,
        "serve fetched the model"
    );

    // Ollama's pull takes a hub reference too: every part, with progress under each part's
    // name, into the hub cache.
    let before = w.hub.stats().cdn_bytes();
    let pull = serde_json::json!({"model": format!("hf:{REPO}:Q4_1")}).to_string();
    let lines: Vec<serde_json::Value> = curl("/api/pull", Some(&pull))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    let digests: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter(|l| l["completed"].is_u64())
        .map(|l| l["digest"].as_str().unwrap())
        .collect();
    assert!(
        digests.len() >= 2 && digests.iter().all(|d| d.contains("-of-")),
        "{digests:?}"
    );
    assert!(w.hub.stats().cdn_bytes() - before >= total * 9 / 10);
    let repo_dir = w
        .cache()
        .join(format!("models--{}", REPO.replace('/', "--")));
    let held: u64 = files_under(&repo_dir.join("blobs"))
        .iter()
        .map(|f| f.1)
        .sum();
    assert!(held >= total, "{held} of {total} bytes in the cache");
    // Once there, a pull says so without a byte from the hub.
    let fetched = w.hub.stats().cdn_bytes();
    let again = curl("/api/pull", Some(&pull));
    assert!(again.contains("in the store already"), "{again}");
    assert_eq!(w.hub.stats().cdn_bytes(), fetched);
    // A repository the hub does not have is a 404 naming it (one answer when not streamed).
    let out = Command::new("curl")
        .args(["-s", "-m", "60", "-H", "content-type: application/json"])
        .args(["-w", "\n%{http_code}", "-d"])
        .arg(r#"{"model": "hf:nobody/nothing", "stream": false}"#)
        .arg(format!("{url}/api/pull"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.ends_with("404") && text.contains("nobody/nothing"),
        "{text}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
