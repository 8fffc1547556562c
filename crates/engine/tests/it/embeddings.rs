//! Embeddings bit for bit as llama.cpp computes them (`fixtures/reference/embeddings-*.json`,
//! made by `scripts/make-embedding-reference.py` with llama.cpp's own pooling and
//! normalisation): each prompt's tokens, the pooled vector and the normalised one, as the
//! SHA-256 of their f32 bytes, for mean, last-token and CLS pooling over prompts of 1 to 64
//! tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use sha2::{Digest, Sha256};
use strata_engine::embed::{Pooling, normalize, pool_states};
use strata_gguf::GgufFile;
use strata_kernels::ThreadPool;
use strata_kernels::attn::Flavour;

fn digest(v: &[f32]) -> String {
    let mut h = Sha256::new();
    for x in v {
        h.update(x.to_le_bytes());
    }
    format!("{:x}", h.finalize())
}

fn fixture(name: &str) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/../../fixtures/reference/embeddings-{name}.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap()
}

fn catalog(id: &str) -> std::path::PathBuf {
    strata_store::Store::from_env().unwrap().ensure(id).unwrap()
}

fn check(id: &str) {
    check_file(&catalog(id), &fixture(id));
}

fn check_file(path: &std::path::Path, fx: &Value) {
    let file = GgufFile::open(path).unwrap();
    let mut model = strata_engine::Model::load_full(&file).unwrap();
    model.set_flavour(match fx["simd"].as_str() {
        Some("avx2") => Flavour::Avx2,
        _ => Flavour::Avx512,
    });
    let tokenizer = strata_tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    let pool = ThreadPool::new(2);
    let width = model.config().n_embd;
    let mut failures = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let text = case["prompt"].as_str().unwrap();
        let pooling = match case["pooling"].as_str().unwrap() {
            "mean" => Pooling::Mean,
            "last" => Pooling::Last,
            "cls" => Pooling::Cls,
            other => panic!("pooling {other} is not computed"),
        };
        let want: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let tokens = tokenizer.encode_prompt(text, true).unwrap();
        assert_eq!(tokens, want, "{text:?}: tokens");
        let mut cache = model.new_cache(tokens.len()).unwrap();
        let mut scratch = strata_engine::Scratch::default();
        model
            .embed(&pool, &mut cache, &mut scratch, &tokens)
            .unwrap();
        let mut v = pool_states(scratch.embeddings(), width, pooling, model.flavour()).unwrap();
        let raw = digest(&v);
        normalize(&mut v);
        let norm = digest(&v);
        let name = format!("{} {text:?}", pooling.name());
        if raw != case["raw_sha256"] {
            failures.push(format!("{name}: pooled vector differs"));
        } else if norm != case["norm_sha256"] {
            failures.push(format!("{name}: normalised vector differs"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn smollm2_embeddings_match_llama_cpp() {
    check("smollm2-135m-instruct");
}

#[test]
fn gemma3_embeddings_match_llama_cpp() {
    check("gemma3-270m");
}

/// A Qwen3-Embedding-shaped synthetic model (qwen3 with last-token pooling and an EOS after
/// every text), written by strata's synthesiser as the fixture records and run by llama.cpp
/// with the pooling its file names.
#[test]
fn a_synthetic_qwen3_embedding_model_matches_llama_cpp() {
    use strata_engine::synth::{SynthLayout, SynthSpec, synth_with};
    let fx = fixture("synth-qwen3-embedding");
    let sy = &fx["synth"];
    let n = |k: &str| sy[k].as_u64().unwrap() as usize;
    assert_eq!(sy["type"], "q8_0");
    assert_eq!(sy["pooling"], "last");
    let spec = SynthSpec {
        arch: strata_engine::Arch::parse(sy["arch"].as_str().unwrap()).unwrap(),
        layers: n("layers"),
        embd: n("embd"),
        ff: n("ff"),
        heads: n("heads"),
        kv_heads: n("kv_heads"),
        head_dim: None,
        ty: strata_gguf::GgmlType::Q8_0,
        tensor_types: Vec::new(),
        seed: 1,
        sliding_window: None,
        chat_template: None,
        pooling: Some(Pooling::Last),
        experts: None,
    };
    let base = GgufFile::open(&catalog("smollm2-135m-instruct")).unwrap();
    let bytes = synth_with(&spec, SynthLayout::default(), &base).unwrap();
    assert_eq!(
        format!("{:x}", Sha256::digest(&bytes)),
        fx["file_sha256"],
        "the synthesiser no longer writes the file the fixture was made from"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3-embedding.gguf");
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        Pooling::of_file(&GgufFile::open(&path).unwrap()),
        Some(Pooling::Last)
    );
    check_file(&path, &fx);
}
