//! Sentence embeddings from the per-token hidden states [`crate::Model::embed`] leaves: pooled
//! and normalised as llama.cpp's embedding paths (`llama-embedding`, `llama-server`'s
//! `/v1/embeddings`) compute them, bit for bit.
//!
//! - Mean pooling is llama.cpp's F32 matrix product of the transposed states with a column
//!   of `1/n`, summed in that product's order (`mean` below). Each text is pooled alone, as
//!   `llama-embedding` does with one text per batch.
//! - Last-token and first-token (CLS) pooling copy a row.
//! - Normalisation is llama.cpp's Euclidean one: squares summed in double precision, one
//!   reciprocal rounded to f32, each value multiplied by it.

use strata_gguf::GgufFile;
use strata_kernels::attn::Flavour;

use crate::{Error, Result};

/// How the states of a text's tokens become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The average of every token's state.
    Mean,
    /// The first token's state (BERT's CLS).
    Cls,
    /// The last token's state (decoder embedding models such as Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// The pooling a GGUF asks for in `ARCH.pooling_type` (llama.cpp's numbering: 1 mean,
    /// 2 CLS, 3 last); `None` when it names none (a chat model) or one strata does not
    /// compute (0 none, 4 rank).
    pub fn of_file(file: &GgufFile) -> Option<Pooling> {
        let md = file.metadata();
        let arch = md.get_str("general.architecture").ok()?;
        Pooling::from_gguf_code(md.get_u32(&format!("{arch}.pooling_type")).ok()?)
    }

    /// The pooling llama.cpp's number `code` names ([`Pooling::gguf_code`]); `None` for
    /// none, rank, or a number it does not use.
    pub fn from_gguf_code(code: u32) -> Option<Pooling> {
        match code {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// llama.cpp's number for it in `ARCH.pooling_type`.
    pub fn gguf_code(self) -> u32 {
        match self {
            Pooling::Mean => 1,
            Pooling::Cls => 2,
            Pooling::Last => 3,
        }
    }

    /// The name llama.cpp's `--pooling` takes.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// Pools `states` (`n` rows of `width` values, one per token) into one vector, summing as the
/// llama.cpp build `flavour` names does.
pub fn pool_states(
    states: &[f32],
    width: usize,
    pooling: Pooling,
    flavour: Flavour,
) -> Result<Vec<f32>> {
    let n = states.len().checked_div(width).unwrap_or(0);
    if n == 0 || n * width != states.len() {
        return Err(Error::EmptyPrompt);
    }
    match pooling {
        Pooling::Cls => Ok(states[..width].to_vec()),
        Pooling::Last => Ok(states[(n - 1) * width..].to_vec()),
        Pooling::Mean => {
            let inv = 1.0 / n as f32;
            let mut col = vec![0.0f32; n];
            Ok((0..width)
                .map(|d| {
                    for (c, row) in col.iter_mut().zip(states.chunks_exact(width)) {
                        *c = row[d];
                    }
                    mean(&col, inv, flavour)
                })
                .collect())
        }
    }
}

/// One dimension's mean: `Σ x[t] · inv` in the order of `ggml_vec_dot_f32`, which llama.cpp
/// runs for one text's mean (its tinyBLAS kernel takes only products with two or more
/// columns): four fused accumulators of the build's vector width (16 floats with AVX-512, 8
/// with AVX2) over whole steps of four vectors, reduced as the build's `REDUCE` macro does,
/// then the leftovers as GCC 12 compiles that loop. ggml is built without fast-math, so the
/// leftovers are summed in order, but the compiler multiplies whole vectors of them unfused
/// (as many as fit, then one of half the width) and fuses only the last few multiply-adds.
fn mean(x: &[f32], inv: f32, flavour: Flavour) -> f32 {
    let lanes = match flavour {
        Flavour::Avx512 => 16,
        Flavour::Avx2 => 8,
        Flavour::Neon => 4,
    };
    let n = x.len();
    let step = 4 * lanes;
    let whole = n / step * step;
    let mut acc = [[0.0f32; 16]; 4];
    for i in (0..whole).step_by(step) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a[..lanes].iter_mut().enumerate() {
                *a = x[i + j * lanes + l].mul_add(inv, *a);
            }
        }
    }
    let v: Vec<f32> = (0..lanes)
        .map(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]))
        .collect();
    let mut sum = match flavour {
        // _mm512_reduce_add_ps: halves added down to one lane.
        Flavour::Avx512 => {
            let mut v = v;
            while v.len() > 1 {
                let h = v.len() / 2;
                v = (0..h).map(|i| v[i] + v[i + h]).collect();
            }
            v[0]
        }
        // The 128-bit halves added, then two horizontal adds.
        Flavour::Avx2 => {
            let t: Vec<f32> = (0..4).map(|i| v[i] + v[i + 4]).collect();
            (t[0] + t[1]) + (t[2] + t[3])
        }
        // vaddvq_f32: pairwise.
        Flavour::Neon => (v[0] + v[1]) + (v[2] + v[3]),
    };
    let mut i = whole;
    let unfused = |sum: &mut f32, i: &mut usize, width: usize| {
        for &v in &x[*i..*i + width] {
            *sum += v * inv;
        }
        *i += width;
    };
    while n - i >= lanes {
        unfused(&mut sum, &mut i, lanes);
    }
    // GCC vectorises the aarch64 leftovers four at a time only.
    if n - i >= lanes / 2 && flavour != Flavour::Neon {
        unfused(&mut sum, &mut i, lanes / 2);
    }
    for &v in &x[i..] {
        sum = v.mul_add(inv, sum);
    }
    sum
}

