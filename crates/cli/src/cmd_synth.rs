//! `strata synth`: writes a random-weight Llama GGUF of chosen dimensions, so sharding can be
//! measured where compute and weight traffic dominate (a Llama-1B-like model, say), without
//! downloading one. The tokenizer and chat template are copied from a real model, so the file
//! runs end to end; its text is noise, its speed is real.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use strata_gguf::{Array, Value};
use strata_gguf::{GgmlType, GgufFile, GgufWriter};
use strata_kernels::formats::quantize_weights;

/// `strata synth`.
#[derive(Debug, Args)]
pub(crate) struct SynthArgs {
    /// Where to write the GGUF file.
    #[arg(long, short = 'o')]
    output: PathBuf,
    /// Model whose tokenizer and chat template to copy (catalog id or path).
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
    /// 4-bit, 32-element blocks.
    #[value(name = "q4_0")]
    Q4_0,
    /// 8-bit, 32-element blocks.
    #[value(name = "q8_0")]
    Q8_0,
}

struct Noise(u64);

impl Noise {
    /// Uniform values in [-scale, scale).
    fn fill(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

pub(crate) fn synth(a: SynthArgs) -> Result<()> {
    let (e, ff, nh, nkv) = (a.embd, a.ff, a.heads, a.kv_heads);
    if a.layers == 0 || nh == 0 || nkv == 0 || !nh.is_multiple_of(nkv) || !e.is_multiple_of(nh) {
        bail!("need layers >= 1, heads a multiple of kv-heads, and embd a multiple of heads");
    }
    if !e.is_multiple_of(32) || !ff.is_multiple_of(32) {
        bail!("embd and ff must be multiples of 32 (the quantisation block)");
    }
    let hd = e / nh;
    let base_path = crate::cmd_run::resolve_model(&a.tokenizer_from)?;
    let base = GgufFile::open(&base_path)?;
    let md = base.metadata();
    let vocab = match md.get("tokenizer.ggml.tokens") {
        Some(Value::Array(Array::String(t))) => t.len(),
        _ => bail!("{} has no tokenizer to copy", base_path.display()),
    };
    let ty = match a.r#type {
        WeightType::Q4_0 => GgmlType::Q4_0,
        WeightType::Q8_0 => GgmlType::Q8_0,
    };
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv(
            "general.name",
            Value::String(format!(
                "synthetic llama {}L {e}x{ff} {nh}/{nkv} heads {:?}",
                a.layers, a.r#type
            )),
        )
        .kv("llama.block_count", Value::U32(a.layers as u32))
        .kv("llama.context_length", Value::U32(4096))
        .kv("llama.embedding_length", Value::U32(e as u32))
        .kv("llama.feed_forward_length", Value::U32(ff as u32))
        .kv("llama.attention.head_count", Value::U32(nh as u32))
        .kv("llama.attention.head_count_kv", Value::U32(nkv as u32))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.rope.dimension_count", Value::U32(hd as u32));
    for (k, v) in md.iter() {
        if k.starts_with("tokenizer.") {
            w.kv(k, v.clone());
        }
    }
    let mut noise = Noise(a.seed.max(1));
    let mut matrix = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize| {
        // Small weights keep activations finite through many layers.
        let x = noise.fill(cols * rows, 1.0 / (cols as f32).sqrt());
        w.tensor(
            name,
            &[cols as u64, rows as u64],
            ty,
            quantize_weights(ty, &x),
        );
    };
    let ones = |n: usize| quantize_weights(GgmlType::F32, &vec![1.0; n]);
    matrix(&mut w, "token_embd.weight", e, vocab);
    w.tensor("output_norm.weight", &[e as u64], GgmlType::F32, ones(e));
    for l in 0..a.layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        w.tensor(&n("attn_norm"), &[e as u64], GgmlType::F32, ones(e));
        w.tensor(&n("ffn_norm"), &[e as u64], GgmlType::F32, ones(e));
        matrix(&mut w, &n("attn_q"), e, nh * hd);
        matrix(&mut w, &n("attn_k"), e, nkv * hd);
        matrix(&mut w, &n("attn_v"), e, nkv * hd);
        matrix(&mut w, &n("attn_output"), nh * hd, e);
        matrix(&mut w, &n("ffn_gate"), e, ff);
        matrix(&mut w, &n("ffn_up"), e, ff);
        matrix(&mut w, &n("ffn_down"), ff, e);
    }
    let bytes = w.to_bytes();
    let tmp = a.output.with_extension("gguf.partial");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &a.output)?;
    println!(
        "wrote {} ({:.1} MB, {} layers, width {e}, FFN {ff}, {nh}/{nkv} heads, vocabulary {vocab})",
        a.output.display(),
        bytes.len() as f64 / 1e6,
        a.layers
    );
    Ok(())
}
