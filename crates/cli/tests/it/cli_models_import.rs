//! End-to-end tests of `strata models import` as a user runs it: the real binary, a store of its
//! own (`STRATA_HOME` in a temp directory, no pip), and a small synthetic model written by
//! `strata synth` with the default model's tokenizer. The last test starts two real `strata node`
//! processes on loopback and has one load a model that only the other imported.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const STRATA: &str = env!("CARGO_BIN_EXE_strata");

/// The default model in the shared store (pulled once if missing): the tokenizer for synth.
fn tokenizer_source() -> PathBuf {
    strata_store::Store::from_env()
        .expect("store")
        .ensure(strata_store::DEFAULT_MODEL_ID)
        .expect("default model")
}

/// `strata ARGS` with its own store at `home`; pip points nowhere, so nothing is downloaded.
fn strata(home: &Path, args: &[&str]) -> Output {
    Command::new(STRATA)
        .args(args)
        .env("STRATA_HOME", home)
        .env("STRATA_PYTHON", home.with_file_name("no-python-here"))
        .output()
        .expect("running strata")
}

/// Stdout of a command that must succeed.
fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

/// Stderr of a command that must fail with one clean line of error.
fn fails(out: &Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} succeeded");
    let err = String::from_utf8(out.stderr.clone()).expect("utf-8 stderr");
    assert!(!err.contains("panicked"), "{what} panicked: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err}");
    assert!(err.starts_with("error: "), "{what}: {err}");
    err
}

/// A 2-layer Llama-family GGUF of about 5 MB at `path`.
fn synth(dir: &Path, path: &Path) {
    let tok = tokenizer_source();
    let out = strata(
        &dir.join("synth-home"),
        &[
            "synth",
            "--arch",
            "llama",
            "--type",
            "q8_0",
            "--layers",
            "2",
            "--embd",
            "64",
            "--ff",
            "128",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--tokenizer-from",
            tok.to_str().unwrap(),
            "-o",
            path.to_str().unwrap(),
        ],
    );
    ok(&out, "synth");
}

/// A temp directory holding a synthetic model `name`, and where its store would be (not yet
/// created).
fn setup(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    synth(dir.path(), &file);
    let home = dir.path().join("home");
    (dir, home, file)
}

/// `file` split as llama.cpp's `gguf-split` lays a set out, as `PREFIX-0000N-of-0000M.gguf`
/// beside it; returns the parts' paths in order.
fn split(file: &Path, prefix: &str) -> Vec<PathBuf> {
    let whole = strata_gguf::GgufFile::open(file).unwrap();
    let parts = strata_gguf::split::split_by_tensors(&whole, 8);
    let n = parts.len() as u32;
    assert!(n >= 3, "only {n} parts");
    parts
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let path = file.with_file_name(strata_gguf::split::part_name(prefix, i as u32 + 1, n));
            std::fs::write(&path, bytes).unwrap();
            path
        })
        .collect()
}

fn sha256_of(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    let text = String::from_utf8(out.stdout).unwrap();
    text.split_whitespace().next().unwrap().to_string()
}

fn listed(home: &Path, id: &str) -> Option<Value> {
    let out = ok(&strata(home, &["models", "list", "--json"]), "models list");
    let all: Value = serde_json::from_str(&out).expect("list json");
    all.as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .cloned()
}

fn run_raw(home: &Path, model: &str) -> Output {
    strata(
        home,
        &[
            "run",
            "-m",
            model,
            "-n",
            "4",
            "--threads",
            "1",
            "--raw",
            "hello",
        ],
    )
}

#[test]
fn an_imported_model_lists_runs_by_id_and_is_removed_with_its_card() {
    // `_dir` holds the temp directory until the end of the test.
    let (_dir, home, file) = setup("Tiny Llama.Q8_0.gguf");
    let original = sha256_of(&file);

    let out = ok(
        &strata(&home, &["models", "import", file.to_str().unwrap()]),
        "import",
    );
    let id = "tiny-llama.q8_0";
    assert!(
        out.contains(&format!("as {id} (hard link)")),
        "import said: {out}"
    );
    let stored = home.join("models").join(id).join("Tiny Llama.Q8_0.gguf");
    assert!(stored.is_file());
    assert!(home.join("models").join(id).join("card.toml").is_file());

    let m = listed(&home, id).expect("the import is listed");
    assert_eq!(m["imported"], true, "{m}");
    assert_eq!(m["present"], true, "{m}");
    assert_eq!(m["size"], std::fs::metadata(&file).unwrap().len(), "{m}");
    assert_eq!(m["sha256"], original, "{m}");
    assert_eq!(m["architecture"], "llama", "{m}");
    assert_eq!(m["quant"], "Q8_0", "{m}");
    assert_eq!(m["source"]["imported_from"], file.to_str().unwrap(), "{m}");
    let table = ok(&strata(&home, &["models", "list"]), "models list");
    assert!(table.contains(&format!("{id}+ ")), "{table}");

    // The id resolves to the imported file: the same greedy text as the file given by path.
    let by_id = ok(&run_raw(&home, id), "run by id");
    let by_path = ok(&run_raw(&home, file.to_str().unwrap()), "run by path");
    assert!(!by_id.trim().is_empty());
    assert_eq!(by_id, by_path);

    // Importing the same file again changes nothing and says so.
    let again = ok(
        &strata(&home, &["models", "import", file.to_str().unwrap()]),
        "re-import",
    );
    assert!(again.contains("nothing to do"), "{again}");
    ok(&strata(&home, &["models", "verify", id]), "verify");

    // Without its file, the import is named as missing here, not pulled.
    std::fs::remove_file(&stored).unwrap();
    let err = fails(&run_raw(&home, id), "run of a missing import");
    assert!(
        err.contains(&format!(
            "imported model '{id}' is not on this node; import it or load it from a peer that has it"
        )),
        "{err}"
    );
    let out = ok(&strata(&home, &["models", "rm", id]), "rm");
    assert!(out.contains("removed its import card"), "{out}");
    assert!(!home.join("models").join(id).exists());
    assert!(listed(&home, id).is_none());
    let err = fails(&run_raw(&home, id), "run of a removed import");
    assert!(err.contains(&format!("unknown model '{id}'")), "{err}");
    // The user's file is untouched (a hard link's removal leaves the original).
    assert_eq!(sha256_of(&file), original);
}

