//! The compute kernels of strata's forward pass: quantised matrix products against 8-bit
//! quantised activations, element-wise layer operations, and the thread pool they run on.
//!
//! Main types: [`QMatrix`] (a weight matrix in a GGUF format, borrowed from the mmap, owned, or
//! repacked for the SIMD kernels, see `packed`), [`QuantActs`] (activations converted for a
//! product), [`matmul`], [`ThreadPool`]. Every SIMD kernel has a scalar twin (`dot`, [`ops`],
//! [`attn`]) that it must match bit for bit; SIMD is chosen at run time from the CPU's features,
//! so one binary runs everywhere.
//!
//! This crate knows nothing of models, tokenizers or networks: it depends only on `strata-gguf`
//! for the names of the formats.
#![warn(missing_docs)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod acts;
pub(crate) mod arm;
mod arm_pairs;
pub mod attn;
pub(crate) mod dot;
pub mod formats;
pub(crate) mod kformats;
pub(crate) mod kquants;
pub(crate) mod libm;
mod matmul;
mod matmul_arm;
pub mod membw;
pub mod ops;
pub(crate) mod packed;
mod pool;
pub(crate) mod quantize;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_attn;
#[cfg(target_arch = "x86_64")]
mod x86_kformats;
#[cfg(target_arch = "x86_64")]
mod x86_kquants;
#[cfg(target_arch = "x86_64")]
mod x86_ops;
#[cfg(target_arch = "x86_64")]
mod x86_rowdot;

use std::sync::OnceLock;

pub use acts::QuantActs;
pub use matmul::{QMatrix, WeightBytes, matmul, matmul_multi};
pub use pool::ThreadPool;
pub use strata_gguf::GgmlType;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor's shape does not fit its format or purpose.
    #[error("{what}: {detail}")]
    Shape {
        /// What was checked.
        what: &'static str,
        /// The numbers.
        detail: String,
    },
    /// The kernels cannot compute with this weight format (yet).
    #[error(
        "unsupported weight format {0} (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4)"
    )]
    UnsupportedType(GgmlType),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether [`matmul`] can use weights of this format.
pub fn supported_weight(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::IQ4NL
            | GgmlType::IQ4XS
            | GgmlType::MXFP4
    )
}

/// The instruction sets the kernels may use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa {
    /// AVX2 + FMA + F16C.
    pub avx2: bool,
}

static ISA: OnceLock<Isa> = OnceLock::new();

/// Detected instruction sets, unless `STRATA_NO_SIMD` is set (to run the portable path).
pub fn isa() -> Isa {
    *ISA.get_or_init(|| {
        if std::env::var_os("STRATA_NO_SIMD").is_some() {
            return Isa { avx2: false };
        }
        #[cfg(target_arch = "x86_64")]
        {
            Isa {
                avx2: is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Isa { avx2: false }
        }
    })
}

/// Whether a SIMD kernel (over the packed layout) exists for weights of `ty` on this CPU.
pub fn simd_kernels(ty: GgmlType) -> bool {
    isa().avx2 && packed::packable(ty)
}

#[cfg(test)]
mod tests;
