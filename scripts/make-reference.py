#!/usr/bin/env python3
"""Regenerates fixtures/reference/MODEL.json: llama.cpp's greedy continuations and logits for a set
of prompts, the golden data strata's engine is tested against.

Needs llama-cpp-python 0.3.36 (`pip install llama-cpp-python==0.3.36`; on CPUs with AMX build it
with CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AMX_INT8=OFF ...",
since ggml's AMX path crashes in some VMs). Usage:

    python3 scripts/make-reference.py MODEL.gguf > fixtures/reference/smollm2-135m-instruct.json
    python3 scripts/make-reference.py GEMMA.gguf gemma3 > fixtures/reference/gemma3-270m.json

The second argument picks the prompt set: `smollm2` (default; chat-templated and raw prompts) or
`gemma3` (raw prompts with BOS: the 270M model is a base model).

Synthetic models of any family (random weights, real tokenizer):

    python3 scripts/make-reference.py --synth qwen2 q4_0 > fixtures/reference/synth-qwen2-q4_0.json
    python3 scripts/make-reference.py --synth qwen3 q4_k_m > fixtures/reference/synth-qwen3-q4_k_m.json
    python3 scripts/make-reference.py --synth olmo2-swa q8_0 > fixtures/reference/synth-olmo2-swa-q8_0.json
    python3 scripts/make-reference.py --synth llama-hd64 iq4_xs_mix > fixtures/reference/synth-llama-hd64-iq4_xs_mix.json
    python3 scripts/make-reference.py --synth llama-hd64-untied iq4_xs_mix > fixtures/reference/synth-llama-hd64-untied-iq4_xs_mix-avx512.json

writes the family's model (a SYNTH variant such as `olmo2-swa` names its architecture and extra
synth flags) in f32 with `strata synth` (dimensions and seed from SYNTH below, the
binary from $STRATA_BIN or target/release/strata), quantises it with llama.cpp's own quantiser
(`llama_model_quantize`, every matrix to the type), and records the digest of the quantised
weights: the parity test synthesises the model in the type itself and must get the same digest,
so it runs on exactly the bytes llama.cpp's quantiser wrote.

llama.cpp's aarch64 builds, for strata's ARM kernels (no Python under emulation: llama.cpp cross-built
with scripts/llama-reference/build-aarch64.sh, run under qemu-aarch64 on the level's CPU, through
scripts/llama-reference/dump.c; numpy and, for --synth, llama-cpp-python on the host):

    python3 scripts/make-reference.py --aarch64 neon MODEL.gguf > fixtures/reference/smollm2-135m-instruct-aarch64-neon.json
    python3 scripts/make-reference.py --aarch64 i8mm --synth qwen2 q4_0 > fixtures/reference/synth-qwen2-q4_0-aarch64-i8mm.json
    python3 scripts/make-reference.py --aarch64 neon --like synth-qwen2-q4_0 > fixtures/reference/synth-qwen2-q4_0-aarch64-neon.json

`--like NAME` takes the synthetic model of an existing fixture: `strata synth` writes it in its
types directly, and the script stops unless its weights digest is the one the fixture recorded
from llama.cpp's quantiser (so no llama-cpp-python is needed on the host).

Settings: 1 thread, one 512-token batch for the prompt, no flash attention, f16 KV cache (the
llama.cpp defaults), logits only for the last position (llama.cpp's normal path).
"""
import hashlib
import json
import os
import sys

import numpy as np

SYSTEM_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
N_GEN = 64
LOGIT_STEPS = [0, 1, 2, 8, 16, 32, 63]
TOP = 20

