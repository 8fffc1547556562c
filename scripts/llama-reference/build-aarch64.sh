#!/usr/bin/env bash
# Cross-builds llama.cpp (from the llama-cpp-python 0.3.36 source package) for aarch64 Linux and
# links scripts/llama-reference/dump.c (whole models) and dots.c (one-row dot products) against
# it: the references for strata's ARM kernels, run under qemu-aarch64. One build per CPU level
# strata reproduces:
#
#   neon       -march=armv8-a               (NEON only: Cortex-A72, Raspberry Pi 4)
#   i8mm       -march=armv8.6-a+fp16        (dotprod, i8mm, bf16, fp16: Apple M2 and later,
#                                            Graviton 3/4, Neoverse V/N2; no SVE)
#
#   scripts/llama-reference/build-aarch64.sh [LEVEL...]   (default: both)
#
# Prints the path of each `dump` binary (`dots` is beside it). Needs cmake, gcc-aarch64-linux-gnu and g++ for it;
# LLAMA_SRC may name an unpacked llama.cpp tree; OUT (default ~/.cache/strata-llama-aarch64)
# holds the builds, which are reused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-${XDG_CACHE_HOME:-$HOME/.cache}/strata-llama-aarch64}"
mkdir -p "$out"
src="${LLAMA_SRC:-}"
if [ -z "$src" ]; then
    src="$out/llama_cpp_python-0.3.36/vendor/llama.cpp"
    if [ ! -d "$src" ]; then
        pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$out"
        tar xzf "$out"/llama_cpp_python-0.3.36.tar.gz -C "$out"
    fi
fi
levels=("$@")
[ ${#levels[@]} -gt 0 ] || levels=(neon i8mm)
for level in "${levels[@]}"; do
    case "$level" in
        neon) march=armv8-a ;;
        i8mm) march=armv8.6-a+fp16 ;;
        *) echo "unknown level $level (neon, i8mm)" >&2; exit 2 ;;
    esac
    build="$out/build-$level"
    if [ ! -f "$build/dump" ] || [ ! -f "$build/dots" ] || [ "$here/dump.c" -nt "$build/dump" ] \
        || [ "$here/dots.c" -nt "$build/dots" ]; then
        cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
            -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
            -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="$march" -DGGML_OPENMP=OFF \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
        cmake --build "$build" --target llama -j "$(nproc)" >/dev/null
        aarch64-linux-gnu-gcc -O2 -march="$march" -c -o "$build/dump.o" "$here/dump.c" \
            -I "$src/include" -I "$src/ggml/include"
        aarch64-linux-gnu-g++ -o "$build/dump" "$build/dump.o" \
            $(find "$build" -name 'libllama.a') $(find "$build" -name 'libggml.a') \
            $(find "$build" -name 'libggml-cpu.a') $(find "$build" -name 'libggml-base.a') \
            -lpthread -lm -static
        aarch64-linux-gnu-gcc -O2 -march="$march" -c -o "$build/dots.o" "$here/dots.c" \
            -I "$src/ggml/include"
        aarch64-linux-gnu-g++ -o "$build/dots" "$build/dots.o" \
            $(find "$build" -name 'libggml-cpu.a') $(find "$build" -name 'libggml-base.a') \
            -lpthread -lm -static
    fi
    echo "$build/dump"
done
