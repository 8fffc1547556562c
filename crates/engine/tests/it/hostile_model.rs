//! Mutation tests on the real model file: flipped header bytes and truncations of
//! SmolLM2's GGUF must end in an error (or a model that runs), never a panic.
//!
//! Every stage a user's file goes through is exercised: the GGUF reader, the tokenizer and chat
//! template built from its metadata, the model configuration, the shard loader (including the
//! weight repacking), and one forward step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};

use strata_engine::{Model, NoComm, Scratch, StageInput};
use strata_gguf::GgufFile;
use strata_kernels::ThreadPool;
use strata_tokenizer::{ChatTemplate, Tokenizer};

fn real_model() -> Vec<u8> {
    let path = strata_store::Store::from_env()
        .expect("model store")
        .ensure("smollm2-135m-instruct")
        .expect("fetching the default model");
    std::fs::read(path).unwrap()
}

/// Runs every loading stage on `bytes`; returns a description of how far it got.
fn load_everything(bytes: Vec<u8>, pool: &ThreadPool) -> String {
    let file = match GgufFile::from_bytes(bytes) {
        Ok(f) => f,
        Err(e) => return format!("gguf: {e}"),
    };
    if let Err(e) = Tokenizer::from_gguf(file.metadata()) {
        return format!("tokenizer: {e}");
    }
    if let Err(e) = ChatTemplate::from_gguf(file.metadata()) {
        return format!("template: {e}");
    }
    let model = match Model::load_full(&file) {
        Ok(m) => m,
        Err(e) => return format!("model: {e}"),
    };
    let mut cache = match model.new_cache(16) {
        Ok(c) => c,
        Err(e) => return format!("cache: {e}"),
    };
    let mut scratch = Scratch::default();
    match model.forward(
        pool,
        &mut cache,
        &mut scratch,
        StageInput::Tokens(&[1, 2, 3]),
        &mut NoComm,
    ) {
        Ok(()) => "ran".into(),
        Err(e) => format!("forward: {e}"),
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn mutated_real_model_headers_fail_cleanly() {
    let original = real_model();
    let header_len = GgufFile::from_bytes(original.clone())
        .unwrap()
        .data_offset() as usize;
    let pool = ThreadPool::new(1);
    let mut rng = Rng(0x5EED_1234);
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for case in 0..40 {
        let mut bytes = original.clone();
        // Half the cases hit the fixed-layout start (counts, first keys), half anywhere in the
        // metadata and tensor table.
        let span = if case % 2 == 0 { 4096 } else { header_len };
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(span);
            bytes[at] = match rng.below(4) {
                0 => 0xFF,
                1 => 0x00,
                2 => bytes[at] ^ (1 << rng.below(8)),
                _ => rng.next() as u8,
            };
        }
        let result = catch_unwind(AssertUnwindSafe(|| load_everything(bytes, &pool)));
        let outcome = result.unwrap_or_else(|_| panic!("case {case}: a mutated header panicked"));
        let stage = outcome.split(':').next().unwrap_or("").to_string();
        *outcomes.entry(stage).or_default() += 1;
    }
    // The mutations must reach past the reader at least sometimes, or the test proves little.
    assert!(outcomes.len() >= 2, "{outcomes:?}");
}

/// Hostile values for the hyper-parameters: zero, one, odd sizes, huge and sign-bit values.
#[test]
fn hostile_hyperparameters_fail_cleanly() {
    let original = real_model();
    let pool = ThreadPool::new(1);
    let keys = [
        "llama.block_count",
        "llama.context_length",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.rope.dimension_count",
        "llama.vocab_size",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
    ];
    let mut reached_model_checks = 0;
    for key in keys {
        let Some(at) = original
            .windows(key.len())
            .position(|w| w == key.as_bytes())
        else {
            continue;
        };
        // Key string, then a u32 value type, then the value.
        let value_at = at + key.len() + 4;
        for v in [0u32, 1, 3, 7, 577, 0x7FFF_FFFF, 0xFFFF_FFFF] {
            let mut bytes = original.clone();
            bytes[value_at..value_at + 4].copy_from_slice(&v.to_le_bytes());
            let outcome = catch_unwind(AssertUnwindSafe(|| load_everything(bytes, &pool)))
                .unwrap_or_else(|_| panic!("{key} = {v} panicked"));
            if outcome.starts_with("model:") || outcome.starts_with("tokenizer:") {
                reached_model_checks += 1;
            }
        }
    }
    assert!(reached_model_checks >= 10, "{reached_model_checks}");
}

#[test]
fn truncated_real_model_fails_cleanly() {
    let original = real_model();
    let pool = ThreadPool::new(1);
    let mut rng = Rng(77);
    for _ in 0..12 {
        let cut = rng.below(original.len());
        let bytes = original[..cut].to_vec();
        let outcome = catch_unwind(AssertUnwindSafe(|| load_everything(bytes, &pool)))
            .unwrap_or_else(|_| panic!("truncation at {cut} panicked"));
        assert!(outcome.starts_with("gguf:"), "cut at {cut}: {outcome}");
    }
}

/// Metadata edits: a key and its new value (`None` removes it).
type Edits<'a> = Vec<(&'a str, Option<strata_gguf::Value>)>;

