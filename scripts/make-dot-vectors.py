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

llama.cpp's aarch64 builds sum in other orders (NEON `vec_dot`, `vdotq_s32` where the CPU has
dotprod, `mmla` row pairs with i8mm). `--aarch64 LEVEL` takes every format strata loads from
the build of that level (scripts/llama-reference/build-aarch64.sh, its `dots` program run under
qemu-aarch64 on the level's CPU) instead, each at lengths with odd and even block counts, and
with i8mm also two rows by two (`nrc` = 2, the path ggml's matrix product takes for pairs):

    python3 scripts/make-dot-vectors.py --aarch64 neon --out fixtures/quant/dots-aarch64-neon.json
    python3 scripts/make-dot-vectors.py --aarch64 i8mm --out fixtures/quant/dots-aarch64-i8mm.json
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


# Every format strata loads, for the aarch64 references: (name, ggml type id, lengths).
ARM_TYPES = [("F32", 0, [8, 40, 96, 1000, 4096]), ("F16", 1, [8, 40, 96, 1000, 4096]),
             ("BF16", 30, [8, 40, 96, 1000, 4096]), ("Q4_0", 2, [32, 96, 128, 4096]),
             ("Q4_1", 3, [32, 96, 128, 4096]), ("Q5_0", 6, [32, 96, 128, 4096]),
             ("Q5_1", 7, [32, 96, 128, 4096]), ("Q8_0", 8, [32, 96, 128, 4096]),
             ("Q2_K", 10, [256, 768, 4096]), ("Q3_K", 11, [256, 768, 4096]),
             ("Q4_K", 12, [256, 768, 4096]), ("Q5_K", 13, [256, 768, 4096]),
             ("Q6_K", 14, [256, 768, 4096]), ("IQ4_NL", 20, [32, 96, 128, 4096]),
             ("IQ4_XS", 23, [256, 768, 4096]), ("MXFP4", 39, [32, 96, 128, 4096])]
# The qemu CPU of each level (as scripts/make-reference.py's).
ARM_CPUS = {"neon": "cortex-a72", "i8mm": "max,sve=off"}


def hexrow(v):
    return np.ascontiguousarray(v, dtype="<f4").tobytes().hex()


def arm_main(level, out_path):
    """Every format's products through llama.cpp's aarch64 build of `level` under qemu.

    The aarch64 build's reference quantisers fuse multiplies and adds where the x86 one
    rounds twice, so some rows quantise to other bytes there. Each weight row's full-length
    case echoes its bytes; where they differ from the x86 quantiser's (the row hashes of
    fixtures/quant/vectors.json), the fixture keeps them (`weights`) and the products are of
    those bytes."""
    import hashlib
    import subprocess
    build = os.path.join(HERE, "llama-reference", "build-aarch64.sh")
    dump = subprocess.run([build, level], check=True, capture_output=True, text=True)
    dots = os.path.join(os.path.dirname(dump.stdout.strip().splitlines()[-1]), "dots")
    with open(os.path.join(HERE, "..", "fixtures", "quant", "vectors.json")) as f:
        x86 = json.load(f)["types"]
    rows = {k: qv.case(k) for k in {k for p in PAIRS for k in p}}
    lines, index = [], []
    for name, tid, lengths in ARM_TYPES:
        for n in lengths:
            for wk, ak in PAIRS:
                echo = int(n == qv.N_PER_ROW)
                lines.append(f"{tid} {n} 1 {echo} {hexrow(rows[wk][:n])} {hexrow(rows[ak][:n])}")
                index.append((name, n, [wk], [ak]))
            if level == "i8mm":
                for (w0, a0), (w1, a1) in zip(PAIRS, PAIRS[1:]):
                    lines.append(f"{tid} {n} 2 0 {hexrow(rows[w0][:n])} {hexrow(rows[w1][:n])} "
                                 f"{hexrow(rows[a0][:n])} {hexrow(rows[a1][:n])}")
                    index.append((name, n, [w0, w1], [a0, a1]))
    run = subprocess.run(["qemu-aarch64", "-cpu", ARM_CPUS[level], dots],
                         input="\n".join(lines) + "\n", check=True, capture_output=True,
                         text=True)
    results = run.stdout.split("\n")
    assert len(results) > len(lines), "dots stopped early"
    out = {"pairs": PAIRS, "level": level, "types": {}, "weights": {}}
    for (name, n, ws, acts), line in zip(index, results):
        if line == "-":
            continue
        words = line.split()
        if len(words) > len(ws) ** 2:
            wbytes = bytes.fromhex(words.pop(0))
            want = x86.get(name, {}).get("row_sha256")
            if want and hashlib.sha256(wbytes).hexdigest() != want[ws[0]]:
                out["weights"].setdefault(name, {})[str(ws[0])] = wbytes.hex()
        bits = [int(b, 16) for b in words]
        case = {"n": n, "w": ws[0], "a": acts[0], "bits": bits[0]}
        if len(ws) == 2:
            # ggml's order: results for activation row 0 (weight rows 0, 1), then row 1.
            case = {"n": n, "w": ws, "a": acts, "bits": bits}
        out["types"].setdefault(name, []).append(case)
    with open(out_path, "w") as f:
        json.dump(out, f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--aarch64", choices=sorted(ARM_CPUS))
    args = ap.parse_args()
    if args.aarch64:
        return arm_main(args.aarch64, args.out)
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
