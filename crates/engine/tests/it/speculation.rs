//! Speculative decoding must change nothing but the speed: a verification pass gives each of
//! its rows, bit for bit, the logits a one-token step gives, so greedy output with drafts is
//! token for token the output without them, on the real models and on synthetic families
//! whose formats llama.cpp multiplies in another order for batches (BF16, repacked Q4_K), with
//! sliding windows and soft-capping (Gemma 2) and with experts (Qwen3-MoE).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_engine::speculate::Speculation;
use strata_engine::synth::{SynthSpec, synth};
use strata_engine::{
    Arch, Batch, GenerateRequest, Model, SamplingParams, Sequences, prefix::Partition,
};
use strata_gguf::{GgmlType, GgufFile};
use strata_tokenizer::Tokenizer;

fn model(id: &str) -> std::path::PathBuf {
    strata_store::Store::from_env()
        .expect("model store")
        .ensure(id)
        .expect("fetching a catalog model")
}

/// Synthetic models of several families, written to a temporary directory.
fn synthetic(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let base = GgufFile::open(&model("smollm2-135m-instruct")).unwrap();
    let spec = |arch, ty, experts, sliding_window| SynthSpec {
        arch,
        layers: 2,
        embd: 128,
        ff: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: None,
        ty,
        tensor_types: Vec::new(),
        seed: 5,
        sliding_window,
        chat_template: None,
        pooling: None,
        experts,
    };
    let specs = [
        spec(Arch::Qwen2, GgmlType::BF16, None, None),
        // K-quant blocks are 256 wide.
        SynthSpec {
            embd: 256,
            ff: 512,
            ..spec(Arch::Llama, GgmlType::Q4K, None, None)
        },
        spec(Arch::Gemma2, GgmlType::Q8_0, None, Some(8)),
        spec(Arch::Qwen3Moe, GgmlType::Q4_0, Some((4, 2)), None),
    ];
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let path = dir.join(format!("synth-{i}.gguf"));
            std::fs::write(&path, synth(s, &base).unwrap()).unwrap();
            path
        })
        .collect()
}

fn batch(path: &std::path::Path, slots: usize) -> (Batch, Tokenizer) {
    let file = GgufFile::open(path).unwrap();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    (
        Batch::new(Model::load_full(&file).unwrap(), 2, slots, 512).unwrap(),
        tok,
    )
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every row of a verification is the one-token step's row, for drafts of 1 to 9 tokens,
/// after a rewind too, and with two sequences in one pass.
fn check_rows(path: &std::path::Path) {
    let (mut b, tok) = batch(path, 3);
    let prompt = tok
        .encode_prompt("def add(a, b):\n    return a + b\n\ndef sub(a, b):", false)
        .unwrap();
    let (solo, _) = Sequences::admit(&mut b, &prompt, Partition::SHARED).unwrap();
    let mut want = vec![Sequences::extend(&mut b, solo, &prompt).unwrap().to_vec()];
    let mut tokens = Vec::new();
    for _ in 0..12 {
        let t = strata_kernels::ops::argmax(want.last().unwrap()) as u32;
        tokens.push(t);
        want.push(Sequences::step(&mut b, &[(solo, t)]).unwrap().to_vec());
    }
    let (spec, _) = Sequences::admit(&mut b, &prompt, Partition::SHARED).unwrap();
    Sequences::extend(&mut b, spec, &prompt).unwrap();
    let mut at = 0;
    for k in [1usize, 3, 9] {
        // The right tokens, then a rewind past the last of them: the cache is as if only
        // the first `k - 1` were decoded, and the next pass starts from there.
        let rows = Sequences::verify(&mut b, &[(spec, &tokens[at..at + k])])
            .unwrap()
            .to_vec();
        let v = rows.len() / k;
        for i in 0..k {
            assert!(
                same(&rows[i * v..(i + 1) * v], &want[at + i + 1]),
                "{}: row {i} of a pass of {k} at {at}",
                path.display()
            );
        }
        at += k - 1;
        Sequences::rewind(&mut b, spec, prompt.len() + at).unwrap();
    }
    // Two sequences' drafts in one pass: each row is still its own one-token step's.
    let (other, _) = Sequences::admit(&mut b, &prompt, Partition::SHARED).unwrap();
    Sequences::extend(&mut b, other, &prompt).unwrap();
    Sequences::rewind(&mut b, spec, prompt.len()).unwrap();
    let rows = Sequences::verify(&mut b, &[(other, &tokens[..5]), (spec, &tokens[..2])])
        .unwrap()
        .to_vec();
    let v = rows.len() / 7;
    for (i, want) in want[1..6].iter().chain(&want[1..3]).enumerate() {
        assert!(
            same(&rows[i * v..(i + 1) * v], want),
            "{}: row {i} of a pass of two sequences",
            path.display()
        );
    }
}

/// Greedy output with prompt-lookup drafts is the output without them, and drafts were taken.
fn check_greedy(path: &std::path::Path, text: &str, n: usize) -> (u64, u64) {
    let (mut b, tok) = batch(path, 1);
    let prompt = tok.encode_prompt(text, false).unwrap();
    let mut run = |speculation| {
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: n,
            sampling: SamplingParams::default(),
            ignore_eos: true,
            speculation,
        };
        let mut out = Vec::new();
        let stats = strata_engine::generate(&mut b, &|_| false, &req, &mut |t| {
            out.push(t);
            true
        })
        .unwrap();
        (out, stats)
    };
    let (want, _) = run(Speculation::Off);
    let (got, stats) = run(Speculation::Ngram);
    assert_eq!(got, want, "{}", path.display());
    assert_eq!(got.len(), n);
    let s = stats.speculation.expect("speculation stats");
    (s.drafted, s.accepted)
}

const CODE: &str = "fn main() {\n    let xs = vec![1, 2, 3, 4, 5, 6, 7, 8];\n    \
    for x in &xs {\n        println!(\"{}\", x * 2);\n    }\n}\n\nRepeat the program above:\n";

#[test]
fn verified_rows_are_one_token_steps_bit_for_bit() {
    check_rows(&model("smollm2-135m-instruct"));
    check_rows(&model("gemma3-270m"));
    let dir = tempfile::tempdir().unwrap();
    for path in synthetic(dir.path()) {
        check_rows(&path);
    }
}

#[test]
fn greedy_output_with_drafts_is_the_output_without() {
    let (drafted, accepted) = check_greedy(&model("smollm2-135m-instruct"), CODE, 120);
    assert!(
        accepted > 20,
        "{accepted} of {drafted} drafted tokens accepted"
    );
    check_greedy(&model("gemma3-270m"), CODE, 60);
    let dir = tempfile::tempdir().unwrap();
    for path in synthetic(dir.path()) {
        // Random weights repeat themselves soon: drafts are taken and mostly accepted or not.
        let (drafted, _) = check_greedy(&path, CODE, 80);
        assert!(drafted > 0, "{}: no draft", path.display());
    }
}