/// A split set is imported from any of its parts, under one id named for the set, with every
/// part pinned by its own hash; it runs as the whole file does and is removed whole.
#[test]
fn a_split_set_imports_as_one_model_from_any_of_its_parts() {
    let (_dir, home, file) = setup("whole.gguf");
    let parts = split(&file, "Tiny-Split");
    let out = ok(
        &strata(&home, &["models", "import", parts[1].to_str().unwrap()]),
        "import of a split set",
    );
    let id = "tiny-split";
    assert!(
        out.contains(&format!("as {id} (hard link)"))
            && out.contains(&format!("in {} parts", parts.len())),
        "import said: {out}"
    );
    let m = listed(&home, id).expect("the import is listed");
    let total: u64 = parts
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(m["present"], true, "{m}");
    assert_eq!(m["file_name"], "Tiny-Split-00001-of-00003.gguf", "{m}");
    assert_eq!(m["sha256"], sha256_of(&parts[0]), "{m}");
    let more = m["more_files"].as_array().expect("more_files");
    assert_eq!(more.len(), parts.len() - 1, "{m}");
    for (f, p) in more.iter().zip(&parts[1..]) {
        assert_eq!(f["sha256"], sha256_of(p), "{m}");
    }
    assert_eq!(
        m["size"].as_u64().unwrap()
            + more
                .iter()
                .map(|f| f["size"].as_u64().unwrap())
                .sum::<u64>(),
        total
    );

    let by_id = ok(&run_raw(&home, id), "run of the split import by id");
    let whole = ok(
        &run_raw(&home, file.to_str().unwrap()),
        "run of the whole file",
    );
    assert!(!by_id.trim().is_empty());
    assert_eq!(by_id, whole);
    ok(&strata(&home, &["models", "verify", id]), "verify");

    // A part that is gone makes the model absent; rm takes the rest and the card.
    let stored = home.join("models").join(id);
    std::fs::remove_file(stored.join("Tiny-Split-00003-of-00003.gguf")).unwrap();
    assert_eq!(listed(&home, id).expect("still listed")["present"], false);
    ok(&strata(&home, &["models", "rm", id]), "rm");
    assert!(!stored.exists());
    assert!(
        parts.iter().all(|p| p.is_file()),
        "the user's parts are untouched"
    );
}

#[test]
fn refused_imports_are_one_line_errors_and_leave_nothing_in_the_store() {
    let (dir, home, good) = setup("good.gguf");

    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, "not a model at all\n").unwrap();
    let err = fails(
        &strata(&home, &["models", "import", junk.to_str().unwrap()]),
        "import of a non-GGUF file",
    );
    assert!(err.contains("cannot be imported"), "{err}");
    assert!(err.contains("GGUF"), "{err}");

    // The same model claiming an architecture the engine does not run.
    let mut bytes = std::fs::read(&good).unwrap();
    let key = b"general.architecture";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("architecture key")
        + key.len();
    // After the key: the value's type (u32) and length (u64), then the string itself.
    let value = at + 4 + 8..at + 4 + 8 + 5;
    assert_eq!(&bytes[value.clone()], b"llama");
    bytes[value].copy_from_slice(b"zzzzz");
    let alien = dir.path().join("alien.gguf");
    std::fs::write(&alien, &bytes).unwrap();
    let err = fails(
        &strata(&home, &["models", "import", alien.to_str().unwrap()]),
        "import of an unsupported architecture",
    );
    assert!(err.contains("unsupported architecture \"zzzzz\""), "{err}");

    // A split set missing a part: named, and nothing is imported.
    let parts = split(&good, "m");
    std::fs::remove_file(&parts[1]).unwrap();
    let err = fails(
        &strata(&home, &["models", "import", parts[0].to_str().unwrap()]),
        "import of a split set without its second part",
    );
    assert!(
        err.contains(&parts[1].file_name().unwrap().to_string_lossy().to_string()),
        "{err}"
    );

    // A good file under a built-in id, a bad id, and a missing file.
    let good = good.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["models", "import", good, "--id", "smollm2-135m-instruct"],
            "already taken by a built-in catalog model",
        ),
        (
            vec!["models", "import", good, "--id", "Bad/Id"],
            "cannot import as 'Bad/Id'",
        ),
        (
            vec!["models", "import", good, "--id", "model.gguf"],
            "would be read as a file path",
        ),
        (
            vec!["models", "import", "/nonexistent/x.gguf"],
            "reading /nonexistent/x.gguf",
        ),
    ] {
        let err = fails(&strata(&home, &args), &format!("{args:?}"));
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(!home.exists(), "the store was touched");
}

