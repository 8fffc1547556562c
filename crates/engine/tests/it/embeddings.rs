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

fn check(id: &str) {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/../../fixtures/reference/embeddings-{id}.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    let path = strata_store::Store::from_env().unwrap().ensure(id).unwrap();
    let file = GgufFile::open(&path).unwrap();
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
