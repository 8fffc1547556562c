//! Synthetic GGUF metadata for unit tests: small vocabularies that exercise one rule each.
#![allow(clippy::unwrap_used)]

use strata_gguf::{Array, GgufFile, GgufWriter, Value};

/// Token types as GGUF stores them.
pub(crate) const NORMAL: i32 = 1;
pub(crate) const CONTROL: i32 = 3;
pub(crate) const USER_DEFINED: i32 = 4;
pub(crate) const BYTE: i32 = 6;

/// A GGUF image holding `tokens` with their `types` plus any extra keys.
pub(crate) fn gguf(model: &str, tokens: &[(&str, i32)], extra: Vec<(&str, Value)>) -> GgufFile {
    let mut w = GgufWriter::new();
    w.kv("tokenizer.ggml.model", Value::String(model.to_string()));
    w.kv(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(
            tokens.iter().map(|(t, _)| t.to_string()).collect(),
        )),
    );
    w.kv(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(tokens.iter().map(|&(_, ty)| ty).collect())),
    );
    for (k, v) in extra {
        w.kv(k, v);
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

/// A string-array value.
pub(crate) fn strings(items: &[&str]) -> Value {
    Value::Array(Array::String(items.iter().map(|s| s.to_string()).collect()))
}

/// A string value.
pub(crate) fn string(s: &str) -> Value {
    Value::String(s.to_string())
}