PROMPTS = [
    {"mode": "chat", "system": None, "prompt": "What is the capital of France?"},
    {"mode": "chat", "system": None, "prompt": "Write a short poem about the sea."},
    {"mode": "chat", "system": "You are a pirate. Answer in character.", "prompt": "Tell me about your ship."},
    {"mode": "chat", "system": None, "prompt": "List three uses of Python, one per line."},
    {"mode": "raw", "system": None, "prompt": "The history of the Roman Empire"},
    {"mode": "raw", "system": None, "prompt": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
    {"mode": "raw", "system": None, "prompt": "Once upon a time, in a small village,"},
]


GEMMA_PROMPTS = [
    {"mode": "raw", "system": None, "prompt": "The capital of France is"},
    {"mode": "raw", "system": None, "prompt": "Once upon a time, in a small village,"},
    {"mode": "raw", "system": None, "prompt": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
    {"mode": "raw", "system": None, "prompt": "The three primary colors are"},
    {"mode": "raw", "system": None, "prompt": "Photosynthesis is the process by which"},
]


# Dimensions of the synthetic parity models: small, but with grouped-query attention (4 query
# heads per KV head), several layers and, for qwen3, heads wider than width / heads.
SYNTH = {
    "llama": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    "qwen2": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    "qwen3": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=64, seed=7),
    "phi3": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    "smollm3": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    "granite": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    "gemma2": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    "mistral3": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    "olmo2": dict(layers=4, embd=256, ff=768, heads=8, kv_heads=2, head_dim=None, seed=7),
    # Qwen3-MoE: 8 experts of FFN width 256 (a K-quant block), 3 per token, so prompts route
    # 8 or more rows to some experts (llama.cpp's tiled kernel) and fewer to others (vec_dot).
    "qwen3moe": dict(layers=4, embd=256, ff=256, heads=8, kv_heads=2, head_dim=64, seed=7,
                     experts=8, experts_used=3),
    # gpt-oss: 8 experts of which 4 per token (the released models use 4 of 32 or 128), heads
    # wider than width / heads, a 16-token window on every other layer.
    "gpt-oss": dict(layers=4, embd=256, ff=256, heads=8, kv_heads=2, head_dim=64, seed=7,
                    experts=8, experts_used=4),
    # Qwen2-MoE: a shared expert twice an expert's width beside 8 experts, 2 per token.
    "qwen2moe": dict(layers=4, embd=256, ff=256, heads=8, kv_heads=2, head_dim=None, seed=7,
                     experts=8, experts_used=2),
    # DeepSeek V3 scaled down (see `SynthMla`): latent attention (a 128-wide latent row, 4
    # heads of 64 + 32 rotated), a dense first layer, 16 experts in 4 groups of which the best 2
    # may be chosen, 4 per token, sigmoid routing with a selection bias, one shared expert, YaRN.
    "deepseek2": dict(layers=4, embd=256, ff=256, heads=4, kv_heads=1, head_dim=64, seed=7,
                      experts=16, experts_used=4),
    # OLMoE: no grouped-query attention (llama.cpp sizes the K norm by the model width).
    "olmoe": dict(layers=4, embd=256, ff=256, heads=8, kv_heads=8, head_dim=None, seed=7,
                  experts=8, experts_used=3),
    # OLMo 3 (llama.cpp's `olmo2` with a sliding window on three layers of four, YaRN on the rest).
    # The shape of the defects found on llama.cpp-written files: 64-wide heads, two query heads
    # per KV head, FFN 512 (with llama-quantize's IQ4_XS mix, `iq4_xs_mix`).
    "llama-hd64": dict(arch="llama", layers=4, embd=256, ff=512, heads=4, kv_heads=2,
                       head_dim=None, seed=7),
    "qwen2-hd64": dict(arch="qwen2", layers=4, embd=256, ff=512, heads=4, kv_heads=2,
                       head_dim=None, seed=7),
    # The same with a separate output.weight, as a file gguf-py wrote: llama-quantize's
    # IQ4_XS mix then puts the head in Q6_K and leaves token_embd in IQ4_XS (read by get_rows).
    "llama-hd64-untied": dict(arch="llama", layers=4, embd=256, ff=512, heads=4, kv_heads=2,
                              head_dim=None, seed=7, untied=True),
    # Phi-3 as the 4k-context checkpoints' files are: fused attn_qkv and ffn_up, no LongRoPE
    # factors, six tensors a layer; and with separate attn_q/k/v, which llama.cpp also loads.
    "phi3-4k": dict(arch="phi3", layers=4, embd=256, ff=512, heads=4, kv_heads=2,
                    head_dim=None, seed=7, no_longrope=True),
    "phi3-split": dict(arch="phi3", layers=4, embd=256, ff=512, heads=4, kv_heads=2,
                       head_dim=None, seed=7, split_qkv=True),
    "olmo2-swa": dict(arch="olmo2", layers=4, embd=256, ff=768, heads=8, kv_heads=2,
                      head_dim=None, seed=7, sliding_window=16),
}
SYNTH_PROMPTS = [
    {"mode": "chat", "system": "You are a helpful assistant.", "prompt": "What is the capital of France?"},
    {"mode": "raw", "system": None, "prompt": "The history of the Roman Empire"},
    {"mode": "raw", "system": None, "prompt": "def fibonacci(n):\n    return n"},
]
# llama.cpp's file types: a plain type quantises every matrix to it (`pure`); a mix (`q4_k_m`...)
# lets llama.cpp pick each tensor's type as `llama-quantize` does, and the fixture lists them.
FTYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9,
          "q2_k": 10, "q3_k": 11, "q4_k": 14, "q5_k": 16, "q6_k": 18, "iq4_nl": 25,
          "iq4_xs": 30, "bf16": 32}
