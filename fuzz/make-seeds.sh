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
# synth NAME KV_HEADS FLAGS...
synth_kv() {
    local name=$1 kv=$2
    shift 2
    "$STRATA" synth --tokenizer-from "$tiny" --layers 2 --embd 256 --ff 256 --heads 4 \
        --kv-heads "$kv" --seed 3 -o "seeds/$name.gguf" "$@" >/dev/null
    echo "seeds/$name.gguf"
}
synth() {
    local name=$1
    shift
    synth_kv "$name" 2 "$@"
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
# The other mixtures of experts: biased experts with sinks (MXFP4 experts on one layer),
# whole-row norms, a gated shared expert, and DeepSeek's latent attention with expert groups.
moe=(--experts 4 --experts-used 2)
synth gpt-oss-q8_0 --arch gpt-oss --type q8_0 "${moe[@]}"
synth gpt-oss-mxfp4 --arch gpt-oss --type q8_0 "${moe[@]}" \
    --tensor-type blk.0.ffn_gate_exps.weight=mxfp4 --tensor-type blk.0.ffn_up_exps.weight=mxfp4 \
    --tensor-type blk.0.ffn_down_exps.weight=mxfp4
synth_kv olmoe-q8_0 4 --arch olmoe --type q8_0 "${moe[@]}"
synth qwen2moe-q4_k --arch qwen2moe --type q4_k "${moe[@]}"
synth_kv deepseek2-q8_0 1 --arch deepseek2 --type q8_0 --head-dim 64 --experts 8 --experts-used 2
