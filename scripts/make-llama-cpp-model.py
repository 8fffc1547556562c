#!/usr/bin/env python3
"""Writes a random-weight model the way a user's file is made, entirely with llama.cpp's tools:
the f32 GGUF with llama.cpp's own `gguf-py` (not `strata synth`), quantised by its `llama-quantize`
with the type's default mix (not `--pure`), so strata is checked on bytes and a tensor layout that
strata's own writer did not choose (a separate `output.weight`, llama-quantize's per-tensor types).

    scripts/make-llama-cpp-model.py OUT.gguf [--arch llama] [--type IQ4_XS] [--layers 4]
        [--embd 256] [--ff 512] [--heads 4] [--kv-heads 2] [--seed 7] [--tied]

Needs `gguf` (pip install LLAMA_CPP/gguf-py) and numpy; `llama-quantize` from $LLAMA_BIN (a
llama.cpp build's bin directory) or PATH. The tokenizer is copied from $TOKENIZER_FROM (default:
the SmolLM2 catalog model in strata's store). Prints the tensor types of the result to stderr.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

DEFAULT_TOKENIZER = os.path.expanduser(
    "~/.cache/strata/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")


def copy_tokenizer(w, path):
    """Copies every `tokenizer.*` key of the GGUF at `path` into writer `w`."""
    r = GGUFReader(path)
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=f.types[1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    return len(r.fields["tokenizer.ggml.tokens"].data)


def write_f32(a, path):
    w = GGUFWriter(path, a.arch)
    w.add_name(f"random {a.arch}")
    n_vocab = copy_tokenizer(w, os.environ.get("TOKENIZER_FROM", DEFAULT_TOKENIZER))
    head_dim = a.embd // a.heads
    w.add_block_count(a.layers)
    w.add_context_length(2048)
    w.add_embedding_length(a.embd)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)
    rng = np.random.default_rng(a.seed)

    def mat(rows, cols):
        # ggml's ne0 is the row length: numpy shape (rows, cols) is ne = [cols, rows].
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    kv = a.kv_heads * head_dim
    w.add_tensor("token_embd.weight", mat(n_vocab, a.embd))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(a.embd))
        w.add_tensor(p + "attn_q.weight", mat(a.embd, a.embd))
        w.add_tensor(p + "attn_k.weight", mat(kv, a.embd))
        w.add_tensor(p + "attn_v.weight", mat(kv, a.embd))
        if a.arch == "qwen2":
            for n, rows in (("q", a.embd), ("k", kv), ("v", kv)):
                w.add_tensor(p + f"attn_{n}.bias", (0.1 * rng.standard_normal(rows)).astype(np.float32))
        w.add_tensor(p + "attn_output.weight", mat(a.embd, a.embd))
        w.add_tensor(p + "ffn_norm.weight", norm(a.embd))
        w.add_tensor(p + "ffn_gate.weight", mat(a.ff, a.embd))
        w.add_tensor(p + "ffn_up.weight", mat(a.ff, a.embd))
        w.add_tensor(p + "ffn_down.weight", mat(a.embd, a.ff))
    w.add_tensor("output_norm.weight", norm(a.embd))
    if not a.tied:
        w.add_tensor("output.weight", mat(n_vocab, a.embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    ap.add_argument("--type", default="IQ4_XS", help="llama-quantize's type (F32: no quantising)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tied", action="store_true", help="no output.weight (tied embedding)")
    a = ap.parse_args()
    if a.type.upper() == "F32":
        write_f32(a, a.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            f32 = os.path.join(tmp, "f32.gguf")
            write_f32(a, f32)
            bindir = os.environ.get("LLAMA_BIN")
            q = os.path.join(bindir, "llama-quantize") if bindir else shutil.which("llama-quantize")
            if not q:
                sys.exit("llama-quantize not found: set LLAMA_BIN to a llama.cpp build's bin dir")
            subprocess.run([q, f32, a.out, a.type, "2"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for t in GGUFReader(a.out).tensors:
        print(f"{t.name:28} {t.tensor_type.name:7} {list(map(int, t.shape))}", file=sys.stderr)


if __name__ == "__main__":
    main()
