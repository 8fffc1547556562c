#!/usr/bin/env bash
# Cross-builds the engine's suites for aarch64 Linux and runs them under qemu-aarch64 at two CPU
# levels: `cortex-a72` (NEON only) and `max,sve=off` (NEON with dotprod, i8mm, fp16, bf16).
# Emulation says nothing about speed; it checks the bits: the kernels against their scalar
# definitions, the tokenizer, the GGUF reader and the engine on the real models.
#
#   scripts/test-aarch64.sh            (CI runs it; about N minutes warm on 2 cores)
#
# Trimmed for emulation (each runs 20-50x slower than natively): the engine's integration suite
# runs its llama.cpp parity tests on the two real models and the synthetic families, not its
# batching, prefix-cache and hostile-file tests (the same code, covered natively); the engine's
# unit test that times a real batched step is skipped (a timing under emulation means nothing),
# and so is the sliding-window test that runs three synthetic models twice per order (window
# bookkeeping, no arithmetic of its own).
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
for cpu in cortex-a72 max,sve=off; do
    echo "== aarch64 under qemu -cpu $cpu"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $cpu"
    start=$SECONDS
    cargo test --target "$target" --profile test-release -p strata-kernels -p strata-tokenizer -p strata-gguf -q
    cargo test --target "$target" --profile test-release -p strata-engine --lib -q -- \
        --skip probe::tests::the_probe_times_a_real_batched_step \
        --skip blocks::attention::tests::skipping_the_keys_before_a_window_changes_no_bit
    cargo test --target "$target" --profile test-release -p strata-engine --test it -q -- llama_cpp_parity
    echo "== qemu -cpu $cpu: $((SECONDS - start)) s"
done
