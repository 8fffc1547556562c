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

Settings: 1 thread, one 512-token batch for the prompt, no flash attention, f16 KV cache (the
llama.cpp defaults), logits only for the last position (llama.cpp's normal path).
"""
import hashlib
import json
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama

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


def chatml(system, user):
    system = SYSTEM_DEFAULT if system is None else system
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def main():
    path = sys.argv[1]
    family = sys.argv[2] if len(sys.argv) > 2 else "smollm2"
    prompts = GEMMA_PROMPTS if family == "gemma3" else PROMPTS
    add_bos = family == "gemma3"
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    llm = Llama(path, n_ctx=2048, n_threads=1, n_threads_batch=1, n_batch=512,
                logits_all=False, verbose=False, seed=0)
    eog = {llm.token_eos(), 0, 2}
    cases = []
    for p in prompts:
        text = chatml(p["system"], p["prompt"]) if p["mode"] == "chat" else p["prompt"]
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=(p["mode"] == "chat"))
        llm.reset()
        llm.eval(ids)
        out, logits = [], []
        for step in range(N_GEN):
            # With logits_all=False llama.cpp keeps only the last position's logits.
            lg = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
            tok = int(np.argmax(lg))
            if step in LOGIT_STEPS:
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
    json.dump({"model_sha256": sha, "llama_cpp_python": "0.3.36", "n_threads": 1, "simd": simd,
               "add_bos": add_bos,
               "cases": cases}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
