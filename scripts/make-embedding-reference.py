#!/usr/bin/env python3
"""Writes fixtures/reference/embeddings-ID.json: llama.cpp's pooled and normalised embeddings of
a few prompts, for crates/engine/tests/it/embeddings.rs.

llama.cpp computes them through scripts/llama-reference/embed.cpp (what llama-embedding does:
one prompt per batch, special tokens parsed, every token an output, no flash attention;
common_embd_normalize for the Euclidean normalisation), built against a llama.cpp tree that was
built with CMake (`cmake -B build && cmake --build build --target llama-common`). The fixture
keeps each vector's SHA-256 (of its f32 bytes) and first values.

    python3 scripts/make-embedding-reference.py LLAMA_CPP_TREE MODEL.gguf > fixtures/reference/embeddings-smollm2-135m-instruct.json

For a synthetic model, SYNTH (a JSON object of the `strata synth` options the file was made
with) is kept with the file's SHA-256, so the test can make the same file again:

    strata synth -o /tmp/qemb.gguf --arch qwen3 --type q8_0 --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --pooling last
    python3 scripts/make-embedding-reference.py LLAMA_CPP_TREE /tmp/qemb.gguf '{"arch": "qwen3", ...}' > fixtures/reference/embeddings-synth-qwen3-embedding.json
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

# Prompts of 1 to about 70 tokens (for the mean: multiples of the vector width and not, leftovers
# of every kind), a chat turn with special tokens among them.
PROMPTS = [
    "The capital of France is Paris.",
    "Embeddings turn text into vectors; similar texts end up close together, so a search can rank documents by meaning.",
    "Hello",
    "<|im_start|>user\nWhat is the weather like?<|im_end|>",
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
    "one two three four five six seven eight",
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen",
    "A cluster of small machines can run a model too large for any one of them: each node holds a "
    "shard of the weights, the links between them carry the activations, and a planner decides "
    "which layers and which columns go where, measuring every machine's memory bandwidth and every "
    "link's latency before it places anything.",
]
POOLINGS = ["mean", "last", "cls"]


def build(tree, out):
    lib = os.path.join(tree, "build", "bin")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama-reference", "embed.cpp")
    subprocess.run(
        ["g++", "-O2", "-std=c++17", f"-I{tree}/include", f"-I{tree}/common", f"-I{tree}/ggml/include",
         src, f"-L{lib}", "-lllama", "-lllama-common", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}", "-o", out],
        check=True,
    )


def words_digest(words):
    data = b"".join(struct.pack("<I", int(w, 16)) for w in words)
    return hashlib.sha256(data).hexdigest(), [struct.unpack("<f", struct.pack("<I", int(w, 16)))[0] for w in words[:4]]


def main():
    tree, model = sys.argv[1], sys.argv[2]
    synth = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "embed")
        build(tree, exe)
        cases = []
        for pooling in POOLINGS:
            stdin = "".join(p.encode().hex() + "\n" for p in PROMPTS)
            out = subprocess.run([exe, model, pooling], input=stdin, capture_output=True, text=True, check=True).stdout
            for prompt, line in zip(PROMPTS, out.splitlines()):
                fields = dict(f.split("=", 1) for f in line.split())
                raw, raw_head = words_digest(fields["raw"].split(","))
                norm, _ = words_digest(fields["norm"].split(","))
                cases.append({"pooling": pooling, "prompt": prompt,
                              "tokens": [int(t) for t in fields["tokens"].split(",")],
                              "raw_sha256": raw, "raw_head": raw_head, "norm_sha256": norm})
    # The tree is built for this CPU (GGML_NATIVE): AVX-512 sums where it has them.
    simd = "avx512" if " avx512f" in open("/proc/cpuinfo").read() else "avx2"
    out = {"model": os.path.basename(model), "simd": simd, "llama_cpp": "0.3.36 (llama-cpp-python's tree)"}
    if synth is not None:
        out["synth"] = synth
        out["file_sha256"] = hashlib.sha256(open(model, "rb").read()).hexdigest()
    out["cases"] = cases
    json.dump(out, sys.stdout, indent=1)
    print()


main()