/// Scales `v` to unit Euclidean length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let sum = v.iter().map(|&x| f64::from(x * x)).sum::<f64>().sqrt();
    let scale = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    for x in v {
        *x *= scale;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rows_are_pooled_and_normalised() {
        let states = [1.0, 2.0, 3.0, 5.0, 6.0, 7.0];
        for f in [Flavour::Avx512, Flavour::Avx2] {
            let pooled = |p| pool_states(&states, 3, p, f).unwrap();
            assert_eq!(pooled(Pooling::Cls), [1.0, 2.0, 3.0]);
            assert_eq!(pooled(Pooling::Last), [5.0, 6.0, 7.0]);
            assert_eq!(pooled(Pooling::Mean), [3.0, 4.0, 5.0]);
            assert!(pool_states(&[], 3, Pooling::Last, f).is_err());
            assert!(pool_states(&[1.0, 2.0], 3, Pooling::Mean, f).is_err());
        }
        let mut v = [3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, [0.0, 0.0]);
    }

    /// ggml's own mean (`fixtures/reference/mean-pooling.json`, made by
    /// `scripts/make-mean-pooling-reference.py` from an AVX-512 and an AVX2 build) for lengths
    /// 1 to 200: every way the vector loop, its reduction and the leftovers combine.
    #[test]
    fn the_mean_is_ggmls_bit_for_bit_for_both_builds() {
        use sha2::{Digest, Sha256};
        let fx: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!(
                "{}/../../fixtures/reference/mean-pooling.json",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap(),
        )
        .unwrap();
        let width = fx["width"].as_u64().unwrap() as usize;
        let mut failures = Vec::new();
        for (name, flavour) in [("avx512", Flavour::Avx512), ("avx2", Flavour::Avx2)] {
            for (n, want) in fx["builds"][name].as_object().unwrap() {
                let n: usize = n.parse().unwrap();
                let states: Vec<f32> = (0..n)
                    .flat_map(|t| {
                        (0..width)
                            .map(move |d| ((t * 7919 + d * 104729) % 2001) as f32 / 1000.0 - 1.0)
                    })
                    .collect();
                let got = pool_states(&states, width, Pooling::Mean, flavour).unwrap();
                let mut h = Sha256::new();
                for v in &got {
                    h.update(v.to_le_bytes());
                }
                if format!("{:x}", h.finalize()) != want.as_str().unwrap() {
                    failures.push(format!("{name} n={n}"));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:?}");
    }
}