MIXES = {"q3_k_m": (12, "q3_k"), "q4_k_m": (15, "q4_k"), "q5_k_m": (17, "q5_k"),
         # MXFP4 experts, every other matrix Q8_0 (how gpt-oss files are quantised).
         "mxfp4_moe": (38, "q8_0"),
         # What `llama-quantize IN OUT IQ4_XS` writes: IQ4_XS, with the LM head (or the tied
         # embedding) in Q6_K and, by the model's shape, some attn_v / ffn_down in Q5_K.
         "iq4_xs_mix": (30, "iq4_xs")}
GGML_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
              10: "q2_k", 11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k", 20: "iq4_nl",
              23: "iq4_xs", 30: "bf16", 39: "mxfp4"}


def tensor_types(path, base):
    """The matrices whose type is not `base`, by name (ggml type names)."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    return {t.name: GGML_NAMES[int(t.tensor_type)] for t in r.tensors
            if len(t.shape) > 1 and t.name.endswith(".weight")
            and GGML_NAMES[int(t.tensor_type)] != base}


def tensor_digest(path):
    """SHA-256 over every tensor in name order of name, NUL, type id (u32 LE) and data, as
    strata's `synth::tensor_digest` computes it."""
    import struct
    from gguf import GGUFReader
    r = GGUFReader(path)
    h = hashlib.sha256()
    for t in sorted(r.tensors, key=lambda t: t.name):
        h.update(t.name.encode() + b"\0" + struct.pack("<I", int(t.tensor_type)))
        h.update(t.data.tobytes())
    return h.hexdigest()


def make_synth(variant, ty, workdir):
    """Writes the f32 model of a SYNTH variant with strata and quantises it with llama.cpp;
    returns its path and the synth parameters for the fixture (with the real architecture)."""
    import os
    import subprocess
    dims = {"arch": variant, **SYNTH[variant]}
    arch = dims["arch"]
    strata = os.environ.get("STRATA_BIN", "target/release/strata")
    f32 = os.path.join(workdir, f"{variant}-f32.gguf")
    args = [strata, "synth", "--type", "f32", "-o", f32]
    for k, v in dims.items():
        if v is True:
            args += ["--" + k.replace("_", "-")]
        elif v is not None and v is not False:
            args += ["--" + k.replace("_", "-"), str(v)]
    subprocess.run(args, check=True, stdout=sys.stderr)
    if ty == "f32":
        return f32, dims
    out = os.path.join(workdir, f"{variant}-{ty}.gguf")
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = MIXES[ty][0] if ty in MIXES else FTYPES[ty]
    params.pure = ty not in MIXES
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(f32.encode(), out.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc})")
    return out, dims


def make_like(name, workdir):
    """Writes the synthetic model of fixtures/reference/NAME.json with `strata synth` in the
    fixture's types; returns its path and the fixture's synth parameters, after checking that
    the weights are the bytes llama.cpp's quantiser wrote for it."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "fixtures", "reference", f"{name}.json")) as f:
        synth = json.load(f)["synth"]
    strata = os.environ.get("STRATA_BIN", "target/release/strata")
    out = os.path.join(workdir, f"{name}.gguf")
    args = [strata, "synth", "-o", out, "--type", synth["type"]]
    for k, v in synth.items():
        if k in ("ftype", "type", "tensor_types", "weights_digest"):
            continue
        if v is True:
            args += ["--" + k.replace("_", "-")]
        elif v is not None and v is not False:
            args += ["--" + k.replace("_", "-"), str(v)]
    for tensor, ty in sorted(synth.get("tensor_types", {}).items()):
        args += ["--tensor-type", f"{tensor}={ty}"]
    subprocess.run(args, check=True, stdout=sys.stderr)
    if tensor_digest(out) != synth["weights_digest"]:
        sys.exit(f"{name}: strata's synthetic weights differ from those the fixture recorded")
    return out, synth


def chatml(system, user):
    system = SYSTEM_DEFAULT if system is None else system
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def case_text(p):
    return chatml(p["system"], p["prompt"]) if p["mode"] == "chat" else p["prompt"]


def run_python(path, prompts, n_gen, add_bos, steps):
    """The cases through llama-cpp-python on this host; and the build's SIMD flavour."""
    import llama_cpp
    from llama_cpp import Llama
    llm = Llama(path, n_ctx=2048, n_threads=1, n_threads_batch=1, n_batch=512,
                logits_all=False, verbose=False, seed=0)
    eog = {llm.token_eos(), 0, 2}
    cases = []
    for p in prompts:
        text = case_text(p)
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=(p["mode"] == "chat"))
        llm.reset()
        llm.eval(ids)
        out, logits = [], []
        for step in range(n_gen):
            # With logits_all=False llama.cpp keeps only the last position's logits.
            lg = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
            tok = int(np.argmax(lg))
            if step in steps:
                top = np.argsort(-lg, kind="stable")[:TOP]
                logits.append({"step": step, "top": [[int(t), float(lg[t])] for t in top]})
            out.append(tok)
            if tok in eog:
                break
            llm.eval([tok])
        cases.append({**p, "text": text, "prompt_ids": ids, "generated_ids": out,
                      "generated_text": llm.detokenize(out).decode("utf-8", "replace"),
                      "logits": logits})
        print(f"{p['mode']}: {p['prompt'][:40]!r} -> {len(out)} tokens", file=sys.stderr)
    # llama.cpp builds for the CPU it runs on; its AVX-512 and AVX2 builds sum attention
    # products in different orders, and the engine test reproduces the one recorded here.
    simd = "avx512" if "AVX512 = 1" in llama_cpp.llama_print_system_info().decode() else "avx2"
    return cases, simd


