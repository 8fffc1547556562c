//! `strata synth`: writes a random-weight GGUF of any supported family and chosen dimensions, so
//! families can be checked against llama.cpp and sharding measured where compute and weight
//! traffic dominate (a Llama-1B-like model, say), without downloading one. The tokenizer is
//! copied from a real model, so the file runs end to end; its text is noise, its speed is real.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use strata_engine::Arch;
use strata_engine::synth::{SynthLayout, SynthSpec};
use strata_gguf::{GgmlType, GgufFile};

/// `strata synth`.
#[derive(Debug, Args)]
pub(crate) struct SynthArgs {
    /// Where to write the GGUF file.
    #[arg(long, short = 'o')]
    output: PathBuf,
    /// Architecture (`general.architecture`): llama, qwen2, qwen3, phi3, gemma2, gemma3, smollm3,
    /// granite, mistral3, olmo2, qwen3moe, gpt-oss, olmoe, qwen2moe, deepseek2.
    #[arg(long, default_value = "llama")]
    arch: String,
    /// Model whose tokenizer to copy (catalog id or path).
    #[arg(long, default_value = strata_store::DEFAULT_MODEL_ID)]
    tokenizer_from: String,
    /// Decoder layers.
    #[arg(long, default_value_t = 16)]
    layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 2048)]
    embd: usize,
    /// FFN width.
    #[arg(long, default_value_t = 8192)]
    ff: usize,
    /// Query heads.
    #[arg(long, default_value_t = 32)]
    heads: usize,
    /// Key/value heads.
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    /// Head width (default: width / heads).
    #[arg(long)]
    head_dim: Option<usize>,
    /// Weight format of the matrices: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k,
    /// q4_k, q5_k, q6_k, iq4_nl, iq4_xs (written as llama.cpp's quantiser writes them).
    #[arg(long, default_value = "q4_0", value_parser = parse_type)]
    r#type: GgmlType,
    /// Another type for one tensor, as `NAME=TYPE` (repeatable): a quantisation mix such as
    /// llama.cpp's Q4_K_M.
    #[arg(long = "tensor-type", value_parser = parse_tensor_type)]
    tensor_types: Vec<(String, GgmlType)>,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sliding window of the family's window layers: Gemma 2's (default 16); for olmo2, an
    /// OLMo 3 model (a window on three layers of four, YaRN on the others).
    #[arg(long)]
    sliding_window: Option<usize>,
    /// A chat template file (Jinja) to carry instead of the family's.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Experts per layer of a mixture-of-experts family (qwen3moe, gpt-oss, olmoe, qwen2moe,
    /// deepseek2; default 8). `--ff` is then
    /// one expert's FFN width.
    #[arg(long)]
    experts: Option<usize>,
    /// Experts each token uses (default 2).
    #[arg(long)]
    experts_used: Option<usize>,
    /// Make an embedding model: its pooling (`mean`, `cls`, or `last`, which also appends EOS
    /// to every text, as Qwen3-Embedding does).
    #[arg(long, value_parser = parse_pooling)]
    pooling: Option<strata_engine::embed::Pooling>,
    /// phi3: separate attn_q/k/v instead of the fused attn_qkv.
    #[arg(long)]
    split_qkv: bool,
    /// phi3: no LongRoPE factors or scaling keys (as Phi-3-mini-4k's files).
    #[arg(long)]
    no_longrope: bool,
    /// A separate `output.weight` (LM head) even for families whose converter ties it.
    #[arg(long)]
    untied: bool,
}

fn parse_type(s: &str) -> std::result::Result<GgmlType, String> {
    GgmlType::from_name(s)
        .filter(|t| strata_engine::synth::WRITABLE.contains(t))
        .ok_or_else(|| {
            let names: Vec<String> = strata_engine::synth::WRITABLE
                .iter()
                .map(|t| t.name().to_lowercase())
                .collect();
            format!(
                "unknown or unwritable type {s:?} (one of {})",
                names.join(", ")
            )
        })
}

fn parse_tensor_type(s: &str) -> std::result::Result<(String, GgmlType), String> {
    let (name, ty) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=TYPE"))?;
    Ok((name.to_string(), parse_type(ty)?))
}

pub(crate) fn synth(a: SynthArgs) -> Result<()> {
    let arch = Arch::parse(&a.arch)?;
    let base_path = crate::cmd_run::resolve_model(&a.tokenizer_from)?;
    let base = GgufFile::open(&base_path)?;
    let chat_template = match &a.chat_template {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the chat template {}", p.display()))?,
        ),
        None => None,
    };
    let spec = SynthSpec {
        arch,
        layers: a.layers,
        embd: a.embd,
        ff: a.ff,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        ty: a.r#type,
        tensor_types: a.tensor_types,
        seed: a.seed,
        sliding_window: a.sliding_window,
        chat_template,
        experts: match (a.experts, a.experts_used) {
            (None, None) => None,
            (n, u) => Some((n.unwrap_or(8), u.unwrap_or(2))),
        },
        pooling: a.pooling,
    };
    let layout = SynthLayout {
        split_qkv: a.split_qkv,
        no_longrope: a.no_longrope,
        untied: a.untied,
    };
    let bytes = strata_engine::synth::synth_with(&spec, layout, &base)?;
    let tmp = a.output.with_extension("gguf.partial");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &a.output)?;
    println!(
        "wrote {} ({:.1} MB, {} {} layers, width {}, FFN {}, {}/{} heads, {})",
        a.output.display(),
        bytes.len() as f64 / 1e6,
        arch.name(),
        a.layers,
        a.embd,
        a.ff,
        a.heads,
        a.kv_heads,
        spec.ty,
    );
    Ok(())
}

pub(crate) fn parse_pooling(s: &str) -> std::result::Result<strata_engine::embed::Pooling, String> {
    use strata_engine::embed::Pooling;
    [Pooling::Mean, Pooling::Cls, Pooling::Last]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("{s:?} is not a pooling: give mean, cls or last"))
}
