//! `strata synth`: writes a random-weight GGUF of any supported family and chosen dimensions, so
//! families can be checked against llama.cpp and sharding measured where compute and weight
//! traffic dominate (a Llama-1B-like model, say), without downloading one. The tokenizer is
//! copied from a real model, so the file runs end to end; its text is noise, its speed is real.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use strata_engine::Arch;
use strata_engine::synth::SynthSpec;
use strata_gguf::{GgmlType, GgufFile};

/// `strata synth`.
#[derive(Debug, Args)]
pub(crate) struct SynthArgs {
    /// Where to write the GGUF file.
    #[arg(long, short = 'o')]
    output: PathBuf,
    /// Architecture (`general.architecture`): llama, qwen2, qwen3, gemma3.
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
    /// Weight format.
    #[arg(long, value_enum, default_value_t = WeightType::Q4_0)]
    r#type: WeightType,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// `--type`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
#[allow(non_camel_case_types)]
pub(crate) enum WeightType {
    /// 32-bit floats.
    #[value(name = "f32")]
    F32,
    /// 16-bit floats.
    #[value(name = "f16")]
    F16,
    /// 4-bit, 32-element blocks.
    #[value(name = "q4_0")]
    Q4_0,
    /// 4-bit with a minimum, 32-element blocks.
    #[value(name = "q4_1")]
    Q4_1,
    /// 5-bit, 32-element blocks.
    #[value(name = "q5_0")]
    Q5_0,
    /// 8-bit, 32-element blocks.
    #[value(name = "q8_0")]
    Q8_0,
}

impl WeightType {
    fn ggml(self) -> GgmlType {
        match self {
            WeightType::F32 => GgmlType::F32,
            WeightType::F16 => GgmlType::F16,
            WeightType::Q4_0 => GgmlType::Q4_0,
            WeightType::Q4_1 => GgmlType::Q4_1,
            WeightType::Q5_0 => GgmlType::Q5_0,
            WeightType::Q8_0 => GgmlType::Q8_0,
        }
    }
}

pub(crate) fn synth(a: SynthArgs) -> Result<()> {
    let arch = Arch::parse(&a.arch)?;
    let base_path = crate::cmd_run::resolve_model(&a.tokenizer_from)?;
    let base = GgufFile::open(&base_path)?;
    let spec = SynthSpec {
        arch,
        layers: a.layers,
        embd: a.embd,
        ff: a.ff,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        ty: a.r#type.ggml(),
        seed: a.seed,
    };
    let bytes = strata_engine::synth::synth(&spec, &base)?;
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