/// Edits, extra tensors (name, f32 length), and what the refusal must say.
type Case<'a> = (Edits<'a>, Vec<(&'a str, usize)>, &'a str);

/// A small synthetic Qwen3 model rewritten with metadata `edits` (a `None` value removes the
/// key) and `extra` tensors; returns what loading it says.
fn load_edited(edits: &[(&str, Option<strata_gguf::Value>)], extra: &[(&str, usize)]) -> String {
    load_edited_arch(strata_engine::Arch::Qwen3, Some(32), edits, extra)
}

/// [`load_edited`] for a model of `arch` (heads `head_dim` wide, or width / heads).
fn load_edited_arch(
    arch: strata_engine::Arch,
    head_dim: Option<usize>,
    edits: &[(&str, Option<strata_gguf::Value>)],
    extra: &[(&str, usize)],
) -> String {
    use strata_engine::synth::{SynthSpec, synth};
    use strata_gguf::{GgmlType, GgufWriter};
    let base = GgufFile::from_bytes(real_model()).unwrap();
    let spec = SynthSpec {
        arch,
        layers: 2,
        embd: 64,
        ff: 128,
        heads: 4,
        kv_heads: 2,
        head_dim,
        ty: GgmlType::Q8_0,
        tensor_types: Vec::new(),
        seed: 3,
        sliding_window: None,
        chat_template: None,
        pooling: None,
        experts: None,
    };
    let file = GgufFile::from_bytes(synth(&spec, &base).unwrap()).unwrap();
    let mut w = GgufWriter::new();
    write_metadata(&mut w, &file, edits);
    for t in file.tensors() {
        w.tensor(&t.name, &t.dims, t.ggml_type, file.tensor_data(t).to_vec());
    }
    for (name, len) in extra {
        w.tensor(name, &[*len as u64], GgmlType::F32, vec![0u8; len * 4]);
    }
    let pool = ThreadPool::new(1);
    load_everything(w.to_bytes(), &pool)
}

#[test]
fn contradictory_metadata_and_unknown_tensors_are_refused_naming_them() {
    use strata_gguf::Value;
    assert_eq!(load_edited(&[], &[]), "ran");
    let cases: Vec<Case<'_>> = vec![
        (
            vec![("general.architecture", Some(Value::String("mamba".into())))],
            vec![],
            "unsupported architecture \"mamba\"",
        ),
        (
            vec![(
                "qwen3.attention.layer_norm_rms_epsilon",
                Some(Value::F32(f32::NAN)),
            )],
            vec![],
            "qwen3.attention.layer_norm_rms_epsilon is NaN",
        ),
        (
            vec![(
                "qwen3.attention.layer_norm_rms_epsilon",
                Some(Value::F32(0.0)),
            )],
            vec![],
            "qwen3.attention.layer_norm_rms_epsilon is 0",
        ),
        (
            vec![("qwen3.rope.freq_base", Some(Value::F32(-1.0)))],
            vec![],
            "qwen3.rope.freq_base is -1",
        ),
        (
            vec![(
                "qwen3.rope.scaling.type",
                Some(Value::String("dynamic".into())),
            )],
            vec![],
            "qwen3.rope.scaling.type = \"dynamic\" is not supported",
        ),
        (
            vec![("qwen3.rope.dimension_count", Some(Value::U32(96)))],
            vec![],
            "qwen3.rope.dimension_count 96",
        ),
        (
            vec![("qwen3.attention.head_count_kv", Some(Value::U32(3)))],
            vec![],
            "inconsistent",
        ),
        (
            vec![],
            vec![("blk.0.attn_sinks.weight", 64)],
            "tensor blk.0.attn_sinks.weight is not part of",
        ),
        (
            vec![],
            vec![("blk.0.attn_output.bias", 63)],
            "blk.0.attn_output.bias has [63] elements",
        ),
    ];
    for (edits, extra, needle) in cases {
        let got = load_edited(&edits, &extra);
        assert!(got.contains(needle), "{edits:?} {extra:?}: {got}");
    }
    // LongRoPE as a type is linear scaling to llama.cpp (its factors are tensors): it loads.
    let longrope = [(
        "qwen3.rope.scaling.type",
        Some(Value::String("longrope".into())),
    )];
    assert_eq!(load_edited(&longrope, &[]), "ran");
}

