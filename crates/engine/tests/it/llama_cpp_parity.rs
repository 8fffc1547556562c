//! Greedy output and logits against llama.cpp on the real models: SmolLM2 (Llama, Q4_1 + Q8_0)
//! and Gemma 3 270M (Q5_0, Q8_0, Q4_K, Q6_K); and on synthetic models of the families no real
//! file of which can be fetched here (`strata synth`, quantised by llama.cpp's own quantiser).
//!
//! The references come from `scripts/make-reference.py` (llama-cpp-python 0.3.36, one thread,
//! f16 KV cache). The models are fetched through strata's own store on first use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::Value;
use strata_engine::synth::{SynthLayout, SynthSpec, synth_with, tensor_digest};
use strata_engine::{Arch, GenerateRequest, Generator, SamplingParams};
use strata_gguf::{GgmlType, GgufFile};
use strata_kernels::attn::Flavour;

#[test]
fn smollm2_matches_an_avx2_build_of_llama_cpp_too() {
    // The same model against llama.cpp built without AVX-512, whose attention sums, `expf` and
    // softmax blocks differ: strata reproduces either build.
    check_against_llama_cpp_fixture("smollm2-135m-instruct", "smollm2-135m-instruct-avx2", 1e-3);
}

fn model_path(id: &str) -> PathBuf {
    strata_store::Store::from_env()
        .expect("model store")
        .ensure(id)
        .unwrap_or_else(|e| panic!("fetching {id}: {e}"))
}

