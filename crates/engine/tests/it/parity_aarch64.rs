//! Greedy output and logits against llama.cpp's aarch64 build for plain NEON
//! (`-march=armv8-a`, cross-built and run under `qemu-aarch64 -cpu cortex-a72` by
//! `scripts/make-reference.py --aarch64 neon`): the two real models and a synthetic model of every
//! family, together every weight format. The build groups integer lanes, orders float sums,
//! rounds activations and multiplies batches (NEON tinyBLAS, f32 operands) in its own ways;
//! strata reproduces them in its `neon` flavour on any CPU, so these run natively here and under
//! qemu in `scripts/test-aarch64.sh`.

use crate::llama_cpp_parity::{check_against_llama_cpp_fixture, check_synthetic};

#[test]
fn smollm2_matches_an_aarch64_neon_build_of_llama_cpp() {
    // Q4_1 and Q8_0, chat-templated and raw prompts.
    check_against_llama_cpp_fixture(
        "smollm2-135m-instruct",
        "smollm2-135m-instruct-aarch64-neon",
        1e-3,
    );
}

#[test]
fn gemma3_matches_an_aarch64_neon_build_of_llama_cpp() {
    // Q5_0, Q8_0, Q4_K and Q6_K products, GELU through the aarch64 C library's `tanhf`, NEOX
    // RoPE and sliding windows, as llama.cpp's NEON build computes them.
    check_against_llama_cpp_fixture("gemma3-270m", "gemma3-270m-aarch64-neon", 1e-3);
}

#[test]
fn synthetic_llama_iq4_nl_matches_an_aarch64_neon_build() {
    // IQ4_NL: the lookup table's codes, the legacy pairs' float steps.
    check_synthetic("synth-llama-iq4_nl-aarch64-neon");
}

#[test]
fn synthetic_llama_q2_k_matches_an_aarch64_neon_build() {
    // Q2_K: the minimums' sums fused before the scales'.
    check_synthetic("synth-llama-q2_k-aarch64-neon");
}

#[test]
fn synthetic_qwen2_bf16_matches_an_aarch64_neon_build() {
    // BF16 products in f64, QKV biases.
    check_synthetic("synth-qwen2-bf16-aarch64-neon");
}

#[test]
fn synthetic_qwen2_q3_k_matches_an_aarch64_neon_build() {
    // Q3_K.
    check_synthetic("synth-qwen2-q3_k-aarch64-neon");
}

#[test]
fn synthetic_qwen3_f16_matches_an_aarch64_neon_build() {
    // F16 weights: NEON tinyBLAS for batches, 4x4 lanes for one row; QK norms.
    check_synthetic("synth-qwen3-f16-aarch64-neon");
}

#[test]
fn synthetic_qwen3_q5_1_matches_an_aarch64_neon_build() {
    // Q5_1 with Q8_1 activations.
    check_synthetic("synth-qwen3-q5_1-aarch64-neon");
}

#[test]
fn synthetic_qwen3_iq4_xs_matches_an_aarch64_neon_build() {
    // IQ4_XS.
    check_synthetic("synth-qwen3-iq4_xs-aarch64-neon");
}

#[test]
fn synthetic_phi3_q4_k_m_matches_an_aarch64_neon_build() {
    // Phi-3: fused QKV and gate-up, LongRoPE; Q4_K with Q6_K and Q5_K beside it.
    check_synthetic("synth-phi3-q4_k_m-aarch64-neon");
}

#[test]
fn synthetic_gemma2_q8_0_matches_an_aarch64_neon_build() {
    // Gemma 2: GELU through the port of glibc's tanhf, logit soft-capping, windows.
    check_synthetic("synth-gemma2-q8_0-aarch64-neon");
}

#[test]
fn synthetic_smollm3_q4_0_matches_an_aarch64_neon_build() {
    // SmolLM3: Q4_0, layers without RoPE.
    check_synthetic("synth-smollm3-q4_0-aarch64-neon");
}

#[test]
fn synthetic_granite_q4_k_m_matches_an_aarch64_neon_build() {
    // Granite: the embedding, residual and logit multipliers.
    check_synthetic("synth-granite-q4_k_m-aarch64-neon");
}

#[test]
fn synthetic_mistral3_q8_0_matches_an_aarch64_neon_build() {
    // Mistral 3: Q8_0.
    check_synthetic("synth-mistral3-q8_0-aarch64-neon");
}

#[test]
fn synthetic_olmo2_q6_k_matches_an_aarch64_neon_build() {
    // OLMo 2: Q6_K, norms after attention and FFN.
    check_synthetic("synth-olmo2-q6_k-aarch64-neon");
}

#[test]
fn synthetic_olmo2_swa_q8_0_matches_an_aarch64_neon_build() {
    // OLMo 3: windows on three layers of four, YaRN.
    check_synthetic("synth-olmo2-swa-q8_0-aarch64-neon");
}

#[test]
fn synthetic_olmoe_q6_k_matches_an_aarch64_neon_build() {
    // OLMoE: experts in Q6_K, full-width K norm.
    check_synthetic("synth-olmoe-q6_k-aarch64-neon");
}

#[test]
fn synthetic_qwen2moe_q4_k_m_matches_an_aarch64_neon_build() {
    // Qwen2-MoE: a gated shared expert.
    check_synthetic("synth-qwen2moe-q4_k_m-aarch64-neon");
}

#[test]
fn synthetic_qwen3moe_q5_k_matches_an_aarch64_neon_build() {
    // Qwen3-MoE: Q5_K experts, tiled and one-row expert products.
    check_synthetic("synth-qwen3moe-q5_k-aarch64-neon");
}

#[test]
fn synthetic_gpt_oss_mxfp4_moe_matches_an_aarch64_neon_build() {
    // gpt-oss: MXFP4 experts, attention sinks, SwiGLU with clamping.
    check_synthetic("synth-gpt-oss-mxfp4_moe-aarch64-neon");
}

#[test]
fn synthetic_deepseek2_q8_0_matches_an_aarch64_neon_build() {
    // DeepSeek V3: latent attention, grouped sigmoid routing, YaRN.
    check_synthetic("synth-deepseek2-q8_0-aarch64-neon");
}