/// The keys and tensors Mistral 3 and OLMo 2 read beyond the common ones are checked too.
#[test]
fn mistral3_and_olmo2_metadata_is_checked_naming_the_key() {
    use strata_engine::Arch;
    use strata_gguf::Value;
    for arch in [Arch::Mistral3, Arch::Olmo2] {
        assert_eq!(load_edited_arch(arch, None, &[], &[]), "ran", "{arch:?}");
    }
    let mistral: Vec<Case<'_>> = vec![
        (
            vec![(
                "mistral3.rope.scaling.yarn_beta_fast",
                Some(Value::F32(-1.0)),
            )],
            vec![],
            "mistral3.rope.scaling.yarn_beta_fast is -1",
        ),
        (
            vec![(
                "mistral3.rope.scaling.yarn_log_multiplier",
                Some(Value::F32(f32::NAN)),
            )],
            vec![],
            "mistral3.rope.scaling.yarn_log_multiplier is NaN",
        ),
        (
            vec![(
                "mistral3.attention.temperature_scale",
                Some(Value::F32(f32::INFINITY)),
            )],
            vec![],
            "mistral3.attention.temperature_scale is inf",
        ),
        (
            vec![("mistral3.rope.scaling.factor", Some(Value::F32(-4.0)))],
            vec![],
            "mistral3.rope.scaling.factor is -4",
        ),
    ];
    for (edits, extra, needle) in mistral {
        let got = load_edited_arch(Arch::Mistral3, None, &edits, &extra);
        assert!(got.contains(needle), "{edits:?}: {got}");
    }
    let olmo: Vec<Case<'_>> = vec![
        (
            vec![
                ("olmo2.attention.key_length", Some(Value::U32(32))),
                ("olmo2.attention.value_length", Some(Value::U32(32))),
            ],
            vec![],
            "must equal the width 64",
        ),
        // A pre-norm OLMo 2 does not have: running without it would be wrong.
        (
            vec![],
            vec![("blk.0.attn_norm.weight", 64)],
            "tensor blk.0.attn_norm.weight is not part of strata's olmo2 model",
        ),
        (
            vec![
                ("olmo2.rope.freq_base_swa", Some(Value::F32(0.0))),
                ("olmo2.attention.sliding_window", Some(Value::U32(8))),
            ],
            vec![],
            "olmo2.rope.freq_base_swa is 0",
        ),
    ];
    for (edits, extra, needle) in olmo {
        let got = load_edited_arch(Arch::Olmo2, None, &edits, &extra);
        assert!(got.contains(needle), "{edits:?} {extra:?}: {got}");
    }
}

/// `file`'s metadata with `edits` (a key's new value, or `None` to drop it).
fn write_metadata(
    w: &mut strata_gguf::GgufWriter,
    file: &GgufFile,
    edits: &[(&str, Option<strata_gguf::Value>)],
) {
    for (k, v) in file.metadata().iter() {
        if !edits.iter().any(|(e, _)| *e == k) {
            w.kv(k, v.clone());
        }
    }
    for (k, v) in edits {
        if let Some(v) = v {
            w.kv(k, v.clone());
        }
    }
}

/// An edited MoE file: metadata edits, replaced tensor dimensions, a tensor cut by one expert,
/// and what the load must say.
type MoeCase<'a> = (
    Vec<(&'a str, strata_gguf::Value)>,
    Vec<(&'a str, &'a [u64])>,
    Option<&'a str>,
    &'a str,
);