# The qemu CPU each aarch64 level runs on (see scripts/llama-reference/build-aarch64.sh).
AARCH64_CPUS = {"neon": "cortex-a72", "i8mm": "max,sve=off"}
AARCH64 = None


def run_aarch64(path, prompts, n_gen, add_bos, steps):
    """The cases through llama.cpp's aarch64 build under qemu (scripts/llama-reference/dump.c,
    the same settings as run_python); the level is the flavour."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    dump = subprocess.run([os.path.join(here, "llama-reference", "build-aarch64.sh"), AARCH64],
                          check=True, capture_output=True, text=True).stdout.split()[-1]
    lines = "".join(
        f"{n_gen} {int(add_bos)} {int(p['mode'] == 'chat')} {','.join(map(str, steps)) or '-'} "
        f"{case_text(p).encode().hex()}\n" for p in prompts)
    run = subprocess.run(["qemu-aarch64", "-cpu", AARCH64_CPUS[AARCH64], dump, path], input=lines,
                         check=True, capture_output=True, text=True)
    out = run.stdout.splitlines()
    print(out[0], file=sys.stderr)
    ints = lambda v: [int(x) for x in v.split(",") if x]
    cases = []
    for p, line in zip(prompts, out[1:], strict=True):
        f = dict(kv.split("=", 1) for kv in line.split(" "))
        logits = []
        for entry in filter(None, f["logits"].split("|")):
            step, top = entry.split(":", 1)
            pairs = [t.split("/") for t in top.split(";")]
            logits.append({"step": int(step), "top": [[int(t), float(v)] for t, v in pairs]})
        gen = ints(f["generated"])
        cases.append({**p, "text": case_text(p), "prompt_ids": ints(f["prompt"]),
                      "generated_ids": gen,
                      "generated_text": bytes.fromhex(f["text"]).decode("utf-8", "replace"),
                      "logits": logits})
        print(f"{p['mode']}: {p['prompt'][:40]!r} -> {len(gen)} tokens", file=sys.stderr)
    return cases, f"aarch64-{AARCH64}"


def main():
    global AARCH64
    if sys.argv[1] == "--aarch64":
        AARCH64 = sys.argv[2]
        del sys.argv[1:3]
    synth = None
    if sys.argv[1] == "--synth":
        import tempfile
        variant, ty = sys.argv[2], sys.argv[3]
        workdir = tempfile.mkdtemp()
        path, dims = make_synth(variant, ty, workdir)
        base = MIXES[ty][1] if ty in MIXES else ty
        synth = {"ftype": ty, "type": base, **dims,
                 "tensor_types": tensor_types(path, base), "weights_digest": tensor_digest(path)}
        family = "synth"
    elif sys.argv[1] == "--like":
        import tempfile
        path, synth = make_like(sys.argv[2], tempfile.mkdtemp())
        family = "synth"
    else:
        path = sys.argv[1]
        family = sys.argv[2] if len(sys.argv) > 2 else "smollm2"
    prompts = {"gemma3": GEMMA_PROMPTS, "synth": SYNTH_PROMPTS}.get(family, PROMPTS)
    n_gen = 32 if synth else N_GEN
    add_bos = family == "gemma3"
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    steps = [s for s in range(n_gen) if s in LOGIT_STEPS or (synth and s == n_gen - 1)]
    if AARCH64:
        cases, simd = run_aarch64(path, prompts, n_gen, add_bos, steps)
    else:
        cases, simd = run_python(path, prompts, n_gen, add_bos, steps)
    json.dump({"model_sha256": sha, "llama_cpp_python": "0.3.36", "n_threads": 1, "simd": simd,
               "add_bos": add_bos, **({"synth": synth} if synth else {}),
               "cases": cases}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
