#!/usr/bin/env python3
"""Writes fixtures/reference/mean-pooling.json: ggml's mean pooling (scripts/llama-reference/mean.c)
for lengths 1 to 200 on states made by a fixed formula, from an AVX-512 and an AVX2 build of
ggml, as the SHA-256 of each result's f32 bytes. strata's mean (crates/engine/src/embed.rs) must
give the same bits for the flavour of each build.

A build is a llama.cpp tree's CMake build directory with libggml-base and libggml-cpu, e.g.
`cmake -B build-avx2 -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_AVX512=OFF && cmake --build build-avx2 --target ggml-cpu`.

    python3 scripts/make-mean-pooling-reference.py TREE avx512=build avx2=build-avx2 > fixtures/reference/mean-pooling.json
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

WIDTH = 48
LENGTHS = list(range(1, 41)) + [47, 48, 63, 64, 65, 72, 79, 80, 95, 96, 100, 127, 128, 129, 150, 200]


def main():
    tree = sys.argv[1]
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama-reference", "mean.c")
    out = {"width": WIDTH, "formula": "((t * 7919 + d * 104729) % 2001) / 1000 - 1", "builds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in sys.argv[2:]:
            flavour, build = spec.split("=", 1)
            lib = os.path.join(tree, build, "bin")
            exe = os.path.join(tmp, "mean-" + flavour)
            subprocess.run(["gcc", "-O2", f"-I{tree}/ggml/include", src, f"-L{lib}", "-lggml-base", "-lggml-cpu",
                            f"-Wl,-rpath,{lib}", "-o", exe], check=True)
            digests = {}
            for n in LENGTHS:
                words = subprocess.run([exe, str(n), str(WIDTH)], capture_output=True, text=True,
                                       check=True).stdout.strip().split(",")
                data = b"".join(struct.pack("<I", int(w, 16)) for w in words)
                digests[str(n)] = hashlib.sha256(data).hexdigest()
            out["builds"][flavour] = digests
    json.dump(out, sys.stdout, indent=1)
    print()


main()