/// A small Qwen3-MoE with `edits` to its metadata and `dims` replacing tensors' dimensions (the
/// bytes unchanged); returns the load's outcome.
fn load_edited_moe(
    arch: strata_engine::Arch,
    edits: &[(&str, strata_gguf::Value)],
    dims: &[(&str, &[u64])],
    drop_bytes_of: Option<&str>,
) -> String {
    use strata_engine::synth::{SynthSpec, synth};
    use strata_gguf::{GgmlType, GgufWriter};
    let base = GgufFile::from_bytes(real_model()).unwrap();
    let spec = SynthSpec {
        arch,
        layers: 2,
        embd: 64,
        ff: 128,
        heads: 4,
        // Latent attention has one KV head, and widths that are whole Q8_0 blocks.
        kv_heads: if arch == strata_engine::Arch::Deepseek2 {
            1
        } else {
            2
        },
        head_dim: (arch == strata_engine::Arch::Deepseek2).then_some(32),
        ty: GgmlType::Q8_0,
        tensor_types: Vec::new(),
        seed: 3,
        sliding_window: None,
        chat_template: None,
        // DeepSeek's synthetic routing groups need at least eight experts.
        pooling: None,
        experts: Some((
            if arch == strata_engine::Arch::Deepseek2 {
                8
            } else {
                4
            },
            2,
        )),
    };
    let file = GgufFile::from_bytes(synth(&spec, &base).unwrap()).unwrap();
    let mut w = GgufWriter::new();
    let edits: Vec<(&str, Option<strata_gguf::Value>)> =
        edits.iter().map(|(k, v)| (*k, Some(v.clone()))).collect();
    write_metadata(&mut w, &file, &edits);
    for t in file.tensors() {
        let d = dims
            .iter()
            .find(|(n, _)| *n == t.name)
            .map_or(t.dims.clone(), |(_, d)| d.to_vec());
        let mut data = file.tensor_data(t).to_vec();
        if drop_bytes_of == Some(t.name.as_str()) {
            // One expert fewer: a 3-D tensor whose expert count contradicts the metadata.
            data.truncate(data.len() / 4 * 3);
        }
        w.tensor(&t.name, &d, t.ggml_type, data);
    }
    load_everything(w.to_bytes(), &ThreadPool::new(1))
}

#[test]
fn mixture_of_experts_metadata_and_tensors_are_checked_naming_them() {
    use strata_engine::Arch;
    use strata_gguf::Value;
    assert_eq!(load_edited_moe(Arch::Qwen3Moe, &[], &[], None), "ran");
    let cases: Vec<MoeCase<'_>> = vec![
        (
            vec![("qwen3moe.expert_used_count", Value::U32(5))],
            vec![],
            None,
            "expert_used_count 5",
        ),
        (
            vec![("qwen3moe.expert_count", Value::U32(0))],
            vec![],
            None,
            "expert_count 0",
        ),
        (
            vec![("qwen3moe.expert_feed_forward_length", Value::U32(0))],
            vec![],
            None,
            "expert_feed_forward_length",
        ),
        // The same bytes as 128 x 4 x 64: rows of the wrong expert would be paired.
        (
            vec![],
            vec![("blk.1.ffn_up_exps.weight", &[64, 4, 128])],
            None,
            "blk.1.ffn_up_exps.weight is [64, 4, 128], expected [64, 128, 4]",
        ),
        (
            vec![],
            vec![("blk.0.ffn_down_exps.weight", &[128, 64, 3])],
            Some("blk.0.ffn_down_exps.weight"),
            "blk.0.ffn_down_exps.weight is [128, 64, 3]",
        ),
        (
            vec![("qwen3moe.expert_count", Value::U32(2))],
            vec![],
            None,
            "ffn_gate_inp.weight is 64x4, expected 64x2",
        ),
    ];
    for (edits, dims, drop, want) in cases {
        let got = load_edited_moe(Arch::Qwen3Moe, &edits, &dims, drop);
        assert!(got.contains(want), "{want:?} not in {got:?}");
    }
}

