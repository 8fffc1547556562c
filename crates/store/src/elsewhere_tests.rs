#![allow(clippy::unwrap_used)]
use super::*;

/// Writes `bytes` at `dir/rel`, making its folders.
fn put(dir: &Path, rel: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A hub cache holding `owner/repo` at commit `c0ffee` (refs/main), its files linked from the
/// snapshot to blobs as the hub's clients lay them out.
fn hub(files: &[&str]) -> (tempfile::TempDir, Elsewhere) {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("models--owner--repo");
    put(&repo, "refs/main", b"c0ffee");
    put(&repo, "refs/v2", b"beef");
    for (i, f) in files.iter().enumerate() {
        let blob = put(&repo, &format!("blobs/{i:064x}"), f.as_bytes());
        let link = repo.join("snapshots/c0ffee").join(f);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&blob, &link).unwrap();
    }
    put(&repo, "snapshots/beef/old-Q8_0.gguf", b"old");
    let e = Elsewhere {
        hf_hub: Some(t.path().to_path_buf()),
        ..Elsewhere::default()
    };
    (t, e)
}

fn resolved(e: &Elsewhere, spec: &str) -> Result<String> {
    e.resolve(spec)
        .unwrap()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
}

#[test]
fn a_hub_repository_resolves_by_tag_with_split_sets_as_one_model() {
    let (_t, e) = hub(&[
        "Qwen3-8B-Q4_K_M.gguf",
        "Qwen3-8B-Q8_0.gguf",
        "Q6/Qwen3-8B-Q6_K-00001-of-00002.gguf",
        "Q6/Qwen3-8B-Q6_K-00002-of-00002.gguf",
        "README.md",
    ]);
    assert_eq!(
        resolved(&e, "hf:owner/repo:q4_k_m").unwrap(),
        "Qwen3-8B-Q4_K_M.gguf"
    );
    assert_eq!(
        resolved(&e, "hf:owner/repo:Q6_K").unwrap(),
        "Qwen3-8B-Q6_K-00001-of-00002.gguf"
    );
    assert_eq!(
        resolved(&e, "hf:owner/repo/Qwen3-8B-Q8_0.gguf").unwrap(),
        "Qwen3-8B-Q8_0.gguf"
    );
    // Another revision, by ref and by commit.
    assert_eq!(
        resolved(&e, "hf:owner/repo:Q8_0@v2").unwrap(),
        "old-Q8_0.gguf"
    );
    assert_eq!(resolved(&e, "hf:owner/repo@beef").unwrap(), "old-Q8_0.gguf");
    // No tag among several, a missing tag, an unknown repository: what there is, in one line.
    let e1 = resolved(&e, "hf:owner/repo").unwrap_err().to_string();
    assert!(
        e1.contains(":Q4_K_M") && e1.contains(":Q6_K") && e1.contains(":Q8_0"),
        "{e1}"
    );
    let e2 = resolved(&e, "hf:owner/repo:IQ4_XS")
        .unwrap_err()
        .to_string();
    assert!(e2.contains("no IQ4_XS") && e2.contains("Q4_K_M"), "{e2}");
    let e3 = resolved(&e, "hf:owner/other:Q4_K_M")
        .unwrap_err()
        .to_string();
    assert!(e3.contains("not in the Hugging Face cache"), "{e3}");
    for bad in [
        "hf:owner",
        "hf:/repo",
        "hf:owner/../x",
        "hf:owner/repo/../../x.gguf",
    ] {
        assert!(resolved(&e, bad).is_err(), "{bad}");
    }
    assert!(e.resolve("smollm2-135m-instruct").is_none());
    let listed: Vec<String> = e.list().into_iter().map(|f| f.id).collect();
    assert_eq!(
        listed,
        [
            "hf:owner/repo:Q4_K_M",
            "hf:owner/repo:Q6_K",
            "hf:owner/repo:Q8_0"
        ]
    );
}

#[test]
fn an_ollama_model_is_its_manifests_model_layer() {
    let t = tempfile::tempdir().unwrap();
    let hex = "ab".repeat(32);
    let manifest = format!(
        r#"{{"schemaVersion":2,"layers":[
            {{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:{}"}},
            {{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{hex}"}}]}}"#,
        "cd".repeat(32)
    );
    put(
        t.path(),
        "manifests/registry.ollama.ai/library/qwen3/8b",
        manifest.as_bytes(),
    );
    put(
        t.path(),
        "manifests/registry.ollama.ai/library/qwen3/latest",
        manifest.as_bytes(),
    );
    put(
        t.path(),
        "manifests/registry.ollama.ai/someone/tiny/q4",
        manifest.as_bytes(),
    );
    put(
        t.path(),
        "manifests/registry.ollama.ai/library/broken/latest",
        b"{\"layers\":[]}",
    );
    let blob = put(t.path(), &format!("blobs/sha256-{hex}"), b"GGUF...");
    let e = Elsewhere {
        ollama: Some(t.path().to_path_buf()),
        ..Elsewhere::default()
    };
    for spec in ["ollama:qwen3:8b", "ollama:qwen3", "ollama:someone/tiny:q4"] {
        assert_eq!(e.resolve(spec).unwrap().unwrap(), blob, "{spec}");
    }
    let missing = e
        .resolve("ollama:llama3:70b")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(missing.contains("ollama pull llama3:70b"), "{missing}");
    let broken = e.resolve("ollama:broken").unwrap().unwrap_err().to_string();
    assert!(broken.contains("no model layer"), "{broken}");
    let listed: Vec<String> = e.list().into_iter().map(|f| f.id).collect();
    assert_eq!(
        listed,
        [
            "ollama:qwen3:8b",
            "ollama:qwen3:latest",
            "ollama:someone/tiny:q4"
        ]
    );
}

#[test]
fn lm_studio_models_resolve_like_hub_repositories() {
    let t = tempfile::tempdir().unwrap();
    put(
        t.path(),
        "lmstudio-community/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf",
        b"x",
    );
    put(t.path(), "bartowski/Tiny-GGUF/tiny.gguf", b"y");
    let e = Elsewhere {
        lmstudio: vec![t.path().join("missing"), t.path().to_path_buf()],
        ..Elsewhere::default()
    };
    assert_eq!(
        resolved(&e, "lmstudio:lmstudio-community/Qwen3-8B-GGUF:Q4_K_M").unwrap(),
        "Qwen3-8B-Q4_K_M.gguf"
    );
    assert_eq!(
        resolved(&e, "lmstudio:bartowski/Tiny-GGUF").unwrap(),
        "tiny.gguf"
    );
    let listed: Vec<String> = e.list().into_iter().map(|f| f.id).collect();
    assert_eq!(
        listed,
        [
            "lmstudio:bartowski/Tiny-GGUF",
            "lmstudio:lmstudio-community/Qwen3-8B-GGUF:Q4_K_M"
        ]
    );
}