fn fixture(id: &str) -> Value {
    let p = format!(
        "{}/../../fixtures/reference/{id}.json",
        env!("CARGO_MANIFEST_DIR")
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
fn smollm2_greedy_tokens_and_logits_match_llama_cpp() {
    check_against_llama_cpp("smollm2-135m-instruct", 1e-3);
}

#[test]
fn gemma3_greedy_tokens_and_logits_match_llama_cpp() {
    check_against_llama_cpp("gemma3-270m", 1e-3);
}

/// SmolLM2 as the split set `llama-gguf-split --split --split-max-tensors N` makes of it
/// (`fixtures/split/smollm2-135m-instruct.json` holds N and the SHA-256 of every part it wrote):
/// strata's own splitter writes the same bytes, and the set, opened by its first part, answers
/// what llama.cpp answers on the whole file.
#[test]
fn smollm2_split_by_llama_gguf_split_matches_llama_cpp() {
    use sha2::{Digest, Sha256};
    use strata_gguf::split::{part_name, split_by_tensors};
    let whole = GgufFile::open(&model_path("smollm2-135m-instruct")).unwrap();
    let p = format!(
        "{}/../../fixtures/split/smollm2-135m-instruct.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let per_part = fx["split_max_tensors"].as_u64().unwrap() as usize;
    let digests: Vec<&str> = fx["parts_sha256"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    let parts = split_by_tensors(&whole, per_part);
    assert_eq!(parts.len(), digests.len());
    let dir = tempfile::tempdir().unwrap();
    let n = parts.len() as u32;
    for (i, (bytes, want)) in parts.iter().zip(&digests).enumerate() {
        let got = format!("{:x}", Sha256::digest(bytes));
        assert_eq!(&got, want, "part {} differs from llama-gguf-split's", i + 1);
        std::fs::write(
            dir.path().join(part_name("smollm2", i as u32 + 1, n)),
            bytes,
        )
        .unwrap();
    }
    drop(parts);
    let first = dir.path().join(part_name("smollm2", 1, n));
    assert_eq!(GgufFile::open(&first).unwrap().paths().len(), n as usize);
    check_model_against(
        &first,
        "smollm2-135m-instruct",
        &fixture("smollm2-135m-instruct"),
        1e-3,
    );
}

fn check_against_llama_cpp(id: &str, logit_tolerance: f32) {
    check_against_llama_cpp_fixture(id, id, logit_tolerance);
}

pub(crate) fn check_against_llama_cpp_fixture(id: &str, fixture_name: &str, logit_tolerance: f32) {
    check_model_against(&model_path(id), id, &fixture(fixture_name), logit_tolerance);
}

/// Synthesises the model a `--synth` fixture describes with strata's own writer and quantiser,
/// checks that its weights are the bytes llama.cpp's quantiser wrote, and compares outputs.
pub(crate) fn check_synthetic(name: &str) {
    let fx = fixture(name);
    let sy = &fx["synth"];
    let ty = GgmlType::from_name(sy["type"].as_str().unwrap()).unwrap();
    // A quantisation mix lists the tensors of other types than `type`.
    let tensor_types = sy["tensor_types"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), GgmlType::from_name(v.as_str().unwrap()).unwrap()))
                .collect()
        })
        .unwrap_or_default();
    let n = |k: &str| sy[k].as_u64().unwrap() as usize;
    let spec = SynthSpec {
        arch: Arch::parse(sy["arch"].as_str().unwrap()).unwrap(),
        layers: n("layers"),
        embd: n("embd"),
        ff: n("ff"),
        heads: n("heads"),
        kv_heads: n("kv_heads"),
        head_dim: sy["head_dim"].as_u64().map(|h| h as usize),
        ty,
        tensor_types,
        seed: sy["seed"].as_u64().unwrap(),
        sliding_window: sy["sliding_window"].as_u64().map(|w| w as usize),
        chat_template: None,
        pooling: None,
        experts: sy["experts"].as_u64().map(|n| {
            let used = sy["experts_used"].as_u64().unwrap_or(2);
            (n as usize, used as usize)
        }),
    };
    let base = GgufFile::open(&model_path("smollm2-135m-instruct")).unwrap();
    let flag = |k: &str| sy[k].as_bool().unwrap_or(false);
    let layout = SynthLayout {
        split_qkv: flag("split_qkv"),
        no_longrope: flag("no_longrope"),
        untied: flag("untied"),
    };
    let bytes = synth_with(&spec, layout, &base).unwrap();
    let path =
        std::env::temp_dir().join(format!("strata-parity-{name}-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(
        tensor_digest(&file),
        sy["weights_digest"].as_str().unwrap(),
        "{name}: strata's synthetic weights differ from those llama.cpp's quantiser wrote"
    );
    // Bit for bit: the same weights through the same float operations.
    check_model_against(&path, name, &fx, 0.0);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn synthetic_llama_q4_k_m_matches_llama_cpp() {
    check_synthetic("synth-llama-q4_k_m");
}

#[test]
fn synthetic_llama_q2_k_matches_llama_cpp() {
    check_synthetic("synth-llama-q2_k");
}

#[test]
fn synthetic_qwen2_q5_k_m_matches_llama_cpp() {
    check_synthetic("synth-qwen2-q5_k_m");
}

#[test]
fn synthetic_qwen2_q3_k_matches_llama_cpp() {
    check_synthetic("synth-qwen2-q3_k");
}

#[test]
fn synthetic_qwen3_q3_k_m_matches_llama_cpp() {
    check_synthetic("synth-qwen3-q3_k_m");
}

#[test]
fn synthetic_qwen3_iq4_xs_matches_llama_cpp() {
    check_synthetic("synth-qwen3-iq4_xs");
}

#[test]
fn synthetic_qwen3_q5_1_matches_llama_cpp() {
    check_synthetic("synth-qwen3-q5_1");
}

#[test]
fn synthetic_phi3_q8_0_matches_llama_cpp() {
    check_synthetic("synth-phi3-q8_0");
}

#[test]
fn synthetic_phi3_q4_k_m_matches_llama_cpp() {
    check_synthetic("synth-phi3-q4_k_m");
}

#[test]
fn synthetic_llama_q8_0_matches_llama_cpp() {
    check_synthetic("synth-llama-q8_0");
}

#[test]
fn synthetic_qwen2_q4_1_matches_llama_cpp() {
    check_synthetic("synth-qwen2-q4_1");
}

#[test]
fn synthetic_qwen2_q8_0_matches_llama_cpp() {
    check_synthetic("synth-qwen2-q8_0");
}

#[test]
fn synthetic_qwen3_q4_1_matches_llama_cpp() {
    check_synthetic("synth-qwen3-q4_1");
}

#[test]
fn synthetic_qwen3_q5_0_matches_llama_cpp() {
    check_synthetic("synth-qwen3-q5_0");
}

#[test]
fn synthetic_llama_iq4_nl_matches_llama_cpp() {
    check_synthetic("synth-llama-iq4_nl");
}

#[test]
fn synthetic_llama_q4_0_matches_llama_cpp() {
    check_synthetic("synth-llama-q4_0");
}

#[test]
fn synthetic_qwen2_bf16_matches_llama_cpp() {
    check_synthetic("synth-qwen2-bf16");
}

#[test]
fn synthetic_qwen3_f16_matches_llama_cpp() {
    check_synthetic("synth-qwen3-f16");
}

#[test]
fn synthetic_gemma2_q8_0_matches_llama_cpp() {
    check_synthetic("synth-gemma2-q8_0");
}

#[test]
fn synthetic_gemma2_q4_k_m_matches_llama_cpp() {
    check_synthetic("synth-gemma2-q4_k_m");
}

#[test]
fn synthetic_smollm3_q4_0_matches_llama_cpp() {
    check_synthetic("synth-smollm3-q4_0");
}

#[test]
fn synthetic_smollm3_q5_k_m_matches_llama_cpp() {
    check_synthetic("synth-smollm3-q5_k_m");
}

#[test]
fn synthetic_granite_q8_0_matches_llama_cpp() {
    check_synthetic("synth-granite-q8_0");
}

#[test]
fn synthetic_granite_q4_k_m_matches_llama_cpp() {
    check_synthetic("synth-granite-q4_k_m");
}

fn check_model_against(path: &std::path::Path, id: &str, fx: &Value, logit_tolerance: f32) {
    let add_bos = fx["add_bos"].as_bool().unwrap_or(false);
    let mut g = Generator::load(path, 2, Some(1024)).unwrap();
    // Reproduce the llama.cpp build that made the reference (AVX-512 or AVX2 sums).
    g.set_flavour(match fx["simd"].as_str() {
        Some("avx2") => Flavour::Avx2,
        Some("aarch64-neon") => Flavour::Neon,
        _ => Flavour::Avx512,
    });
    // Tokens come from the loop `strata run` uses, on a one-slot batch of the same model.
    let mut one = {
        let file = GgufFile::open(path).unwrap();
        let mut model = strata_engine::Model::load_full(&file).unwrap();
        model.set_flavour(g.model().flavour());
        strata_engine::Batch::new(model, 2, 1, 1024).unwrap()
    };
    let tok = g.tokenizer_shared();
    let mut failures = Vec::new();
    let mut worst_logit_err = 0.0f32;
    for case in fx["cases"].as_array().unwrap() {
        let name = format!("{} {:?}", case["mode"], case["prompt"].as_str().unwrap());
        let chat = case["mode"] == "chat";
        let text = case["text"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        // Our tokenizer must agree with llama.cpp's on the prompt.
        let ours = if add_bos {
            g.tokenizer().encode_prompt(text, chat).unwrap()
        } else {
            g.tokenizer().encode(text, chat).unwrap()
        };
        assert_eq!(ours, prompt, "{name}: prompt tokens");
        let want = ids(&case["generated_ids"]);

        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: want.len(),
            sampling: SamplingParams::default(),
            ignore_eos: false,
            speculation: Default::default(),
        };
        let mut got = Vec::new();
        strata_engine::generate(&mut one, &|t| tok.is_eog(t), &req, &mut |t| {
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
                    if err > logit_tolerance {
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
    eprintln!("{id}: worst top-20 logit difference: {worst_logit_err}");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn synthetic_mistral3_q8_0_matches_llama_cpp() {
    check_synthetic("synth-mistral3-q8_0");
}

#[test]
fn synthetic_mistral3_q4_k_m_matches_llama_cpp() {
    check_synthetic("synth-mistral3-q4_k_m");
}

#[test]
fn synthetic_olmo2_q4_1_matches_llama_cpp() {
    check_synthetic("synth-olmo2-q4_1");
}

#[test]
fn synthetic_olmo2_q6_k_matches_llama_cpp() {
    check_synthetic("synth-olmo2-q6_k");
}

#[test]
fn synthetic_olmo3_q8_0_matches_llama_cpp() {
    check_synthetic("synth-olmo2-swa-q8_0");
}

#[test]
fn synthetic_qwen3moe_q8_0_matches_llama_cpp() {
    check_synthetic("synth-qwen3moe-q8_0");
}

#[test]
fn synthetic_qwen3moe_q5_k_matches_llama_cpp() {
    check_synthetic("synth-qwen3moe-q5_k");
}

#[test]
fn synthetic_qwen3moe_bf16_matches_llama_cpp() {
    check_synthetic("synth-qwen3moe-bf16");
}

#[test]
fn synthetic_qwen3moe_q4_1_matches_llama_cpp() {
    check_synthetic("synth-qwen3moe-q4_1");
}

#[test]
fn synthetic_qwen3moe_q4_k_matches_llama_cpp() {
    check_synthetic("synth-qwen3moe-q4_k");
}

#[test]
fn synthetic_qwen3moe_q4_0_matches_llama_cpp() {
    check_synthetic("synth-qwen3moe-q4_0");
}

#[test]
fn synthetic_qwen3moe_iq4_nl_matches_llama_cpp() {
    check_synthetic("synth-qwen3moe-iq4_nl");
}

#[test]
fn synthetic_gpt_oss_mxfp4_moe_matches_llama_cpp() {
    check_synthetic("synth-gpt-oss-mxfp4_moe");
}

#[test]
fn synthetic_olmoe_q6_k_matches_llama_cpp() {
    check_synthetic("synth-olmoe-q6_k");
}

#[test]
fn synthetic_qwen2moe_q4_k_m_matches_llama_cpp() {
    check_synthetic("synth-qwen2moe-q4_k_m");
}

#[test]
fn synthetic_deepseek2_q8_0_matches_llama_cpp() {
    check_synthetic("synth-deepseek2-q8_0");
}

#[test]
fn synthetic_deepseek2_q4_k_m_matches_llama_cpp() {
    check_synthetic("synth-deepseek2-q4_k_m");
}

#[test]
fn synthetic_llama_iq4_xs_matches_llama_cpp() {
    check_synthetic("synth-llama-iq4_xs");
}

#[test]
fn synthetic_qwen2_iq4_xs_matches_llama_cpp() {
    check_synthetic("synth-qwen2-iq4_xs");
}

/// The shape and type of a reported IQ4_XS mismatch: 64-wide heads, FFN 512, and the mix
/// `llama-quantize ... IQ4_XS` writes (the tied embedding in Q6_K).
#[test]
fn synthetic_llama_iq4_xs_mix_with_64_wide_heads_matches_llama_cpp() {
    check_synthetic("synth-llama-hd64-iq4_xs_mix");
}

#[test]
fn synthetic_qwen2_iq4_xs_mix_with_64_wide_heads_matches_llama_cpp() {
    check_synthetic("synth-qwen2-hd64-iq4_xs_mix");
}

/// A llama file with its own `output.weight` (as `gguf-py` writes it), through
/// `llama-quantize`'s IQ4_XS mix: the head in Q6_K, `token_embd` left in IQ4_XS and
/// read through `get_rows`. llama.cpp's `llama-simple` is no reference here: its default
/// `flash_attn = auto` turns flash attention on for the CPU, a different attention float order
/// (it differs from the non-flash path on Q8_0 files as much).
#[test]
fn synthetic_llama_untied_iq4_xs_mix_matches_llama_cpp() {
    check_synthetic("synth-llama-hd64-untied-iq4_xs_mix-avx512");
}

/// The same against llama.cpp built with AVX-512 and VNNI, whose tiled K-quant kernel (taken by
/// prompts of 8 or more tokens) is its VNNI one.
#[test]
fn synthetic_qwen2_iq4_xs_mix_matches_an_avx512_build_of_llama_cpp() {
    check_synthetic("synth-qwen2-hd64-iq4_xs_mix-avx512");
}

/// Phi-3 as the 4k-context checkpoints' files are: six tensors a layer (fused `attn_qkv` and
/// `ffn_up`), no LongRoPE factors. A block-count check of seven tensors a layer refused them.
#[test]
fn synthetic_phi3_with_six_tensors_a_layer_loads_and_matches_llama_cpp() {
    check_synthetic("synth-phi3-4k-q8_0");
}

/// Phi-3 with separate `attn_q`, `attn_k` and `attn_v`, which llama.cpp loads too.
#[test]
fn synthetic_phi3_with_separate_qkv_matches_llama_cpp() {
    check_synthetic("synth-phi3-split-q4_k_m");
}
