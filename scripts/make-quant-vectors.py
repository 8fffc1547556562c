#!/usr/bin/env python3
r"""Regenerate fixtures/quant/vectors.json: digests of llama.cpp's quantised bytes for fixed inputs.

strata writes synthetic models whose quantised tensors must be the bytes `llama-quantize` would
write (crates/kernels/src/quantize.rs ports llama.cpp's reference quantisers operation for
operation). This script asks llama.cpp itself: it builds ROWS rows of N_PER_ROW floats with the
deterministic generator below (the Rust test in quantize.rs rebuilds the same floats bit for bit),
quantises them with `ggml_quantize_chunk` from the libggml-base that llama-cpp-python ships
(imatrix NULL, which is what `llama_model_quantize` does without an importance matrix), and
stores, per type, the byte length and the SHA-256 of the whole output and of each row.

The generator is splitmix64; `unit()` is `(next() >> 40) / 2^23 - 1` in [-1, 1), exact in f32.
Every later operation is one f32 multiplication or addition (numpy float32, correctly rounded as
in Rust), so the inputs do not depend on the platform.

Setup (as for make-tokenizer-vectors.py): `python3 -m pip install llama-cpp-python==0.3.36 numpy`.

Usage:

    python3 scripts/make-quant-vectors.py --out fixtures/quant/vectors.json
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys

import numpy as np

ROWS = 16
N_PER_ROW = 4096
MASK = (1 << 64) - 1

# ggml type ids, names as in ggml's type_traits.
TYPES = [
    ("Q5_1", 7),
    ("Q2_K", 10),
    ("Q3_K", 11),
    ("Q4_K", 12),
    ("Q5_K", 13),
    ("Q6_K", 14),
    ("IQ4_NL", 20),
    ("IQ4_XS", 23),
    ("BF16", 30),
]


class SplitMix:
    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def unit(self):
        # Exact in double and in f32: an integer below 2^24 over 2^23, minus one.
        return np.float32((self.next() >> 40) / 8388608.0 - 1.0)


def f32(v):
    return np.float32(v)


def case(kind):
    """Row `kind` (0..ROWS): the same floats as `case` in quantize.rs's tests."""
    r = SplitMix(1000 + kind)
    out = np.zeros(N_PER_ROW, dtype=np.float32)
    for i in range(N_PER_ROW):
        if kind == 0:  # plain uniform
            v = r.unit()
        elif kind == 1:  # typical weight scale
            v = r.unit() * f32(0.02)
        elif kind == 2:  # all zeros
            v = f32(0.0)
        elif kind == 3:  # tiny: below GROUP_MAX_EPS
            v = r.unit() * f32(1e-30)
        elif kind == 4:  # small: f16 subnormal scales
            v = r.unit() * f32(1e-7)
        elif kind == 5:  # two huge outliers in small noise
            v = r.unit() * f32(0.01)
            if i == 17:
                v = f32(1000.0)
            elif i == 2049:
                v = f32(-300.0)
        elif kind == 6:  # negative only
            v = -abs(r.unit()) * f32(0.5)
        elif kind == 7:  # positive only
            v = abs(r.unit()) * f32(3.0)
        elif kind == 8:  # bell-shaped: sum of three uniforms
            a = r.unit()
            b = r.unit()
            c = r.unit()
            v = ((a + b) + c) * f32(0.05)
        elif kind == 9:  # scale varying by powers of two every 32 values
            v = r.unit() * f32(2.0 ** ((i // 32) % 24 - 12))
        elif kind == 10:  # sparse: one value in ten
            m = r.next()
            u = r.unit()
            v = u * f32(0.5) if m % 10 == 0 else f32(0.0)
        elif kind == 11:  # constant blocks of 32 (one of them zero)
            v = f32((i // 32) % 7) * f32(0.125) - f32(0.375)
        elif kind == 12:  # large: f16 overflow of Q5_1's minimum
            v = r.unit() * f32(1e5)
        elif kind == 13:  # multiples of 0.25: rounding ties
            v = f32(int(r.next() % 17) - 8) * f32(0.25)
        elif kind == 14:  # alternating magnitudes
            v = r.unit() * (f32(1e3) if i % 2 == 0 else f32(1e-3))
        else:  # one value per 32-block
            u = r.unit()
            v = u if i % 32 == 5 else f32(0.0)
        out[i] = v
    return out


def inputs():
    return np.concatenate([case(k) for k in range(ROWS)]).astype(np.float32)


def load_ggml():
    import llama_cpp

    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def quantize(lib, type_id, x, nrows, n_per_row):
    """llama.cpp's bytes for `x` (nrows x n_per_row f32) in type `type_id`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    size = lib.ggml_row_size(type_id, n_per_row) * nrows
    dst = ctypes.create_string_buffer(size)
    n = lib.ggml_quantize_chunk(type_id, x.ctypes.data, dst, 0, nrows, n_per_row, None)
    if n != size:
        sys.exit(f"type {type_id}: ggml_quantize_chunk wrote {n} bytes, expected {size}")
    return dst.raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    lib = load_ggml()
    x = inputs()
    types = {}
    for name, tid in TYPES:
        q = quantize(lib, tid, x, ROWS, N_PER_ROW)
        row = len(q) // ROWS
        rows = [q[i * row : (i + 1) * row] for i in range(ROWS)]
        types[name] = {
            "id": tid,
            "bytes": len(q),
            "sha256": hashlib.sha256(q).hexdigest(),
            "row_sha256": [hashlib.sha256(r).hexdigest() for r in rows],
        }
    doc = {
        "source": "ggml_quantize_chunk (libggml-base of llama-cpp-python), imatrix NULL",
        "generator": "scripts/make-quant-vectors.py, case()",
        "rows": ROWS,
        "n_per_row": N_PER_ROW,
        "input_sha256": hashlib.sha256(x.astype("<f4").tobytes()).hexdigest(),
        "types": types,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
