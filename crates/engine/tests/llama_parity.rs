//! Greedy output and logits against llama.cpp on the real default model.
//!
//! The reference comes from `scripts/make-reference.py` (llama-cpp-python 0.3.36, one thread,
//! f16 KV cache). The model is fetched through strata's own store on first use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::Value;
use strata_engine::{GenerateRequest, Generator, SamplingParams};

fn model_path() -> PathBuf {
    strata_store::Store::from_env()
        .expect("model store")
        .ensure("smollm2-135m-instruct")
        .expect("fetching the default model")
}

fn fixture() -> Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/reference/smollm2-135m-instruct.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn greedy_tokens_and_logits_match_llama_cpp() {
    let fx = fixture();
    let mut g = Generator::load(&model_path(), 2, Some(1024)).unwrap();
    let mut failures = Vec::new();
    let mut worst_logit_err = 0.0f32;
    for case in fx["cases"].as_array().unwrap() {
        let name = format!("{} {:?}", case["mode"], case["prompt"].as_str().unwrap());
        let chat = case["mode"] == "chat";
        let text = case["text"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        // Our tokenizer must agree with llama.cpp's on the prompt.
        assert_eq!(
            g.tokenizer().encode(text, chat).unwrap(),
            prompt,
            "{name}: prompt tokens"
        );
        let want = ids(&case["generated_ids"]);

        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: want.len(),
            sampling: SamplingParams::default(),
        };
        let mut got = Vec::new();
        g.generate(&req, &mut |t| {
            got.push(t);
            true
        })
        .unwrap();
        if got != want {
            let at = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            failures.push(format!(
                "{name}: first difference at step {at}: got {:?} want {:?}",
                &got[at..],
                &want[at..]
            ));
            continue;
        }

        // Logits at the recorded steps, computed along the same path: prefill, then one
        // decode step per reference token.
        let mut logits = g.prompt_logits(&prompt).unwrap();
        let records = case["logits"].as_array().unwrap();
        for (step, &tok) in want.iter().enumerate() {
            if let Some(rec) = records
                .iter()
                .find(|r| r["step"].as_u64() == Some(step as u64))
            {
                for pair in rec["top"].as_array().unwrap() {
                    let id = pair[0].as_u64().unwrap() as usize;
                    let v = pair[1].as_f64().unwrap() as f32;
                    let err = (logits[id] - v).abs();
                    worst_logit_err = worst_logit_err.max(err);
                    if err > 1e-3 {
                        failures.push(format!(
                            "{name}: step {step} token {id}: logit {} vs llama.cpp {v}",
                            logits[id]
                        ));
                    }
                }
            }
            if step + 1 < want.len() {
                logits = g.decode_logits(tok).unwrap().to_vec();
            }
        }
    }
    eprintln!("worst top-20 logit difference: {worst_logit_err}");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