// --- two nodes on loopback ---

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One `strata node` on loopback, killed when dropped.
struct Node {
    child: Child,
    api: String,
    log: PathBuf,
}

impl Node {
    fn start(dir: &Path, name: &str, key: &Path, control: u16, peer: Option<u16>) -> Node {
        let api_port = free_port();
        let log = dir.join(format!("{name}.log"));
        let mut cmd = Command::new(STRATA);
        cmd.args(["node", "--name", name, "--no-multicast", "--threads", "1"])
            .args(["--api-addr", &format!("127.0.0.1:{api_port}")])
            .args(["--control-addr", &format!("127.0.0.1:{control}")])
            .args(["--advertise-addr", "127.0.0.1"])
            .arg("--state-dir")
            .arg(dir.join(format!("{name}-state")))
            .arg("--cluster-key-file")
            .arg(key)
            .env("STRATA_HOME", dir.join(format!("{name}-home")))
            .env("STRATA_PYTHON", dir.join("no-python-here"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        if let Some(p) = peer {
            cmd.args(["--peer", &format!("127.0.0.1:{p}")]);
        }
        Node {
            child: cmd.spawn().expect("starting a node"),
            api: format!("http://127.0.0.1:{api_port}"),
            log,
        }
    }

    /// `strata ARGS --node <this node> --json`, parsed, or the error text.
    fn cli(&self, args: &[&str]) -> Result<Value, String> {
        let out = Command::new(STRATA)
            .args(args)
            .args(["--node", &self.api, "--json"])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, limit: Duration, nodes: &[&Node], mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > limit {
            let logs: Vec<String> = nodes.iter().map(|n| n.log()).collect();
            panic!(
                "timed out waiting until {what}; logs:\n{}",
                logs.join("\n---\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_node_loads_a_model_imported_only_on_its_peer() {
    let (dir, _, file) = setup("peer-model.gguf");
    let key = dir.path().join("cluster.key");
    ok(
        &Command::new(STRATA)
            .args(["keygen", "--out"])
            .arg(&key)
            .output()
            .unwrap(),
        "keygen",
    );
    // Only node a has the import, a split set.
    let parts = split(&file, "peer-model");
    let a_home = dir.path().join("a-home");
    ok(
        &strata(&a_home, &["models", "import", parts[0].to_str().unwrap()]),
        "import on a",
    );
    std::fs::remove_file(&file).unwrap();
    for p in &parts {
        std::fs::remove_file(p).unwrap();
    }

    let (ca, cb) = (free_port(), free_port());
    let a = Node::start(dir.path(), "a", &key, ca, None);
    let b = Node::start(dir.path(), "b", &key, cb, Some(ca));
    wait_for(
        "both nodes see each other",
        Duration::from_secs(60),
        &[&a, &b],
        || {
            [&a, &b].iter().all(|n| {
                n.cli(&["status"])
                    .is_ok_and(|s| s["topology"]["nodes"].as_array().map_or(0, Vec::len) == 2)
            })
        },
    );

    // Asked through a, placed on b alone: b must copy the import from a.
    let loaded = a
        .cli(&["load", "peer-model", "--nodes", "b"])
        .unwrap_or_else(|e| panic!("load: {e}\n{}\n---\n{}", a.log(), b.log()));
    assert_eq!(loaded["placement"]["strategy"], "single", "{loaded}");

    // Every part arrived, byte for byte.
    let b_model = dir.path().join("b-home/models/peer-model");
    for p in &parts {
        let name = p.file_name().unwrap();
        assert_eq!(
            sha256_of(&b_model.join(name)),
            sha256_of(&a_home.join("models/peer-model").join(name)),
            "{name:?}"
        );
    }
    assert!(b.log().contains("got peer-model from node"), "{}", b.log());
    // Its log is a file, not a terminal: the copy is reported in lines as it goes.
    assert!(
        b.log().contains("copying peer-model from node")
            && b.log().contains("100 % of")
            && b.log().contains("installed "),
        "{}",
        b.log()
    );
    // b keeps the card: the model is b's import now too, listed and servable.
    let card = std::fs::read_to_string(b_model.join("card.toml")).unwrap();
    assert!(card.contains("imported_from"), "{card}");
    let m = listed(&dir.path().join("b-home"), "peer-model").expect("listed on b");
    assert_eq!(
        (m["imported"].clone(), m["present"].clone()),
        (Value::Bool(true), Value::Bool(true))
    );
}
