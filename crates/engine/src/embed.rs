//! Sentence embeddings from the per-token hidden states [`crate::Model::embed`] leaves: pooled
//! and normalised as llama.cpp's embedding paths (`llama-embedding`, `llama-server`'s
//! `/v1/embeddings`) compute them, bit for bit.
//!
//! - Last-token and first-token (CLS) pooling copy a row.
//! - Normalisation is llama.cpp's Euclidean one: squares summed in double precision, one
//!   reciprocal rounded to f32, each value multiplied by it.
//!
//! Mean pooling is not offered: llama.cpp computes it as an F32 matrix product of the
//! transposed states with a column of `1/n`, and its sums for most prompt lengths follow an
//! order not reproduced here yet.

use strata_gguf::GgufFile;

use crate::{Error, Result};

/// How the states of a text's tokens become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's state (BERT's CLS).
    Cls,
    /// The last token's state (decoder embedding models such as Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// The pooling a GGUF asks for in `ARCH.pooling_type` (llama.cpp's numbering: 2 CLS,
    /// 3 last); `None` when it names none (a chat model) or one strata does not compute
    /// (0 none, 1 mean, 4 rank).
    pub fn of_file(file: &GgufFile) -> Option<Pooling> {
        let md = file.metadata();
        let arch = md.get_str("general.architecture").ok()?;
        match md.get_u32(&format!("{arch}.pooling_type")).ok()? {
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// The name llama.cpp's `--pooling` takes.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// Pools `states` (`n` rows of `width` values, one per token) into one vector.
pub fn pool_states(states: &[f32], width: usize, pooling: Pooling) -> Result<Vec<f32>> {
    let n = states.len().checked_div(width).unwrap_or(0);
    if n == 0 || n * width != states.len() {
        return Err(Error::EmptyPrompt);
    }
    match pooling {
        Pooling::Cls => Ok(states[..width].to_vec()),
        Pooling::Last => Ok(states[(n - 1) * width..].to_vec()),
    }
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
        assert_eq!(
            pool_states(&states, 3, Pooling::Cls).unwrap(),
            [1.0, 2.0, 3.0]
        );
        assert_eq!(
            pool_states(&states, 3, Pooling::Last).unwrap(),
            [5.0, 6.0, 7.0]
        );
        assert!(pool_states(&[], 3, Pooling::Last).is_err());
        assert!(pool_states(&[1.0, 2.0], 3, Pooling::Last).is_err());
        let mut v = [3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, [0.0, 0.0]);
    }
}
