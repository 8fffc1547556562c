#!/usr/bin/env bash
# Cross-builds the engine's suites for aarch64 Linux and runs them under qemu-aarch64 at two CPU
# levels: `cortex-a72` (NEON only) and `max,sve=off` (NEON with dotprod, i8mm, fp16, bf16).
# Emulation says nothing about speed; it checks the bits: the kernels against their scalar
# definitions, the tokenizer, the GGUF reader and the engine against llama.cpp on synthetic models.
#
#   scripts/test-aarch64.sh            (CI runs it)
#
# Trimmed for emulation (each runs 20-50x slower than natively). The kernel suite checks the
# NEON kernels against their portable definitions and against llama.cpp's aarch64 NEON build's
# own products (fixtures/quant/dots-aarch64-neon.json), at both levels; both run the NEON
# flavour (strata does not use dotprod or i8mm yet). The engine's integration suite runs, on
# the NEON level, 4 synthetic models against llama.cpp's aarch64 NEON build in strata's native
# flavour there (see `neon_parity`: the NEON kernels end to end), and on the dotprod + i8mm
# level 8 of its x86 parity tests (see `parity`) in the x86 builds' flavour, which strata
# reproduces on ARM too. Not run under emulation: the parity tests on the two real models, x86
# and aarch64 references alike (64 tokens x 7 prompts take over 10 minutes each there; the
# aarch64 ones run natively on x86 in the main suite, through the portable definitions and
# their AVX2 emulation), the other synthetic families (all 19 aarch64 references run on x86), and the
# batching, prefix-cache and hostile-file tests (the same arithmetic, covered natively). The
# engine's unit test that times a real batched step is skipped (a timing under emulation means
# nothing), and so is the sliding-window test that runs three synthetic models twice per order
# (window bookkeeping, no arithmetic of its own).
#
# Needs the rustup target aarch64-unknown-linux-gnu and Debian's gcc-aarch64-linux-gnu and
# qemu-user; as root (CI) it installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user >/dev/null
    else
        echo "needs gcc-aarch64-linux-gnu and qemu-user (apt-get install gcc-aarch64-linux-gnu qemu-user)" >&2
        exit 1
    fi
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
crates=(-p strata-kernels -p strata-tokenizer -p strata-gguf -p strata-engine)
cargo test --target "$target" --profile test-release "${crates[@]}" --no-run
# One parity test per kind of kernel (legacy, K-quant, lookup-table and half-precision formats),
# plus the mixture-of-experts (MXFP4) and latent-attention paths: about 50 s each under qemu.
parity=(synthetic_llama_q4_0 synthetic_qwen2_q4_1 synthetic_llama_q8_0 synthetic_llama_q4_k_m
    synthetic_llama_iq4_xs_matches synthetic_qwen2_bf16 synthetic_gpt_oss synthetic_deepseek2_q8_0)
parity=("${parity[@]/#/llama_cpp_parity::}")
# Against llama.cpp's NEON build: the legacy, Q8_0 (with glibc's tanhf), Q6_K and K-quant
# mixture-of-experts kernels, about 40 s each.
neon_parity=(parity_aarch64::synthetic_smollm3_q4_0 parity_aarch64::synthetic_gemma2_q8_0
    parity_aarch64::synthetic_olmo2_q6_k parity_aarch64::synthetic_qwen3moe_q5_k)
for cpu in cortex-a72 max,sve=off; do
    echo "== aarch64 under qemu -cpu $cpu"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $cpu"
    start=$SECONDS
    cargo test --target "$target" --profile test-release -p strata-kernels -p strata-tokenizer -p strata-gguf -q
    cargo test --target "$target" --profile test-release -p strata-engine --lib -q -- \
        --skip probe::tests::the_probe_times_a_real_batched_step \
        --skip blocks::attention::tests::skipping_the_keys_before_a_window_changes_no_bit
    if [ "$cpu" = "max,sve=off" ]; then
        cargo test --target "$target" --profile test-release -p strata-engine --test it -q -- \
            "${parity[@]}"
    else
        cargo test --target "$target" --profile test-release -p strata-engine --test it -q -- \
            "${neon_parity[@]}"
    fi
    echo "== qemu -cpu $cpu: $((SECONDS - start)) s"
done
