//! llama.cpp's own tokenizer test suite (`models/ggml-vocab-*.gguf` with `.inp`/`.out`) for every
//! vocabulary family we support.
//!
//! Those vocab-only GGUFs are not committed (megabytes each, and llama.cpp's to ship). They come
//! with llama-cpp-python's source distribution:
//!
//! ```text
//! python3 -m pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d /tmp/lcp
//! tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
//! ```
//!
//! Point `STRATA_LLAMA_CPP_MODELS` at `vendor/llama.cpp/models` (default: that path under
//! /tmp/lcp). Without it the test prints why and passes; the SmolLM2 golden test
//! (golden_smollm2.rs) is the one that always runs.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use strata_gguf::GgufFile;
use strata_tokenizer::Tokenizer;

const DEFAULT_DIR: &str = "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/models";

/// Vocabularies covering each supported pre-tokenizer family and SentencePiece.
const VOCABS: &[&str] = &[
    "starcoder",
    "refact",
    "command-r",
    "gpt-2",
    "mpt",
    "llama-bpe",
    "qwen2",
    "llama-spm",
    "phi-3",
];

/// Opens a vocab-only GGUF. These files end right after the metadata, without padding the
/// (empty) tensor-data section to the alignment; llama.cpp accepts that, but strata-gguf reports
/// the file as truncated. Until the reader accepts it, parse a zero-padded copy in memory.
fn open_vocab(path: &Path) -> GgufFile {
    if let Ok(file) = GgufFile::open(path) {
        return file;
    }
    let mut bytes = std::fs::read(path).unwrap();
    bytes.resize(bytes.len().next_multiple_of(32), 0);
    GgufFile::from_bytes(bytes).unwrap()
}

fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("STRATA_LLAMA_CPP_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    dir.is_dir().then_some(dir)
}

/// Reads a `.inp`/`.out` pair exactly as llama.cpp's test-tokenizer-0 does.
fn read_cases(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(i) => {
                inputs.push(rest[..i].to_string());
                rest = &rest[i + SEP.len()..];
            }
            None => {
                inputs.push(rest.to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: .inp and .out disagree"
    );
    inputs.into_iter().zip(outputs).collect()
}

#[test]
fn llama_cpp_tokenizer_suite() {
    let Some(dir) = models_dir() else {
        println!(
            "skipped: llama.cpp vocab files not found (set STRATA_LLAMA_CPP_MODELS to \
             llama.cpp's models/ directory; see this file's header)"
        );
        return;
    };
    let mut failures = Vec::new();
    for name in VOCABS {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        if !path.exists() {
            println!("{name}: skipped, {} absent", path.display());
            continue;
        }
        let file = open_vocab(&path);
        let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
        let cases = read_cases(&dir, name);
        let mut passed = 0;
        for (text, want) in &cases {
            // The suite tokenizes with add_special = false, parse_special = false.
            let got = tok.encode(text, false).unwrap();
            if &got == want {
                passed += 1;
            } else {
                failures.push(format!(
                    "{name}: {text:?}\n  llama.cpp {want:?}\n  strata    {got:?}"
                ));
            }
        }
        println!("{name}: {passed} of {} vectors pass", cases.len());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unsupported_vocabularies_are_typed_errors() {
    let Some(dir) = models_dir() else {
        println!("skipped: llama.cpp vocab files not found");
        return;
    };
    for (name, needle) in [
        ("falcon", "\"falcon\""),
        ("deepseek-coder", "\"deepseek-coder\""),
        ("bert-bge", "\"bert\""),
    ] {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        if !path.exists() {
            continue;
        }
        let file = open_vocab(&path);
        let err = Tokenizer::from_gguf(file.metadata()).unwrap_err();
        assert!(err.to_string().contains(needle), "{name}: {err}");
    }
}
