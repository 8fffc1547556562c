#!/usr/bin/env python3
r"""Regenerate fixtures/quant/dots.json: llama.cpp's own one-row dot products (`vec_dot`).

strata's kernels must sum in llama.cpp's order to give its bits. The model parity tests check
that end to end, but only for the matrix shapes the synthetic models have; this fixture pins the
one-token `vec_dot` order of the formats whose order has special cases (an odd trailing block,
a tail shorter than a SIMD step) directly against the functions of the libggml-cpu that
llama-cpp-python ships (an AVX2 build on the machines strata is measured on).

For each case it takes weight row `w` and activation row `a` of the inputs of
scripts/make-quant-vectors.py (the same generator; quantise.rs's tests rebuild them bit for bit),
cut to `n` elements, quantises the weights with `ggml_quantize_chunk` and the activations with
the `from_float` of the format's `vec_dot_type`, calls `vec_dot`, and stores the f32 result's
bits.

Usage:

    python3 scripts/make-dot-vectors.py --out fixtures/quant/dots.json
"""

import argparse
import ctypes
import importlib.util
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("qv", os.path.join(HERE, "make-quant-vectors.py"))
qv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qv)

TYPES = [("IQ4_NL", 20), ("MXFP4", 39), ("BF16", 30), ("F16", 1), ("Q4_0", 2), ("Q8_0", 8)]
LENGTHS = {"IQ4_NL": [32, 64, 96, 288, 4096], "MXFP4": [32, 64, 96, 288, 4096],
           "Q4_0": [32, 96, 4096], "Q8_0": [32, 96, 4096],
           "BF16": [8, 40, 96, 1000, 4096], "F16": [8, 40, 96, 1000, 4096]}
# (weight row, activation row) pairs of make-quant-vectors.py's inputs.
PAIRS = [(0, 8), (1, 0), (5, 7), (9, 14), (13, 6)]


class Traits(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


FROM = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import llama_cpp
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = qv.load_ggml()
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
    rows = {k: qv.case(k) for k in {k for p in PAIRS for k in p}}
    out = {"pairs": PAIRS, "types": {}}
    for name, tid in TYPES:
        t = cpu.ggml_get_type_traits_cpu(tid).contents
        act = cpu.ggml_get_type_traits_cpu(t.vec_dot_type).contents
        cases = []
        for n in LENGTHS[name]:
            for wk, ak in PAIRS:
                w = np.ascontiguousarray(rows[wk][:n], dtype=np.float32)
                x = np.ascontiguousarray(rows[ak][:n], dtype=np.float32)
                wb = ctypes.create_string_buffer(base.ggml_row_size(tid, n))
                base.ggml_quantize_chunk(tid, w.ctypes.data, wb, 0, 1, n, None)
                ab = ctypes.create_string_buffer(base.ggml_row_size(t.vec_dot_type, n))
                FROM(act.from_float)(x.ctypes.data, ab, n)
                s = ctypes.c_float()
                VEC_DOT(t.vec_dot)(n, ctypes.byref(s), 0, wb, 0, ab, 0, 1)
                bits = int(np.array([s.value], dtype=np.float32).view(np.uint32)[0])
                cases.append({"n": n, "w": wk, "a": ak, "bits": bits})
        out["types"][name] = cases
    with open(args.out, "w") as f:
        json.dump(out, f)
        f.write("\n")


if __name__ == "__main__":
    main()