/// Qwen2-MoE's shared expert is checked against its width key.
#[test]
fn a_shared_expert_of_the_wrong_width_is_refused_naming_it() {
    use strata_engine::Arch;
    assert_eq!(load_edited_moe(Arch::Qwen2Moe, &[], &[], None), "ran");
    let got = load_edited_moe(
        Arch::Qwen2Moe,
        &[],
        &[("blk.0.ffn_up_shexp.weight", &[64, 192])],
        Some("blk.0.ffn_up_shexp.weight"),
    );
    assert!(
        got.contains("blk.0.ffn_up_shexp.weight is 64x192, expected 64x256"),
        "{got}"
    );
}

/// gpt-oss's own keys and tensors (window, sinks, expert biases) are checked too.
#[test]
fn gpt_oss_metadata_and_tensors_are_checked_naming_them() {
    use strata_engine::Arch;
    use strata_gguf::Value;
    assert_eq!(load_edited_moe(Arch::GptOss, &[], &[], None), "ran");
    let cases: Vec<MoeCase<'_>> = vec![
        (
            vec![("gpt-oss.attention.sliding_window", Value::U32(0))],
            vec![],
            None,
            "gpt-oss.attention.sliding_window must be positive",
        ),
        // A bias per expert stored expert-major: each expert would read another's biases.
        (
            vec![],
            vec![("blk.1.ffn_up_exps.bias", &[4, 128])],
            None,
            "blk.1.ffn_up_exps.bias is [4, 128], expected [128, 4]",
        ),
        (
            vec![],
            vec![("blk.0.attn_sinks.weight", &[3])],
            Some("blk.0.attn_sinks.weight"),
            "blk.0.attn_sinks.weight has [3] elements, expected 4",
        ),
        (
            vec![],
            vec![("blk.0.ffn_gate_inp.bias", &[3])],
            Some("blk.0.ffn_gate_inp.bias"),
            "blk.0.ffn_gate_inp.bias has [3] elements, expected 4",
        ),
    ];
    for (edits, dims, drop, want) in cases {
        let got = load_edited_moe(Arch::GptOss, &edits, &dims, drop);
        assert!(got.contains(want), "{want:?} not in {got:?}");
    }
}

/// DeepSeek's latent attention, dense lead, expert groups and selection bias are checked
/// against each other and against the tensors.
#[test]
fn deepseek2_metadata_and_tensors_are_checked_naming_them() {
    use strata_engine::Arch;
    use strata_gguf::Value;
    assert_eq!(load_edited_moe(Arch::Deepseek2, &[], &[], None), "ran");
    let cases: Vec<MoeCase<'_>> = vec![
        (
            vec![("deepseek2.attention.key_length_mla", Value::U32(16))],
            vec![],
            None,
            "latent attention's sizes are inconsistent",
        ),
        (
            vec![("deepseek2.attention.head_count_kv", Value::U32(2))],
            vec![],
            None,
            "heads",
        ),
        (
            vec![("deepseek2.leading_dense_block_count", Value::U32(5))],
            vec![],
            None,
            "leading_dense_block_count 5 exceeds the 2 layers",
        ),
        (
            vec![("deepseek2.expert_group_used_count", Value::U32(0))],
            vec![],
            None,
            "expert_group_count 4 and expert_group_used_count 0 do not fit",
        ),
        (
            vec![("deepseek2.expert_gating_func", Value::U32(9))],
            vec![],
            None,
            "expert_gating_func 9 is not supported",
        ),
        // Heads and latent rows swapped: each head would read another's rows.
        (
            vec![],
            vec![("blk.1.attn_k_b.weight", &[32, 4, 64])],
            None,
            "blk.1.attn_k_b.weight is [32, 4, 64], expected [32, 64, 4]",
        ),
        (
            vec![],
            vec![("blk.1.exp_probs_b.bias", &[3])],
            Some("blk.1.exp_probs_b.bias"),
            "blk.1.exp_probs_b.bias has [3] elements, expected 8",
        ),
        // A dense layer's FFN where experts belong: the layer lacks the router.
        (
            vec![("deepseek2.leading_dense_block_count", Value::U32(0))],
            vec![],
            None,
            "layer 0 lacks ffn_gate_inp.weight (a deepseek2 layer needs it)",
        ),
    ];
    for (edits, dims, drop, want) in cases {
        let got = load_edited_moe(Arch::Deepseek2, &edits, &dims, drop);
        assert!(got.contains(want), "{want:?} not in {got:?}");
    }
}
