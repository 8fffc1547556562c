#!/usr/bin/env bash
# Regenerates fixtures/split/MODEL.json: the SHA-256 of every part llama.cpp's own
# `llama-gguf-split --split --split-max-tensors N` writes of a catalog model, which the parity
# test `smollm2_split_by_llama_gguf_split_matches_llama_cpp` checks strata's splitter against
# before it runs the set.
#
#   scripts/make-split-reference.sh [MODEL] [N]     (default: smollm2-135m-instruct 64)
#
# Builds llama-gguf-split from the llama-cpp-python 0.3.36 source package (needs cmake and a C++
# compiler; LLAMA_SRC may name an unpacked llama.cpp tree instead) and the model through
# strata's store (STRATA_BIN, default target/release/strata).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-smollm2-135m-instruct}"
n="${2:-64}"
strata="${STRATA_BIN:-target/release/strata}"
work="${WORK:-$(mktemp -d)}"
src="${LLAMA_SRC:-}"
if [ -z "$src" ]; then
    pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$work"
    tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
    src="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
fi
if [ ! -x "$src/build/bin/llama-gguf-split" ]; then
    cmake -S "$src" -B "$src/build" -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$src/build" --target llama-gguf-split -j "$(nproc)" >/dev/null
fi
file="$("$strata" models path "$model")"
"$src/build/bin/llama-gguf-split" --split --split-max-tensors "$n" "$file" "$work/$model" >/dev/null
python3 - "$model" "$n" "$work" > "fixtures/split/$model.json" <<'PY'
import glob, hashlib, json, sys
model, n, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
parts = sorted(glob.glob(f"{work}/{model}-*-of-*.gguf"))
digests = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in parts]
print(json.dumps({"model": model, "tool": "llama-gguf-split (llama-cpp-python 0.3.36)",
                  "split_max_tensors": n, "parts_sha256": digests}, indent=1))
PY
echo "wrote fixtures/split/$model.json ($(ls "$work/$model"-*-of-*.gguf | wc -l) parts)"
