#!/usr/bin/env bash
# Writes fuzz/seeds/: the tiny Llama seed (make-seed.py), then one small random-weight model of
# every architecture strata runs, in several tensor types (legacy, K-quant, IQ4, BF16, a fused
# or windowed variant), written by `strata synth` with the tiny seed's 16-token vocabulary. The
# gguf_load target mutates these, so every family's loader, its metadata checks and each
# type's kernels are reached from the first run. Usage (from the repository root, after
# `cargo build --release`):
#   bash fuzz/make-seeds.sh [path/to/strata]
set -euo pipefail
cd "$(dirname "$0")"
STRATA="${1:-../target/release/strata}"
python3 make-seed.py >/dev/null
tiny=seeds/tiny-llama.gguf
synth() {
    local name=$1
    shift
    "$STRATA" synth --tokenizer-from "$tiny" --layers 2 --embd 256 --ff 256 --heads 4 \
        --kv-heads 2 --seed 3 -o "seeds/$name.gguf" "$@" >/dev/null
    echo "seeds/$name.gguf"
}
for arch in llama qwen2 qwen3 phi3 gemma2 gemma3 smollm3 granite mistral3 olmo2 qwen3moe; do
    for ty in q4_0 q8_0 q4_k; do
        synth "$arch-$ty" --arch "$arch" --type "$ty"
    done
done
for ty in q4_1 q5_0 q5_1 q2_k q3_k q5_k q6_k iq4_nl iq4_xs bf16 f16; do
    synth "qwen2-$ty" --arch qwen2 --type "$ty"
done
synth olmo3-q8_0 --arch olmo2 --type q8_0 --sliding-window 16
for ty in q8_0 q5_k bf16 q4_k; do
    synth "qwen3moe-$ty" --arch qwen3moe --type "$ty" --experts 4 --experts-used 2
done
synth llama-mix --arch llama --type q4_k --tensor-type blk.0.ffn_down.weight=q6_k \
    --tensor-type token_embd.weight=q8_0
