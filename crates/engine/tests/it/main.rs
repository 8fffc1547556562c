//! The engine's integration tests in one test binary (one link instead of three).
//! `no_alloc_per_token` stays a binary of its own: it counts allocations process-wide.

mod batched_decode;
mod embeddings;
mod hostile_model;
mod llama_cpp_parity;
mod parity_aarch64;
mod prefix_cache;
mod speculation;
