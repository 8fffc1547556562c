//! Continuous batching must not change what a sequence generates: decoding several sequences in
//! one forward pass gives each of them, bit for bit, the logits it gets when decoded alone, even
//! when sequences join and leave the batch at different steps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_engine::synth::{SynthSpec, synth};
use strata_engine::{Arch, Batch, GenerateRequest, Generator, Model, SamplingParams};
use strata_gguf::{GgmlType, GgufFile};

fn solo(g: &mut Generator, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = vec![g.prompt_logits(prompt).unwrap()];
    let mut toks = Vec::new();
    for _ in 0..n {
        let t = strata_kernels::ops::argmax(logits.last().unwrap()) as u32;
        toks.push(t);
        logits.push(g.decode_logits(t).unwrap().to_vec());
    }
    (toks, logits)
}

fn smollm2() -> std::path::PathBuf {
    strata_store::Store::from_env()
        .expect("model store")
        .ensure("smollm2-135m-instruct")
        .expect("fetching the default model")
}

#[test]
fn batched_decode_equals_decoding_each_sequence_alone() {
    check_batched_decode(&smollm2());
}

/// BF16 is a format llama.cpp multiplies in another order for a batch of two or more rows than
/// for one (tinyBLAS, not `vec_dot`): a batch of sequences must still get each its solo bits.
#[test]
fn batched_decode_keeps_one_token_order_for_batch_order_formats() {
    let base = GgufFile::open(&smollm2()).unwrap();
    let spec = SynthSpec {
        arch: Arch::Qwen2,
        layers: 2,
        embd: 128,
        ff: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: None,
        ty: GgmlType::BF16,
        tensor_types: Vec::new(),
        seed: 11,
        sliding_window: None,
        chat_template: None,
        pooling: None,
        experts: None,
    };
    let bytes = synth(&spec, &base).unwrap();
    let path =
        std::env::temp_dir().join(format!("strata-batched-bf16-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    check_batched_decode(&path);
    let _ = std::fs::remove_file(&path);
}

fn check_batched_decode(path: &std::path::Path) {
    let mut g = Generator::load(path, 2, Some(512)).unwrap();
    let tok = g.tokenizer_shared();
    let prompts: Vec<Vec<u32>> = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a village by the sea, there lived",
    ]
    .iter()
    .map(|p| tok.encode_prompt(p, false).unwrap())
    .collect();
    let steps = 20;
    let expected: Vec<_> = prompts.iter().map(|p| solo(&mut g, p, steps)).collect();

    let file = GgufFile::open(path).unwrap();
    let mut batch = Batch::new(Model::load_full(&file).unwrap(), 2, 2, 512).unwrap();
    // Sequence i joins at step 3*i; only two slots, so the third waits for the first to finish
    // (its `steps` tokens done) and reuses its slot.
    let mut live: Vec<(usize, strata_engine::SlotId, usize, u32)> = Vec::new(); // (seq, slot, done, next)
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut joined = 0;
    for round in 0..200 {
        while joined < prompts.len() && batch.free_slots() > 0 && round >= 3 * joined {
            let (slot, logits) = batch.start(&prompts[joined]).unwrap();
            assert_eq!(
                &*logits,
                &expected[joined].1[0][..],
                "prompt logits of {joined}"
            );
            let t = strata_kernels::ops::argmax(logits) as u32;
            got[joined].push(t);
            live.push((joined, slot, 1, t));
            joined += 1;
        }
        if live.is_empty() {
            if joined == prompts.len() {
                break;
            }
            continue;
        }
        let step: Vec<_> = live.iter().map(|l| (l.1, l.3)).collect();
        let vocab = batch.model().config().n_vocab;
        let logits = batch.step(&step).unwrap().to_vec();
        for (i, l) in live.iter_mut().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            assert_eq!(
                row,
                &expected[l.0].1[l.2][..],
                "sequence {} step {}",
                l.0,
                l.2
            );
            let t = strata_kernels::ops::argmax(row) as u32;
            got[l.0].push(t);
            l.2 += 1;
            l.3 = t;
        }
        live.retain(|l| {
            let done = l.2 >= steps;
            if done {
                batch.release(l.1);
            }
            !done
        });
    }
    for (i, e) in expected.iter().enumerate() {
        assert_eq!(got[i][..steps], e.0[..], "tokens of sequence {i}");
    }
    // The one-sequence loop `strata run` uses, on a slot of the batch, agrees with the solo
    // reference.
    let mut first = Vec::new();
    strata_engine::generate(
        &mut batch,
        &|t| tok.is_eog(t),
        &GenerateRequest {
            prompt: prompts[0].clone(),
            max_tokens: steps,
            sampling: SamplingParams::default(),
            ignore_eos: true,
            speculation: Default::default(),
        },
        &mut |t| {
            first.push(t);
            true
        },
    )
    .unwrap();
    assert_eq!(first, expected[0].0);
}

/// Tokens appended in one pass (`Batch::extend`, the API's path for grammar-forced tokens) give
/// the logits that prefilling the whole text gives, and the same greedy continuation.
#[test]
fn extending_a_sequence_in_one_pass_equals_prefilling_it_whole() {
    let path = strata_store::Store::from_env()
        .expect("model store")
        .ensure("smollm2-135m-instruct")
        .expect("fetching the default model");
    let file = GgufFile::open(&path).unwrap();
    let mut batch = Batch::new(Model::load_full(&file).unwrap(), 2, 2, 64).unwrap();
    let g = Generator::load(&path, 1, Some(64)).unwrap();
    let tok = g.tokenizer_shared();
    let head = tok
        .encode_prompt("The capital of France is", false)
        .unwrap();
    let tail = tok
        .encode(" Paris, and the capital of Spain is", false)
        .unwrap();
    let whole: Vec<u32> = head.iter().chain(&tail).copied().collect();

    let (a, logits) = batch.start(&whole).unwrap();
    let expected = logits.to_vec();
    batch.release(a);
    let (b, _) = batch.start(&head).unwrap();
    let got = batch.extend(b, &tail).unwrap().to_vec();
    let worst = expected
        .iter()
        .zip(&got)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-3, "largest logit difference {worst}");
    assert_eq!(
        strata_kernels::ops::argmax(&expected),
        strata_kernels::ops::argmax(&got)
    );
    assert_eq!(batch.len(b), whole.len());

    // Past the context, into a free slot, or nothing at all: errors, not panics.
    assert!(batch.extend(b, &[1; 64]).is_err());
    assert_eq!(a, b, "the released slot is taken again");
    let free = strata_engine::SlotId::from_index(1 - b.index());
    assert!(batch.extend(free, &tail).is_err());
    assert!(batch.extend(b, &[]).is_err());
}
