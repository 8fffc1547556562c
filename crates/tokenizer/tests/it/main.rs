//! The tokenizer's integration tests in one test binary (one link instead of three).

mod chat_template;
mod common;
mod golden_vectors;
mod llama_cpp_vocabs;
