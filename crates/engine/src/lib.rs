//! The inference engine: the forward pass of fifteen decoder families (dense: Llama, Gemma 2 and
//! 3, Qwen2 and 3, Phi-3, SmolLM3, Granite, Mistral 3, OLMo 2; mixtures of experts: Qwen3-MoE,
//! Qwen2-MoE, OLMoE, gpt-oss, DeepSeek-V2/V3; one file each under `models/`) over a shard of a
//! model, its KV cache, sampling, and the generation loop that ties them to a tokenizer.
//!
//! Main types: [`Model`] (a loaded [`ShardSpec`] of a GGUF model), [`KvCache`], [`Scratch`],
//! [`Sampler`], and [`Generator`] (prompt in, streamed tokens and timing out). The model code is
//! written for shards from the start: a worker may own any layer range and any slice of heads,
//! FFN columns and vocabulary rows, and combines partial results through a [`Collective`].
//! Arithmetic follows llama.cpp's bit for bit, in the flavour of the llama.cpp build chosen with
//! [`Model::set_flavour`] (its AVX-512 and AVX2 builds round differently).
//!
//! The engine depends on the GGUF reader, the tokenizer and the kernels; it knows nothing of
//! networks, clusters or HTTP.
#![warn(missing_docs)]

mod batch;
mod blocks;
mod config;
pub mod embed;
mod error;
mod generate;
mod kv_cache;
mod model;
mod models;
pub mod prefix;
pub mod probe;
mod ready;
mod sampler;
mod sequences;
mod shard;
pub mod speculate;
pub mod synth;
mod weights;

pub use batch::{Batch, SlotId};
pub use config::{
    DEFAULT_CONTEXT_CAP, FfnAct, ModelConfig, SlidingWindow, held_bytes, streamed_bytes,
    streamed_params,
};
pub use error::{Error, Result};
pub use generate::{GenerateRequest, GenerationStats, Generator, SpeculationStats, StopReason};
/// The half-precision float the KV cache keeps keys and values in.
pub use half::f16;
pub use kv_cache::KvCache;
pub use model::{Axis, Collective, CommError, Model, NoComm, Scratch, StageInput};
pub use models::Arch;
pub use ready::Ready;
pub use sampler::{Sampler, SamplingParams, shard_candidates};
pub use sequences::{
    EngineError, PREFILL_CHUNK, Sequences, StepKind, generate, mask_allow, mask_allows,
    prefill_chunks,
};
pub use shard::{Combine, ExpertSplit, ShardSpec};
